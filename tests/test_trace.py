"""trace_activation_memory: the fake-tensor trace equals a real run, measured independently."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from zerokit.core.errors import ZerokitError
from zerokit.measure.meter import MemoryMeter
from zerokit.measure.trace import trace_activation_memory

TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 128,
}
SEQ, BATCH = 32, 2


def _real_forward_activation_bytes(attn: str, checkpointing: bool = False) -> dict:
    """The same step on real tensors, measured by MemoryMeter (not MemTracker): bytes created by the
    forward pass and still alive after it (what backward needs, plus logits and loss)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(TINY)
    cfg = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    meter = MemoryMeter("cpu").start()
    try:
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
        model.train()
        if checkpointing:
            (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
        ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ))
        mask = torch.ones(BATCH, SEQ, dtype=torch.long) if attn == "eager" else None
        meter.register_module(model)
        with meter.phase("forward"):
            out = model(input_ids=ids, attention_mask=mask, labels=ids.clone(), use_cache=False)
        loss = out.loss
        del out
        with meter.phase("backward"):
            loss.backward()
        s = meter.summary()
    finally:
        meter.close()
        torch.set_default_dtype(old)
    fw = s["phases"]["forward"]
    # labels.clone() is created inside the forward phase: 8 bytes per token, not an activation
    return {"activation_bytes": fw["end_bytes"] - fw["start_bytes"] - BATCH * SEQ * 8,
            "params_bytes": s["categories"]["parameters"], "gradients_bytes": s["categories"]["gradients"]}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_trace_matches_real_run(attn):
    traced = trace_activation_memory(TINY, SEQ, BATCH, precision="bf16", attn_implementation=attn)
    real = _real_forward_activation_bytes(attn)
    assert traced["attn_implementation"] == attn
    assert traced["method"] == "fake_tensor_mem_tracker"
    assert abs(traced["activation_bytes"] - real["activation_bytes"]) <= 0.001 * real["activation_bytes"], (traced, real)
    assert traced["params_bytes"] == real["params_bytes"] == 2 * traced["params"]
    assert traced["gradients_bytes"] == real["gradients_bytes"]


def test_checkpointing_matches_real_run_and_saves_memory():
    plain = trace_activation_memory(TINY, SEQ, BATCH)
    ckpt = trace_activation_memory(TINY, SEQ, BATCH, activation_checkpointing=True)
    real = _real_forward_activation_bytes("sdpa", checkpointing=True)
    # within 0.5%: under checkpointing the two differ by a few hundred bytes of bookkeeping tensors
    assert abs(ckpt["activation_bytes"] - real["activation_bytes"]) <= 0.005 * real["activation_bytes"]
    assert ckpt["activation_bytes"] < plain["activation_bytes"]


def test_eager_stores_scores_sdpa_does_not():
    """eager keeps the b*a*s^2 probabilities per layer; sdpa (CPU flash path) keeps out + logsumexp."""
    e = trace_activation_memory(TINY, 64, 1, attn_implementation="eager")
    s = trace_activation_memory(TINY, 64, 1, attn_implementation="sdpa")
    assert e["activation_bytes"] - s["activation_bytes"] >= TINY["num_hidden_layers"] * 4 * 64 * 64 * 2


def test_optimizer_step_and_categories():
    r = trace_activation_memory(TINY, SEQ, BATCH, precision="fp32", optimizer_step=True)
    assert r["params_bytes"] == 4 * r["params"]
    assert r["gradients_bytes"] == 4 * r["params"]
    # AdamW: exp_avg + exp_avg_sq in the parameter dtype (+ a scalar step per tensor)
    assert 8 * r["params"] <= r["optimizer_states_bytes"] <= 8 * r["params"] + 4096
    assert r["peak_bytes"] >= r["params_bytes"] + r["gradients_bytes"] + r["optimizer_states_bytes"]
    assert set(r["phases"]) == {"forward", "backward", "optimizer"}


def test_scales_with_batch():
    one = trace_activation_memory(TINY, SEQ, 1)
    two = trace_activation_memory(TINY, SEQ, 2)
    assert 1.9 < two["activation_bytes"] / one["activation_bytes"] < 2.1


def test_bad_inputs():
    with pytest.raises(ZerokitError):
        trace_activation_memory(TINY, SEQ, BATCH, precision="fp8")
    with pytest.raises(ZerokitError):
        trace_activation_memory({"hidden_size": 8}, SEQ, BATCH)
    with pytest.raises(ZerokitError):
        trace_activation_memory("/nonexistent/model/dir", SEQ, BATCH)
