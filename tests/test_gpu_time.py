"""The GPU time model (estimate/gpu_time.py) against the sources each rule copies: the MAMF table's matmul rates, the
FlashAttention-2 paper's FLOP accounting and kernel rates, the FlashAttention-3 paper's rates, transformers' varlen path
for packed documents, DeepSpeed's overlap of ZeRO's collectives, and the host
costs measured on an H200 node. Its accuracy against published runs is bench/published_runs.py's (not gated here:
tests/test_published_runs.py only checks that the committed table and range are what the model gives now)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from specs import LLAMA3_8B
from zerokit.core.resources import bundled_data
from zerokit.estimate.gpu_time import (FLASH_BACKWARD_FLOPS, GpuCompute, attention_flops_per_token, time_fit,
                                       exposed_communication, optimizer_bytes_per_param)
from zerokit.estimate.timing import estimate_time, flops_per_token, matmul_params
from zerokit.spec.hardware import Cluster, accelerator
from zerokit.spec.optimizer import ADAMW
from zerokit.spec.setup import Workload, ZeroKnobs, ZeroSetup

REPO = Path(__file__).resolve().parents[1]


# stas00/ml-engineering, compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table" (BF16):
# MAMF and theory TFLOP/s as printed there
MAMF_TABLE = {"a100-80gb": (271.2, 312), "h100-80gb": (794.5, 989), "gh200-144gb": (828.6, 989),
              "b200": (1745.0, 2250), "mi300x": (668.4, 1300)}


@pytest.mark.parametrize("gpu", list(MAMF_TABLE))
def test_matmul_fraction_is_the_mamf_table(gpu):
    mamf, theory = MAMF_TABLE[gpu]
    assert accelerator(gpu).matmul_fraction == pytest.approx(mamf / theory, abs=0.001)


def test_flash_attention_flops_follow_the_fa2_paper():
    # Dao 2023, section 4.1: forward FLOPs 4 s^2 d per head, halved with a causal mask (about half the blocks are
    # skipped); backward 2.5x the forward (5 matmuls to 2, the scores recomputed)
    m = LLAMA3_8B
    s, ad, layers = 4096, m.num_attention_heads * m.head_dim, m.num_layers
    fwd, bwd = attention_flops_per_token(m, s, False, "sdpa")
    assert fwd == pytest.approx(layers * 4 * s * ad / 2)
    assert bwd == pytest.approx(FLASH_BACKWARD_FLOPS * fwd) and FLASH_BACKWARD_FLOPS == 2.5
    # eager computes every score, masked or not; its backward is two matmuls per forward one
    e_fwd, e_bwd = attention_flops_per_token(m, s, False, "eager")
    assert e_fwd == pytest.approx(2 * fwd) and e_bwd == pytest.approx(2 * e_fwd)
    # checkpointing recomputes the forward once more; a sliding window caps the keys a query reads
    assert attention_flops_per_token(m, s, True, "sdpa")[1] == pytest.approx(bwd + fwd)
    windowed = replace(m, sliding_window=1024, sliding_window_layers=layers)
    assert attention_flops_per_token(windowed, s, False, "sdpa")[0] == pytest.approx(layers * 4 * 1024 * ad)


def test_a100_attention_rate_is_the_fa2_papers():
    # FA2 on A100: forward up to 73% of peak, backward (2.5x its FLOPs) ~50%: 3.5 / (1/0.73 + 2.5/0.5) of peak over
    # forward + backward; on H100 up to 335 of 989 TFLOP/s (Dao 2023, section 4.1)
    assert accelerator("a100-80gb").attention_fraction == pytest.approx(3.5 / (1 / 0.73 + 2.5 / 0.5), abs=0.005)
    assert accelerator("h100-80gb").attention_fraction == pytest.approx(335 / 989, abs=0.005)


def test_flash3_rate_is_the_fa3_papers_and_hopper_only(capsys, tmp_path):
    # Shah et al. 2024 (FlashAttention-3, arXiv 2407.08608), H100 SXM5, head dim 128, 16K tokens: forward (causal)
    # 616 TFLOP/s, backward 561, of 989; the same figures put FlashAttention-2 at 335 and 322: the catalog's 34%
    fa3 = 3.5 / (989 / 616 + 2.5 * 989 / 561)
    assert accelerator("h100-80gb").flash3_fraction == pytest.approx(fa3, abs=0.001)
    assert 3.5 / (989 / 335 + 2.5 * 989 / 322) == pytest.approx(accelerator("h100-80gb").attention_fraction, abs=0.015)
    # the same FLOPs at that rate: flash3 prices attention at FA2's rate / FA3's of flash's time, nothing else changes
    cluster = Cluster(accelerator=accelerator("h100-80gb"), gpus_per_node=8)
    setup = ZeroSetup(zero_stage=3, activation_checkpointing=True)
    fa2_time = estimate_time(LLAMA3_8B, cluster, setup, Workload(seq_len=16384, attention="flash"))
    fa3_time = estimate_time(LLAMA3_8B, cluster, setup, Workload(seq_len=16384, attention="flash3"))
    h100 = accelerator("h100-80gb")
    assert fa3_time.attention_seconds == pytest.approx(
        fa2_time.attention_seconds * h100.attention_fraction / h100.flash3_fraction, rel=1e-9)
    assert fa3_time.matmul_seconds == fa2_time.matmul_seconds
    assert fa3_time.step_seconds < fa2_time.step_seconds
    # its kernels are Hopper's (sm90): elsewhere one line, exit 2, in plan and check
    from helpers import run_cli

    for gpu in ("a100-80gb", "cpu"):
        rc, out, err = run_cli(["plan", "llama-3.1-8b", "--gpu", gpu, "--attention", "flash3"], capsys)
        assert rc == 2 and not out and err.count("\n") == 1
        assert "FlashAttention-3 runs on Hopper GPUs" in err and f"not {gpu}" in err and "--attention flash" in err
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}))
    rc, out, err = run_cli(["check", config, "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--attention", "flash3"],
                           capsys)
    assert rc == 2 and not out and "FlashAttention-3 runs on Hopper GPUs" in err


def test_packed_documents_are_attended_one_at_a_time(capsys):
    # transformers' flash path sees position ids restarting per document and calls flash_attn_varlen_func
    # (_flash_attention_forward: _is_packed_sequence): a 64K sequence packed with 8K documents attends like eight 8K
    # sequences, so its attention is 8x one 8K sequence's; nothing else changes, memory included
    from zerokit.estimate.memory import estimate_memory

    cluster = Cluster(accelerator=accelerator("a100-80gb"), gpus_per_node=4)
    setup = ZeroSetup(zero_stage=3, activation_checkpointing=True, sequence_parallel=4)
    whole = Workload(seq_len=65536, attention="flash")
    packed = Workload(seq_len=65536, attention="flash", doc_len=8192)
    one_doc = estimate_time(LLAMA3_8B, cluster, setup, Workload(seq_len=8192, attention="flash"))
    t_whole, t_packed = (estimate_time(LLAMA3_8B, cluster, setup, w) for w in (whole, packed))
    assert t_packed.attention_seconds == pytest.approx(8 * one_doc.attention_seconds, rel=1e-9)
    assert t_packed.attention_seconds == pytest.approx(t_whole.attention_seconds / 8, rel=1e-9)
    assert t_packed.matmul_seconds == t_whole.matmul_seconds
    assert t_packed.memory_bound_seconds == t_whole.memory_bound_seconds
    assert t_packed.flops_per_step < t_whole.flops_per_step
    assert estimate_memory(LLAMA3_8B, cluster, setup, packed).per_gpu_total == \
        estimate_memory(LLAMA3_8B, cluster, setup, whole).per_gpu_total
    # a document as long as the sequence is no packing
    same = estimate_time(LLAMA3_8B, cluster, setup, Workload(seq_len=65536, attention="flash", doc_len=65536))
    assert same.step_seconds == t_whole.step_seconds
    # the plan says it; bad input is one line, exit 2
    from helpers import run_cli

    base = ["plan", "llama-3.1-8b", "--gpu", "a100-80gb", "--seq-len", 4096]
    rc, out, err = run_cli([*base, "--attention", "flash", "--doc-len", 1024, "--json"], capsys)
    assert rc == 0 and json.loads(out)["workload"]["doc_len"] == 1024
    rc, out, err = run_cli([*base, "--attention", "flash", "--doc-len", 1024], capsys)
    assert "attention flash within packed 1024-token documents" in out
    for extra, needle in ((["--doc-len", 1024], "sdpa attends over the whole packed sequence"),
                          (["--attention", "eager", "--doc-len", 1024], "eager attends over the whole packed sequence"),
                          (["--attention", "flash", "--doc-len", 8192], "--doc-len 8192 is longer than the 4096-token")):
        rc, out, err = run_cli([*base, *extra], capsys)
        assert rc == 2 and not out and err.count("\n") == 1 and needle in err, err


def test_matmul_time_is_the_dense_flops_at_mamf():
    cluster = Cluster(accelerator=accelerator("a100-80gb"), gpus_per_node=1)
    setup = ZeroSetup(zero_stage=0, micro_batch_size=2, gradient_accumulation_steps=3)
    t = estimate_time(LLAMA3_8B, cluster, setup, Workload(seq_len=1024))
    dense = flops_per_token(LLAMA3_8B, 0, False) * 2 * 1024 * 3
    # A100's MAMF, at the share of it the fit found a model's matmuls reach (gpu_time.TimeFit.matmul_share)
    share = time_fit().matmul_share("ampere", LLAMA3_8B.hidden_size)
    assert t.matmul_seconds == pytest.approx(dense / (312e12 * 271.2 / 312 * share), rel=2e-3)
    assert flops_per_token(LLAMA3_8B, 0, False) == 6 * matmul_params(LLAMA3_8B)  # no attention in the dense part
    assert t.compute_seconds == pytest.approx(t.matmul_seconds + t.attention_seconds + t.memory_bound_seconds
                                              + t.host_seconds)
    assert t.efficiency is None and t.calibrated is False


def test_optimizer_step_is_memory_bound():
    # FusedAdam in mixed precision: fp32 master r/w 8, two moments r/w 16, fp32 gradient 4, the 16-bit gradient cast
    # in (2 + 4) and the updated weight cast out (4 + 2)
    assert optimizer_bytes_per_param(ADAMW, "bf16") == 8 + 16 + 4 + 6 + 6
    assert optimizer_bytes_per_param(ADAMW, "fp32") == 8 + 16 + 4
    cluster = Cluster(accelerator=accelerator("h100-80gb"), gpus_per_node=8)
    t = estimate_time(LLAMA3_8B, cluster, ZeroSetup(zero_stage=1), Workload(seq_len=1024))
    assert t.optimizer_seconds == pytest.approx(LLAMA3_8B.params / 8 * 40 / 3350e9)


def test_collectives_overlap_as_deepspeed_schedules_them():
    compute = GpuCompute(matmul_seconds=1.0, attention_seconds=0.5, memory_seconds=0.5, optimizer_seconds=0.0,
                         backward_seconds=1.2)
    # ZeRO-0: the all-reduce after backward, all of it
    assert exposed_communication(0, True, 0.8, 0.0, compute) == pytest.approx(0.8)
    # ZeRO-1/2: the bucketed reduce hides behind backward, the gather after the step does not
    assert exposed_communication(2, True, 1.0, 0.3, compute) == pytest.approx(0.3)
    assert exposed_communication(2, True, 1.5, 0.3, compute) == pytest.approx(0.3 + 0.3)
    # ZeRO-3: prefetched gathers and reduce-scatters hide behind all of compute
    assert exposed_communication(3, True, 1.0, 0.9, compute) == pytest.approx(0.0)
    assert exposed_communication(3, True, 1.5, 1.0, compute) == pytest.approx(0.5)
    # overlap_comm off: every byte waits
    assert exposed_communication(3, False, 1.0, 0.9, compute) == pytest.approx(1.9)


def test_a_plan_states_what_overlapped():
    cluster = Cluster(accelerator=accelerator("a100-80gb"), gpus_per_node=8)
    w = Workload(seq_len=2048)
    on = estimate_time(LLAMA3_8B, cluster, ZeroSetup(zero_stage=3), w, ZeroKnobs(overlap_comm=True))
    off = estimate_time(LLAMA3_8B, cluster, ZeroSetup(zero_stage=3), w, ZeroKnobs(overlap_comm=False))
    assert on.communication_hidden_seconds > 0 and off.communication_hidden_seconds == 0
    assert off.step_seconds == pytest.approx(on.step_seconds + on.communication_hidden_seconds)


def test_host_costs_are_the_h200_profiles():
    # zerokit/data/gpu_host.json copies the measured figures of bench/results/h200_profile_20261126.json
    host = json.loads(bundled_data("gpu_host.json").read_text())
    profile = json.loads((REPO / host["source"]).read_text())
    coef = profile["compute_timing"]["gated"]["bf16"]["coef"]
    assert host["compute"]["bf16"] == {k: coef[k] for k in ("micro", "layer", "recompute")}
    for precision, fits in host["engine_overhead"]["by_precision"].items():
        for stage, fit in fits.items():
            measured = profile["engine_overhead"]["by_precision"][precision][stage]
            assert fit == {k: v for k, v in measured.items() if not k.endswith("runs")}


def test_host_costs_grow_with_depth_and_zero3():
    cluster = Cluster(accelerator=accelerator("h100-80gb"), gpus_per_node=8)
    w = Workload(seq_len=1024)
    shallow = estimate_time(replace(LLAMA3_8B, num_layers=8), cluster, ZeroSetup(zero_stage=3), w)
    deep = estimate_time(LLAMA3_8B, cluster, ZeroSetup(zero_stage=3), w)
    z2 = estimate_time(LLAMA3_8B, cluster, ZeroSetup(zero_stage=2), w)
    assert 0 < shallow.host_seconds < deep.host_seconds
    assert deep.host_seconds > z2.host_seconds  # ZeRO-3's hooks on every module


def test_every_gpu_plan_has_a_range_around_its_step():
    ranges = json.loads(bundled_data("time_range.json").read_text())
    for gpu in ("a100-80gb", "h100-80gb", "v100-32gb", "mi300x"):
        cluster = Cluster(accelerator=accelerator(gpu), gpus_per_node=8)
        precision = "fp16" if gpu.startswith("v100") else "bf16"
        t = estimate_time(LLAMA3_8B, cluster, ZeroSetup(zero_stage=3, precision=precision),
                          Workload(seq_len=2048, samples=1000))
        assert t.step_seconds_low == pytest.approx(t.step_seconds / ranges["catalog_gpu"]["ratio_high"])
        assert t.step_seconds_high == pytest.approx(t.step_seconds / ranges["catalog_gpu"]["ratio_low"])
        assert t.step_seconds_low < t.step_seconds < t.step_seconds_high
        assert t.total_seconds_low == pytest.approx(t.steps * t.step_seconds_low)
        assert "held-out published runs" in t.range_basis
    # the catalog's rough CPU figures were never checked: no range
    cpu = estimate_time(LLAMA3_8B, Cluster(accelerator=accelerator("cpu"), gpus_per_node=2), ZeroSetup(precision="fp32"),
                        Workload(seq_len=64))
    assert cpu.step_seconds_low is None and cpu.range_basis is None


def test_the_links_are_the_users(capsys, tmp_path):
    # the same two-node ZeRO-3 plan over the catalog's 25 GB/s per A100 and over AWS p4d's 400 Gb/s EFA for 8 GPUs
    from zerokit.cli import main

    base = ["plan", "llama-3-8b", "--gpu", "a100-80gb", "--gpus-per-node", "8", "--nodes", "2", "--stage", "3",
            "--micro-batch", "1", "--grad-accum", "1", "--activation-checkpointing", "off", "--json"]
    assert main(base) in (0, 1)
    catalog = json.loads(capsys.readouterr().out)
    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text("inter-node-bandwidth: 6.25\n")
    assert main([*base, "-c", str(run_yaml)]) in (0, 1)
    efa = json.loads(capsys.readouterr().out)
    assert efa["hardware"]["accelerator"]["inter_node_bw"] == 6.25
    assert catalog["hardware"]["accelerator"]["inter_node_bw"] == 25
    # a ring over 2 nodes of 8 carries 1/15 of its bytes through each GPU's NIC (timing.ring_node_share): 6.25 x 15
    assert efa["time"]["link_gbps"] == pytest.approx(93.75) and efa["time"]["step_seconds"] > catalog["time"]["step_seconds"]
    assert main([*base[:-1], "--intra-node-bandwidth", "25"]) in (0, 1)
    assert "links     25 GB/s per GPU within a node, 25 GB/s per GPU between nodes" in capsys.readouterr().out
