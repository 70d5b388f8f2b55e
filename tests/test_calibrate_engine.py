"""The DeepSpeed engine-cost calibration (zerokit/calibrate_engine.py): the fit, and a real run of
synthetic engines whose fitted terms timing.py then adds to the same setups' predictions."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from zerokit.estimate.timing import engine_seconds
from zerokit.measure.engine_fit import OFFLOAD_RUNS, RUNS, STAGES, _fit


@pytest.fixture(autouse=True)
def _one_pass_per_engine(monkeypatch):
    """The real-engine tests check what is fitted and that the estimate charges it, on runs whose depths differ 8x;
    calibrate's repeated passes (the fastest kept) guard a real profile against a busy machine, not this mechanism."""
    from zerokit.measure import engine_fit

    for name in ("ENGINE_PASSES", "PEFT_PASSES", "MODEL_PARALLEL_PASSES", "RING_PASSES"):
        monkeypatch.setattr(engine_fit, name, 1)


def test_fit_recovers_a_line_and_keeps_both_terms_non_negative():
    fit = _fit([(1, 0.012), (4, 0.018), (8, 0.026)])
    assert fit["per_step_s"] == pytest.approx(0.01, abs=3e-4)
    assert fit["per_layer_micro_s"] == pytest.approx(0.002, abs=1e-4)
    assert _fit([(1, 0.02), (4, 0.01), (8, 0.0)]) == {"per_step_s": pytest.approx(0.01), "per_layer_micro_s": 0.0}
    neg = _fit([(1, -0.01), (4, 0.02), (8, 0.05)])  # a negative intercept: the line through the origin
    assert neg["per_step_s"] == 0.0 and neg["per_layer_micro_s"] > 0


def test_engine_seconds_picks_the_precision_and_stage():
    eng = {"by_precision": {"bf16": {"3": {"per_step_s": 0.01, "per_layer_micro_s": 0.001}},
                            "fp32": {"3": {"per_step_s": 0.02, "per_layer_micro_s": 0.0}}}}
    assert engine_seconds(eng, "bf16", 3, layers=10, accum=2) == pytest.approx(0.01 + 0.001 * 20)
    assert engine_seconds(eng, "fp16", 3, layers=10, accum=1) == pytest.approx(0.02)  # fp16 takes bf16's
    assert engine_seconds(eng, "fp32", 3, layers=10, accum=1) == pytest.approx(0.02)
    assert engine_seconds(eng, "fp32", 2, layers=10, accum=1) == 0.0
    assert engine_seconds(None, "fp32", 3, layers=10, accum=1) == 0.0
    eng["by_precision"]["fp32"]["3"]["per_layer_recompute_s"] = 0.003  # only with checkpointing
    assert engine_seconds(eng, "fp32", 3, layers=10, accum=2) == pytest.approx(0.02)
    assert engine_seconds(eng, "fp32", 3, layers=10, accum=2, checkpointing=True) == pytest.approx(0.02 + 0.003 * 20)
    eng["by_precision"]["fp32"]["3"]["offload"] = {"per_step_s": 0.005, "per_layer_micro_s": 0.0005}  # only offloaded
    assert engine_seconds(eng, "fp32", 3, layers=10, accum=2) == pytest.approx(0.02)
    assert engine_seconds(eng, "fp32", 3, layers=10, accum=2, offload=True) == pytest.approx(0.02 + 0.005 + 0.0005 * 20)
    # a ZeRO-1/2 fit per collective call (engine_fit.PER_CALL_STAGES): the step's calls, whatever the depth; recompute
    # stays per layer; without the calls (or in an older profile's per-layer fit) per layer and micro step
    eng["by_precision"]["fp32"]["2"] = {"per_step_s": 0.004, "per_layer_micro_s": 0.0, "per_call_s": 0.0007,
                                        "per_layer_recompute_s": 0.002}
    assert engine_seconds(eng, "fp32", 2, layers=10, accum=2, calls=37) == pytest.approx(0.004 + 0.0007 * 37)
    assert engine_seconds(eng, "fp32", 2, layers=40, accum=2, calls=37) == pytest.approx(0.004 + 0.0007 * 37)
    assert engine_seconds(eng, "fp32", 2, layers=10, accum=2, checkpointing=True, calls=5) == pytest.approx(
        0.004 + 0.0007 * 5 + 0.002 * 20)
    assert engine_seconds(eng, "fp32", 2, layers=10, accum=2) == pytest.approx(0.004)


@pytest.mark.slow
@pytest.mark.timed
def test_real_engines_fit_and_the_time_model_adds_the_fit(tmp_path):
    pytest.importorskip("deepspeed")
    from zerokit.spec.profile import load_profile
    from zerokit.measure.engine_fit import SEQ_LEN, MICRO_BATCH, measure_engine_overhead, synthetic_engine_config
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.model import load_model_spec
    from zerokit.estimate.timing import collective_calls_per_step, estimate_time
    from zerokit.measure.engine_fit import PER_CALL_STAGES
    from zerokit.spec.setup import Workload, ZeroSetup

    # a profile as calibrate writes it before the engine step (the committed CPU benchmark profile)
    prof = load_profile(Path(__file__).resolve().parents[1] / "bench/results/accuracy_cpu_profile.json")
    prof.pop("engine_overhead", None)
    eng = measure_engine_overhead(prof, ["fp32"], world_size=2, threads=1)
    fits = eng["by_precision"]["fp32"]
    assert set(fits) == {str(s) for s in STAGES}
    for stage in STAGES:
        fit = fits[str(stage)]
        assert fit["per_step_s"] >= 0 and fit["per_layer_micro_s"] >= 0
        assert fit["per_layer_recompute_s"] >= 0
        runs = {(r["layers"], r["accum"], r["ckpt"], r["offload"]): r for r in fit["runs"]}
        assert set(runs) == set(RUNS + (OFFLOAD_RUNS if stage else ()))
        assert ("offload" in fit) == (stage > 0) and all(v >= 0 for v in fit.get("offload", {}).values())
        assert all(r["seconds"] > 0 and r["predicted_s"] > 0 for r in runs.values())
        assert runs[(4, 1, False, "none")]["seconds"] > runs[(1, 1, False, "none")]["seconds"]  # more layers cost more
    # the fitted terms reach the prediction of the same setups through the profile
    prof["engine_overhead"] = eng
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(prof))
    cluster = build_cluster(gpu="cpu", gpus_per_node=2, hardware_profile=str(path))
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(synthetic_engine_config(4)))
    spec = load_model_spec(str(model_dir))
    for stage in STAGES:
        r = next(r for r in fits[str(stage)]["runs"] if (r["layers"], r["accum"], r["ckpt"], r["offload"]) == (4, 2, False, "none"))
        setup = ZeroSetup(zero_stage=stage, precision="fp32", micro_batch_size=MICRO_BATCH, gradient_accumulation_steps=2)
        t = estimate_time(spec, cluster, setup, Workload(seq_len=SEQ_LEN))
        fit = fits[str(stage)]
        calls = collective_calls_per_step(spec, cluster, setup)
        assert r["calls"] == calls.reduces + calls.gathers
        if stage in PER_CALL_STAGES:  # ZeRO-1/2: per collective call of the step (2 ranks: 36 fp32 buckets here)
            assert fit["per_layer_micro_s"] == 0.0 and fit["per_call_s"] >= 0
            assert t.engine_seconds == pytest.approx(fit["per_step_s"] + fit["per_call_s"] * r["calls"])
        else:
            assert "per_call_s" not in fit
            assert t.engine_seconds == pytest.approx(fit["per_step_s"] + fit["per_layer_micro_s"] * 8)
        assert t.step_seconds - t.engine_seconds == pytest.approx(r["predicted_s"], rel=1e-6)


def _tiny_llama_lora():
    from zerokit.spec.finetune import Finetune, finetuned_spec
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.resolve import resolve_model

    src = str(resolve_model("tiny-llama").config_file())
    return finetuned_spec(load_model_spec(src), src, Finetune(mode="lora"))


def test_peft_modules_priced_at_the_fitted_costs_else_the_older_rules():
    """timing.peft_module_seconds: with a stage's fits from the LoRA engines (engine_fit.measure_peft_module_costs),
    every module peft adds costs per_peft_module_s per micro step and per_peft_module_recompute_s more when its layer is
    recomputed; without them (older profiles) ZeRO-3 keeps its hook rule and recompute its fixed cost over the layer's
    13 modules. A full model adds no module: nothing."""
    from zerokit.estimate.timing import (CALIBRATION_MODULES_PER_LAYER, peft_module_seconds,
                                         zero3_module_hook_seconds)
    from zerokit.spec.setup import ZeroSetup

    lora = _tiny_llama_lora()
    assert lora.trained.extra_modules_per_layer == 70  # peft's modules per tiny-llama layer (tests/test_finetune.py)
    modules = lora.trained.extra_modules_per_layer * lora.num_layers * 2
    coef = {"recompute": 0.0017}
    fitted = {"by_precision": {"bf16": {"2": {"per_step_s": 0.0, "per_layer_micro_s": 0.0, "per_peft_module_s": 2e-5,
                                              "per_peft_module_recompute_s": 1e-5},
                                        "3": {"per_step_s": 0.0, "per_layer_micro_s": 0.008, "per_peft_module_s": 2.4e-4,
                                              "per_peft_module_recompute_s": 1.9e-4}}}}
    z2 = ZeroSetup(zero_stage=2, precision="bf16", gradient_accumulation_steps=2)
    z3 = ZeroSetup(zero_stage=3, precision="bf16", gradient_accumulation_steps=2)
    ckpt = {"activation_checkpointing": True}
    assert peft_module_seconds(fitted, coef, lora, z2) == pytest.approx(2e-5 * modules)
    assert peft_module_seconds(fitted, coef, lora, replace(z2, **ckpt)) == pytest.approx(3e-5 * modules)
    assert peft_module_seconds(fitted, coef, lora, replace(z3, **ckpt)) == pytest.approx(4.3e-4 * modules)
    assert peft_module_seconds(fitted, coef, lora, replace(z2, precision="fp16")) == pytest.approx(
        2e-5 * modules)  # fp16 takes bf16's, as engine_seconds does
    full = lora.with_trained(extra_modules_per_layer=0)
    assert peft_module_seconds(fitted, coef, full, replace(z3, **ckpt)) == 0.0
    # an older profile: stage 3's measured hooks alone, recompute at the layer's fixed cost per module
    older = {"by_precision": {"bf16": {"2": {"per_step_s": 0.0, "per_layer_micro_s": 0.0},
                                       "3": {"per_step_s": 0.0, "per_layer_micro_s": 0.008, "per_peft_module_s": 2.4e-4}}}}
    assert peft_module_seconds(older, coef, lora, z2) == 0.0
    assert peft_module_seconds(older, coef, lora, replace(z2, **ckpt)) == pytest.approx(
        0.0017 * modules / CALIBRATION_MODULES_PER_LAYER)
    assert peft_module_seconds(older, coef, lora, z3) == pytest.approx(zero3_module_hook_seconds(older, lora, z3)) \
        == pytest.approx(2.4e-4 * modules)


@pytest.mark.slow
@pytest.mark.timed
def test_real_lora_engines_fit_a_cost_per_peft_module(tmp_path):
    """measure_peft_module_costs on real DeepSpeed engines with peft LoRA on every Linear, ZeRO-0 and 3 over gloo on 2
    ranks: each run priced without peft's module costs; the fit is the plain runs' slope per module, then the
    checkpointed runs' beyond it, and the estimate charges exactly that. Timed at ZeRO-0 and ZeRO-3, the least and
    the most hooked (ZeRO-1/2 run ZeRO-0's module code; calibrate times all four). ZeRO-3 hooks every submodule
    (fetch, release, trace: parameter_offload.py), so its cost per module is the highest (measured 203-244 us against
    12-37 us at ZeRO-0/1/2 on this CPU, 2026-11-26)."""
    pytest.importorskip("peft")
    from zerokit.estimate.timing import estimate_time, peft_module_seconds
    from zerokit.measure.engine_fit import MICRO_BATCH, PEFT_RUNS, SEQ_LEN, measure_peft_module_costs
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.profile import load_profile
    from zerokit.spec.setup import Workload, ZeroSetup

    prof = load_profile(Path(__file__).resolve().parents[1] / "bench/results/accuracy_cpu_profile_20261126.json")
    stages = (0, 3)
    out = measure_peft_module_costs(prof, ["bf16"], world_size=2, threads=1, stages=stages)
    fits = prof["engine_overhead"]["by_precision"]["bf16"]
    assert set(out["bf16"]) == set(stages)
    for stage in stages:
        fit = fits[str(stage)]
        runs = {(r["layers"], r["ckpt"]): r for r in fit["peft_runs"]}
        assert set(runs) == {(layers, ckpt) for layers, _, ckpt, _ in PEFT_RUNS}
        assert all(r["extra_modules"] == 70 and r["seconds"] > 0 and r["predicted_s"] > 0 for r in runs.values())
        assert runs[(8, False)]["seconds"] > runs[(4, False)]["seconds"]
        plain = [(70 * r["layers"], r["seconds"] - r["predicted_s"]) for r in runs.values() if not r["ckpt"]]
        slope = max(0.0, sum(x * y for x, y in plain) / sum(x * x for x, _ in plain))
        assert fit["per_peft_module_s"] == pytest.approx(slope)
        assert fit["per_peft_module_recompute_s"] >= 0
        assert out["bf16"][stage] == (fit["per_peft_module_s"], fit["per_peft_module_recompute_s"])
    assert fits["3"]["per_peft_module_s"] > 2 * fits["0"]["per_peft_module_s"]

    # the fitted terms reach the estimate: the same LoRA setup costs its priced-without run plus the fit
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(prof))
    cluster = build_cluster(gpu="cpu", gpus_per_node=2, hardware_profile=str(path))
    lora = _tiny_llama_lora()
    for stage in stages:
        setup = ZeroSetup(zero_stage=stage, precision="bf16", micro_batch_size=MICRO_BATCH, activation_checkpointing=True)
        t = estimate_time(lora, cluster, setup, Workload(seq_len=SEQ_LEN))
        fit = fits[str(stage)]
        extra = (fit["per_peft_module_s"] + fit["per_peft_module_recompute_s"]) * 70 * lora.num_layers
        assert peft_module_seconds(prof["engine_overhead"], None, lora, setup) == pytest.approx(extra)
        bare = estimate_time(lora.with_trained(extra_modules_per_layer=0), cluster, setup, Workload(seq_len=SEQ_LEN))
        assert t.step_seconds - bare.step_seconds == pytest.approx(extra * cluster.profile.cpu_oversubscription(2), rel=1e-6)


def test_model_parallel_calls_priced_at_the_fitted_cost_else_the_latencies(tmp_path):
    """timing.model_parallel_call_seconds: with a fitted cost per TP / SP call in the profile (engine_fit
    measure_model_parallel_calls), every call of model_parallel_calls at that cost, ring steps counted; without one,
    the back-to-back latencies (all-reduce for AutoTP, all-to-all for Ulysses, all-gather for the gathers); and the
    step time moves by exactly the difference."""
    from zerokit.estimate.timing import (estimate_time, model_parallel_call_seconds, model_parallel_calls,
                                         ring_steps)
    from zerokit.measure.engine_fit import synthetic_engine_config
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.profile import load_profile
    from zerokit.spec.setup import Workload, ZeroSetup

    prof = load_profile(Path(__file__).resolve().parents[1] / "bench/results/accuracy_cpu_profile.json")
    for fits in prof["engine_overhead"]["by_precision"].values():
        fits.pop("tp", None), fits.pop("sp", None)
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(synthetic_engine_config(4, (4, 2))))
    spec = load_model_spec(str(model_dir))
    work = Workload(seq_len=64)

    def price(profile, **setup):
        path = tmp_path / "prof.json"
        path.write_text(json.dumps(profile))
        ranks = setup.get("tensor_parallel", 1) * setup.get("sequence_parallel", 1)
        cluster = build_cluster(gpu="cpu", gpus_per_node=max(2, ranks), hardware_profile=str(path))
        s = ZeroSetup(zero_stage=2, precision="bf16", micro_batch_size=2, **setup)
        return cluster, s, estimate_time(spec, cluster, s, work).step_seconds

    for kind, setup, latency in (("tp", {"tensor_parallel": 2}, "all_reduce_latency_s"),
                                 ("sp", {"sequence_parallel": 2}, "all_to_all_latency_s"),
                                 ("sp", {"sequence_parallel": 4}, "all_to_all_latency_s")):
        cluster, s, before = price(prof, **setup)
        calls = model_parallel_calls(spec, s)
        steps = ring_steps(s.tensor_parallel * s.sequence_parallel)
        back_to_back = (calls.reduces * prof[latency] + calls.gathers * prof["all_gather_latency_s"]) * steps
        assert model_parallel_call_seconds(cluster.profile.timing, spec, s) == pytest.approx(back_to_back)
        fitted = json.loads(json.dumps(prof))
        fitted["engine_overhead"]["by_precision"]["bf16"][kind] = {"per_call_s": 0.0004}
        cluster, s, after = price(fitted, **setup)
        in_step = (calls.reduces + calls.gathers) * steps * 0.0004
        assert model_parallel_call_seconds(cluster.profile.timing, spec, s) == pytest.approx(in_step)
        # (CPU ranks beyond the profile's cores share them: every term slower by the same factor)
        share = cluster.profile.cpu_oversubscription(cluster.gpus_per_node)
        assert after - before == pytest.approx(share * (in_step - back_to_back))
    cluster, s, _ = price(prof)
    assert model_parallel_call_seconds(cluster.profile.timing, spec, s) == 0.0  # no TP, no SP: no calls


@pytest.mark.slow
@pytest.mark.timed
def test_real_tp_and_sp_engines_fit_a_cost_per_call(tmp_path):
    """measure_model_parallel_calls on real DeepSpeed engines: AutoTP 2 and Ulysses SP 2 over gloo on 2 ranks, at 1 and
    8 layers. Each run is priced without its TP / SP calls and carries their count (model_parallel_calls, as counted on
    real steps in tests/test_timing.py); the deeper engine costs more; the fit is what the estimate then charges."""
    pytest.importorskip("deepspeed")
    from zerokit.estimate.timing import model_parallel_fit
    from zerokit.measure.engine_fit import MODEL_PARALLEL_RUNS, measure_model_parallel_calls
    from zerokit.spec.profile import load_profile

    prof = load_profile(Path(__file__).resolve().parents[1] / "bench/results/accuracy_cpu_profile.json")
    out = measure_model_parallel_calls(prof, ["bf16"], world_size=2, threads=1)
    assert set(out) == {"bf16"} and set(out["bf16"]) == {"tp", "sp"}
    fits = prof["engine_overhead"]["by_precision"]["bf16"]
    for kind in ("tp", "sp"):
        runs = {r["layers"]: r for r in fits[kind]["runs"]}
        assert set(runs) == {r[0] for r in MODEL_PARALLEL_RUNS}
        shallow, deep = runs[min(runs)], runs[max(runs)]
        assert deep["seconds"] > shallow["seconds"] and deep["mp_calls"] > shallow["mp_calls"] > 0
        assert all(r["kind"] == kind and 0 < r["predicted_s"] for r in runs.values())
        # the least-squares slope through the origin, as the estimate reads it back
        pts = [(r["mp_calls"], r["seconds"] - r["predicted_s"]) for r in runs.values()]
        slope = max(0.0, sum(x * y for x, y in pts) / sum(x * x for x, _ in pts))
        assert fits[kind]["per_call_s"] == pytest.approx(slope) == model_parallel_fit(prof["engine_overhead"], "bf16", kind)


def test_zero3_calls_over_a_wider_ring_priced_at_the_fitted_latency_else_back_to_back(tmp_path):
    """timing.zero_call_seconds: ZeRO-3 over more than 2 ranks with a fitted ring latency in the profile
    (engine_fit.measure_zero_ring_calls), every call x its ring steps at that latency; without one, or over 2 ranks
    (what the 2-rank engine fits were fitted against), or at ZeRO-1/2, the back-to-back latencies per kind x ring steps;
    a profile whose latencies were measured on a wider ring (8 GPUs) already holds its ring's steps. The step time
    moves by exactly the difference, times the CPU's oversubscription."""
    from zerokit.estimate.timing import collective_calls_per_step, estimate_time, ring_steps, zero_call_seconds
    from zerokit.measure.engine_fit import synthetic_engine_config
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.profile import load_profile
    from zerokit.spec.setup import Workload, ZeroSetup

    prof = load_profile(Path(__file__).resolve().parents[1] / "bench/results/accuracy_cpu_profile.json")
    for fits in prof["engine_overhead"]["by_precision"].values():
        fits["3"].pop("ring", None)
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(synthetic_engine_config(4)))
    spec = load_model_spec(str(model_dir))
    work = Workload(seq_len=64)

    def price(profile, ranks, stage):
        path = tmp_path / "prof.json"
        path.write_text(json.dumps(profile))
        cluster = build_cluster(gpu="cpu", gpus_per_node=ranks, hardware_profile=str(path))
        s = ZeroSetup(zero_stage=stage, precision="fp32", micro_batch_size=2)
        return cluster, s, estimate_time(spec, cluster, s, work).step_seconds

    fitted = json.loads(json.dumps(prof))
    fitted["engine_overhead"]["by_precision"]["fp32"]["3"]["ring"] = {"ranks": 4, "per_call_s": 0.001}
    for ranks, stage in ((4, 3), (2, 3), (4, 2)):
        cluster, s, before = price(prof, ranks, stage)
        calls = collective_calls_per_step(spec, cluster, s)
        back_to_back = ((calls.reduces * prof["all_reduce_latency_s"] + calls.gathers * prof["all_gather_latency_s"])
                        * ring_steps(ranks))
        assert zero_call_seconds(cluster.profile.timing, spec, cluster, s) == pytest.approx(back_to_back)
        cluster, s, after = price(fitted, ranks, stage)
        if (ranks, stage) == (4, 3):
            in_step = (calls.reduces + calls.gathers) * ring_steps(4) * 0.001
            assert in_step != pytest.approx(back_to_back)
            assert zero_call_seconds(cluster.profile.timing, spec, cluster, s) == pytest.approx(in_step)
            share = cluster.profile.cpu_oversubscription(cluster.gpus_per_node)
            assert share == 2  # 4 ranks on the profile's 2 cores
            assert after - before == pytest.approx(share * (in_step - back_to_back))
        else:
            assert after == pytest.approx(before)
    # latencies measured on 8 ranks were 7 ring steps each: an 8-rank call costs what was measured, a 4-rank one 3/7
    wide = json.loads(json.dumps(prof))
    wide["collectives"]["world_size"] = 8
    for ranks in (8, 4):
        path = tmp_path / "wide.json"
        path.write_text(json.dumps(wide))
        cluster = build_cluster(gpu="cpu", gpus_per_node=ranks, hardware_profile=str(path))
        s = ZeroSetup(zero_stage=2, precision="fp32", micro_batch_size=2)
        calls = collective_calls_per_step(spec, cluster, s)
        measured = calls.reduces * prof["all_reduce_latency_s"] + calls.gathers * prof["all_gather_latency_s"]
        assert zero_call_seconds(cluster.profile.timing, spec, cluster, s) == pytest.approx(
            measured * ring_steps(ranks) / ring_steps(8))


@pytest.mark.slow
@pytest.mark.timed
def test_real_zero3_engines_on_4_ranks_fit_a_ring_latency(tmp_path):
    """measure_zero_ring_calls on real DeepSpeed engines: ZeRO-3 over gloo on 4 ranks at 1 and 8 layers. Each run is
    priced without ZeRO's call latencies and carries its calls x ring steps x oversubscription (4 ranks on the profile's
    2 cores: 2); the deeper engine makes more calls and costs more; the fit is the slope the estimate reads back."""
    pytest.importorskip("deepspeed")
    from zerokit.estimate.timing import zero_ring_fit
    from zerokit.measure.engine_fit import RING_RANKS, RING_RUNS, measure_zero_ring_calls
    from zerokit.spec.profile import load_profile

    prof = load_profile(Path(__file__).resolve().parents[1] / "bench/results/accuracy_cpu_profile.json")
    out = measure_zero_ring_calls(prof, ["fp32"], threads=1)
    assert set(out) == {"fp32"}
    ring = prof["engine_overhead"]["by_precision"]["fp32"]["3"]["ring"]
    assert ring["ranks"] == RING_RANKS == 4
    runs = {r["layers"]: r for r in ring["runs"]}
    assert set(runs) == {r[0] for r in RING_RUNS}
    shallow, deep = runs[min(runs)], runs[max(runs)]
    assert deep["seconds"] > shallow["seconds"] and deep["ring_calls"] > shallow["ring_calls"] > 0
    assert all(r["kind"] == "ring" and r["stage"] == 3 and 0 < r["predicted_s"] for r in runs.values())
    pts = [(r["ring_calls"], r["seconds"] - r["predicted_s"]) for r in runs.values()]
    slope = max(0.0, sum(x * y for x, y in pts) / sum(x * x for x, _ in pts))
    assert ring["per_call_s"] == pytest.approx(slope) == zero_ring_fit(prof["engine_overhead"], "fp32")
