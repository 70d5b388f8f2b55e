"""zerokit's step time against published, measured DeepSpeed training runs, on the fit and the held-out half (issue 42).

Each run in bench/data/published_runs.yaml (source URL, quote, setup, measured step seconds) is planned with zerokit's
own planner pinned to the run's setup: the same `build_plan` that `zerokit plan` runs, on the catalog's figures
(`--hardware-profile none`: a calibration of this machine must not leak into GPU predictions). The predicted step time
is printed as a ratio to the measured one, beside the rule of thumb

    6 * N * tokens / (GPUs * peak * 0.40)

on the same run (N the model's parameters as zerokit counts them, tokens the step's tokens, peak the datasheet dense
peak of zerokit/data/gpus.json for the run's precision; 0.40 the MFU of EleutherAI's "Transformer Math 101").
Summary per half (bench/data/split.yaml): median and max of |log ratio| as a ratio (max(r, 1/r)), the share of runs
within 1.25x and the signed median of predicted / measured, for zerokit with its fitted figures
(zerokit/data/time_fit.json, fitted on the fit half by bench/fit_time.py), for the same priced parts with no fitted
figure (first principles) and for the rule of thumb; then the held-out half by GPU generation, ZeRO stage, offload,
model size and framework, flagging a group of 5 or more that leans more than 15% one way.

This only measures zerokit's time model; it changes nothing in it.

Usage: python bench/published_runs.py [--only REGEX] [--out bench/results/published_runs.txt]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "bench" / "data" / "published_runs.yaml"
RULE_MFU = 0.40  # EleutherAI "Transformer Math 101": 115-150 of 312 TFLOP/s on A100 is well tuned, ~0.4 of peak
WITHIN = 1.25  # the issue's "three runs in four within 1.25x" target
TABLE_COMMAND = "python bench/published_runs.py --out bench/results/published_runs.txt"

# setup key -> zerokit plan flag; the values are pinned so the planner evaluates exactly the published setup
FLAGS = {
    "gpu": "--gpu", "gpus_per_node": "--gpus-per-node", "nodes": "--nodes", "params": "--params",
    "hidden_size": "--hidden-size", "num_layers": "--num-layers", "vocab_size": "--vocab-size",
    "num_attention_heads": "--num-attention-heads", "num_kv_heads": "--num-kv-heads",
    "stage": "--stage", "offload_optimizer": "--offload-optimizer", "offload_param": "--offload-param",
    "precision": "--precision", "micro_batch": "--micro-batch", "grad_accum": "--grad-accum", "seq_len": "--seq-len",
    "activation_checkpointing": "--activation-checkpointing", "sequence_parallel": "--sequence-parallel",
    "tensor_parallel": "--tensor-parallel", "attention": "--attention", "doc_len": "--doc-len",
    "liger_kernels": "--liger-kernels", "hpz": "--hpz", "finetune": "--finetune", "lora_r": "--lora-r",
    "quantized_weights": "--zero-quantized-weights", "quantized_gradients": "--zero-quantized-gradients",
    "intra_node_bandwidth": "--intra-node-bandwidth", "inter_node_bandwidth": "--inter-node-bandwidth",
    "compile": "--compile", "tiled_loss": "--tiled-loss", "tiled_mlp": "--tiled-mlp", "cpu_memory": "--cpu-memory",
    "seq_parallel_comm_dtype": "--seq-parallel-comm-dtype",
}
# Sequence parallelism run outside DeepSpeed's engine: the framework builds its own SP groups and all-to-alls and gives
# deepspeed.initialize no SP mpu, so the engine sees data parallelism and reduces gradients in the training precision,
# not in seq_parallel_communication_data_type (engine.py sets that only with an SP group). XTuner (mmengine's
# DeepSpeedStrategy calls deepspeed.initialize without an mpu: xtuner/engine/_strategy/deepspeed.py), ms-swift and
# 360-LLaMA-Factory (the HF Trainer's deepspeed_init passes none) and EasyContext (accelerate without a parallelism
# config). ArcticTraining and accelerate's sp_backend deepspeed pass the mpu: the engine's rule holds for them.
SP_OUTSIDE_ENGINE = ("github.com/InternLM/xtuner", "github.com/modelscope/ms-swift",
                     "github.com/Qihoo360/360-LLaMA-Factory", "github.com/jzhang38/EasyContext")
# what a run did not use unless its setup says so: the planner would otherwise reach for them where the published
# setup does not fit its memory model (AutoTP, Ulysses, hpZ, ALST's tiling), pricing a setup the run never ran
UNSTATED_PINS = {"tensor_parallel": 1, "sequence_parallel": 1, "hpz": 1, "tiled_loss": False, "tiled_mlp": False}
# what a complete entry states (tests/test_published_runs.py checks these)
REQUIRED_RUN = ("id", "source", "group", "framework", "quote", "setup", "measured", "step_seconds", "conversion",
                "assumptions")
REQUIRED_SETUP = ("gpu", "gpus_per_node", "nodes", "stage", "offload_optimizer", "offload_param", "precision",
                  "micro_batch", "grad_accum", "seq_len", "activation_checkpointing")


FRAMEWORKS = ("deepspeed", "fsdp", "megatron", "colossalai", "other")
# whose tensor parallelism a run with tensor_parallel > 1 used: Megatron's (Megatron-DeepSpeed, Domino, ATorch) splits
# the embedding, the LM head and the cross-entropy by vocabulary rows (VocabParallelEmbedding,
# vocab_parallel_cross_entropy: ModelSpec.vocab_parallel, as bench/published_3d.py prices it); DeepSpeed's AutoTP
# splits the decoder's Linears and an untied head (ModelSpec.tensor_parallel_shard)
TENSOR_PARALLEL_KINDS = ("megatron", "autotp")
# setup keys that are no plan flag; lm_head false: an encoder fine-tuned with a classification head (run_glue), whose
# count holds the vocabulary once, as a tied LM's does (spec_from_params), but runs no matmul over it
SETUP_FACTS = {"model", "interconnect", "tensor_parallel_kind", "lm_head"}


class CorpusError(Exception):
    """A corpus file that cannot be read as runs: one line naming the run, the problem and the fix."""


class SetupRefused(CorpusError):
    """A well-formed run whose setup zerokit refuses to plan (TP across nodes, a shape Ulysses cannot split): a blind
    set reports it as not planned; an entry naming a GPU, model or option value zerokit lacks stays a CorpusError."""


def load_runs(path: Path = DATA) -> list[dict]:
    """The runs of a corpus file, each checked (check_run): a CorpusError names the first bad one."""
    import yaml

    try:
        runs = yaml.safe_load(path.read_text())["runs"]
    except (OSError, yaml.YAMLError, TypeError, KeyError) as e:
        raise CorpusError(f"{path}: not a corpus file ({type(e).__name__}): a YAML mapping with a 'runs' list") from e
    if not isinstance(runs, list) or not runs:
        raise CorpusError(f"{path}: 'runs' holds no run: give a list of runs (bench/data/published_runs.yaml)")
    seen: set[str] = set()
    for i, run in enumerate(runs):
        problem = check_run(run)
        if problem is None and run["id"] in seen:
            problem = f"run {run['id']}: the id is used twice: give each run its own id"
        if problem:
            raise CorpusError(problem if problem.startswith("run ") else f"run #{i + 1}: {problem}")
        seen.add(run["id"])
    return runs


def check_run(run) -> str | None:
    """Why a corpus entry cannot be planned, in one line; None when it can: every REQUIRED_RUN field, every
    REQUIRED_SETUP key, only keys FLAGS knows (with the model's name or its shape), a positive step, a known
    framework. Whether zerokit knows the GPU and model is build_plan's to say (predict)."""
    if not isinstance(run, dict) or not isinstance(run.get("setup"), dict):
        return "not a run: give a mapping with id, source, group, framework, quote, setup, measured, step_seconds"
    name = f"run {run.get('id')}" if run.get("id") else "a run without an id"
    missing = [k for k in REQUIRED_RUN if run.get(k) in (None, "")]
    if missing:
        return f"{name}: missing {', '.join(missing)}: every run states {', '.join(REQUIRED_RUN)}"
    setup = run["setup"]
    missing = [k for k in REQUIRED_SETUP if k not in setup]
    if missing:
        return f"{name}: setup lacks {', '.join(missing)}: state it, or the default taken, in assumptions"
    unknown = sorted(set(setup) - set(FLAGS) - SETUP_FACTS)
    if unknown:
        return f"{name}: unknown setup key {unknown[0]}: use one of {', '.join([*sorted(SETUP_FACTS), *FLAGS])}"
    if int(setup.get("tensor_parallel", 1)) > 1 and setup.get("tensor_parallel_kind") not in TENSOR_PARALLEL_KINDS:
        return (f"{name}: tensor_parallel {setup['tensor_parallel']} without tensor_parallel_kind: state whose it was, "
                f"{' or '.join(TENSOR_PARALLEL_KINDS)}")
    if "lm_head" in setup and not isinstance(setup["lm_head"], bool):
        return f"{name}: lm_head {setup['lm_head']!r}: give true or false"
    if "model" not in setup and not all(k in setup for k in ("params", "hidden_size", "num_layers", "vocab_size")):
        return f"{name}: no model: give model, or params, hidden_size, num_layers and vocab_size"
    try:
        if not float(run["step_seconds"]) > 0:
            raise ValueError
    except (TypeError, ValueError):
        return f"{name}: step_seconds {run['step_seconds']!r} is not a positive number of seconds"
    if run["framework"] not in FRAMEWORKS:
        return f"{name}: framework {run['framework']!r}: use one of {', '.join(FRAMEWORKS)}"
    return None


def plan_argv(setup: dict, source: str = "") -> list[str]:
    """The `zerokit plan` command line that pins every dimension of a published setup (from `source`: whose sequence
    parallelism it ran, SP_OUTSIDE_ENGINE)."""
    argv = ["plan"]
    if "model" in setup:
        argv.append(str(setup["model"]))
    setup = {**UNSTATED_PINS, **setup}
    if int(setup["sequence_parallel"]) > 1 and any(s in source for s in SP_OUTSIDE_ENGINE):
        setup.setdefault("seq_parallel_comm_dtype", setup["precision"])
    for key, flag in FLAGS.items():
        if key in setup:
            value = setup[key]
            if isinstance(value, float) and key == "params":
                value = f"{value:.6g}"
            if isinstance(value, bool):  # YAML's true/false: the on/off switches
                value = "on" if value else "off"
            argv += [flag, str(value)]
    return argv + ["--hardware-profile", "none"]


def planned(req, setup: dict):
    """The model build_plan plans for a run: Megatron's tensor parallelism holds vocab / tp rows of the embedding and
    head on each rank (TENSOR_PARALLEL_KINDS); without an LM head the vocabulary is the input embedding alone, a lookup
    (timing.matmul_params; the logits' element-wise work is still priced, as for an LM)."""
    from dataclasses import replace

    from zerokit.api import planned_model

    model = planned_model(req)
    if setup.get("lm_head") is False:
        model = replace(model, tied_embeddings=False, embedding_params=model.vocab_size * model.hidden_size)
    return replace(model, vocab_parallel=True) if setup.get("tensor_parallel_kind") == "megatron" else model


def plan_request(argv: list[str]):
    """`zerokit plan`'s parsed request for argv, quietly: a value no option takes raises ZerokitError with argparse's
    own line (it prints its usage and the error, then exits), as every other refusal does. The corpus harnesses'
    one parser (this file, bench/long_context.py)."""
    import contextlib
    import io

    from zerokit.cli import request
    from zerokit.core.errors import ZerokitError

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return request(argv)
    except SystemExit:
        raise ZerokitError((said.getvalue().strip().splitlines() or ["bad value"])[-1]) from None


def predict(run: dict) -> dict:
    """zerokit's plan of one run (pinned) and the rule of thumb on the same run."""
    from zerokit.api import build_plan
    from zerokit.core.errors import ZerokitError
    from zerokit.spec.hardware import resolve_gpu_name

    setup = run["setup"]
    try:  # the entry itself: option values the parser takes, a GPU and a model zerokit knows
        req = plan_request(plan_argv(setup, run["source"]))
        resolve_gpu_name(str(setup["gpu"]))
        model = planned(req, setup)
    except ZerokitError as e:
        raise CorpusError(f"run {run['id']}: zerokit cannot plan its setup: {e}") from e
    try:
        plan = build_plan(req, model=model)
    except ZerokitError as e:
        raise SetupRefused(f"run {run['id']}: zerokit cannot plan its setup: {e}") from e
    ev = plan.best  # the chosen setup, or the smallest when nothing fits: its time is priced either way
    t = ev.time
    acc = plan.cluster.accelerator
    gpus = int(setup["gpus_per_node"]) * int(setup["nodes"])
    peak = acc.peak_flops(setup["precision"])
    params = plan.model.params
    rule = 6 * params * t.tokens_per_step / (gpus * peak * RULE_MFU)
    return {"predicted": t.step_seconds, "rule": rule, "fits": plan.fits, "label": ev.setup.label,
            "tokens": t.tokens_per_step, "params": params, "parts": t.gpu_parts,
            "generation": acc.generation}


def spread(ratios: list[float]) -> tuple[float, float, float]:
    """(median, max) of max(r, 1/r), and the share of runs within WITHIN x."""
    folds = [math.exp(abs(math.log(r))) for r in ratios]
    return statistics.median(folds), max(folds), sum(f <= WITHIN for f in folds) / len(folds)


def central_ratios(ratios: list[float]) -> tuple[float, float]:
    """The 10th and 90th percentiles of predicted / measured (statistics.quantiles, inclusive): the ratios 80% of the
    runs fall between, what a plan's range rests on (zerokit/data/time_range.json)."""
    deciles = statistics.quantiles(ratios, n=10, method="inclusive")
    return deciles[0], deciles[-1]


def covered(ratios: list[float], low: float, high: float) -> float:
    """The share of runs whose measured step lies in [predicted / high, predicted / low]."""
    return sum(low <= r <= high for r in ratios) / len(ratios)


# zerokit's own calibrated predictions against real DeepSpeed jobs on this project's CPUs: the range of a plan priced
# on a measured profile (time_range.json "calibrated")
CALIBRATED_TABLES = ("accuracy_cpu", "accuracy_cpu_parallel", "accuracy_cpu_finetune")


def calibrated_ratios() -> list[float]:
    """predicted / measured step time of every rank row in CALIBRATED_TABLES (1 + time_err)."""
    rows = []
    for name in CALIBRATED_TABLES:
        rows += json.loads((REPO / "bench" / "results" / f"{name}.json").read_text())["rows"]
    return [1 + float(r["time_err"]) for r in rows if r.get("time_err") is not None]


def range_data(held_out: list[float], cmd: str) -> dict:
    """time_range.json: each basis's central ratios, where they come from and how many runs they rest on. The GPU
    range is the held-out half's: residuals of runs no figure was fitted on."""
    low, high = central_ratios(held_out)
    cal = calibrated_ratios()
    c_low, c_high = central_ratios(cal)
    return {
        "_about": "predicted / measured step time, 10th and 90th percentiles: a plan's step time range is "
                  "[predicted / ratio_high, predicted / ratio_low] (estimate/timing.py step_range). Written by "
                  "bench/fit_time.py --write; tests/test_published_runs.py recomputes it.",
        "catalog_gpu": {"ratio_low": round(low, 4), "ratio_high": round(high, 4), "runs": len(held_out),
                        "basis": f"80% of the {len(held_out)} held-out published runs, none of which the fitted "
                                 f"figures saw (bench/results/published_runs.txt)",
                        "command": cmd},
        "calibrated": {"ratio_low": round(c_low, 4), "ratio_high": round(c_high, 4), "runs": len(cal),
                       "basis": f"80% of {len(cal)} real DeepSpeed ranks predicted on a measured profile "
                                f"(bench/results/{', '.join(CALIBRATED_TABLES)})"},
    }


def size_class(params: float) -> str:
    return "<1B" if params < 1e9 else "1-10B" if params < 10e9 else "10-100B" if params < 100e9 else ">=100B"


def offload_class(setup: dict) -> str:
    kinds = [k for k in ("offload_optimizer", "offload_param") if setup.get(k, "none") != "none"]
    return "offload " + "+".join(k.split("_")[1] for k in kinds) if kinds else "no offload"


# what a group of held-out runs is split by (issue 42, item 4): signed median per group
GROUPINGS = (("GPU generation", lambda run, p: p["generation"]),
             ("ZeRO stage", lambda run, p: f"ZeRO-{run['setup']['stage']}"),
             ("offload", lambda run, p: offload_class(run["setup"])),
             ("model size", lambda run, p: size_class(p["params"])))
LEAN_LIMIT = 0.15  # a group of LEAN_MIN or more held-out runs leaning more than this one way needs a reason
LEAN_MIN = 5
# Sourced reasons for the runs of a held-out group that leans, by source: each with its cite, quote and confidence
LEAN_REASONS = Path(__file__).resolve().parent / "data" / "leaning_reasons.yaml"


def lean_reasons() -> dict[str, list[dict]]:
    """bench/data/leaning_reasons.yaml by source: the public words on why a source's runs ran as they did."""
    import yaml

    out: dict[str, list[dict]] = {}
    for entry in yaml.safe_load(LEAN_REASONS.read_text(encoding="utf-8")) or []:
        out.setdefault(entry["source"], []).append(entry)
    return out


def signed_median(ratios: list[float]) -> float:
    return statistics.median(ratios)


def summary_line(name: str, ratios: list[float]) -> str:
    med, worst, share = spread(ratios)
    return (f"  {name:26} median x{med:.2f}  worst x{worst:.2f}  within {WITHIN}x: {share:4.0%} "
            f"({round(share * len(ratios))}/{len(ratios)})  signed median {signed_median(ratios):.2f}")


def lean_sources(members: list[dict], reasons: dict[str, list[dict]]) -> str:
    """Where a leaning group's runs come from: each source's count and signed median, most runs first, and for each
    the confidence of its sourced reason (bench/data/leaning_reasons.yaml) or "no sourced reason"."""
    by: dict[str, list[float]] = {}
    for m in members:
        by.setdefault(m["run"]["group"], []).append(m["zk"])
    cells = []
    for g, v in sorted(by.items(), key=lambda kv: -len(kv[1])):
        found = reasons.get(g, [])
        levels = ("high", "medium", "low")
        best = min((e["confidence"] for e in found), key=levels.index) if found else None
        why = f"sourced reason, {best}" if best else ("no sourced reason" if abs(signed_median(v) - 1) > LEAN_LIMIT
                                                       else "no lean")
        cells.append(f"{g} {len(v)} x{signed_median(v):.2f} [{why}]")
    return ", ".join(cells)


def group_lines(rows: list[dict], half: str) -> list[str]:
    out, reasons = [], lean_reasons()
    for title, key in GROUPINGS:
        groups: dict[str, list[dict]] = {}
        for row in rows:
            groups.setdefault(key(row["run"], row["p"]), []).append(row)
        cells = []
        for g, members in sorted(groups.items()):
            med = signed_median([m["zk"] for m in members])
            cell = f"{g} n={len(members)} x{med:.2f} (rule x{signed_median([m['rule'] for m in members]):.2f})"
            if half == "held_out" and len(members) >= LEAN_MIN and abs(med - 1) > LEAN_LIMIT:
                cell += f" LEANS ({lean_sources(members, reasons)})"
            cells.append(cell)
        out.append(f"  by {title}: " + "; ".join(cells))
    return out


# the runs the fit learns from and the targets judge: DeepSpeed's engine (bench/fit_time.py)
FITTED_FRAMEWORK = "deepspeed"


def evaluate(runs: list[dict]) -> list[dict]:
    """Each run planned with the committed fit: zerokit's ratio, first principles' (TimeFit()) and the rule's."""
    from zerokit.estimate.gpu_time import TimeFit, gpu_step

    rows = []
    for run in runs:
        p = predict(run)
        measured = float(run["step_seconds"])
        unfitted = gpu_step(p["parts"], TimeFit()).step_seconds if p["parts"] is not None else p["predicted"]
        rows.append({"run": run, "p": p, "zk": p["predicted"] / measured, "raw": unfitted / measured,
                     "rule": p["rule"] / measured})
    return rows


def table(rows: list[dict], split: dict[str, str], cmd: str) -> str:
    n_fit = sum(split[r["run"]["group"]] == "fit" for r in rows)
    lines = [f"command: {cmd}",
             f"data: bench/data/published_runs.yaml ({len(rows)} runs, {len({r['run']['group'] for r in rows})} "
             f"sources); split: bench/data/split.yaml ({n_fit} runs in the fit half, {len(rows) - n_fit} held out, "
             f"whole sources in each)",
             "zerokit: planned with --hardware-profile none (the catalog's figures, estimate/gpu_time.py) and the "
             "fitted figures of zerokit/data/time_fit.json (fitted on the fit half only: python bench/fit_time.py "
             "--write), every setup dimension pinned; 'first principles': the same parts with no fitted figure",
             f"rule of thumb: 6 * N * tokens / (GPUs * peak * {RULE_MFU:.2f}), peak from zerokit/data/gpus.json",
             "ratio = predicted / measured step time (> 1: predicted slower than measured)", ""]
    head = (f"{'run':46} {'half':8} {'gpu':10} {'gpus':>5} {'z':>1} {'measured s':>10} {'zerokit s':>10} {'ratio':>6} "
            f"{'1st pr.':>7} {'rule':>6}  fits")
    lines += [head, "-" * len(head)]
    for half in ("fit", "held_out", "blind"):
        for row in (r for r in rows if split[r["run"]["group"]] == half):
            run, p, s = row["run"], row["p"], row["run"]["setup"]
            gpus = int(s["gpus_per_node"]) * int(s["nodes"])
            lines.append(f"{run['id'][:46]:46} {half:8} {s['gpu']:10} {gpus:>5} {s['stage']:>1} "
                         f"{float(run['step_seconds']):>10.4g} {p['predicted']:>10.4g} {row['zk']:>6.2f} "
                         f"{row['raw']:>7.2f} {row['rule']:>6.2f}  {'yes' if p['fits'] else 'NO'}")
    for half, title in (("fit", "fit half (the fitted figures saw these runs)"),
                        ("held_out", "held-out half (no fitted figure saw these runs)")):
        part = [r for r in rows if split[r["run"]["group"]] == half and r["run"]["framework"] == FITTED_FRAMEWORK]
        if not part:
            continue
        lines += ["", f"{title}: {len(part)} DeepSpeed runs from {len({r['run']['group'] for r in part})} sources"]
        lines.append(summary_line("zerokit (fitted)", [r["zk"] for r in part]))
        lines.append(summary_line("zerokit (first principles)", [r["raw"] for r in part]))
        lines.append(summary_line("rule of thumb", [r["rule"] for r in part]))
        lines += group_lines(part, half)
        if half == "held_out":
            lines.append("  a LEANS group's sources, each with the confidence of its sourced reason: the cites and "
                         "quotes are in bench/data/leaning_reasons.yaml (collected after this table was first printed; "
                         "they explain a lean and change no prediction)")
        others: dict[str, list[dict]] = {}
        for r in rows:
            if split[r["run"]["group"]] == half and r["run"]["framework"] != FITTED_FRAMEWORK:
                others.setdefault(r["run"]["framework"], []).append(r)
        if others:
            lines.append("  other frameworks (their own group: never fitted, not in the targets): " + "; ".join(
                f"{fw} n={len(v)} zerokit x{signed_median([r['zk'] for r in v]):.2f} "
                f"rule x{signed_median([r['rule'] for r in v]):.2f}" for fw, v in sorted(others.items())))
    deepspeed = [r for r in rows if r["run"]["framework"] == FITTED_FRAMEWORK]
    held = [r["zk"] for r in deepspeed if split[r["run"]["group"]] == "held_out"]
    fit = [r["zk"] for r in deepspeed if split[r["run"]["group"]] == "fit"]
    if len(held) > 1 and len(fit) > 1:
        low, high = central_ratios(held)
        f_low, f_high = central_ratios(fit)
        lines += ["", f"likely range (zerokit/data/time_range.json catalog_gpu): the held-out half's 10th-90th "
                      f"percentile ratios x{low:.2f} to x{high:.2f}: a plan's step from predicted / {high:.2f} to "
                      f"predicted / {low:.2f}; it holds {covered(held, low, high):.0%} of the held-out runs and "
                      f"{covered(fit, low, high):.0%} of the fit half's",
                  f"  out-of-sample check: the same range from the fit half's residuals (x{f_low:.2f} to x{f_high:.2f}) "
                  f"holds {covered(held, f_low, f_high):.0%} of the held-out runs"]
    return "\n".join(lines) + "\n"


BLIND = REPO / "bench" / "data" / "blind_runs.yaml"
BLIND_TITLE = "blind set (collected by readers who never saw a prediction; no fitted figure saw these runs)"
# a blind file's first table, kept as printed where a later change (the harness's UNSTATED_PINS) moved its figures
# each blind set's table as first judged, kept as printed, and what changed the model since
FIRST_LOOKS = {"blind_runs.yaml": ("bench/results/published_runs_blind_first_look.txt",
                                   "before the harness pinned UNSTATED_PINS"),
               "blind_runs_r4.yaml": ("bench/results/published_runs_blind_r4_first_look.txt",
                                      "before a count's tie was read only where room is left beside the layers")}


BLIND_COMMAND = "python bench/published_runs.py --blind --out bench/results/published_runs_blind.txt"


def blind_rows(runs: list[dict]) -> tuple[list[dict], list[str]]:
    """evaluate() of each blind run, and the one-line reasons of those whose setup zerokit refuses (reported, not
    dropped); an entry naming a GPU, model or option value zerokit lacks is a CorpusError, as in the corpus."""
    rows, unplanned = [], []
    for run in runs:
        try:
            rows += evaluate([run])
        except SetupRefused as e:
            unplanned.append(str(e))
    return rows, unplanned


def blind_table(rows: list[dict], unplanned: list[str], cmd: str = BLIND_COMMAND, path: Path = BLIND) -> str:
    """The blind set, judged once by the committed fit: each run, then the held-out half's summary and groups, and the
    share of runs the committed likely range (zerokit/data/time_range.json catalog_gpu) holds; `unplanned`: the runs
    zerokit refuses to plan, each with its one-line reason."""
    split = {r["run"]["group"]: "blind" for r in rows}
    text = table(rows, split, cmd).split("\n")
    shown = path.resolve().relative_to(REPO) if path.resolve().is_relative_to(REPO) else path
    lines = [line for line in text[:6] if not line.startswith("data:")]
    first = FIRST_LOOKS.get(path.name)
    lines.insert(1, f"data: {shown} ({len(rows)} runs, {len(split)} sources), none in bench/data/split.yaml yet: they "
                    "join the split (python bench/fit_time.py --split) at the next refit"
                    + (f"; first judged in {first[0]}, {first[1]}" if first else ""))
    lines += [line for line in text[6:] if line and not line.startswith(("fit half", "held-out half", "likely range",
                                                                            "  out-of-sample"))]
    part = [r for r in rows if r["run"]["framework"] == FITTED_FRAMEWORK]
    if part:
        lines += ["", f"{BLIND_TITLE}: {len(part)} DeepSpeed runs from {len({r['run']['group'] for r in part})} sources",
                  summary_line("zerokit (fitted)", [r["zk"] for r in part]),
                  summary_line("zerokit (first principles)", [r["raw"] for r in part]),
                  summary_line("rule of thumb", [r["rule"] for r in part])]
        lines += group_lines(part, "held_out")
        committed = json.loads((REPO / "zerokit" / "data" / "time_range.json").read_text())["catalog_gpu"]
        low, high = committed["ratio_low"], committed["ratio_high"]
        lines.append(f"  the committed likely range (x{low} to x{high}, the held-out half's 80%) holds "
                     f"{covered([r['zk'] for r in part], low, high):.0%} of these runs")
    if unplanned:
        lines += ["", f"not planned ({len(unplanned)} runs: zerokit refuses their setup, so they are in no figure above):"]
        lines += [f"  {why}" for why in unplanned]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="regex over run ids")
    ap.add_argument("--out", help="also write the table here")
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--blind", action="store_true",
                    help=f"judge the blind set ({BLIND.relative_to(REPO)}, not in the split) with the committed fit")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from fit_time import load_split

    try:
        data = BLIND if a.blind and a.data == str(DATA) else Path(a.data)
        runs = [r for r in load_runs(Path(data)) if not a.only or re.search(a.only, r["id"])]
    except CorpusError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not runs:
        print("error: no run matches --only: give a regex over the run ids", file=sys.stderr)
        return 2
    cmd = "python bench/published_runs.py" + "".join(f" {x}" for x in (argv if argv is not None else sys.argv[1:]))
    if a.blind:
        try:
            text = blind_table(*blind_rows(runs), cmd, data)
        except CorpusError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(text, end="")
        if a.out:
            Path(a.out).write_text(text)
        return 0
    split = load_split()
    missing = sorted({r["group"] for r in runs} - set(split))
    if missing:
        print(f"error: groups without a half in bench/data/split.yaml: {', '.join(missing)}: run python "
              f"bench/fit_time.py --split", file=sys.stderr)
        return 2
    try:
        text = table(evaluate(runs), split, cmd)
    except CorpusError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
