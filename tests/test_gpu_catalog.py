"""The GPU catalog (zerokit/data/gpus.json), entry by entry: every figure there and sane, a source on each, the
precision flags agreeing with the figures, names that resolve, a plan that runs, and where a public source gives a
number (an nvidia-smi or rocm-smi line, a datasheet's sparsity figure, a measured matmul) the catalog agrees with it.

nvidia-smi cannot exist on this machine: --gpu auto is tested with a stand-in script on PATH that prints what
`nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits` prints on such a node.
"""

from __future__ import annotations

import json
import re
import stat

import pytest

from zerokit.cli import main
from zerokit.core.resources import bundled_data
from zerokit.core.units import GiB, MiB
from zerokit.spec.hardware import catalog, detect_accelerator, resolve_gpu_name

RAW = {k: v for k, v in json.loads(bundled_data("gpus.json").read_text()).items() if not k.startswith("_")}
ENTRIES = list(RAW)
GPUS = [k for k in ENTRIES if not RAW[k].get("is_cpu")]
NUMBERS = ("memory_mib", "bf16_tflops", "fp16_tflops", "fp32_tflops", "intra_node_bw", "inter_node_bw", "pcie_bw")
# the GPU time model's figures (estimate/gpu_time.py): every GPU has them; the CPU entry keeps a flat efficiency
KERNEL_FIGURES = ("hbm_gbps", "matmul_fraction", "attention_fraction")

# nvidia-smi / rocm-smi memory.total as published for the part (MiB), where it was found pasted in public.
PUBLISHED_MIB = {
    # https://github.com/modal-labs/modal-client/pull/2797: "H100: 81559MiB, A100 80GB: 81920MiB, A100 40GB:
    # 40960MiB, A10: 23028MiB, L40S: 46068MiB, L4: 23034MiB, T4: 15360MiB"
    "h100-80gb": 81559, "a100-80gb": 81920, "a100-40gb": 40960, "a10": 23028, "l40s": 46068, "l4": 23034,
    "t4": 15360,
    "a40": 46068,  # "NVIDIA A40 ... 31365MiB / 46068MiB": https://github.com/chatdoc-com/OCRFlux/issues/64
    "h20": 97871,  # "NVIDIA H20 ... 0MiB / 97871MiB": https://github.com/NVIDIA/nvtrust/issues/128
    "b200": 183359,  # "NVIDIA B200 ... 166593MiB / 183359MiB": https://github.com/NVIDIA/TensorRT-LLM/issues/10278
    "rtx4090": 24564,  # "NVIDIA GeForce RTX 4090 ... 507MiB / 24564MiB": https://github.com/RLinf/RLinf/issues/255
    # rocm-smi "VRAM Total Memory (B): 206141652992": https://github.com/ROCm/legacy-rocm-build/issues/4750
    "mi300x": 206141652992 // MiB,
    # rocminfo "Size: 67092480(0x3ffc000) KB", one GCD: https://github.com/ROCm/rocm_smi_lib/issues/160
    "mi250x": 67092480 // 1024,
}

# Datasheets quote tensor peaks as "dense | with sparsity" or only with sparsity; the catalog holds dense = half.
SPARSE_TFLOPS = {
    "h100-80gb": 1979,  # NVIDIA H100 datasheet, SXM: BF16 Tensor Core 1,979 teraFLOPS*, *with sparsity
    "gh200-96gb": 1979, "gh200-144gb": 1979,  # the same H100 (NVIDIA GH200 datasheet)
    "l4": 242,  # NVIDIA L4 datasheet: BF16 Tensor Core 242 teraFLOPS*
    "a10": 250,  # NVIDIA A10 datasheet: BF16 Tensor Core 125 | 250 TF*
    "a40": 299.4,  # NVIDIA A40 datasheet: Peak BF16 Tensor TFLOPS with FP32 Accumulate 149.7 | 299.4*
    "rtx-a6000": 309.7,  # NVIDIA RTX A6000 datasheet: Tensor Performance 309.7 TFLOPS (with sparsity)
    "l40": 362.1,  # NVIDIA L40 datasheet: BF16 Tensor Core 181.05 | 362.1*
    "rtx6000-ada": 728.4,  # NVIDIA Ada architecture whitepaper, RTX 6000: FP16 with FP32 accumulate 364.2/728.4
    "b200": 4500,  # NVIDIA HGX B200 datasheet: FP16/BF16 Tensor Core 36 PFLOPS* for 8 GPUs
    "mi300x": 2614.9,  # AMD Instinct MI300X data sheet: Peak BF16 1307.4 TFLOPs, 2614.9 with structured sparsity
}

# A measured bf16 matmul can only come under the peak (and a sane peak is not far above it).
MEASURED_BF16_TFLOPS = {
    "h20": 142.25,  # 10240^3 bf16 matmul, torch 2.7: https://github.com/zzc0721/torch-performance-test-data/issues/77
}


def _sized(key: str) -> int | None:
    m = re.search(r"-(\d+)gb$", key)
    return int(m.group(1)) if m else None


@pytest.mark.parametrize("key", ENTRIES)
def test_every_figure_is_there_and_sane(key):
    d = RAW[key]
    for field in NUMBERS:
        v = d[field]
        assert isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0, (field, v)
    assert isinstance(d["memory_mib"], int) and d["memory_mib"] > 0
    assert d["fp32_tflops"] > 0 and d["intra_node_bw"] > 0 and d["inter_node_bw"] > 0
    if d.get("is_cpu"):
        assert 0 < d["efficiency"] <= 1 and not any(k in d for k in KERNEL_FIGURES)
    else:
        assert "efficiency" not in d and d["hbm_gbps"] > 0
        assert 0 < d["attention_fraction"] <= d["matmul_fraction"] <= 1  # no attention kernel beats a plain matmul
        # FlashAttention-3 is written for Hopper (sm90): its rate only there, and faster than FlashAttention-2's
        hopper = any(f" {part}" in d["names"][0] for part in ("H100", "H200", "H20", "GH200"))
        assert ("flash3_fraction" in d) == hopper
        if hopper:
            assert d["attention_fraction"] < d["flash3_fraction"] <= d["matmul_fraction"]
        assert catalog()[key].prices_kernels
    assert d["pcie_bw"] > 0 or d.get("is_cpu")  # the CPU has no host<->device copies


@pytest.mark.parametrize("key", ENTRIES)
def test_precision_flags_agree_with_the_figures(key):
    d = RAW[key]
    for precision in ("bf16", "fp16"):
        assert isinstance(d[precision], bool)
        assert d[precision] == (d[f"{precision}_tflops"] > 0), precision
    if not d.get("is_cpu"):  # tensor cores beat the FP32 units on every GPU here: a swapped field shows
        assert max(d["bf16_tflops"], d["fp16_tflops"]) > d["fp32_tflops"]


@pytest.mark.parametrize("key", ENTRIES)
def test_every_entry_names_its_sources(key):
    source = RAW[key]["source"].strip()
    assert source
    if key in GPUS:
        assert re.search(r"datasheet|data sheet|whitepaper|specifications|product brief", source, re.I), source


@pytest.mark.parametrize("key", ENTRIES)
def test_its_names_resolve_to_it(key):
    acc = catalog()[key]
    assert resolve_gpu_name(key) == (key, None)
    if key in GPUS:
        assert acc.names, "a GPU entry lists what nvidia-smi / rocm-smi print for it"
    for name in acc.names:
        assert resolve_gpu_name(name) == (key, None), name


NVIDIA = [k for k in GPUS if not RAW[k]["names"][0].startswith("AMD ")]  # --gpu auto reads nvidia-smi only


@pytest.mark.parametrize("key", NVIDIA)
def test_gpu_auto_takes_it_from_its_nvidia_smi_line(key, tmp_path, monkeypatch):
    name, mib = RAW[key]["names"][0], RAW[key]["memory_mib"]
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\ncase \"$*\" in *name,memory.total*) ;; *) exit 9 ;; esac\n"
                      + f"echo '{name}, {mib}'\n" * 8)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    acc, count = detect_accelerator()
    assert (acc.name, count, acc.memory_bytes) == (key, 8, mib * MiB)


@pytest.mark.parametrize("key", [k for k in ENTRIES if _sized(k)])
def test_memory_fits_the_size_in_its_name(key):
    # Vendors' "80GB" of HBM is 80 GiB of stacks; the driver keeps a few percent (H100: 81559 of 81920 MiB).
    gib = RAW[key]["memory_mib"] * MiB / GiB
    assert 0.95 * _sized(key) <= gib <= _sized(key)


def test_mi250x_is_one_gcd_not_the_card():
    # AMD Instinct MI250X data sheet: 128 GB HBM2e per card of two GCDs; torch and rocm-smi list each GCD.
    gib = catalog()["mi250x"].memory_bytes / GiB
    assert 0.95 * 64 <= gib <= 64


@pytest.mark.parametrize("key", list(PUBLISHED_MIB))
def test_memory_is_what_the_driver_reports(key):
    assert RAW[key]["memory_mib"] == PUBLISHED_MIB[key]


@pytest.mark.parametrize("key", list(SPARSE_TFLOPS))
def test_tensor_peaks_are_dense(key):
    assert RAW[key]["bf16_tflops"] == pytest.approx(SPARSE_TFLOPS[key] / 2, rel=1e-3)


@pytest.mark.parametrize("key", list(MEASURED_BF16_TFLOPS))
def test_a_measured_matmul_stays_under_the_peak(key):
    assert 0.5 < MEASURED_BF16_TFLOPS[key] / RAW[key]["bf16_tflops"] <= 1


def _plan(capsys, *args):
    rc = main(["plan", "--params", "7e9", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("key", ENTRIES)
def test_a_plan_runs_on_it(key, capsys):
    rc, out, err = _plan(capsys, "--gpu", key, "--json")
    assert rc in (0, 1), err
    plan = json.loads(out)
    acc = catalog()[key]
    assert plan["hardware"]["accelerator"]["name"] == key
    assert plan["hardware"]["accelerator"]["memory_bytes"] == acc.memory_bytes
    assert plan["choice"]["precision"] in acc.precisions


# bf16 tensor cores start at Ampere (sm_80; torch.cuda.is_bf16_supported(including_emulation=False) is
# `major >= 8`): Turing's T4 and Volta's V100s have fp16 only. Named here, not read from the catalog under test.
NO_BF16 = ["t4", "v100-16gb", "v100-32gb"]


@pytest.mark.parametrize("key", NO_BF16)
def test_without_bf16_the_planner_picks_fp16(key, capsys):
    rc, out, err = _plan(capsys, "--gpu", key, "--json")
    assert rc == 0, err
    plan = json.loads(out)
    assert plan["choice"]["precision"] == "fp16"
    assert plan["ds_config"]["fp16"]["enabled"] is True and not plan["ds_config"].get("bf16", {}).get("enabled")
    assert all(r["setup"]["precision"] != "bf16" for r in plan["rejected"])  # bf16 was never a candidate
    rc, out, err = _plan(capsys, "--gpu", key, "--precision", "bf16")
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and f"bf16 is not supported on {key}: use --precision fp16" in lines[0], err
