"""zerokit calibrate: measurements, the profile file, and applying it to an Accelerator."""

import json
import os

import pytest

from zerokit.spec import hardware
from zerokit.estimate.timing import efficiency_from_run
from zerokit.spec.profile import SANITY, apply_profile, load_profile
from zerokit.core.errors import ZerokitError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _profile(**over):
    prof = {
        "zerokit_hardware_profile": 1,
        "created": "2026-01-01T00:00:00+00:00",
        "quick": True,
        "device": {"type": "cpu", "name": "test cpu", "count": 1, "memory_bytes": 16 * 2**30, "cpu_cores": 2},
        "matmul_size": 1024,
        "matmul_tflops": {"bf16": 0.05, "fp16": None, "fp32": 0.04},
        "collectives": {"backend": "gloo", "world_size": 2, "all_reduce_busbw_gbps": 1.5, "all_gather_busbw_gbps": 0.2},
        "h2d_gbps": None,
        "d2h_gbps": None,
        "cpu_adam_params_per_s": 2.0e8,
        "torch_adamw_params_per_s": 3.0e7,
        "notes": [],
    }
    prof.update(over)
    return prof


def _write(tmp_path, prof, name="prof.json"):
    p = tmp_path / name
    p.write_text(json.dumps(prof) if not isinstance(prof, str) else prof)
    return str(p)


def test_apply_profile_changes_cpu_accelerator(tmp_path):
    cpu = hardware.accelerator("cpu")
    acc = apply_profile(cpu, _write(tmp_path, _profile()))
    assert acc.fp32_tflops == 0.04 and acc.bf16_tflops == 0.05
    assert acc.bf16 is True and acc.fp16 is False and acc.fp16_tflops == 0.0
    assert acc.efficiency == 1.0
    assert acc.intra_node_bw == 1.5
    assert acc.memory_bytes == 16 * 2**30
    assert acc.pcie_bw == cpu.pcie_bw  # no copies measured on CPU
    assert acc.inter_node_bw == cpu.inter_node_bw  # not measurable on one node
    assert "zerokit calibrate" in acc.source
    assert acc != cpu and acc.name == cpu.name


def test_apply_profile_gpu(tmp_path):
    prof = _profile(
        device={"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "count": 8, "memory_bytes": 85520809984},
        matmul_tflops={"bf16": 700.0, "fp16": 710.0, "fp32": 50.0},
        collectives={"backend": "nccl", "world_size": 2, "all_reduce_busbw_gbps": 360.0, "all_gather_busbw_gbps": 350.0},
        h2d_gbps=50.0, d2h_gbps=45.0,
    )
    acc = apply_profile(hardware.accelerator("h100-80gb"), _write(tmp_path, prof))
    assert (acc.bf16_tflops, acc.fp16_tflops, acc.fp32_tflops) == (700.0, 710.0, 50.0)
    assert acc.intra_node_bw == 360.0 and acc.pcie_bw == 45.0 and acc.efficiency == 1.0
    assert acc.peak_flops("bf16") == 700e12


def test_build_cluster_uses_profile(tmp_path):
    path = _write(tmp_path, _profile())
    cl = hardware.build_cluster(gpu="cpu", hardware_profile=path)
    assert cl.accelerator.fp32_tflops == 0.04 and cl.accelerator.efficiency == 1.0


@pytest.mark.parametrize(
    "content",
    [
        "not json {",
        json.dumps([1, 2]),
        json.dumps({"matmul_tflops": {"fp32": 1.0}}),  # no schema marker
        json.dumps(_profile(matmul_tflops={"bf16": 1.0})),  # no fp32
        json.dumps(_profile(matmul_tflops={"fp32": -1.0})),
        json.dumps(_profile(matmul_tflops={"fp32": 1.0, "bf16": "fast"})),
        json.dumps(_profile(device={"name": "x"})),
    ],
)
def test_bad_profile_raises(tmp_path, content):
    path = _write(tmp_path, content)
    with pytest.raises(ZerokitError):
        apply_profile(hardware.accelerator("cpu"), path)


def test_missing_profile_raises(tmp_path):
    with pytest.raises(ZerokitError, match="calibrate"):
        apply_profile(hardware.accelerator("cpu"), str(tmp_path / "nope.json"))


def test_unwritable_output_fails_before_measuring(tmp_path, capsys):
    """A bad --output is one line and exit 2 at once (no minutes of measuring first), and nothing is written."""
    import time

    from zerokit.cli import main as cli_main

    blocker = tmp_path / "file"
    blocker.write_text("x")
    t0 = time.perf_counter()
    for out in (tmp_path, blocker / "sub" / "p.json"):  # a directory; a folder that cannot be created
        assert cli_main(["calibrate", "--quick", "-o", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and "--output" in err[0]
    assert time.perf_counter() - t0 < 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_profile_device_mismatch(tmp_path):
    with pytest.raises(ZerokitError, match="cpu"):
        apply_profile(hardware.accelerator("a100-80gb"), _write(tmp_path, _profile()))


def test_efficiency_from_run():
    assert efficiency_from_run(10.0, 20.0, 0.4) == pytest.approx(0.2)
    assert efficiency_from_run(10.0, 5.0, 0.4) == pytest.approx(0.8)
    assert efficiency_from_run(10.0, 1.0, 0.4) == 1.0  # clamped
    assert efficiency_from_run(1.0, 1e6, 0.4) == 0.01
    for bad in [(0, 1, 0.4), (1, -1, 0.4), (1, 1, 0), (float("nan"), 1, 0.4)]:
        with pytest.raises(ZerokitError):
            efficiency_from_run(*bad)


def test_measure_matmul_cpu():
    pytest.importorskip("torch")
    from zerokit.measure.calibrate import measure_matmul

    from zerokit.measure.calibrate import precision_supported

    assert measure_matmul("fp32", 128, "cpu", min_time_s=0.05) > 0
    assert measure_matmul("bf16", 128, "cpu", min_time_s=0.05) > 0
    if precision_supported("fp16", "cpu")[0]:  # DeepSpeed's CPU accelerator runs fp16 on AVX512-FP16/AMX CPUs
        assert measure_matmul("fp16", 128, "cpu", min_time_s=0.05) > 0
    else:
        with pytest.raises(ZerokitError, match="fp16"):
            measure_matmul("fp16", 128, "cpu")


def test_torch_adamw_rate():
    pytest.importorskip("torch")
    from zerokit.measure.calibrate import measure_torch_adamw

    assert measure_torch_adamw(100_000, "cpu", min_time_s=0.05) > 0


# a one-GPU calibration (zerokit calibrate on an H200, 2026-11-26), before torch_adamw_device
H200_PROFILE = os.path.join(REPO, "bench", "results", "h200_profile_20261126.json")


def test_one_gpu_profile_summary():
    """A one-GPU calibration measures no collective (one rank: measure.calibrate.benchmark_world_size): its summary
    says so. The H200 calibration of 2026-11-26 wrote this profile, then stopped on KeyError 'backend' printing it."""
    from zerokit.measure.calibrate import format_profile

    text = format_profile(load_profile(H200_PROFILE))
    assert "collectives: one rank, not measured" in text and "NVIDIA H200" in text


def test_optimizer_rate_priced_only_where_the_step_updates(tmp_path):
    """torch_adamw_params_per_s prices the update of a step without optimizer offload, which runs on the training
    device. The H200 profile timed it on the host (before torch_adamw_device) at 779 M params/s and so priced a
    246M-parameter step's update at 316 ms: its rate is not read. Marked as timed on the GPU, the same rate prices it
    at trainable / rate; a CPU profile's host is its device."""
    from zerokit.estimate.timing import estimate_time
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.profile import TimingTerms
    from zerokit.spec.setup import Workload, ZeroSetup

    prof = json.loads(open(H200_PROFILE).read())
    rate = prof["torch_adamw_params_per_s"]
    assert "torch_adamw_device" not in prof and rate > 0
    assert TimingTerms.from_profile(prof).torch_adamw_params_per_s == 0
    assert TimingTerms.from_profile(dict(prof, torch_adamw_device="cuda")).torch_adamw_params_per_s == rate
    assert TimingTerms.from_profile(_profile()).torch_adamw_params_per_s == 3.0e7

    spec = load_model_spec(os.path.join(REPO, "bench", "accuracy", "models", "gpu-llama"))
    setup = ZeroSetup(zero_stage=0, precision="bf16", micro_batch_size=4)
    optimizer_s = {}
    for name, p in (("host", prof), ("device", dict(prof, torch_adamw_device="cuda"))):
        cluster = build_cluster(gpu="h200", gpus_per_node=1, hardware_profile=_write(tmp_path, p, f"{name}.json"))
        optimizer_s[name] = estimate_time(spec, cluster, setup, Workload(seq_len=2048)).optimizer_seconds
    assert optimizer_s["host"] == 0
    assert optimizer_s["device"] == pytest.approx(spec.trainable / rate)


def test_quantized_device_map(monkeypatch):
    """The compute benchmark's 4-bit models load on the rank's own GPU by index. Its ranks pass torch.device("cuda")
    (index None, after torch.cuda.set_device), and transformers refused {"": None}: the H200 calibration lost its
    QLoRA and LoRA points to it. No GPU here: the current device is what set_device would have left."""
    torch = pytest.importorskip("torch")
    from zerokit.measure.compute_fit import quantized_device_map

    assert quantized_device_map(torch.device("cpu")) == {"": "cpu"}
    assert quantized_device_map(torch.device("cuda", 1)) == {"": 1}
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert quantized_device_map(torch.device("cuda")) == {"": 3}


def test_compute_benchmark_on_one_rank():
    """A one-GPU machine calibrates on one rank (measure.calibrate.benchmark_world_size): no collective to measure,
    the compute benchmark alone. Two ranks sharing one GPU would each read half its speed. Run here on the CPU, where
    the same path (a 1-rank process group, Lockstep) runs: every job timed, in order, a deeper model slower."""
    pytest.importorskip("torch")
    from zerokit.measure import compute_fit
    from zerokit.measure.calibrate import benchmark_world_size, time_compute
    from zerokit.measure.ranks import device_of

    assert benchmark_world_size(device_of("cpu")) == 2  # a CPU job's ranks share the cores: timed in pairs
    jobs = [j for j in compute_fit.benchmark_jobs(["fp32"], False, True, 1)
            if j["family"] == "gated" and not j["checkpointing"]]
    depths = [j["config"]["num_hidden_layers"] for j in jobs]
    secs = time_compute(1, {"jobs": jobs, "min_time_s": 0.05, "device": None}, threads=1)
    assert len(secs) == len(jobs) and all(s > 0 for s in secs)
    by_depth = {}
    for d, s in zip(depths, secs):
        by_depth.setdefault(d, []).append(s)
    assert min(by_depth[max(depths)]) > max(by_depth[min(depths)]), by_depth


@pytest.mark.slow
@pytest.mark.timed
def test_quick_calibration_end_to_end(tmp_path):
    pytest.importorskip("torch")
    from zerokit.measure.calibrate import run_calibration

    ext = os.path.join(REPO, ".cache", "torch_extensions")
    if os.path.isdir(ext):
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", ext)
    from zerokit.measure.calibrate import EXIT_TOO_BUSY

    out = tmp_path / "sub" / "profile.json"
    try:  # a busy machine: the degenerate points are re-measured; still degenerate, one line and no profile
        # bf16 (and fp32, always): what every x86 CPU here runs; fp16 on AVX512-FP16 CPUs is test_fp16_cpu's. The
        # gated family only (as `calibrate --model` of a Llama): the plain one is the same code on other shapes
        prof = run_calibration(out, quick=True, precisions=("bf16",), gated_mlp=True)
    except ZerokitError as e:
        assert e.exit_code == EXIT_TOO_BUSY and not out.exists(), e
        pytest.fail(str(e))
    on_disk = load_profile(out)
    assert on_disk == json.loads(json.dumps(prof))
    for key in ("device", "matmul_tflops", "collectives", "cpu_adam_params_per_s", "torch_adamw_params_per_s", "notes"):
        assert key in on_disk
    assert on_disk["device"]["type"] == "cpu"
    assert on_disk["matmul_tflops"]["fp32"] > 0 and on_disk["matmul_tflops"]["bf16"] > 0
    assert on_disk["matmul_tflops"]["fp16"] is None and any(n.startswith("fp16: not measured") or
                                                            n.startswith("fp16: skipped") for n in on_disk["notes"])
    coll = on_disk["collectives"]
    assert coll["backend"] == "gloo" and coll["all_reduce_busbw_gbps"] > 0 and coll["all_gather_busbw_gbps"] > 0
    assert on_disk["torch_adamw_params_per_s"] > 0 and on_disk["torch_adamw_device"] == "cpu"
    # the compute benchmark: both families in both CPU precisions, every point timed, the fit's costs >= 0
    # and the fit sane (spec.profile.SANITY: FLOP rate plausible, points within its loose error bound)
    from zerokit.measure.compute_fit import compute_fit_problems
    from zerokit.estimate.timing import COMPUTE_FEATURES
    from zerokit.spec.profile import ADAPTER_FEATURES, slow_precisions

    ct = on_disk["compute_timing"]
    assert sorted(ct) == ["gated"] and all(sorted(ct[f]) == ["bf16", "fp32"] for f in ct)
    assert any(n.startswith("compute: the gated block family only") for n in on_disk["notes"])
    # a CPU without AVX-512 bf16 runs bf16 under 1/10 of fp32's rate: calibrate times it on its smallest shapes only
    # and fits no adapters for it (run_calibration: a slow precision is never planned)
    slow = set(slow_precisions(on_disk["matmul_tflops"]))
    for fam in ct.values():
        for prec, v in fam.items():
            assert all(v["coef"][n] >= 0 for n in COMPUTE_FEATURES) and v["coef"]["flop"] > 0
            assert all(p["seconds"] > 0 for p in v["points"])
            if prec in slow:
                assert "adapter_points" not in v
                continue
            # LoRA and QLoRA versions of the models (peft and bitsandbytes are installed here): their costs fitted
            assert all(v["coef"][n] >= 0 for n in ADAPTER_FEATURES)
            assert {p["finetune"] for p in v["adapter_points"]} == {"lora", "qlora"}
    assert compute_fit_problems(ct, on_disk["matmul_tflops"]) == {}
    assert all(0 <= cv <= SANITY.max_spread_cv for cv in on_disk["matmul_spread_cv"].values())
    assert on_disk["cpu_adam_params_per_s"] is None or on_disk["cpu_adam_params_per_s"] > 0
    acc = apply_profile(hardware.accelerator("cpu"), str(out))
    assert acc.fp32_tflops == on_disk["matmul_tflops"]["fp32"] and acc.efficiency == 1.0
    # quick mode's engines: the plain ones once, every stage, in the precision a plan here picks (the fastest matmul);
    # the fit's terms >= 0, each stage's two depths measured
    from zerokit.measure.engine_fit import QUICK_RUNS, STAGES

    fastest = max((p for p in on_disk["matmul_tflops"] if on_disk["matmul_tflops"][p] and p not in slow),
                  key=lambda p: on_disk["matmul_tflops"][p])
    engines = on_disk["engine_overhead"]["by_precision"]
    assert list(engines) == [fastest] and sorted(engines[fastest]) == [str(s) for s in STAGES]
    for fit in engines[fastest].values():
        assert len(fit["runs"]) == len(QUICK_RUNS) and all(r["seconds"] > 0 for r in fit["runs"])
        assert fit["per_step_s"] >= 0 and fit["per_layer_micro_s"] >= 0 and "offload" not in fit
    assert any(n.startswith(f"engine costs: one pass of the plain engines in {fastest}") for n in on_disk["notes"])
