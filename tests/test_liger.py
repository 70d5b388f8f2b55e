"""`--liger-kernels on` (issue 28): the model as Liger-Kernel patches it (AutoLigerKernelForCausalLM, ArcticTraining's
`type: liger`), priced in plan and check.

Oracles: Liger-Kernel's own source for what its functions keep (LigerRMSNormFunction and LigerSiLUMulFunction's
save_for_backward, fused_linear_cross_entropy_forward's chunk rule and the worked example in its comment); for the
whole model, ArcticTraining's H200 recipes that ran Llama-3.1-8B with and without Liger at the edge of the GPU's memory
(bench/alst_max_seq.py, held within 15% by tests/test_long_context.py). Liger's Triton kernels need a GPU: they cannot
run here, so no CPU rank measures them."""

from __future__ import annotations

import json

import pytest

from helpers import run_cli as run
from zerokit.estimate.memory import (activation_bytes_per_layer, activation_terms, estimate_memory,
                                     final_norm_bytes_per_token, liger_loss_chunk_tokens)
from zerokit.spec.hardware import Cluster, accelerator
from zerokit.spec.model import load_model_spec
from zerokit.spec.setup import Workload, ZeroSetup

H200 = Cluster(accelerator("h200"), gpus_per_node=1)


def test_loss_chunk_is_ligers_rule():
    # fused_linear_cross_entropy_forward's comment: "BT = 4096*4, V = 32000, H = 4096 ==> inc_factor = 8, chunk_size = 2048"
    assert liger_loss_chunk_tokens(4096 * 4, 32000, 4096) == 2048
    # Llama-3.1 (V 128256, H 4096): inc_factor 32; 1.2M tokens: cdiv 37,500, next power of two 65,536
    assert liger_loss_chunk_tokens(1_200_000, 128256, 4096) == 65536
    assert liger_loss_chunk_tokens(100, 128256, 4096) == 4
    assert liger_loss_chunk_tokens(3, 32000, 4096) == 1  # never more than the tokens


def test_a_layer_keeps_what_ligers_functions_save():
    hf = load_model_spec("llama-3.1-8b")
    liger = hf.with_liger_kernels()
    h, i, tokens = hf.hidden_size, hf.intermediate_size, 1000
    saved_hf = activation_bytes_per_layer(hf, tokens, tokens, "bf16", "flash")
    saved_liger = activation_bytes_per_layer(liger, tokens, tokens, "bf16", "flash")
    # per norm, transformers' RMSNorm keeps its fp32 input copy, the bf16 cast the weight multiplies and its output
    # (4h + 2h + 2h + a fp32 rsqrt); Liger's its input, a fp32 rstd and its output (2h + 2h + 4): 4h less, two norms.
    # MLP: gate, act(gate), up, product (4 x 2i) against Liger's gate, up, product (3 x 2i)
    assert saved_hf - saved_liger == tokens * (2 * 4 * h + 2 * i)
    assert final_norm_bytes_per_token(liger, "bf16") == 2 * 2 * h + 4


def test_under_checkpointing_the_first_norm_keeps_the_checkpointed_input():
    liger = load_model_spec("llama-3.1-8b").with_liger_kernels()
    tokens, e = 8192, 2
    setup = ZeroSetup(zero_stage=3, precision="bf16", activation_checkpointing=True)
    acts = activation_terms(liger, setup, Workload(seq_len=tokens, attention="flash"), on_cpu=False)
    layer = activation_bytes_per_layer(liger, tokens, tokens, "bf16", "flash")
    final = tokens * final_norm_bytes_per_token(liger, "bf16")
    assert acts["activations_recompute"] == layer - tokens * liger.hidden_size * e + final


def test_the_fused_loss_keeps_a_chunk_of_logits_and_the_gradients_it_made_in_forward():
    liger = load_model_spec("llama-3.1-8b").with_liger_kernels()
    h, v, tokens = liger.hidden_size, liger.vocab_size, 32768
    setup = ZeroSetup(zero_stage=3, precision="bf16", offload_optimizer="cpu", offload_param="cpu",
                      activation_checkpointing=True)
    workload = Workload(seq_len=tokens, attention="flash")
    acts = activation_terms(liger, setup, workload)
    chunk = liger_loss_chunk_tokens(tokens, v, h)
    assert chunk == 1024
    # the chunk's bf16 logits (the kernel writes their gradient over them) and a fp32 loss per token; grad_input kept
    assert acts["logits_and_loss"] == chunk * v * 2 + 4 * tokens
    assert acts["logits_grad"] == 0 and acts["tiled_loss_input_grad"] == tokens * h * 2
    phases = estimate_memory(liger, H200, setup, workload).phase_terms
    assert phases["backward"]["tiled_loss_head_grad"] == 2 * v * h  # grad_weight, made in forward
    assert phases["backward"]["loss_backward_transient"] == 0
    assert all("logits_output" not in terms for terms in phases.values())  # skip_logits: no logits returned
    # transformers' loss at the same length holds the whole logits and their fp32 gradient
    hf = activation_terms(load_model_spec("llama-3.1-8b"), setup, workload)
    assert hf["logits_and_loss"] > 20 * acts["logits_and_loss"]


def test_plan_says_it_and_json_carries_it(capsys):
    argv = ["plan", "llama-3.1-8b", "--gpu", "h200", "--gpus-per-node", "1", "--seq-len", "max", "--stage", "3",
            "--offload-optimizer", "cpu", "--offload-param", "cpu", "--micro-batch", "1", "--precision", "bf16",
            "--activation-checkpointing", "on", "--tiled-mlp", "off", "--hardware-profile", "none"]
    rc, out, err = run([*argv, "--liger-kernels", "on", "--json"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    assert d["model"]["liger_kernels"] is True and not d["choice"]["tiled_loss"]
    with_liger = d["workload"]["max_seq_len_search"]["memory_bound_seq_len"]
    rc, out, err = run([*argv, "--tiled-loss", "off", "--json"], capsys)
    without = json.loads(out)["workload"]["max_seq_len_search"]["memory_bound_seq_len"]
    # ArcticTraining's H200 recipes: 65K without Liger, 300K with it (checkpointing, no offload of the checkpoints):
    # the memory model's own answers (the answer a user copies is cut to where published runs ended: search.py)
    assert without < 80_000 < 280_000 < with_liger
    rc, out, err = run([*argv, "--liger-kernels", "on"], capsys)
    assert rc == 0 and "Liger kernels (RMSNorm, SwiGLU, fused linear cross-entropy)" in out


def test_check_prices_a_liger_script(tmp_path, capsys):
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
           "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}}
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    argv = ["check", str(tmp_path / "ds.json"), "--model", "llama-3.1-8b", "--gpu", "h200", "--gpus-per-node", "1",
            "--seq-len", "max", "--activation-checkpointing", "on", "--hardware-profile", "none", "--json"]
    lengths = {}
    for liger in ("off", "on"):
        rc, out, err = run([*argv, "--liger-kernels", liger], capsys)
        assert rc == 0, err
        d = json.loads(out)
        assert d["fits"]
        lengths[liger] = d["workload"]["max_seq_len"]
    assert lengths["on"] > 3 * lengths["off"]


@pytest.mark.parametrize("extra, needle", [
    (["gpt2"], "model type 'gpt2'"),
    (["llama-3.1-8b", "--tiled-loss", "on"], "drop --tiled-loss"),
    (["tiny-llama", "--trace"], "drop --trace or --liger-kernels"),
])
def test_what_liger_cannot_run_is_one_line(extra, needle, capsys):
    rc, out, err = run(["plan", *extra, "--gpu", "h100-80gb", "--liger-kernels", "on"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert "Traceback" not in err


def test_a_bare_count_runs_liger_as_the_llama_it_is_priced_as(capsys):
    """A --params count is priced as a Llama (spec_from_params), whose modules Liger patches: its fused linear
    cross-entropy takes the logits out, as for llama-2-7b's own config (same shape, same vocabulary)."""
    terms = {}
    for model in (["--params", "6738415616", "--hidden-size", "4096", "--num-layers", "32"], ["llama-2-7b"]):
        for liger in ("off", "on"):
            rc, out, err = run(["plan", *model, "--gpu", "h100-80gb", "--seq-len", "4096", "--stage", "3", "--micro-batch", "1",
                                "--liger-kernels", liger, "--json"], capsys)
            assert rc in (0, 1), err
            terms[(model[0], liger)] = json.loads(out)["memory"]["per_gpu"]["terms"]
    assert terms[("--params", "on")].get("logits_and_loss", 0) < terms[("--params", "off")]["logits_and_loss"]
    assert terms[("--params", "on")].get("logits_and_loss", 0) == terms[("llama-2-7b", "on")].get("logits_and_loss", 0)


# ------------------------------------------------------------------- releases before 0.6.1: 32-bit row offsets
def test_before_0_6_1_a_ranks_tokens_are_capped_where_the_recipe_crashed():
    """Oracle: ArcticTraining's run-h100-sp1-llama-8b.yml (liger-kernel 0.5.x, June 2025): Llama-3.1-8B at 500,000
    tokens on one H100 "ok", 555,000 "Triton Error [CUDA]: an illegal memory access"; Liger-Kernel PR #804 (0.6.1) cast
    RMSNorm's and RoPE's program id to int64 for it. The cap lies between, at 2^31 / 4096 rows."""
    from zerokit.spec.liger import liger_token_limit

    llama = load_model_spec("llama-3.1-8b")
    limit = liger_token_limit(llama.with_liger_kernels("0.5.10"))
    assert 500_000 <= limit.tokens < 555_000 and limit.tokens == 2**31 // 4096 and "RMSNorm" in limit.kernel
    assert "liger-kernel>=0.6.1" in limit.fix
    assert liger_token_limit(llama.with_liger_kernels("0.6.0")) == limit  # 0.6.0 still 32-bit
    for fixed in (None, "0.6.1", "0.8.2", "1.0"):
        assert liger_token_limit(llama.with_liger_kernels(fixed)) is None
    assert liger_token_limit(llama) is None  # no Liger


def test_a_per_head_q_norm_is_capped_until_0_8_4():
    """Qwen3's q_norm normalises 64 rows of 128 a token (Qwen3-32B); from 0.6.0 LigerRMSNorm runs such narrow rows
    through its block kernel, 32-bit until 0.8.4 (bench/results/liger_int32_probe.txt): 2^31 / (64 x 128) tokens a rank
    before 0.8.4, and 0.6.1 is not the fix. Its recipes ran 230,000 tokens on one GPU and 4M over 16 (250,000 a rank):
    under the cap."""
    from zerokit.spec.liger import liger_token_limit

    qwen = load_model_spec("qwen3-32b")
    for release in ("0.5.10", "0.6.0", "0.6.1", "0.8.2", "0.8.3"):
        limit = liger_token_limit(qwen.with_liger_kernels(release))
        assert limit.tokens == 2**31 // (64 * 128) >= 4_000_000 // 16 >= 230_000, release
        assert "rows of 128, 64 a token" in limit.kernel and "liger-kernel>=0.8.4" in limit.fix, release
    assert "block kernel" in liger_token_limit(qwen.with_liger_kernels("0.6.1")).kernel
    for fixed in ("0.8.4", "0.8.5", None):
        assert liger_token_limit(qwen.with_liger_kernels(fixed)) is None


def _probe_results() -> dict[tuple[int, int, int], dict[str, str]]:
    """bench/results/liger_int32_probe.txt: {release: {case: result}}."""
    import re
    from pathlib import Path

    out, release = {}, None
    for line in (Path(__file__).resolve().parents[1] / "bench/results/liger_int32_probe.txt").read_text().splitlines():
        if m := re.match(r"liger-kernel (\d+)\.(\d+)\.(\d+),", line):
            release = tuple(map(int, m.groups()))
            out[release] = {}
        elif line.startswith("  ") and release:
            case, result = re.split(r"\s{2,}", line.strip(), maxsplit=1)
            out[release][case] = result
    return out


def test_the_rule_agrees_with_the_kernels_run_in_tritons_interpreter():
    """Each release bench/liger_int32_probe.py ran: a kernel crashed at a row starting at element 2^31 exactly where
    zerokit/spec/liger.py says that kernel indexes in 32 bits, and every control at 2^30 came out right."""
    from zerokit.spec.liger import BLOCK_INT64_SINCE, BLOCK_KERNEL_SINCE, INT64_ROWS_SINCE

    runs = _probe_results()
    assert {(0, 5, 10), (0, 6, 0), INT64_ROWS_SINCE, (0, 8, 3), BLOCK_INT64_SINCE} <= set(runs)
    for release, cases in runs.items():
        assert len(cases) == 6, release
        expect = {"row kernel": release < INT64_ROWS_SINCE, "RoPE": release < INT64_ROWS_SINCE,
                  "block kernel": BLOCK_KERNEL_SINCE <= release < BLOCK_INT64_SINCE}
        for case, result in cases.items():
            kernel = next(k for k in expect if case.startswith(k))
            if kernel == "block kernel" and release < BLOCK_KERNEL_SINCE:
                assert result == "absent in this release", (release, case)
            elif "(control)" in case:
                assert result == "correct", (release, case)
            else:
                assert result.startswith("crashed") == expect[kernel] and result != "wrong", (release, case, result)


def test_plan_refuses_past_the_cap_and_names_the_release_that_lifts_it(capsys):
    argv = ["plan", "llama-3.1-8b", "--gpu", "h100-80gb", "--gpus-per-node", "1", "--seq-len", "600000", "--stage", "3",
            "--offload-optimizer", "cpu", "--offload-param", "cpu", "--micro-batch", "1", "--precision", "bf16",
            "--activation-checkpointing", "offload", "--tiled-mlp", "on", "--hardware-profile", "none", "--json"]
    rc, out, err = run([*argv, "--liger-kernels", "on"], capsys)
    assert rc == 0 and json.loads(out)["fits"], err  # the memory fits
    rc, out, err = run([*argv, "--liger-kernels", "0.5.10"], capsys)
    d = json.loads(out)
    assert rc == 1 and not d["fits"] and d["model"]["liger_version"] == "0.5.10"
    assert "600000 tokens per rank overflow it past 524288" in d["reasons"][0]
    assert "liger-kernel>=0.6.1" in d["reasons"][0] and "PR #804" in d["reasons"][0]
    rc, out, err = run([*argv[:1], "qwen3-32b", *argv[2:], "--liger-kernels", "0.8.3"], capsys)
    reason = json.loads(out)["reasons"][0]
    assert rc == 1 and "liger-kernel 0.8.3's RMSNorm block kernel (rows of 128, 64 a token)" in reason, reason
    assert "liger-kernel>=0.8.4" in reason
    rc, out, err = run([a for a in argv if a != "--json"] + ["--liger-kernels", "0.5.10"], capsys)
    assert rc == 1 and "Liger kernels 0.5.10 (RMSNorm" in out and "indexes in 32 bits" in out


def test_seq_len_max_stops_at_the_cap_over_the_sequence_parallel_ranks(capsys):
    """ALST's SP 8 setup (arXiv 2506.13996: 3.7M on 8 H100s, liger-kernel 0.5.x): the memory model alone answers
    5.07M; the 0.5.10 kernels stop at 524,288 tokens a rank, 8 x 524,288 in all."""
    argv = ["plan", "llama-3.1-8b", "--gpu", "h100-80gb", "--gpus-per-node", "8", "--seq-len", "max", "--stage", "3",
            "--offload-optimizer", "cpu", "--offload-param", "none", "--micro-batch", "1", "--precision", "bf16",
            "--sequence-parallel", "8", "--activation-checkpointing", "offload", "--tiled-mlp", "on",
            "--attention", "flash", "--hardware-profile", "none", "--json"]
    rc, out, err = run([*argv, "--liger-kernels", "0.5.10"], capsys)
    assert rc == 0, err
    w = json.loads(out)["workload"]
    assert w["max_seq_len"] == 8 * 2**31 // 4096
    assert w["max_seq_len_search"]["binds"].startswith("liger-kernel 0.5.10's RMSNorm")
    assert "largest term" not in w["max_seq_len_search"]["binds"]  # not a memory budget
    rc, out, err = run([*argv, "--liger-kernels", "on"], capsys)
    assert rc == 0 and json.loads(out)["workload"]["max_seq_len"] > 8 * 2**31 // 4096


def test_check_refuses_a_config_past_the_cap(tmp_path, capsys):
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
           "sequence_parallel_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    argv = ["check", str(tmp_path / "ds.json"), "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--gpus-per-node", "8",
            "--seq-len", "4194312", "--activation-checkpointing", "offload", "--hardware-profile", "none"]
    rc, out, err = run([*argv, "--liger-kernels", "0.5.10"], capsys)
    assert rc == 1 and "524289 tokens per rank overflow it past 524288" in out, out + err


@pytest.mark.parametrize("value", ["banana", "0.x", "on5"])
def test_a_liger_release_it_cannot_read_is_one_line(value, capsys):
    rc, out, err = run(["plan", "llama-3.1-8b", "--gpu", "h100-80gb", "--liger-kernels", value], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "a liger-kernel version such as 0.6.1" in err, err


def test_the_time_model_prices_ligers_single_pass_kernels():
    """Liger's Triton kernels move each tensor once (Liger-Kernel src/liger_kernel/ops): RMSNorm reads x and writes y
    (2E per hidden element, not transformers' fp32 casts' 36 B), rotary rewrites q and k in place (2E, not 12E),
    SwiGLU reads gate and up and writes their product (3E per intermediate element, not silu's 2E + the product's 3E),
    and the fused cross-entropy reads each logit twice and writes its gradient once (3E per logit, not 28 + 2E)."""
    from zerokit.estimate.gpu_time import elementwise_bytes_per_token, logit_bytes_per_token
    from zerokit.estimate.timing import estimate_time

    hf = load_model_spec("qwen2.5-7b")
    liger = hf.with_liger_kernels()
    e, h, i, v = 2, hf.hidden_size, hf.intermediate_size, hf.vocab_size
    qk = (hf.num_attention_heads + hf.num_kv_heads) * hf.head_dim
    residual = 2 * 3 * e * h
    assert elementwise_bytes_per_token(hf, 4096, "bf16", "flash") == \
        hf.num_layers * (2 * 36 * h + residual + 12 * e * qk + 2 * e * i + 3 * e * i)
    assert elementwise_bytes_per_token(liger, 4096, "bf16", "flash") == \
        hf.num_layers * (2 * 2 * e * h + residual + 2 * e * qk + 3 * e * i)
    assert logit_bytes_per_token(hf, "bf16") == v * (28 + 2 * e)
    assert logit_bytes_per_token(liger, "bf16") == v * 3 * e
    # the matmuls and attention are the same kernels' FLOPs: only the memory-bound part falls
    cluster = Cluster(accelerator("a100-80gb"), gpus_per_node=4)
    setup = ZeroSetup(zero_stage=3, activation_checkpointing=True)
    t_hf, t_liger = (estimate_time(m, cluster, setup, Workload(seq_len=16384, attention="flash")) for m in (hf, liger))
    assert t_liger.matmul_seconds == t_hf.matmul_seconds and t_liger.attention_seconds == t_hf.attention_seconds
    assert t_liger.memory_bound_seconds < 0.4 * t_hf.memory_bound_seconds
