"""Oracles from real GPU runs: the one-GPU accuracy rows measured on an H200 (bench/results/accuracy_h200.json,
`python bench/accuracy/run.py --one-gpu`, torch 2.11, CUDA 13.0, DeepSpeed 0.19.8), re-predicted here by the harness's
own predict(). What they pin: the allocated peak on CUDA (grouped-head fp32 attention on torch's math kernel, one-rank
ZeRO-3 without gathered copies, the cuBLAS workspace), the CUDA context outside torch's allocator, and the run report
reading a real CUDA metrics file."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "accuracy_h200.json"
sys.path.insert(0, str(REPO / "bench" / "accuracy"))

import run as harness  # bench/accuracy/run.py


def _measured_jobs() -> list[dict]:
    data = json.loads(RESULTS.read_text())
    assert data["device"] == "cuda" and "H200" in data["machine"]
    return [j for j in data["jobs"] if j["measured"]]


def _cluster():
    return harness.make_cluster("cuda", 1, None, 143771, None, "NVIDIA H200")


def test_allocated_peak_on_an_h200_meets_the_grids_targets():
    """The issue's targets for the accuracy grid (peak memory median <= 3%, max <= 8%), against torch's
    max_memory_allocated on the H200, for every measured row (8: ZeRO-0..3, bf16 and fp32, checkpointing, LoRA, Llama
    and GPT-2). Before the GPU rules the fp32 row (Llama 16/4 heads) was 27% under and the one-rank ZeRO-3 rows 3-9%
    over."""
    cluster = _cluster()
    errs = {}
    for j in _measured_jobs():
        job = harness.Job(**j["job"])
        cfg = harness.render(job, cluster, 12)
        pred = harness.predict(job, cluster, cfg)["per_rank_bytes"]
        meas = j["measured"]["0"]["peak_bytes"]
        errs[job.name] = (pred - meas) / meas
    assert len(errs) == 8
    assert statistics.median(abs(e) for e in errs.values()) <= 0.03, errs
    assert max(abs(e) for e in errs.values()) <= 0.08, errs


def test_one_rank_zero3_holds_no_gathered_copy():
    """Measured on the H200 (same model, micro batch, sequence): ZeRO-3 peaked one gradient partition (the 16-bit
    model, 469 MiB) above ZeRO-0, not two: at one rank NoGatherHandle points param.data at the partition."""
    by_name = {j["name"]: j["measured"]["0"]["peak_bytes"] for j in _measured_jobs()}
    z0, z3 = by_name["gpu-llama_z0_bf16_mb4_s2048_r1"], by_name["gpu-llama_z3_bf16_mb4_s2048_r1"]
    from zerokit.spec.model import load_model_spec

    sixteen_bit = 2 * load_model_spec(harness.MODELS["gpu-llama"]).params
    assert abs((z3 - z0) - sixteen_bit) < 0.01 * sixteen_bit
    from zerokit.estimate.memory import estimate_memory
    from zerokit.spec.setup import Workload, ZeroSetup

    est = estimate_memory(load_model_spec(harness.MODELS["gpu-llama"]), _cluster(),
                          ZeroSetup(zero_stage=3, precision="bf16", micro_batch_size=4), Workload(seq_len=2048))
    assert est.phase_terms["backward"].get("stage3_live_params", 0) == 0


def _repredicted(paths, cluster):
    """(job, rank 0's measurement, the harness's prediction now) for every measured job of these H200 result files."""
    for path in paths:
        data = json.loads(path.read_text())
        assert data["device"] == "cuda" and "H200" in data["machine"]
        for j in (j for j in data["jobs"] if j["measured"]):
            job = harness.Job(**j["job"])
            yield job, j["measured"]["0"], harness.predict(job, cluster, harness.render(job, cluster, data["steps"]))


# bench/gpu_lend.sh's runs on H200s: the first lend, the second's three other rows (its repeat, _0557, ran the same),
# and the third's ZeRO-3 rows at 2K and 8K tokens (its 16K row measured the second's to the byte)
LEND_RESULTS = [REPO / "bench" / "results" / f"accuracy_gpu_lend_{t}.json"
                for t in ("20261127_0251", "20261127_0546", "20261128_1821")]


def test_the_lend_rows_and_the_zero2_step_peak():
    """bench/gpu_lend.sh on H200s (2026-11-27): 1B and 3B Llama shapes, one rank, ZeRO-0 to 3, 2K-16K tokens. The 3B
    ZeRO-2 bf16 row peaks in the optimizer step, at stage_1_and_2.py step()'s cast of the flattened 16-bit gradient
    partition to fp32 while the gradients it copied are alive: 8 bytes per parameter beside the weights and Adam's
    state, where the in-step fp32 partition alone (what the CPU rows with torch AdamW's temporaries peak at) is 4.
    Before that rule the row was 18% under; every row within 1% of torch's max_memory_allocated now (the second lend's
    rows, ZeRO-1, ZeRO-3 and 16K tokens, were measured after the rule and checked against it unchanged). ZeRO-3 does the
    same per sub-group (stage3.py _prepare_fp32_grad_for_sub_group): the third lend's 2K and 8K rows, which peak in the
    step, were 7% under without the sub-group's flat 16-bit copy and are 1.5% over with it (zerokit counts the largest
    sub-group DeepSpeed can make)."""
    cluster = _cluster()
    errs, phases = {}, {}
    for job, measured, pred in _repredicted(LEND_RESULTS, cluster):
        meas = measured["peak_bytes"]
        errs[job.name] = (pred["per_rank_bytes"] - meas) / meas
        phases[job.name] = measured["peak_phase"]
    assert len(errs) == 8 and max(abs(e) for e in errs.values()) <= 0.015, errs
    assert phases["gpu-3b_z2_bf16_mb2_s2048_ckpt_r1"] == phases["gpu-1b_z3_bf16_mb1_s2048_ckpt_r1"] == "step"
    from zerokit.estimate.memory import estimate_memory
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.setup import Workload, ZeroSetup

    model = load_model_spec(harness.MODELS["gpu-3b"])
    est = estimate_memory(model, cluster, ZeroSetup(zero_stage=2, precision="bf16", micro_batch_size=2,
                                                    activation_checkpointing=True), Workload(seq_len=2048))
    step = est.phase_terms["step"]
    assert est.peak_phase == "step"
    assert step["gradients"] == step["gradient_flat_copy"] == 2 * model.trainable
    assert step["fp32_gradients"] == 4 * model.trainable


def test_the_context_range_holds_what_the_h200_showed():
    """cudaMemGetInfo's used memory less torch's reserve at step ends (outside_allocator_bytes): 1,311-1,717 MiB on the
    H200; zerokit's context range (estimate/reserved.py, one rank: no NCCL peers) must hold every job's figure, and
    its central value must be within 20% of each."""
    from zerokit.estimate.reserved import CUDA_CONTEXT_BYTES

    central, low, high = CUDA_CONTEXT_BYTES
    outside = [j["measured"]["0"]["outside_allocator_bytes"] for j in _measured_jobs()]
    assert len(outside) == 8 and all(low <= b <= high for b in outside), outside
    assert all(abs(central - b) / b <= 0.20 for b in outside), outside


def test_the_run_report_reads_a_real_cuda_metrics_file():
    """tests/data/h200_run: the metrics of gpu-llama ZeRO-0 bf16 (micro batch 4, seq 2048) as the H200 rank wrote them.
    The report compares the allocated peak without the fit's context allowance, the allocator's reserve, nvidia-smi's
    figure and the part outside torch's allocator, each with what the rank measured."""
    from zerokit.planning.planner import evaluate
    from zerokit.report import run_report as zreport
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.setup import Workload, ZeroSetup

    measured = zreport.summarize_metrics(zreport.read_metrics(REPO / "tests" / "data" / "h200_run"))
    rank = measured["ranks"][0]
    assert measured["memory_method"] == "cuda_max_allocated"
    assert rank["device_used_bytes"] > rank["peak_reserved_bytes"] > rank["peak_memory_bytes"]
    assert rank["outside_allocator_bytes"] == pytest.approx(1715 * 2**20, rel=0.01)
    ev = evaluate(load_model_spec(harness.MODELS["gpu-llama"]), _cluster(), Workload(seq_len=2048),
                  ZeroSetup(zero_stage=0, precision="bf16", micro_batch_size=4))
    rep = zreport.build_report(zreport.prediction_from_evaluation(ev, 12), measured)
    rows = {r["name"]: r for r in rep["rows"]}
    peak = rows["peak memory per rank (max over ranks)"]
    assert peak["predicted"] == ev.memory.per_gpu_total - ev.memory.per_gpu["cuda_context"]
    assert peak["ratio"] == pytest.approx(1.0, abs=0.01)  # measured 12,426 MiB; predicted 12,392
    outside = rows["outside torch's allocator: CUDA context, NCCL (max over ranks)"]
    assert outside["ratio"] == pytest.approx(1715 / 1536, rel=0.01)
    assert rows["nvidia-smi used per GPU (max over ranks)"]["measured"] == rank["device_used_bytes"]
    assert rows["allocator reserved peak (max over ranks)"]["measured"] == rank["peak_reserved_bytes"]


# bench/gpu_lend.sh LEND_SET=long on an H200 (2026-11-28, issue 45): gpu-1b (22 layers, h 2048) at ZeRO-3 bf16 with
# checkpoint offload, tiled loss and tiled MLP, 32K-128K tokens at 4 steps, then 256K at 2, under DeepSpeed 0.19.8's
# stock CheckpointHiddenStatesOffload (before zerokit restored each input once: launching/ckpt_offload.py)
LONG_RESULTS = [REPO / "bench" / "results" / f"accuracy_gpu_long_20261128_{t}.json" for t in ("1816", "1826")]


def test_the_long_rows_backward_peak_is_the_plan_plus_the_inputs_deepspeed_kept():
    """Measured allocated peaks at 32K-256K tokens were 3-44% over the plan's, term by term:
    - DeepSpeed's unpack hook cached every restored layer input until its context exited, so at layer 0's recompute
      the other 21 inputs were back on the GPU, 20 more than the plan's 2, at tokens x h x 2 bytes each (zerokit's loop
      now restores each once: tests/test_ckpt_offload.py);
    - the plan missed the second norm's own backward under TiledMLP, after the MLP's and before attention's, with
      autograd's fp32 temporaries (memory.RMSNORM_BACKWARD_PEAK_BYTES, measured on CPU).
    The plan's recompute phase plus the cached inputs is now within 0-2% over the measured backward peak at every
    length, where without the norm's backward it was 3-10% under."""
    from zerokit.spec.model import load_model_spec

    errs = {}
    for job, measured, pred in _repredicted(LONG_RESULTS, _cluster()):
        model = load_model_spec(harness.MODELS[job.model])  # gpu-1b: 22 layers, h 2048
        cached = (model.num_layers - 2) * job.seq_len * model.hidden_size * 2  # bf16 inputs beyond the plan's 2
        recompute = pred["phases"]["backward_recompute"] - pred["nvidia_smi"]["nvidia_smi_terms"]["cuda_context_bytes"]
        meas = measured["phase_peaks"]["backward"]
        errs[job.seq_len] = (recompute + cached - meas) / meas
        assert (recompute - meas) / meas < -0.10  # DeepSpeed's cache: 11-32% under without it
    assert sorted(errs) == [32768, 65536, 131072, 262144], errs
    assert all(0 <= e <= 0.02 for e in errs.values()), errs
