"""This machine's own hardware profile (issue 13, "the first impression"): `zerokit calibrate` writes it where plans
find it (spec.profile.local_profile_path), scripts/setup.sh measures a quick one once, and a plan without
--hardware-profile prices step time on it when it measured what the plan targets (spec.hardware.machine_profile_for);
the plan and the run report say which figures they used and when they were measured."""

from __future__ import annotations

import json
import os

import pytest

from test_calibrate import _profile, _write
from zerokit.cli import main as cli_main
from zerokit.spec.profile import LOCAL_PROFILE_ENV, cpu_model_name

PLAN = ["plan", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", "64", "--global-batch", "8", "--json"]


def _this_cpu(**over):
    """A profile as calibrate writes it on this machine, with figures far from the catalog's (so a test can tell)."""
    dev = {"type": "cpu", "name": cpu_model_name(), "count": 1, "memory_bytes": 16 * 2**30, "cpu_cores": os.cpu_count()}
    return _profile(device=dev, matmul_tflops={"bf16": 0.002, "fp16": None, "fp32": 0.9}, **over)


def _plan(capsys, *extra) -> dict:
    assert cli_main([*PLAN, *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def machine_profile(tmp_path, monkeypatch):
    """Point ZEROKIT_HARDWARE_PROFILE at a file (conftest sets "none" for every other test)."""
    def use(prof) -> str:
        path = _write(tmp_path, prof, "machine.json")
        monkeypatch.setenv(LOCAL_PROFILE_ENV, path)
        return path
    return use


def test_plan_uses_this_machines_profile_and_says_so(capsys, machine_profile):
    catalog = _plan(capsys)
    assert "catalog" in catalog["hardware"]["time_source"]
    path = machine_profile(_this_cpu())
    auto = _plan(capsys)
    explicit = _plan(capsys, "--hardware-profile", path)
    # the same figures as naming the file: fp32 at 0.9 TFLOP/s, bf16 at 2 GFLOP/s -> the plan trains in fp32
    assert auto["time"] == explicit["time"] and auto["choice"] == explicit["choice"]
    assert auto["choice"]["precision"] == "fp32" and auto["time"] != catalog["time"]
    src = auto["hardware"]["time_source"]
    assert path in src and "2026-01-01T00:00:00+00:00" in src and "--quick" in src
    assert any("calibrated with" in n and path in n for n in auto["notes"])  # against the catalog's choice
    # --hardware-profile none: the catalog's figures even with a machine profile present
    assert _plan(capsys, "--hardware-profile", "none")["time"] == catalog["time"]


def test_plan_text_names_the_figures(capsys, machine_profile):
    path = machine_profile(_this_cpu())
    assert cli_main(PLAN[:-1]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if "step time priced on" in x]
    assert len(line) == 1 and path in line[0] and "zerokit calibrate --quick" in line[0]


@pytest.mark.parametrize("device", [
    {"name": "another CPU model"},  # the case: a profile from an AVX2 EPYC must not price this machine
    {"cpu_cores": 1024},
], ids=["other-cpu-model", "other-core-count"])
def test_profile_from_another_cpu_is_not_used(capsys, machine_profile, device):
    prof = _this_cpu()
    prof["device"].update(device)
    machine_profile(prof)
    assert "catalog" in _plan(capsys)["hardware"]["time_source"]


def test_gpu_profile_prices_only_its_own_gpu(capsys, machine_profile):
    machine_profile(_profile(device={"type": "cuda", "name": "NVIDIA A100-SXM4-80GB", "count": 8,
                                     "memory_bytes": 85899345920, "cpu_cores": 32},
                             matmul_tflops={"bf16": 250.0, "fp16": 260.0, "fp32": 19.0},
                             collectives={"backend": "nccl", "world_size": 8, "all_reduce_busbw_gbps": 230.0,
                                          "all_gather_busbw_gbps": 220.0}))
    base = ["plan", "--params", "7e9", "--gpus-per-node", "8", "--json"]
    assert cli_main([*base, "--gpu", "a100-80gb"]) == 0
    a100 = json.loads(capsys.readouterr().out)["hardware"]
    assert "NVIDIA A100-SXM4-80GB" in a100["time_source"] and a100["accelerator"]["bf16_tflops"] == 250.0
    assert cli_main([*base, "--gpu", "h100-80gb"]) == 0
    assert "catalog" in json.loads(capsys.readouterr().out)["hardware"]["time_source"]
    assert "catalog" in _plan(capsys)["hardware"]["time_source"]  # a GPU profile never prices --gpu cpu


def test_broken_default_profile_is_a_cache_miss(capsys, tmp_path, monkeypatch):
    """Unset ZEROKIT_HARDWARE_PROFILE: the default file under the cache dir; unreadable costs only the catalog."""
    monkeypatch.delenv(LOCAL_PROFILE_ENV)
    monkeypatch.setenv("ZEROKIT_CACHE_DIR", str(tmp_path))
    assert "catalog" in _plan(capsys)["hardware"]["time_source"]  # none written yet
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "profile.json").write_text("{not json")
    assert "catalog" in _plan(capsys)["hardware"]["time_source"]
    (tmp_path / "hardware" / "profile.json").write_text(json.dumps(_this_cpu()))
    assert str(tmp_path / "hardware" / "profile.json") in _plan(capsys)["hardware"]["time_source"]


def test_named_profile_must_exist(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(LOCAL_PROFILE_ENV, str(tmp_path / "missing.json"))
    assert cli_main(PLAN) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing.json does not exist" in err and "=none" in err


def test_calibrate_writes_this_machines_profile_by_default(capsys, tmp_path, monkeypatch):
    """Without -o, calibrate writes where plans look (checked before any measuring: an impossible path fails fast)."""
    (tmp_path / "f").write_text("a file, not a folder")
    monkeypatch.setenv(LOCAL_PROFILE_ENV, str(tmp_path / "f" / "profile.json"))
    assert cli_main(["calibrate", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "cannot create" in err and str(tmp_path / "f") in err


def test_calibrate_if_missing_keeps_this_machines_profile(capsys, machine_profile):
    """setup.sh's `calibrate --quick --if-missing`: a profile of this machine is kept as it is (no measuring)."""
    path = machine_profile(_this_cpu())
    before = open(path).read()
    assert cli_main(["calibrate", "--quick", "--if-missing"]) == 0
    assert "already measured on this machine" in capsys.readouterr().err and open(path).read() == before
