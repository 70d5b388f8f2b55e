"""GPU names as people type them and as nvidia-smi and torch.cuda.get_device_name print them, for every catalog
entry; short names; unknown names with suggestions; --gpu auto from the local GPUs.

nvidia-smi cannot exist on this machine: --gpu auto is tested with a stand-in script on PATH that prints what
`nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits` prints on such a node (the strings below
are the ones NVIDIA's driver reports, which torch.cuda.get_device_name returns too).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from zerokit.core.errors import ZerokitError
from zerokit.spec.hardware import catalog, resolve_gpu_name

REPO = Path(__file__).resolve().parents[1]

# catalog key -> names users and tools write for it
NAMES = {
    "a100-40gb": ["NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB", "A100 40GB", "a100_40gb", "A100-40GB"],
    "a100-80gb": ["NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "a100 80gb", "A100-80GB"],
    "h100-80gb": ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "H100", "h100 80GB", "H100-80GB"],
    "h200": ["NVIDIA H200", "H200", "h-200"],
    "l40s": ["NVIDIA L40S", "L40S", "l40-s"],
    "a10g": ["NVIDIA A10G", "A10G"],
    "v100-16gb": ["Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB", "V100 16GB"],
    "v100-32gb": ["Tesla V100-SXM2-32GB", "V100-32GB", "v100 32gb"],
    "rtx3090": ["NVIDIA GeForce RTX 3090", "RTX 3090", "rtx-3090"],
    "rtx4090": ["NVIDIA GeForce RTX 4090", "RTX 4090", "rtx-4090", "GeForce RTX 4090"],
    "t4": ["Tesla T4", "T4", "NVIDIA T4"],
    "l4": ["NVIDIA L4", "L4"],
    "a10": ["NVIDIA A10", "A10"],
    "a40": ["NVIDIA A40", "A40"],
    "rtx-a6000": ["NVIDIA RTX A6000", "RTX A6000", "A6000", "rtxa6000"],
    "l40": ["NVIDIA L40", "L40"],
    "rtx6000-ada": ["NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada", "rtx6000ada"],
    "h20": ["NVIDIA H20", "H20"],
    # nvidia-smi names the 96 GB GH200 by its CPU's memory (480GB or 120GB LPDDR5X)
    "gh200-96gb": ["NVIDIA GH200 480GB", "NVIDIA GH200 120GB", "GH200 96GB"],
    "gh200-144gb": ["NVIDIA GH200 144G HBM3e", "GH200 144GB"],
    "b200": ["NVIDIA B200", "B200"],
    # torch.cuda.get_device_name on ROCm: the rocminfo marketing name
    "mi250x": ["AMD Instinct MI250X", "AMD Instinct MI250X/MI250", "MI250X"],
    "mi300x": ["AMD Instinct MI300X", "MI300X", "mi-300x"],
    "cpu": ["cpu", "CPU", " Cpu "],
}
CASES = [(key, name) for key, names in NAMES.items() for name in [key, *names]]


def test_every_catalog_entry_has_names():
    assert set(NAMES) == set(catalog())


@pytest.mark.parametrize("key,name", CASES, ids=[f"{k}<-{n.strip()}" for k, n in CASES])
def test_names_resolve_to_the_entry(key, name):
    assert resolve_gpu_name(name) == (key, None)


@pytest.mark.parametrize("name,key,others", [("A100", "a100-80gb", "a100-40gb"), ("v100", "v100-32gb", "v100-16gb"),
                                             ("Tesla V100", "v100-32gb", "v100-16gb"),
                                             ("GH200", "gh200-144gb", "gh200-96gb")])
def test_a_family_without_its_size_takes_the_largest_with_a_note(name, key, others):
    got, note = resolve_gpu_name(name)
    assert got == key and others in note and "\n" not in note


@pytest.mark.parametrize("name,suggested", [("h1000", "h100-80gb"), ("a30", "a40"), ("rtx-4080", "rtx4090"),
                                            ("NVIDIA H100 NVL", None)])
def test_unknown_names_suggest_the_closest(name, suggested):
    with pytest.raises(ZerokitError) as e:
        resolve_gpu_name(name)
    msg = str(e.value)
    assert "unknown GPU" in msg and "--gpu-memory" in msg and "\n" not in msg
    if suggested:
        assert f"did you mean {suggested}" in msg


def _fake_smi(tmp_path: Path, lines: list[str]) -> Path:
    """A directory holding an `nvidia-smi` that prints `lines` for the query zerokit makes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    body = "\n".join(f"echo '{line}'" for line in lines)
    script.write_text(f"#!/bin/sh\ncase \"$*\" in *name,memory.total*) ;; *) exit 9 ;; esac\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def _plan(args, path_dir: Path, tmp_path: Path):
    env = dict(os.environ, PATH=f"{path_dir}{os.pathsep}/usr/bin:/bin", PYTHONPATH=str(REPO),
               ZEROKIT_CACHE_DIR=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, "-m", "zerokit", "plan", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_gpu_auto_reads_the_local_gpus(tmp_path):
    smi = _fake_smi(tmp_path, ["NVIDIA A100-SXM4-80GB, 81920"] * 8)
    r = _plan(["--params", "7e9", "--gpu", "auto", "--json"], smi, tmp_path)
    assert r.returncode in (0, 1), r.stderr
    cluster = json.loads(r.stdout)["hardware"]
    assert cluster["gpus_per_node"] == 8 and cluster["accelerator"]["name"] == "a100-80gb"
    assert cluster["accelerator"]["memory_bytes"] == 81920 * 2**20
    assert cluster["accelerator"]["detected"] == "8 x NVIDIA A100-SXM4-80GB, 81920 MiB (nvidia-smi)"
    text = _plan(["--params", "7e9", "--gpu", "auto", "--gpus-per-node", "4"], smi, tmp_path)
    assert "4 a100-80gb" in text.stdout and "[--gpu auto: 8 x NVIDIA A100-SXM4-80GB" in text.stdout, text.stdout


@pytest.mark.parametrize("lines,needle", [
    ([], "found no NVIDIA GPU"),
    (["NVIDIA H100 80GB HBM3, 81559", "NVIDIA A100-SXM4-80GB, 81920"], "different GPUs"),
    (["NVIDIA B300, 288000"], "--gpu-memory 288000MiB"),
], ids=["none", "mixed", "not-in-catalog"])
def test_gpu_auto_refusals_are_one_line(tmp_path, lines, needle):
    smi = _fake_smi(tmp_path, lines)
    r = _plan(["--params", "7e9", "--gpu", "auto"], smi, tmp_path)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and needle in err[0], r.stderr


def test_gpu_auto_without_nvidia_smi(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = _plan(["--params", "7e9", "--gpu", "auto"], empty, tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--gpu NAME" in r.stderr and "--gpu-memory" in r.stderr


def test_a_short_name_notes_its_choice_on_stderr(tmp_path):
    r = _plan(["--params", "7e9", "--gpu", "A100"], tmp_path, tmp_path)
    assert r.returncode in (0, 1) and r.stderr.startswith("note: --gpu A100: planning for a100-80gb"), r.stderr
    assert "a100-80gb" in r.stdout


@pytest.mark.parametrize("line,name", [("NVIDIA H200, 143771", "h200"), ("NVIDIA B300, 288000", "custom")],
                         ids=["in-catalog", "not-in-catalog"])
def test_launch_without_gpu_prices_the_local_gpus_kind(tmp_path, monkeypatch, line, name):
    """`zerokit launch` with no --gpu on a GPU machine: the GPU's catalog entry (its TFLOP/s and links) when nvidia-smi
    names one the catalog knows, else only its memory. Before, an H200 was priced on the default's (A100) 312 bf16
    TFLOP/s instead of its 989."""
    from zerokit.launching.prepare import LaunchRequest, resolve_cluster

    monkeypatch.setenv("PATH", f"{_fake_smi(tmp_path, [line])}{os.pathsep}/usr/bin:/bin")
    monkeypatch.setenv("ZEROKIT_CACHE_DIR", str(tmp_path / "cache"))
    cluster, _, _ = resolve_cluster(LaunchRequest(model="tiny-llama"))
    mib = int(line.rsplit(",", 1)[1])
    assert cluster.accelerator.name == name and cluster.accelerator.memory_bytes == mib * 2**20
    assert cluster.gpus_per_node == 1
