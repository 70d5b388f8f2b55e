"""zerokit.launching.pipeline: an HF decoder as a DeepSpeed PipelineModule, proven on real CPU ranks over gloo.

In process: the pipeline's layers, run in order, give HF's own loss for every supported architecture and hold exactly
the model's parameters; an unsupported model, eager attention, a sequence that reaches a sliding window and bad
pipeline arguments are refused with one-line ZerokitErrors.

Real ranks (tests/helpers/pipeline_ranks.py under the deepspeed launcher, as tests/test_timing.py launches its
ranks): the bundled random-init tiny Llama, fp32, seq 64, micro-batch 2, gradient accumulation 4, 3 AdamW steps
(torch_adam, no JIT op) with DeepSpeed's default clipping at 1.0, which the gradients' norm (~1.3-1.5) engages on
every step, against the same model trained in one process with plain PyTorch on the same global batches. Measured
here (2 cores): per-step losses and the eval loss after training within 3.6e-7 of the reference for P=2 (with and
without activation checkpointing) and the tied variant, 6.0e-7 for P=2 x DP=2 (ZeRO-1): at most 8e-8 relative, about
one fp32 ulp of the loss; the tolerance is 1e-5 relative. Without the adapter's clip-norm mark
(pipeline._count_every_stage_in_the_clip_norm) P=2 drifted 8e-5 by step 3 and 2.7e-4 on the eval loss.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zerokit.core.errors import ZerokitError

REPO = Path(__file__).resolve().parent.parent
TINY_LLAMA = REPO / "zerokit" / "data" / "models" / "tiny-llama"
TINY_GPT2 = REPO / "zerokit" / "data" / "models" / "tiny-gpt2"
RANKS = "tests.helpers.pipeline_ranks"
REL_TOL = 1e-5  # fp32; measured <= 8e-8 relative (module docstring)
SMALL = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2)


def _config(arch: str):
    import transformers

    if arch == "llama":
        return transformers.AutoConfig.from_pretrained(TINY_LLAMA)
    if arch == "llama-tied":
        return transformers.AutoConfig.from_pretrained(TINY_LLAMA, tie_word_embeddings=True)
    if arch == "mistral":
        return transformers.MistralConfig(**SMALL, sliding_window=128)
    if arch == "qwen2":
        return transformers.Qwen2Config(**SMALL)
    if arch == "qwen3":
        return transformers.Qwen3Config(**SMALL, head_dim=16)
    return transformers.GemmaConfig(**SMALL, head_dim=16)  # tied, embedding scaled by sqrt(hidden)


def _model(config, **kw):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, **kw)


def _run_layers(layers, x):
    """The layers in order, as PipelineModule.forward runs them on one stage; a tied spec's module built once."""
    from deepspeed.pipe import TiedLayerSpec

    built = {}
    for layer in layers:
        if isinstance(layer, TiedLayerSpec):
            module = built.setdefault(layer.key, layer.build())
            x = layer.forward_fn(module, x) if layer.forward_fn else module(x)
        else:
            x = layer(x)
    return x, built


def _layer_params(layers, built) -> set[int]:
    from deepspeed.pipe import TiedLayerSpec

    modules = [m for m in layers if not isinstance(m, TiedLayerSpec)] + list(built.values())
    return {id(p) for m in modules for p in m.parameters()}


@pytest.mark.parametrize("arch", ["llama", "llama-tied", "mistral", "qwen2", "qwen3", "gemma"])
def test_the_layers_in_order_give_hfs_loss_with_the_models_own_parameters(arch):
    import torch

    from zerokit.launching.pipeline import causal_lm_loss, is_tied, pipeline_layers

    model = _model(_config(arch))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (2, 64), generator=g)
    labels = ids.clone()
    labels[0, :7] = -100
    ref = model(input_ids=ids, labels=labels).loss
    layers = pipeline_layers(model)
    logits, built = _run_layers(layers, ids)
    got = causal_lm_loss(logits, labels)
    assert got.item() == pytest.approx(ref.item(), rel=1e-6, abs=0)
    # the model's own weights, nothing re-initialised, the tie kept as one Parameter
    assert _layer_params(layers, built) == {id(p) for p in model.parameters()}
    assert len(layers) == model.config.num_hidden_layers + (3 if is_tied(model) else 2)
    ref.backward()
    hf_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    got.backward()
    for p, g_ref in zip(model.parameters(), hf_grads):
        torch.testing.assert_close(p.grad, g_ref, rtol=1e-5, atol=1e-7)


def test_an_unsupported_architecture_is_refused_in_one_line():
    from transformers import AutoConfig

    from zerokit.launching.pipeline import SUPPORTED_ARCHITECTURES, pipeline_layers

    model = _model(AutoConfig.from_pretrained(TINY_GPT2))
    with pytest.raises(ZerokitError) as e:
        pipeline_layers(model)
    msg = str(e.value)
    assert "\n" not in msg and "GPT2LMHeadModel" in msg
    assert all(name in msg for name in SUPPORTED_ARCHITECTURES)


def test_eager_attention_is_refused_it_would_attend_to_later_tokens_without_a_mask():
    from zerokit.launching.pipeline import pipeline_layers

    with pytest.raises(ZerokitError, match="attn_implementation='sdpa'") as e:
        pipeline_layers(_model(_config("llama"), attn_implementation="eager"))
    assert "\n" not in str(e.value)


def test_a_sequence_that_reaches_the_sliding_window_is_refused():
    import torch
    import transformers

    from zerokit.launching.pipeline import pipeline_layers

    layers = pipeline_layers(_model(transformers.MistralConfig(**SMALL, sliding_window=32)))
    hidden = layers[0](torch.zeros(1, 31, dtype=torch.long))
    assert layers[1](hidden).shape == (1, 31, 64)  # under the window HF builds no mask either
    with pytest.raises(ZerokitError, match="sliding window 32"):
        layers[1](layers[0](torch.zeros(1, 32, dtype=torch.long)))


def test_a_frozen_embedding_still_hands_on_hidden_states_that_take_a_grad():
    """Reentrant activation checkpointing of the next block needs it (EmbeddingPipe says why); on 2 ranks with the
    embedding frozen and activation_checkpoint_interval 1 the guard turned a RuntimeError into HF's losses."""
    import torch

    from zerokit.launching.pipeline import pipeline_layers

    model = _model(_config("llama"))
    model.model.embed_tokens.weight.requires_grad_(False)
    embed = pipeline_layers(model)[0]
    assert embed(torch.zeros(1, 8, dtype=torch.long)).requires_grad
    with torch.no_grad():
        assert not embed(torch.zeros(1, 8, dtype=torch.long)).requires_grad


@pytest.mark.parametrize("kw, needle", [(dict(num_stages=0), "pipeline stages must be 1..6"),
                                        (dict(num_stages=7), "pipeline stages must be 1..6"),
                                        (dict(num_stages=2, partition_method="greedy"), "partition method 'greedy'")])
def test_bad_pipeline_arguments_are_refused_before_deepspeed_is_asked(kw, needle):
    from zerokit.launching.pipeline import pipeline_module

    with pytest.raises(ZerokitError, match=needle):
        pipeline_module(_model(_config("llama")), **kw)


# --- real ranks -------------------------------------------------------------------------------------------------


def _env() -> dict:
    bindir = Path(sys.executable).parent
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
               PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONPATH=str(REPO))
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _train(tmp_path: Path, ranks: int, model: Path, zero: int = 0, ckpt: int = 0) -> tuple[list[dict], dict]:
    """(each rank's report, the reference's) of a 2-stage pipeline over `ranks` ranks and of plain PyTorch on the same
    global batches; the reference runs alongside the ranks."""
    from zerokit.measure.ranks import free_port

    out = tmp_path / "ranks"
    out.mkdir()
    dp = ranks // 2
    ref_path = tmp_path / "reference.json"
    ref = subprocess.Popen([sys.executable, "-m", RANKS, "--reference", "--model", str(model), "--dp", str(dp),
                            "--out", str(ref_path)], cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    argv = [str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", str(ranks), "--master_port", str(free_port()),
            "--module", RANKS, "--model", str(model), "--stages", "2", "--zero", str(zero), "--ckpt", str(ckpt),
            "--out", str(out)]
    r = subprocess.run(argv, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    ref_out, _ = ref.communicate(timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert ref.returncode == 0, ref_out[-4000:]
    reports = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda d: d["rank"])
    assert [d["rank"] for d in reports] == list(range(ranks)), (r.stdout + r.stderr)[-4000:]
    return reports, json.loads(ref_path.read_text())


def _assert_same_training(reports: list[dict], ref: dict) -> None:
    assert len(ref["losses"]) == 3
    # the steps moved the weights far beyond the tolerance: step 0's batch, evaluated after training, lost > 0.1
    assert ref["losses"][0] - ref["eval"] > 0.1
    for d in reports:  # train_batch's loss reaches every rank (broadcast from the last stage, averaged over DP)
        assert d["losses"] == pytest.approx(ref["losses"], rel=REL_TOL, abs=0), (d, ref)
        assert d["eval"] == pytest.approx(ref["eval"], rel=REL_TOL, abs=0), (d, ref)


def _assert_two_stages(reports: list[dict], first: str, last: str) -> None:
    for d in reports:
        assert d["parts"][0] == 0 and len(d["parts"]) == 3
        assert d["layers"][0 if d["stage"] == 0 else -1] == (first if d["stage"] == 0 else last), d
        assert len(d["layers"]) == d["parts"][d["stage"] + 1] - d["parts"][d["stage"]]


@pytest.mark.slow
@pytest.mark.parametrize("ckpt", [0, 1], ids=["plain", "activation-checkpointing"])
def test_two_stages_train_like_one_process(tmp_path, ckpt):
    """ckpt 1: DeepSpeed's (reentrant) activation checkpointing of every decoder layer, the embedding left out."""
    reports, ref = _train(tmp_path, ranks=2, model=TINY_LLAMA, ckpt=ckpt)
    assert [(d["stage"], d["dp_rank"]) for d in reports] == [(0, 0), (1, 0)]
    _assert_two_stages(reports, "EmbeddingPipe", "LMHeadPipe")
    assert reports[0]["parts"] == [0, 3, 6]  # "parameters": embedding + 2 decoder layers | 2 + norm and head
    # one block a layer: the decoder layers are checkpointed, the embedding (integer input) and the head are not
    assert [d["checkpointed"] for d in reports] == ([[False, True, True], [True, True, False]] if ckpt else [[], []])
    _assert_same_training(reports, ref)


@pytest.mark.slow
def test_two_stages_by_two_data_parallel_ranks_train_like_one_process_on_the_global_batch(tmp_path):
    """4 ranks, ZeRO-1: the reference takes micro x accumulation x DP = 16 samples a step."""
    reports, ref = _train(tmp_path, ranks=4, model=TINY_LLAMA, zero=1)
    assert sorted((d["stage"], d["dp_rank"]) for d in reports) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    _assert_two_stages(reports, "EmbeddingPipe", "LMHeadPipe")
    _assert_same_training(reports, ref)


@pytest.mark.slow
def test_tied_embeddings_train_like_one_process_and_stay_tied(tmp_path):
    config = json.loads((TINY_LLAMA / "config.json").read_text())
    model = tmp_path / "tiny-llama-tied"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    reports, ref = _train(tmp_path, ranks=2, model=model)
    _assert_two_stages(reports, "TiedEmbeddingPipe", "_tied_head")
    assert reports[1]["layers"][-2] == "FinalNormPipe"
    _assert_same_training(reports, ref)
    # after training, the first stage's embedding equals the last stage's head weight (all-gathered by the ranks)
    assert [d["tied_max_diff"] for d in reports] == [0.0, 0.0]
