"""What the DeepSpeed engine itself costs per step, measured on real engines (part of `zerokit calibrate`).

The step-time model prices compute from timed HF models (compute_fit.py), collectives from their measured
per-call latency and the optimizer from its measured rate. A real DeepSpeed step also runs the engine's
own Python: ZeRO-3's pre/post forward and backward hooks on every module (fetch, release, prefetch
bookkeeping), ZeRO-1/2's per-parameter gradient hooks and bucket copies, the optimizer wrapper (fp32
master partition, gradient norm, overflow check, copying the partition back). On small models and
small micro batches these dominate (measured on this project's 2-vCPU machine: the model without them
missed tiny-model ZeRO-3 steps by 60-85 ms, 35-45%).

This module trains a synthetic Llama-style model (hidden 96, 3 heads, 1 KV head, vocab 1024: no shape
of the bundled or benchmark models) with every ZeRO stage at 1 and 4 layers, accumulation 1 and 2, and
checkpointed (and at ZeRO-1..3 with the optimizer offloaded to the CPU), in every supported precision, on
`world_size` ranks at once, and fits per precision and stage
    measured - zerokit's prediction without engine costs = per_step_s + per_layer_micro_s x layers x accumulation
(least squares over the three runs without checkpointing, both terms >= 0; at ZeRO-1/2 per collective call of the
step in place of per layer and micro step: PER_CALL_STAGES says why) and, from the checkpointed run,
per_layer_recompute_s: what recompute costs per layer and micro step beyond the terms already priced, and from
the two offloaded runs the same two terms for what optimizer offload adds ("offload").
timing.py adds the fitted terms to the stage's step.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from zerokit.core.errors import ZerokitError
from zerokit.core.process import finish_rank

# (layers, accumulation, activation checkpointing, optimizer offload) per stage: the per-layer slope needs two
# depths, the split between per-step and per-micro-step costs a second accumulation, recompute's own cost a
# checkpointed run; optimizer offload (ZeRO-1..3) its own per-step and per-layer costs at two depths
RUNS = ((1, 1, False, "none"), (4, 1, False, "none"), (4, 2, False, "none"), (4, 1, True, "none"))
OFFLOAD_RUNS = ((1, 1, False, "cpu"), (4, 1, False, "cpu"))
# `calibrate --quick`: the two depths alone, one pass. Without them a quick profile priced no engine at all, and the
# demo's ZeRO-0 bf16 step (tiny-llama, 2 ranks) came out 1.5-2.0x slower than predicted: DeepSpeed's BF16_Optimizer
# step and its gradient all-reduce took ~20 ms of a ~77 ms step (wall_clock_breakdown) that no other term prices
QUICK_RUNS = ((1, 1, False, "none"), (4, 1, False, "none"))
STAGES = (0, 1, 2, 3)
# Stages whose engine cost is fitted per collective call of the step instead of per layer and micro step: ZeRO-1/2's
# gradient hooks copy into buckets and every bucket's reduce waits on the other rank, which the 4 KiB back-to-back
# latency under-prices (a calibration that measured it at 1.09 ms fitted 6.4-7.4 ms per synthetic layer of 9 buckets;
# one that measured 2.10 ms, none). Per layer, that cost reached LoRA models, whose adapters fill a few buckets per
# step: ZeRO-2 LoRA rows 15-48% over (bench/results/accuracy_cpu_finetune.txt, rerun 2026-11-26 08:21).
PER_CALL_STAGES = (1, 2)
ENGINE_PASSES = 2
# Every stage under LoRA (measure_peft_module_costs): the same engines with peft's adapters on every Linear, at two
# depths, and checkpointed at both (what a recomputed module costs): each engine's fastest of PEFT_PASSES passes
PEFT_RUNS = ((4, 1, False, "none"), (8, 1, False, "none"), (4, 1, True, "none"), (8, 1, True, "none"))
PEFT_PASSES = 2
LORA_R = 8
MICRO_BATCH, SEQ_LEN = 2, 64
STEPS, WARMUP = 12, 2


# TP 2 and SP 2 engines (measure_model_parallel_calls) at two depths, at ZeRO-2 (both run under it); 4 query and 2 K/V
# heads of 24, as AutoTP shards both and Ulysses splits the heads over the group
MODEL_PARALLEL_RUNS = ((1, 1, False, "none"), (8, 1, False, "none"))
MODEL_PARALLEL_STAGE = 2
MODEL_PARALLEL_DEGREE = 2
MODEL_PARALLEL_HEADS = (4, 2)
MODEL_PARALLEL_PASSES = 3

# ZeRO-3 engines on a ring wider than calibration's 2 ranks (measure_zero_ring_calls): 4 ranks, as the 4-rank grid
# rows (hpZ) run on the 2-core machine, at two depths; each engine's fastest of RING_PASSES passes
RING_RANKS = 4
RING_RUNS = ((1, 1, False, "none"), (8, 1, False, "none"))
RING_PASSES = 2


def synthetic_engine_config(layers: int, heads: tuple[int, int] = (3, 1)) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 96, "intermediate_size": 256,
            "num_attention_heads": heads[0], "num_key_value_heads": heads[1], "num_hidden_layers": layers, "vocab_size": 1024,
            "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
            "attention_dropout": 0.0, "torch_dtype": "float32"}


def _rank_main() -> None:
    """One rank: train every job's engine for STEPS steps, print the median step time after WARMUP (rank 0)."""
    import warnings

    warnings.filterwarnings("ignore")
    import deepspeed
    import torch
    import torch.distributed as dist
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig
    import torch._dynamo  # as zerokit.launching.train: imported before zero.Init

    spec = json.loads(os.environ["ZEROKIT_ENGINE_SPEC"])
    # the backend zerokit.launching.train gets: the accelerator's default (gloo on CPU, nccl on GPUs)
    deepspeed.init_distributed(auto_mpi_discovery=False, verbose=False)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if spec["backend"] == "nccl" else torch.device("cpu")
    results = []
    sp_mpus: dict = {}
    for job in spec["jobs"]:
        cfg = job["ds_config"]
        keep = HfDeepSpeedConfig(cfg) if cfg["zero_optimization"]["stage"] == 3 else None  # held while the model builds: transformers then builds it under zero.Init
        torch.manual_seed(0)
        conf = AutoConfig.from_pretrained(job["model_dir"])
        model = AutoModelForCausalLM.from_config(conf)
        if job["ckpt"]:
            model.gradient_checkpointing_enable()  # as zerokit.launching.train does
        model.config.use_cache = False  # as zerokit.launching.train runs it (a KV cache in training costs time)
        sp = int(cfg.get("sequence_parallel_size") or 1)
        mpu = None
        if sp > 1:  # Ulysses as zerokit.launching.parallel.register_ulysses sets it up: the sdpa wrapper and the SP groups,
            # once per process (DeepSpeed asserts "sequence parallel group is already initialized"; the wrapper replaces
            # sdpa in transformers' registry, so the later models of the same shape run it too)
            if sp not in sp_mpus:
                from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

                sp_mpus[sp] = UlyssesSPAttentionHF.register_with_transformers(
                    model_name_or_path=model, core_attn_implementation="sdpa", sequence_parallel_size=sp,
                    micro_batch_size=cfg["train_micro_batch_size_per_gpu"], seq_length_is_variable=True)
            mpu = sp_mpus[sp]
        if job.get("lora_r"):  # as zerokit.launching.train applies LoRA: peft over the (zero.Init) base, then at
            # ZeRO-3 the adapters cast to a 16-bit run's dtype (DeepSpeed skips them: see launching/train.py)
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=job["lora_r"], target_modules="all-linear"))
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(job["precision"])
            for p in model.parameters():
                if dtype is not None and not hasattr(p, "ds_id") and p.is_floating_point() and p.dtype != dtype:
                    p.data = p.data.to(dtype)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                          config=cfg, mpu=mpu)
        # the same sample on every rank (the seed above): what a TP or SP group reads
        x = torch.randint(0, conf.vocab_size, (cfg["train_micro_batch_size_per_gpu"], job["seq_len"]),
                          generator=torch.Generator().manual_seed(0)).to(device)
        batch = {"input_ids": x, "labels": x}
        if sp > 1:  # this rank's slice of the sequence, with its global positions (launching/parallel.sp_shard); the loss
            # is the slice's own (the group's weighted mean adds two small all_gathers, priced by their latency)
            chunk = job["seq_len"] // sp
            lo = chunk * (dist.get_rank() % sp)
            pos = torch.arange(lo, lo + chunk, device=device).unsqueeze(0).expand(x.shape[0], chunk)
            batch = {"input_ids": x[:, lo:lo + chunk], "labels": x[:, lo:lo + chunk], "position_ids": pos}
        times = []
        dist.barrier()
        for _ in range(STEPS):
            # no barrier per step: a training loop's ranks meet only in the engine's collectives (a barrier
            # before every step puts both ranks' compute in lockstep and measured ~20% slower steps here)
            t0 = time.perf_counter()
            for _ in range(cfg["gradient_accumulation_steps"]):
                loss = engine(**batch).loss
                engine.backward(loss)
                engine.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        t = torch.tensor([statistics.median(times[WARMUP:])], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        results.append({**{k: job[k] for k in ("precision", "stage", "layers", "accum", "ckpt", "offload", "kind")},
                        "seconds": float(t.item())})
        engine.destroy()
        del engine, model, keep
    dist.barrier()
    if dist.get_rank() == 0:
        print("ZEROKIT_ENGINE " + json.dumps(results), flush=True)
    # out as zerokit's other ranks end (core.process.finish_rank): the groups closed, then no interpreter teardown.
    # Closing the groups alone was not enough: a clean CI lost test_calibrate_engine to "rank 0 exited -6: terminate
    # called without an active exception" at this rank's exit, after its result was printed
    finish_rank(0)


def _fit(points: list[tuple[float, float]]) -> dict:
    """resid = a + b x, least squares, a, b >= 0 (x = layers x accumulation)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    a = my - b * mx
    if b < 0:
        a, b = max(0.0, my), 0.0
    elif a < 0:
        a, b = 0.0, max(0.0, sum(x * y for x, y in points) / sum(x * x for x, _ in points))
    return {"per_step_s": a, "per_layer_micro_s": b}


def _slope_through_origin(points: list[tuple[float, float]]) -> float:
    """y = b x, least squares, b >= 0 (0 without points off x = 0)."""
    sxx = sum(x * x for x, _ in points)
    return max(0.0, sum(x * y for x, y in points) / sxx) if sxx else 0.0


def _run_engines(profile: dict, precisions: list[str], stages, runs_of, world_size: int, threads: int | None,
                 timeout_s: float, log, finetune=None, job_extra: dict | None = None, kind: str = "dp") -> list[dict]:
    """Train the synthetic engines (runs_of(stage): (layers, accumulation, checkpointing, offload) each) on
    `world_size` local ranks; each row has its measured median step seconds and predicted_s, its price with
    `profile` (finetune(spec, model_dir): the spec as fine-tuned; the cost of peft's modules, timing.peft_module_seconds,
    left out, as that is what measure_peft_module_costs measures) and extra_modules (peft's per layer). kind "tp" / "sp": every engine
    TP or SP MODEL_PARALLEL_DEGREE on the MODEL_PARALLEL_HEADS model, its TP / SP calls left out of predicted_s (what
    measure_model_parallel_calls measures), with mp_calls: those calls per step, ring steps counted. kind "ring": ZeRO's
    calls' latency left out of predicted_s (what measure_zero_ring_calls measures), with ring_calls: those calls per
    step x ring steps x the CPU's oversubscription (all that estimate_time multiplies a latency by)."""
    import torch

    from zerokit.config.render import render_ds_config
    from zerokit.estimate.timing import (collective_calls_per_step, estimate_time,
                                         model_parallel_call_seconds,
                                         model_parallel_call_steps, peft_module_seconds, zero_call_seconds,
                                         zero_call_steps)
    from zerokit.measure.ranks import free_port, run_local_ranks, tagged_json
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.setup import Workload, ZeroSetup

    say = log or (lambda m: None)
    on_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= world_size
    with tempfile.TemporaryDirectory(prefix="zerokit-engine-") as tmp:
        tmp = Path(tmp)
        prof_path = tmp / "profile.json"
        prof_path.write_text(json.dumps(profile))
        cluster = build_cluster(gpu=None if on_gpu else "cpu", gpus_per_node=world_size, hardware_profile=str(prof_path))
        engine_terms = cluster.profile.timing.engine_overhead if cluster.profile is not None else None

        def coefs(spec, precision):
            return cluster.profile.timing.compute_coefficients(spec.gated_mlp, precision) if cluster.profile else None
        workload = Workload(seq_len=SEQ_LEN)
        jobs, preds, modules, mp_calls, ring_calls, calls = [], {}, {}, {}, {}, {}
        specs = {}
        for layers in sorted({run[0] for stage in stages for run in runs_of(stage)}):
            d = tmp / f"layers{layers}"
            d.mkdir()
            heads = MODEL_PARALLEL_HEADS if kind in ("tp", "sp") else (3, 1)
            (d / "config.json").write_text(json.dumps(synthetic_engine_config(layers, heads)))
            spec = load_model_spec(str(d))
            specs[layers] = (str(d), finetune(spec, str(d)) if finetune else spec)
        for precision in precisions:
            for stage in stages:
                for layers, accum, ckpt, off in runs_of(stage):
                    model_dir, spec = specs[layers]
                    setup = ZeroSetup(zero_stage=stage, precision=precision, micro_batch_size=MICRO_BATCH,
                                      gradient_accumulation_steps=accum, activation_checkpointing=ckpt,
                                      offload_optimizer=off,
                                      tensor_parallel=MODEL_PARALLEL_DEGREE if kind == "tp" else 1,
                                      sequence_parallel=MODEL_PARALLEL_DEGREE if kind == "sp" else 1)
                    cfg = render_ds_config(setup, cluster, spec, workload, lr=1e-4, warmup_steps=1, total_steps=STEPS)
                    jobs.append({"precision": precision, "stage": stage, "layers": layers, "accum": accum, "ckpt": ckpt,
                                 "offload": off, "seq_len": SEQ_LEN, "model_dir": model_dir, "ds_config": cfg,
                                 "kind": kind, **(job_extra or {})})
                    key = (precision, stage, layers, accum, ckpt, off)
                    preds[key] = estimate_time(spec, cluster, setup, workload).step_seconds
                    made = collective_calls_per_step(spec, cluster, setup)
                    calls[key] = made.reduces + made.gathers
                    if kind in ("tp", "sp"):
                        preds[key] -= model_parallel_call_seconds(cluster.profile.timing, spec, setup)
                        mp_calls[key] = model_parallel_call_steps(spec, setup)
                    elif kind == "ring":
                        share = cluster.profile.cpu_oversubscription(cluster.gpus_per_node)
                        preds[key] -= share * zero_call_seconds(cluster.profile.timing, spec, cluster, setup)
                        ring_calls[key] = share * zero_call_steps(spec, cluster, setup)
                    if spec.trained.extra_modules_per_layer:
                        preds[key] -= peft_module_seconds(engine_terms, coefs(spec, precision), spec, setup)
                    modules[key] = spec.trained.extra_modules_per_layer
        spec_env = {"jobs": jobs, "backend": "nccl" if on_gpu else "gloo"}
        port = free_port()
        env = dict(os.environ, ZEROKIT_ENGINE_SPEC=json.dumps(spec_env), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size), LOCAL_SIZE=str(world_size),
                   CROSS_RANK="0", CROSS_SIZE="1")
        # ^ what DeepSpeed's launcher sets (launcher/launch.py). Without LOCAL_SIZE its CPU accelerator counts
        # devices by running `numactl --hardware` on every device_count() call, which ZeRO-3 makes every
        # step: measured 254 ms instead of 180 ms for a tiny-llama ZeRO-3 step.
        if not on_gpu:
            env["DS_ACCELERATOR"] = "cpu"
            env["OMP_NUM_THREADS"] = str(threads or 1)
        say(f"DeepSpeed engine costs: {len(jobs)} synthetic engines on {world_size} ranks ...")
        cmd = [sys.executable, "-c", "from zerokit.measure.engine_fit import _rank_main; _rank_main()"]
        outs = run_local_ranks(cmd, [dict(env, RANK=str(r), LOCAL_RANK=str(r)) for r in range(world_size)],
                               timeout_s, "the DeepSpeed engine benchmark")
        rows = tagged_json(outs[0], "ZEROKIT_ENGINE")
        if not rows:
            raise ZerokitError("the DeepSpeed engine benchmark printed no result")
    out = []
    for r in rows:
        key = (r["precision"], r["stage"], r["layers"], r["accum"], r["ckpt"], r["offload"])
        out.append(dict(r, predicted_s=preds[key], calls=calls[key],
                        **({"extra_modules": modules[key]} if modules[key] else {}),
                        **({"mp_calls": mp_calls[key]} if key in mp_calls else {}),
                        **({"ring_calls": ring_calls[key]} if key in ring_calls else {})))
    return out


def _priced_without(profile: dict, precisions: list[str], stage: str, paths) -> tuple[dict, list[str], dict]:
    """For a fit measured on top of `profile`'s engine fits: (its engine fits by precision, the precisions among
    `precisions` with a fit for `stage`, a copy of `profile` without the entries at `paths` (each a key path under a
    precision's fits) for those precisions): a re-measurement replaces, never builds on, an earlier figure."""
    import copy

    fits = (profile.get("engine_overhead") or {}).get("by_precision") or {}
    precisions = [p for p in precisions if (fits.get(p) or {}).get(stage)]
    priced = copy.deepcopy(profile)
    for p in precisions:
        for *parents, key in paths:
            node = priced["engine_overhead"]["by_precision"][p]
            for k in parents:
                node = node[k]
            node.pop(key, None)
    return fits, precisions, priced


def _fastest_of(passes: int, run) -> list[dict]:
    """run() `passes` times (each returns the same engines' rows in the same order) and keep each engine's fastest row:
    another tenant's burst only adds time."""
    results = [run() for _ in range(passes)]
    return [min(same, key=lambda r: r["seconds"]) for same in zip(*results)]


def measure_peft_module_costs(profile: dict, precisions: list[str], world_size: int = 2, threads: int | None = None,
                              timeout_s: float = 900.0, log=None, stages: tuple[int, ...] = STAGES) -> dict:
    """What each module peft adds costs a real step at every ZeRO stage, measured: the synthetic engines with LoRA r=8
    on every Linear (PEFT_RUNS: two depths, plain and checkpointed), less their price with everything else in
    `profile` (its engine fits and its adapter compute costs included), fitted per stage on the modules peft added
    (Trained.extra_modules_per_layer x layers x micro steps) and those a checkpointed layer recomputes; least squares
    through the origin. Writes per_peft_module_s and per_peft_module_recompute_s (and peft_runs) into each precision's
    fits of `stages` (calibrate: all) and returns {precision: {stage: (per module, per recomputed module)}};
    timing.peft_module_seconds reads
    them. Why: ZeRO-3 hooks every submodule (fetch, release, trace); at ZeRO-0/1/2 the engines measured 10-17 ms over
    at 8 LoRA layers, which nothing priced, and the recompute rule before this (the layer's recompute cost over its 13
    modules, per module) priced checkpointed LoRA engines 30-52 ms over at 8 layers (2026-11-26)."""
    from zerokit.spec.finetune import Finetune, finetuned_spec

    fits, precisions, priced = _priced_without(
        profile, precisions, "3", [(str(st), k) for st in stages for k in ("per_peft_module_s", "per_peft_module_recompute_s")])
    if not precisions:
        return {}

    def finetune(spec, model_dir):
        return finetuned_spec(spec, model_dir, Finetune(mode="lora", lora_r=LORA_R))

    runs = _fastest_of(PEFT_PASSES, lambda: _run_engines(
        priced, precisions, stages, lambda stage: PEFT_RUNS, world_size, threads, timeout_s, log, finetune,
        {"lora_r": LORA_R}))
    def modules(r):
        return r["extra_modules"] * r["layers"] * r["accum"]

    out: dict = {}
    for p in precisions:
        for stage in stages:
            mine = [r for r in runs if r["precision"] == p and r["stage"] == stage]
            # per module from the plain runs; per recomputed module from the checkpointed runs, beyond that. One
            # least squares over both (a ZeRO-1 bf16 stage fit whose recompute cost came out high left the checkpointed
            # runs under their price) drove both to 0
            per_module = _slope_through_origin([(modules(r), r["seconds"] - r["predicted_s"]) for r in mine if not r["ckpt"]])
            per_recomputed = _slope_through_origin([(modules(r), r["seconds"] - r["predicted_s"] - per_module * modules(r))
                                                    for r in mine if r["ckpt"]])
            fit = fits[p][str(stage)]
            fit.update(per_peft_module_s=per_module, per_peft_module_recompute_s=per_recomputed, peft_runs=mine)
            out.setdefault(p, {})[stage] = (per_module, per_recomputed)
    return out


def measure_model_parallel_calls(profile: dict, precisions: list[str], world_size: int = 2, threads: int | None = None,
                                 timeout_s: float = 900.0, log=None) -> dict:
    """What a TP or SP collective call costs inside a real step, measured: TP 2 and SP 2 engines (ZeRO-2, the synthetic
    model with MODEL_PARALLEL_HEADS) at two depths, less their price with everything else in `profile` (its stage-2
    engine fit included), over their TP / SP calls (timing.model_parallel_calls, ring steps counted); least squares
    through the origin, so per-layer work TP or SP adds beyond the priced bytes and FLOPs (AutoTP's wrapped Linears,
    Ulysses' reshapes) is in it too. Why: calls timed back to back are not what a step pays; on the 2-core machine they
    priced TP 2 rows 9-33% over and SP 2 rows 14-26% under (bench/results/accuracy_cpu_parallel.txt as of dd53276). Writes
    {"per_call_s", "runs"} as each precision's engine_overhead "tp" and "sp" entries (timing.model_parallel_call_seconds
    reads them) and returns {precision: {"tp": s, "sp": s}}; {} where the stage-2 fit is missing or the world size is
    not a multiple of the degree (one GPU)."""
    fits, precisions, priced = _priced_without(profile, precisions, str(MODEL_PARALLEL_STAGE), [("tp",), ("sp",)])
    if not precisions or world_size % MODEL_PARALLEL_DEGREE:
        return {}
    out: dict = {}
    for kind in ("tp", "sp"):
        # MODEL_PARALLEL_PASSES passes, each engine's fastest kept (two single passes here fitted TP bf16 at 0.63 and
        # 1.05 ms a call, from 4-layer steps of 80 and 95 ms)
        runs = _fastest_of(MODEL_PARALLEL_PASSES, lambda: _run_engines(
            priced, precisions, (MODEL_PARALLEL_STAGE,), lambda stage: MODEL_PARALLEL_RUNS, world_size, threads,
            timeout_s, log, kind=kind))
        for p in precisions:
            mine = [r for r in runs if r["precision"] == p]
            per_call = _slope_through_origin([(r["mp_calls"], r["seconds"] - r["predicted_s"]) for r in mine])
            fits[p][kind] = {"per_call_s": per_call, "runs": mine}
            out.setdefault(p, {})[kind] = per_call
    return out


def measure_zero_ring_calls(profile: dict, precisions: list[str], threads: int | None = None, timeout_s: float = 900.0,
                            log=None) -> dict:
    """What a ZeRO-3 collective call costs per ring step inside real steps on a ring of RING_RANKS ranks, measured: the
    synthetic ZeRO-3 engines on RING_RANKS local ranks at two depths, less their price with everything else in
    `profile` (its 2-rank stage-3 engine fit included), over their calls x ring steps x the CPU's oversubscription
    (timing.zero_call_steps); least squares through the origin. Why: the 2-rank engine fits see one ring step, and
    the 2-rank back-to-back latency x 3 ring steps x 2 (4 ranks on 2 cores) priced the 4-rank ZeRO-3 (hpZ) rows 26-52%
    over (bench/results/accuracy_cpu_parallel.txt as of 6b037c4); that latency also swings 0.6-2.1 ms between
    calibrations of the same machine. Writes {"ranks", "per_call_s", "runs"} as each precision's stage-3 "ring" entry
    (timing.zero_call_seconds reads it) and returns {precision: seconds}; {} where the stage-3 fit is missing. Run on a
    CPU machine: on GPUs calibration's own engines already run on every GPU of the node."""
    fits, precisions, priced = _priced_without(profile, precisions, "3", [("3", "ring")])
    if not precisions:
        return {}
    runs = _fastest_of(RING_PASSES, lambda: _run_engines(priced, precisions, (3,), lambda stage: RING_RUNS, RING_RANKS,
                                                         threads, timeout_s, log, kind="ring"))
    out = {}
    for p in precisions:
        mine = [r for r in runs if r["precision"] == p]
        out[p] = _slope_through_origin([(r["ring_calls"], r["seconds"] - r["predicted_s"]) for r in mine])
        fits[p]["3"]["ring"] = {"ranks": RING_RANKS, "per_call_s": out[p], "runs": mine}
    return out


def measure_engine_overhead(profile: dict, precisions: list[str], world_size: int = 2, threads: int | None = None,
                            timeout_s: float = 900.0, log=None, offload: bool = True, quick: bool = False) -> dict:
    """Run the synthetic engines on `world_size` local ranks and fit each stage's engine terms against the
    prediction made with `profile` (the rest of the calibration). Returns {"by_precision": {precision:
    {stage: {per_step_s, per_layer_micro_s, per_layer_recompute_s, offload: {per_step_s, per_layer_micro_s},
    runs: [...]}}}} (ZeRO-1/2: per_call_s too, per_layer_micro_s 0) plus the shapes and world size (offload=False: no
    offloaded runs, no "offload" terms). quick=True (`calibrate --quick`): QUICK_RUNS once, no offload: the per-step
    and per-layer (per-call) terms, ~15 s per precision on 2 cores; recompute and offload are then not priced."""
    # ENGINE_PASSES passes, each engine's fastest kept: one slow run moves a two-point slope (single passes fitted
    # ZeRO-3 fp32's recompute at 4.7 and 16.3 ms a layer on the same machine)
    runs_of = (lambda stage: QUICK_RUNS) if quick else (lambda stage: RUNS + (OFFLOAD_RUNS if stage and offload else ()))
    rows = _fastest_of(1 if quick else ENGINE_PASSES, lambda: _run_engines(
        profile, precisions, STAGES, runs_of, world_size, threads, timeout_s, log))
    out: dict = {"world_size": world_size, "micro_batch": MICRO_BATCH, "seq_len": SEQ_LEN, "by_precision": {}}
    for precision in precisions:
        fits = out["by_precision"][precision] = {}
        for stage in STAGES:
            runs = [r for r in rows if r["stage"] == stage and r["precision"] == precision]
            plain = [r for r in runs if r["offload"] == "none"]
            per_call = stage in PER_CALL_STAGES

            def x(r):  # what the stage's cost grows with: collective calls, or layers x micro steps
                return r["calls"] if per_call else r["layers"] * r["accum"]

            fit = _fit([(x(r), r["seconds"] - r["predicted_s"]) for r in plain if not r["ckpt"]])
            slope = fit["per_layer_micro_s"]
            if per_call:
                fit = {"per_step_s": fit["per_step_s"], "per_layer_micro_s": 0.0, "per_call_s": slope}

            def beyond(r):  # what a run costs beyond the prediction and the fitted per-step and growing terms
                return r["seconds"] - r["predicted_s"] - fit["per_step_s"] - slope * x(r)

            # what recompute costs beyond its FLOPs and layer overheads (checkpoint bookkeeping, ZeRO-3's
            # forward hooks firing again), per layer and micro step
            extra = [beyond(r) / (r["layers"] * r["accum"]) for r in plain if r["ckpt"]]
            fit["per_layer_recompute_s"] = max(0.0, statistics.median(extra)) if extra else 0.0
            # optimizer offload: the CPU optimizer's wrapper, per-parameter gradient copies to the host
            # buffers and the updated partition's copy back, beyond the CPU-Adam rate already priced
            off = [(r["layers"] * r["accum"], beyond(r)) for r in runs if r["offload"] != "none"]
            if off:
                fit["offload"] = _fit(off)
            fits[str(stage)] = {**fit, "runs": runs}
    return out
