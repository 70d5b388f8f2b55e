"""zerokit's predictions against measured truth (bench/accuracy).

Fast: the benchmark's table arithmetic, the calibrated time model's terms, the fit of a layer's fixed
overhead and throughput, the report's "efficiency that would have matched".
Slow: real 2-rank DeepSpeed jobs (gloo, CPU) whose measured peak memory (zerokit.measure.meter's exact
live-tensor bytes, per phase) must be within the benchmark's target of the prediction.
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "accuracy"))

from accuracy import format_table, group_terms, rel_err, summarize, summary_of_rows

MEMORY_TARGET_MAX = 0.08  # bench/accuracy target: max |error| 8%, median 3%
MEMORY_TARGET_MEDIAN = 0.03


def test_relative_error_is_signed_against_the_measurement():
    assert rel_err(110, 100) == pytest.approx(0.10)
    assert rel_err(90, 100) == pytest.approx(-0.10)
    assert rel_err(None, 100) is None and rel_err(100, None) is None and rel_err(100, 0) is None


def test_summary_takes_median_and_max_of_absolute_errors():
    s = summarize([0.01, -0.05, 0.02, None, -0.002])
    assert s["n"] == 4
    assert s["median_abs"] == pytest.approx((0.01 + 0.02) / 2)
    assert s["max_abs"] == pytest.approx(0.05)
    assert summarize([None]) == {"n": 0, "median_abs": None, "max_abs": None}
    rows = [{"mem_err": 0.01, "time_err": -0.3}, {"mem_err": -0.03, "time_err": None}, {"mem_err": 0.02, "time_err": 0.1}]
    both = summary_of_rows(rows)
    assert both["peak_memory"]["median_abs"] == pytest.approx(0.02) and both["peak_memory"]["max_abs"] == pytest.approx(0.03)
    assert both["step_time"]["n"] == 2 and both["step_time"]["max_abs"] == pytest.approx(0.3)


def test_table_shows_each_row_and_the_summary():
    rows = [{"job": "tiny-llama_z2_bf16_mb1_s64", "rank": 0, "pred_mem": 2**20 * 10, "meas_mem": 2**20 * 8,
             "mem_err": rel_err(10, 8), "peak_phase": "backward", "pred_time": 0.1, "meas_time": 0.2,
             "time_err": rel_err(0.1, 0.2)}]
    text = format_table(rows, summary_of_rows(rows))
    assert "tiny-llama_z2_bf16_mb1_s64" in text and "+25.0%" in text and "-50.0%" in text
    assert "peak memory: median |err| 25.0%, max |err| 25.0% over 1 rank rows" in text
    assert group_terms({"a": 1, "b": 2, "c": 4}, {"x": ("a", "c"), "y": ("z",)}) == {"x": 5, "y": 0}


def test_compute_fit_recovers_known_costs():
    """calibrate_compute.fit on points made from known per-unit costs gives those costs back, and keeps
    every cost >= 0 when the data would pull one negative."""
    from zerokit.measure.compute_fit import fit
    from zerokit.spec.model import load_model_spec
    from zerokit.estimate.timing import COMPUTE_FEATURES, compute_features

    truth = {"micro": 4e-4, "layer": 1e-3, "recompute": 1.2e-3, "flop": 1e-11, "score": 7e-9, "activation": 1e-8,
             "logit": 3e-9}
    pts = []
    # two depths, or the per-layer and per-micro-step costs move together (as in the benchmark)
    specs = [replace(load_model_spec(name), num_layers=L) for name in ("tiny-llama", "tiny-gpt2") for L in (1, 3)]
    for spec in specs:
        for mb, s in ((1, 64), (2, 128), (8, 64), (1, 256), (4, 128)):
            for ckpt in (False, True):
                f = compute_features(spec, mb, s, ckpt)
                pts.append({"features": f, "seconds": sum(truth[n] * f[n] for n in COMPUTE_FEATURES)})
    got = fit(pts, COMPUTE_FEATURES)
    for n in COMPUTE_FEATURES:
        assert got[n] == pytest.approx(truth[n], rel=1e-6), n
    # seconds that fall with the layer count: the layer cost is clamped at 0 and the rest refitted
    neg = [{"features": {"micro": 1.0, "layer": float(L)}, "seconds": 0.01 - 1e-4 * L} for L in (1, 2, 3)]
    got = fit(neg, ("micro", "layer"))
    assert got["layer"] == 0.0 and 0.0097 < got["micro"] < 0.0099


def test_adapter_fit_recovers_known_costs_and_leaves_the_full_model_price():
    """compute_fit.fit_adapters on LoRA and QLoRA points made from known adapter and dequantization costs over a base
    price gives those costs back in its stages (LoRA first, QLoRA on what is left), leaves the base coefficients as
    they were, and a profile without the dequantization fit prices a dequantized element as an activation element."""
    from zerokit.estimate.timing import ADAPTER_FEATURES, COMPUTE_FEATURES, _calibrated_compute, compute_features
    from zerokit.measure.compute_fit import fit_adapters
    from zerokit.spec.finetune import Finetune, finetuned_spec
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.resolve import resolve_model
    from zerokit.spec.setup import Workload, ZeroSetup

    base_coef = {"micro": 4e-4, "layer": 1e-3, "recompute": 1.2e-3, "flop": 1e-11, "score": 7e-9, "activation": 1e-8,
                 "logit": 3e-9}
    truth = {"adapter": 6e-5, "adapter_element": 3e-9, "dequant": 1e-9, "dequant_call": 1.2e-4}
    src = str(resolve_model("tiny-llama").config_file())
    jobs, seconds = [], []
    for mode in ("lora", "qlora"):
        spec = finetuned_spec(load_model_spec("tiny-llama"), src, Finetune(mode=mode, lora_r=8))
        for layers, width in ((1, 1), (3, 1), (3, 4)):  # depth and width move the 4-bit elements and calls apart
            t = spec.trained
            s = replace(spec, num_layers=layers, trained=replace(t, quantized_params=t.quantized_params * layers * width // 4,
                                                                 quantized_tensors=t.quantized_tensors * layers // 4,
                                                                 lora_io_per_layer=t.lora_io_per_layer * width))
            for mb, seq in ((1, 64), (2, 128), (8, 64), (1, 256)):
                f = compute_features(s, mb, seq, False)
                jobs.append({"family": "gated", "precision": "fp32", "finetune": mode, "features": f,
                             "micro_batch": mb, "seq": seq, "config": {"hidden_size": 128}})
                seconds.append(sum(base_coef[n] * f[n] for n in COMPUTE_FEATURES)
                               + sum(truth[n] * f[n] for n in ADAPTER_FEATURES))
    timing = {"gated": {"fp32": {"coef": dict(base_coef)}}}
    fit_adapters(timing, jobs, seconds)
    got = timing["gated"]["fp32"]["coef"]
    for n in ADAPTER_FEATURES:
        assert got[n] == pytest.approx(truth[n], rel=1e-6), n
    assert {n: got[n] for n in COMPUTE_FEATURES} == base_coef
    assert len(timing["gated"]["fp32"]["adapter_points"]) == len(jobs)
    # a profile from before the dequantization fit: a dequantized element at the activation element's price
    qlora = finetuned_spec(load_model_spec("tiny-llama"), src, Finetune(mode="qlora", lora_r=8))
    setup, work = ZeroSetup(zero_stage=2, precision="fp32", micro_batch_size=2), Workload(seq_len=64)
    f = compute_features(qlora, 2, 64, False)
    assert _calibrated_compute(qlora, setup, work, base_coef) == pytest.approx(
        sum(base_coef[n] * f[n] for n in COMPUTE_FEATURES) + base_coef["activation"] * f["dequant"])


ENGINE = {"world_size": 2, "by_precision": {"fp32": {"2": {"per_step_s": 0.01, "per_layer_micro_s": 0.002}}}}


def _profile(tmp_path, overhead=2e-3, tflops=0.05, latency=1e-4, adamw=2e8, engine=None):
    prof = {"zerokit_hardware_profile": 1, "device": {"type": "cpu", "name": "test cpu", "memory_bytes": 2**34},
            "matmul_tflops": {"fp32": 0.1, "bf16": 0.05, "fp16": None}, "collectives": {},
            "layer_timing": {"fp32": {"layer_overhead_s": overhead, "layer_tflops": tflops},
                             "bf16": {"layer_overhead_s": 2 * overhead, "layer_tflops": tflops / 2}},
            "collective_latency_s": latency, "all_reduce_latency_s": 3 * latency, "all_gather_latency_s": latency,
            "torch_adamw_params_per_s": adamw, "created": "now"}
    if engine:
        prof["engine_overhead"] = engine
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(prof))
    return path


def test_calibrated_time_prices_layer_overhead_flops_latency_and_optimizer(tmp_path):
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.model import load_model_spec
    from zerokit.estimate.timing import collective_bytes_per_step, collective_calls_per_step, estimate_time, flops_per_token, link_bandwidth
    from zerokit.spec.setup import Workload, ZeroSetup

    spec = load_model_spec("tiny-llama")
    cl = build_cluster(gpu="cpu", gpus_per_node=2, hardware_profile=str(_profile(tmp_path, engine=ENGINE)))
    setup = ZeroSetup(zero_stage=2, precision="fp32", micro_batch_size=2)
    w = Workload(seq_len=128)
    t = estimate_time(spec, cl, setup, w)
    assert t.calibrated and t.efficiency is None
    compute = (spec.num_layers + 1) * 2e-3 + flops_per_token(spec, 128, False) * 256 / 0.05e12
    assert t.compute_seconds == pytest.approx(compute)
    assert t.optimizer_seconds == pytest.approx(spec.params / 2 / (2e8 / 2))
    calls = collective_calls_per_step(spec, cl, setup)
    assert calls.reduces > calls.gathers == 1
    # every call at its own kind's measured latency: reduces at the all-reduce's, gathers at the all-gather's
    latency = calls.reduces * 3e-4 + calls.gathers * 1e-4
    assert t.communication_seconds == pytest.approx(collective_bytes_per_step(spec, cl, setup) / link_bandwidth(cl) + latency)
    assert t.engine_seconds == pytest.approx(0.01 + 0.002 * spec.num_layers)  # fitted engine terms of ZeRO-2 fp32
    assert t.step_seconds == pytest.approx(t.compute_seconds + t.communication_seconds + t.optimizer_seconds + t.engine_seconds)
    assert estimate_time(spec, cl, setup.with_(zero_stage=1), w).engine_seconds == 0  # no fit for ZeRO-1 here
    # bf16 uses its own measured terms; without a profile, the catalog's FLOPs / (peak x efficiency)
    assert estimate_time(spec, cl, setup.with_(precision="bf16"), w).compute_seconds > 2 * compute * 0.99
    plain = estimate_time(spec, build_cluster(gpu="cpu", gpus_per_node=2), setup, w)
    assert not plain.calibrated and plain.efficiency == 1.0


def test_calibrated_compute_prices_each_feature_at_its_family_cost(tmp_path):
    """A profile from the HF-model benchmark (compute_timing): a micro step is the sum of each feature
    times its measured cost, GPT-2 takes the plain family's costs, Llama the gated ones; accumulation
    multiplies it."""
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.model import load_model_spec
    from zerokit.estimate.timing import COMPUTE_FEATURES, compute_features, estimate_time
    from zerokit.spec.setup import Workload, ZeroSetup

    gated = {"micro": 1e-3, "layer": 2e-3, "recompute": 3e-3, "flop": 1e-11, "score": 1e-8, "activation": 2e-8, "logit": 5e-9}
    plain = {n: 2 * v for n, v in gated.items()}
    path = _profile(tmp_path)
    prof = json.loads(path.read_text())
    prof["compute_timing"] = {"gated": {"fp32": {"coef": gated}}, "plain": {"fp32": {"coef": plain}}}
    path.write_text(json.dumps(prof))
    cl = build_cluster(gpu="cpu", gpus_per_node=2, hardware_profile=str(path))
    for name, coef in (("tiny-llama", gated), ("tiny-gpt2", plain)):
        spec = load_model_spec(name)
        setup = ZeroSetup(zero_stage=2, precision="fp32", micro_batch_size=2, gradient_accumulation_steps=3,
                          activation_checkpointing=True)
        f = compute_features(spec, 2, 128, True)
        t = estimate_time(spec, cl, setup, Workload(seq_len=128))
        assert t.calibrated
        assert t.compute_seconds == pytest.approx(3 * sum(coef[n] * f[n] for n in COMPUTE_FEATURES))
    assert f["recompute"] == spec.num_layers and compute_features(spec, 2, 128, False)["recompute"] == 0


def test_report_prints_the_efficiency_that_would_have_matched():
    from zerokit.report.run_report import build_report, format_report

    pred = {"setup": "x", "per_rank_memory_bytes": 100, "step_seconds": 0.1, "efficiency": 0.4}
    measured = {"ranks": {}, "step_seconds": 0.4, "peak_memory_bytes_max": 90}
    rep = build_report(pred, measured, {})
    assert rep["efficiency_to_match"] == pytest.approx(0.1)
    assert "0.1 would have matched" in format_report(rep)


# -- real runs ----------------------------------------------------------------------------------------
# (GPT-2 at ZeRO-3 is left out: the run trains, but exporting its tied embedding through zero_to_fp32 +
# safetensors fails after training, a launch bug outside this check.)
JOBS = [("tiny-gpt2", 2, "bf16", 2, 64, "none", "none", False), ("tiny-llama", 3, "fp32", 1, 128, "cpu", "none", True)]


@pytest.mark.slow
def test_real_runs_peak_memory_within_target(tmp_path):
    import run as bench

    device, ranks, mib = bench.detect_device()
    cluster = bench.make_cluster(device, ranks, None, mib, None)
    errors = []
    for args in JOBS:
        job = bench.Job(*args)
        res = bench.run_job(job, tmp_path, device, ranks, cluster, steps=3, memory_steps=2, timeout=600)
        assert res["returncode"] == 0, (tmp_path / f"{job.name}.log").read_text()[-3000:]
        measured = bench.measure(tmp_path / job.name, warmup=2)
        assert sorted(measured) == list(range(ranks))
        cfg = json.loads((tmp_path / f"{job.name}.ds_config.json").read_text())
        pred = bench.predict(job, cluster, cfg)
        recs = [json.loads(x) for x in (tmp_path / job.name / "metrics" / "rank0.jsonl").read_text().splitlines()]
        steps = [r for r in recs if r.get("event") == "step"]
        # per-phase peaks on every metered step; the meter stops after ZEROKIT_MEMORY_STEPS on CPU
        assert set(steps[0]["phases"]) == {"forward", "backward", "step"}
        if device == "cpu":
            assert [r["metered"] for r in steps] == [True, True, False]
            assert "optimizer_states" in steps[1]["phases"]["backward"]["categories"]
        for m in measured.values():
            errors.append(rel_err(pred["per_rank_bytes"], m["peak_bytes"]))
    assert max(abs(e) for e in errors) <= MEMORY_TARGET_MAX, errors
    assert summarize(errors)["median_abs"] <= MEMORY_TARGET_MEDIAN, errors


def test_repeats_keep_memory_of_the_first_and_the_fastest_median():
    import run as bench

    first = {0: {"peak_bytes": 10, "step_seconds": 0.30}, 1: {"peak_bytes": 11, "step_seconds": 0.25}}
    again = {0: {"peak_bytes": 99, "step_seconds": 0.20}, 1: {"peak_bytes": 99, "step_seconds": 0.40}}
    got = bench.fastest_of_repeats(first, [again])
    assert got[0]["peak_bytes"] == 10 and got[0]["step_seconds"] == 0.20 and got[0]["step_seconds_by_repeat"] == [0.30, 0.20]
    assert got[1]["peak_bytes"] == 11 and got[1]["step_seconds"] == 0.25


def test_the_long_lend_rows_train_with_checkpoint_offload_as_planned(tmp_path):
    """bench/gpu_lend.sh LEND_SET=long (issue 45): each LONG row is launched with --activation-checkpointing offload,
    rendered with DeepSpeed's cpu_checkpointing key, and predicted with checkpoint offload: the job and its plan are
    the same setup."""
    import run

    from zerokit.spec.hardware import build_cluster

    cluster = build_cluster(gpu="h200", gpus_per_node=1, hardware_profile="none")
    assert [j.seq_len for j in run.LONG] == sorted(j.seq_len for j in run.LONG) and len(run.LONG) == 4
    for job in run.LONG:
        assert job.setup().checkpoint_offload and job.setup().tiled_mlp and "ckptoff" in job.name
        cmd = run.launch_command(job, tmp_path / "c.json", tmp_path / "o", "cuda", 1, 4)
        assert cmd[cmd.index("--activation-checkpointing") + 1] == "offload"
        cfg = run.render(job, cluster, 4)
        assert cfg["activation_checkpointing"]["cpu_checkpointing"] is True
        assert run.predict(job, cluster, cfg)["per_rank_bytes"] < cluster.accelerator.memory_bytes
