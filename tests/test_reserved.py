"""What nvidia-smi will show (zerokit/estimate/reserved.py), beside the allocated peak the fit is judged on.

No GPU was available: the figure is derived from sources, and the oracles below are published measurements
(cited at each) that its ranges must contain, plus torch's own allocator constants read from the installed
headers.
"""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from zerokit.core.units import GiB, MiB
from zerokit.estimate.memory import estimate_memory
from zerokit.estimate.reserved import ROUNDING_BYTES_PER_TENSOR
from zerokit.planning.planner import evaluate
from zerokit.report.plan_text import format_memory
from zerokit.report.run_report import build_report, prediction_from_evaluation
from zerokit.spec.hardware import Cluster, accelerator
from zerokit.spec.model import spec_from_params
from zerokit.spec.setup import Workload, ZeroSetup

REPO = Path(__file__).resolve().parent.parent
MODEL = spec_from_params(7e9)
A100x4 = Cluster(accelerator=accelerator("a100-80gb"), gpus_per_node=4, nodes=1)
WORK = Workload(seq_len=2048)
TERMS = ("allocated_peak_bytes", "cuda_context_bytes", "nccl_buffers_bytes", "allocator_rounding_bytes",
         "zero3_churn_reserve_bytes")


def smi(stage=3, cluster=A100x4, **kw):
    setup = ZeroSetup(zero_stage=stage, precision="bf16", micro_batch_size=1, **kw)
    return estimate_memory(MODEL, cluster, setup, WORK)


def test_terms_are_named_ordered_and_sum():
    mem = smi()
    r = mem.nvidia_smi
    for terms in (r.terms, r.low_terms, r.high_terms):
        assert tuple(terms) == TERMS
    assert r.nvidia_smi_bytes == sum(r.terms.values())
    assert r.low_bytes <= r.nvidia_smi_bytes <= r.high_bytes
    for k in TERMS:
        assert r.low_terms[k] <= r.terms[k] <= r.high_terms[k], k
    # the allocated part is the fit's peak without the fit's own context allowance (the estimate has its own)
    assert r.terms["allocated_peak_bytes"] == mem.per_gpu_total - mem.per_gpu["cuda_context"]
    # what max_memory_reserved should show: nvidia-smi less the context and NCCL's buffers
    assert r.allocator_reserved() == r.nvidia_smi_bytes - r.terms["cuda_context_bytes"] - r.terms["nccl_buffers_bytes"]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero3_churn_only_at_stage_3(stage):
    churn = smi(stage).nvidia_smi.terms["zero3_churn_reserve_bytes"]
    assert (churn > 0) == (stage == 3)


def test_one_gpu_has_no_nccl_buffers():
    one = Cluster(accelerator=accelerator("a100-80gb"), gpus_per_node=1)
    assert smi(3, one).nvidia_smi.high_terms["nccl_buffers_bytes"] == 0
    assert smi(3).nvidia_smi.low_terms["nccl_buffers_bytes"] > 0


def test_cpu_accelerator_has_no_nvidia_smi_figure():
    cpu = Cluster(accelerator=accelerator("cpu"), gpus_per_node=2, cpu_memory_bytes=64 * GiB)
    mem = smi(2, cpu)
    assert mem.nvidia_smi is None
    assert not any(k.startswith("nvidia_smi") for k in mem.to_dict()["per_gpu"])
    assert not any("nvidia-smi" in line for line in format_memory(mem, evaluate(MODEL, cpu, WORK, ZeroSetup(
        zero_stage=2, precision="bf16", micro_batch_size=1)).budget, cpu))


def test_cuda_context_range_contains_pytorch_measurements():
    """PyTorch PR #86509 (https://github.com/pytorch/pytorch/pull/86509, torch 1.13 sets CUDA_MODULE_LOADING=LAZY):
    a CUDA context measured at 287,047,680 B with lazy module loading and 666,632,192 B without it."""
    r = smi().nvidia_smi
    for measured in (287_047_680, 666_632_192):
        assert r.low_terms["cuda_context_bytes"] <= measured <= r.high_terms["cuda_context_bytes"]


def test_non_allocator_part_of_a_zero3_offload_7b_run_on_4_gpus():
    """DeepSpeed issue #4527 (https://github.com/deepspeedai/DeepSpeed/issues/4527): a 6805M-parameter model,
    ZeRO-3 with parameter and optimizer CPU offload, 1 node x 4 GPUs. After deepspeed.initialize nvidia-smi showed
    14678 MiB while DeepSpeed's see_memory_usage printed CA 13.01 GB (torch.cuda.memory_reserved / 1024**3, two
    decimals): the rest, 14678 MiB - 13.01(+-0.005) GiB, is what the allocator does not hold, i.e. the CUDA context
    and NCCL's buffers. zerokit's range for those two terms must contain it."""
    model = spec_from_params(6_805_000_000)
    setup = ZeroSetup(zero_stage=3, offload_optimizer="cpu", offload_param="cpu", precision="fp16", micro_batch_size=1)
    r = estimate_memory(model, A100x4, setup, WORK).nvidia_smi
    low = r.low_terms["cuda_context_bytes"] + r.low_terms["nccl_buffers_bytes"]
    high = r.high_terms["cuda_context_bytes"] + r.high_terms["nccl_buffers_bytes"]
    outside_allocator = (14678 * MiB - int(13.015 * GiB), 14678 * MiB - int(13.005 * GiB))
    assert low <= outside_allocator[0] and outside_allocator[1] <= high


def test_rounding_bound_is_torchs_large_allocation_rounding():
    """The per-tensor bound is kRoundLarge, read from the installed torch's c10/core/AllocatorConfig.h."""
    torch_dir = Path(importlib.util.find_spec("torch").origin).parent
    header = (torch_dir / "include" / "c10" / "core" / "AllocatorConfig.h").read_text()
    round_large = int(re.search(r"kRoundLarge = (\d+);", header).group(1))
    assert ROUNDING_BYTES_PER_TENSOR[2] == round_large
    assert ROUNDING_BYTES_PER_TENSOR[0] == round_large // 2  # a uniform remainder averages half the block


def test_fit_is_judged_on_the_allocated_peak_not_on_nvidia_smi():
    setup = ZeroSetup(zero_stage=3, precision="bf16", micro_batch_size=1)
    mem = estimate_memory(MODEL, A100x4, setup, WORK)
    # a budget between the allocated peak and the nvidia-smi figure: the fit holds
    fraction = (mem.per_gpu_total + mem.nvidia_smi.nvidia_smi_bytes) / 2 / A100x4.accelerator.memory_bytes
    assert mem.per_gpu_total < fraction * A100x4.accelerator.memory_bytes < mem.nvidia_smi.nvidia_smi_bytes
    assert evaluate(MODEL, A100x4, WORK, setup, memory_fraction=fraction).fits


def test_figure_follows_a_refined_allocated_peak():
    mem = smi()
    before = mem.nvidia_smi
    mem.per_gpu["activations"] += 1 * GiB  # as refine.apply_activation_trace replaces terms after the estimate
    after = mem.nvidia_smi
    assert after.nvidia_smi_bytes - before.nvidia_smi_bytes == 1 * GiB
    assert after.high_bytes - before.high_bytes == 1 * GiB


def test_plan_json_and_text_carry_both_figures():
    base = [sys.executable, "-m", "zerokit", "plan", "--params", "7e9", "--gpu", "a100-80gb", "--gpus-per-node", "4",
            "--stage", "3"]
    js = subprocess.run(base + ["--json"], capture_output=True, text=True, cwd=REPO)
    assert js.returncode == 0, js.stderr
    per_gpu = json.loads(js.stdout)["memory"]["per_gpu"]
    assert per_gpu["nvidia_smi_low_bytes"] <= per_gpu["nvidia_smi_bytes"] <= per_gpu["nvidia_smi_high_bytes"]
    assert set(per_gpu["nvidia_smi_terms"]) == set(TERMS)
    assert per_gpu["nvidia_smi_bytes"] == sum(per_gpu["nvidia_smi_terms"].values())
    assert per_gpu["nvidia_smi_terms"]["allocated_peak_bytes"] == per_gpu["total_bytes"] - per_gpu["terms"]["cuda_context"]
    text = subprocess.run(base, capture_output=True, text=True, cwd=REPO)
    assert text.returncode == 0, text.stderr
    assert "allocated peak (what the fit is judged on)" in text.stdout
    assert "nvidia-smi will show about" in text.stdout and "not measured" in text.stdout


def test_run_report_compares_reserved_on_cuda_only():
    setup = ZeroSetup(zero_stage=3, precision="bf16", micro_batch_size=1)
    pred = prediction_from_evaluation(evaluate(MODEL, A100x4, WORK, setup), steps=5)
    assert pred["allocator_reserved_bytes"] == estimate_memory(MODEL, A100x4, setup, WORK).nvidia_smi.allocator_reserved()
    cuda = {"ranks": {0: {"peak_memory_bytes": 10, "peak_reserved_bytes": 30}, 1: {"peak_memory_bytes": 11,
                                                                                  "peak_reserved_bytes": 40}}}
    row = [r for r in build_report(pred, cuda)["rows"] if r["name"].startswith("allocator reserved")]
    assert len(row) == 1 and row[0]["measured"] == 40 and row[0]["predicted"] == pred["allocator_reserved_bytes"]
    cpu = {"ranks": {0: {"peak_memory_bytes": 10, "peak_reserved_bytes": None}}}
    assert not [r for r in build_report(pred, cpu)["rows"] if r["name"].startswith("allocator reserved")]
