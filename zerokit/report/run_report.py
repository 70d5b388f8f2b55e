"""After a run: zerokit's prediction next to what the run measured.

Pure functions of (prediction dict, metrics records, run info) so they are testable without a run:

    measured = summarize_metrics(read_metrics(output_dir))
    report = build_report(prediction, measured, run)
    text = format_report(report)
    write_report(output_dir, report)        # report.txt + report.json (atomic)

prediction (from prediction_from_evaluation(planner Evaluation, steps)):
    {"setup": "ZeRO-2 fp32 mb=2x2", "per_rank_memory_bytes": int, "memory_terms": {name: bytes},
     "step_seconds": float, "tokens_per_second": float, "total_seconds": float | None, "steps": int,
     "per_node_cpu_bytes": int}
metrics: the JSON records of output_dir/metrics/rank{R}.jsonl (events "start", "step", "end").
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from zerokit.core.units import fmt_bytes, fmt_seconds


def read_metrics(output_dir: str | os.PathLike) -> dict[int, list[dict]]:
    """rank -> records, in file order; lines cut short by a kill are skipped."""
    from zerokit.report.run_dir import metrics_files

    out: dict[int, list[dict]] = {}
    for rank, f in metrics_files(output_dir):
        recs = []
        for line in f.read_text().splitlines():
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        out[rank] = recs
    return out


def _steady(recs: list[dict]) -> list[dict]:
    """Step records without the first step of each attempt (start-up, JIT, allocator warm-up), and with
    only the last record of a step that was redone after a restart."""
    by_step: dict[int, dict] = {}
    first_of_attempt: set[tuple] = set()
    seen_attempts: set = set()
    for r in recs:
        if r.get("event") != "step":
            continue
        a = (r.get("run_id"), r.get("attempt", 0))
        if a not in seen_attempts:
            seen_attempts.add(a)
            first_of_attempt.add((a, r["step"]))
        by_step[r["step"]] = r
    steady = [r for s, r in sorted(by_step.items())
              if ((r.get("run_id"), r.get("attempt", 0)), s) not in first_of_attempt]
    return steady or [r for _, r in sorted(by_step.items())]


def current_world(metrics: dict[int, list[dict]]) -> dict[int, list[dict]]:
    """Only the records of runs with the latest run's world size: a run resumed on another number of ranks
    (launching/checkpoints.py Resize) appends to the same metrics files, and the earlier run's ranks and steps would
    otherwise stand next to the new prediction. The files keep everything; records without a run id (a user's
    callback, older runs) stay."""
    starts = [r for recs in metrics.values() for r in recs if r.get("event") == "start" and "world_size" in r]
    if not starts:
        return metrics
    world = max(starts, key=lambda r: r.get("time") or 0)["world_size"]
    world_of_run = {r.get("run_id"): r["world_size"] for r in sorted(starts, key=lambda r: r.get("time") or 0)}
    return {rank: [r for r in recs if world_of_run.get(r.get("run_id"), world) == world]
            for rank, recs in metrics.items() if rank < world}


def summarize_metrics(metrics: dict[int, list[dict]]) -> dict:
    """Per-rank peak memory, median step time, tokens/s; job-wide throughput and training time (of the runs
    with the latest world size: current_world)."""
    metrics = current_world(metrics)
    ranks = {}
    global_tps, step_times, train_s = [], [], []
    steps_done = 0
    method = None
    for rank, recs in sorted(metrics.items()):
        steps = [r for r in recs if r.get("event") == "step"]
        ends = [r for r in recs if r.get("event") == "end"]
        steady = _steady(recs)
        # steps timed after the CPU memory meter stopped (ZEROKIT_MEMORY_STEPS) carry none of its overhead
        unmetered = [r for r in steady if r.get("metered") is False]
        steady = unmetered or steady
        peaks = [r.get("peak_allocated_bytes") for r in steps + ends if r.get("peak_allocated_bytes")]
        reserved = [r.get("peak_reserved_bytes") for r in steps + ends if r.get("peak_reserved_bytes")]
        used = [r.get("device_used_bytes") for r in steps if r.get("device_used_bytes")]
        outside = [r.get("outside_allocator_bytes") for r in steps if r.get("outside_allocator_bytes") is not None]
        st = statistics.median([r["step_time"] for r in steady]) if steady else None
        ranks[rank] = {
            "peak_memory_bytes": max(peaks) if peaks else None,
            "peak_reserved_bytes": max(reserved) if reserved else None,
            # CUDA: the GPU's used memory at step ends (nvidia-smi's figure), and the part outside torch's allocator
            "device_used_bytes": max(used) if used else None,
            "outside_allocator_bytes": max(outside) if outside else None,
            "step_seconds": st,
            "tokens_per_second": statistics.median([r["tokens_per_s"] for r in steady]) if steady else None,
            "steps": max((r["step"] for r in steps), default=0),
            "timed_without_meter": bool(unmetered),
        }
        method = method or next((r.get("memory_method") for r in recs if r.get("memory_method")), None)
        if rank == 0:
            global_tps = [r["global_tokens_per_s"] for r in steady if "global_tokens_per_s" in r]
            step_times = [r["step_time"] for r in steady]
            train_s = [r["train_s"] for r in ends if "train_s" in r]
            steps_done = ranks[rank]["steps"]
    peaks = [v["peak_memory_bytes"] for v in ranks.values() if v["peak_memory_bytes"]]
    return {
        "ranks": ranks,
        "world_size": len(ranks),
        "memory_method": method,
        "peak_memory_bytes_max": max(peaks) if peaks else None,
        "step_seconds": statistics.median(step_times) if step_times else None,
        "tokens_per_second": statistics.median(global_tps) if global_tps else None,
        "train_seconds": train_s[-1] if train_s else None,
        "steps": steps_done,
        "timed_without_meter": bool(ranks) and all(v.get("timed_without_meter") for v in ranks.values()),
    }


def prediction_from_evaluation(ev, steps: int | None, time_source: str | None = None) -> dict:
    """The planner's Evaluation as the plain dict build_report takes; time_source: what the step time was priced on
    (spec.hardware.Cluster.time_source: a measured profile and when, or the catalog)."""
    mem, t = ev.memory, ev.time
    smi = getattr(mem, "nvidia_smi", None)
    context = int(mem.per_gpu.get("cuda_context", 0))
    return {
        "setup": ev.setup.label,
        "fits": ev.fits,
        "per_rank_memory_bytes": int(mem.per_gpu_total),
        # what torch.cuda.max_memory_allocated (and the CPU meter) can show: the fit's CUDA-context allowance is no
        # allocation of torch's; it is priced, with NCCL's buffers, in nvidia_smi_bytes
        "allocated_peak_bytes": int(mem.per_gpu_total) - context,
        # pipeline stages: each stage's allocated peak, stage 0 first (rank r runs stage r x stages // world:
        # PipeDataParallelTopology); the figure above is the largest
        "stage_allocated_peak_bytes": [int(t) - context for t in getattr(mem, "stage_totals", None) or []],
        "memory_terms": {k: int(v) for k, v in mem.per_gpu.items()},
        "per_node_cpu_bytes": int(getattr(mem, "per_node_cpu_total", 0) or 0),
        "step_seconds": float(t.step_seconds),
        "tokens_per_second": float(t.tokens_per_second),
        "steps": steps,
        "total_seconds": float(t.step_seconds) * steps if steps else t.total_seconds,
        "efficiency": getattr(t, "efficiency", None),
        "time_source": time_source,
        # what a learned run (spec.profile.LearnedRun) is keyed on and compared with: the prediction before any
        # learned correction, so learning the same run twice gives the same ratio
        "learned_factor": float(getattr(t, "learned_factor", 1.0)),
        "unlearned_step_seconds": float(t.step_seconds) / float(getattr(t, "learned_factor", 1.0) or 1.0),
        "precision": ev.setup.precision,
        "zero_stage": ev.setup.zero_stage,
        "micro_batch": ev.setup.micro_batch_size,
        # what torch.cuda.max_memory_reserved should show (estimate/reserved.py); None on CPU
        "allocator_reserved_bytes": smi.allocator_reserved() if smi else None,
        "nvidia_smi_bytes": smi.nvidia_smi_bytes if smi else None,
        "outside_allocator_bytes": (smi.terms["cuda_context_bytes"] + smi.terms["nccl_buffers_bytes"]) if smi else None,
    }


def _ratio(measured, predicted):
    if measured is None or not predicted:
        return None
    return measured / predicted


def build_report(prediction: dict | None, measured: dict, run: dict | None = None,
                 trackers: dict | None = None) -> dict:
    """Rows of (quantity, predicted, measured, measured/predicted), plus per-rank memory and the run's
    restart accounting; `trackers`: tracker -> where its curves are (launch --report-to)."""
    p = prediction or {}
    run = run or {}
    # the allocated peak: per_rank_memory_bytes less the CUDA-context allowance (reports written before it existed: the
    # whole figure, which has no context term on CPU)
    allocated = p.get("allocated_peak_bytes", p.get("per_rank_memory_bytes"))
    rows = [
        {"name": "peak memory per rank (max over ranks)", "unit": "bytes",
         "predicted": allocated, "measured": measured.get("peak_memory_bytes_max")},
        {"name": "step time (median, steady state)", "unit": "s",
         "predicted": p.get("step_seconds"), "measured": measured.get("step_seconds")},
        {"name": "throughput (all ranks)", "unit": "tokens/s",
         "predicted": p.get("tokens_per_second"), "measured": measured.get("tokens_per_second")},
        {"name": "training loop (steps + checkpoints)", "unit": "s",
         "predicted": p.get("total_seconds"), "measured": measured.get("train_seconds")},
        {"name": "total wall time (incl. start-up, restarts)", "unit": "s",
         "predicted": None, "measured": run.get("wall_s")},
    ]
    by_rank = measured.get("ranks", {}).values()
    reserved = [m.get("peak_reserved_bytes") for m in by_rank if m.get("peak_reserved_bytes")]
    used = [m.get("device_used_bytes") for m in by_rank if m.get("device_used_bytes")]
    outside = [m.get("outside_allocator_bytes") for m in by_rank if m.get("outside_allocator_bytes") is not None]
    if reserved:  # CUDA only: the allocator's reserve (nvidia-smi less the CUDA context and NCCL's buffers)
        rows.insert(1, {"name": "allocator reserved peak (max over ranks)", "unit": "bytes",
                        "predicted": p.get("allocator_reserved_bytes"), "measured": max(reserved)})
    if used:  # CUDA only: estimate/reserved.py's figure against cudaMemGetInfo at step ends
        rows.insert(2, {"name": "nvidia-smi used per GPU (max over ranks)", "unit": "bytes",
                        "predicted": p.get("nvidia_smi_bytes"), "measured": max(used)})
    if outside:
        rows.insert(3, {"name": "outside torch's allocator: CUDA context, NCCL (max over ranks)", "unit": "bytes",
                        "predicted": p.get("outside_allocator_bytes"), "measured": max(outside)})
    for r in rows:
        r["ratio"] = _ratio(r["measured"], r["predicted"])
    efficiency_to_match = None
    if p.get("efficiency") and p.get("step_seconds") and measured.get("step_seconds"):
        from zerokit.estimate.timing import efficiency_from_run

        efficiency_to_match = efficiency_from_run(p["step_seconds"], measured["step_seconds"], p["efficiency"])
    per_rank = []
    stages = p.get("stage_allocated_peak_bytes") or []
    world = measured.get("world_size") or len(measured.get("ranks", {}))
    for rank, m in sorted(measured.get("ranks", {}).items(), key=lambda kv: int(kv[0])):
        # with pipeline stages each rank is judged against its own stage's prediction
        predicted = stages[int(rank) * len(stages) // world] if stages and world else allocated
        per_rank.append({"rank": int(rank), "predicted_bytes": predicted,
                         "measured_bytes": m.get("peak_memory_bytes"),
                         "measured_reserved_bytes": m.get("peak_reserved_bytes"),
                         "ratio": _ratio(m.get("peak_memory_bytes"), predicted),
                         "step_seconds": m.get("step_seconds"), "tokens_per_second": m.get("tokens_per_second")})
    return {
        "setup": p.get("setup"),
        "memory_method": measured.get("memory_method"),
        "steps": measured.get("steps"),
        "world_size": measured.get("world_size"),
        "rows": rows,
        "per_rank": per_rank,
        "memory_terms_predicted": p.get("memory_terms") or {},
        "efficiency": p.get("efficiency"),
        "efficiency_to_match": efficiency_to_match,
        "restarts": run.get("restarts", 0),
        "redone_steps": run.get("redone_steps", 0),
        "returncode": run.get("returncode"),
        "prediction": prediction,
        "measured": measured,
        "trackers": dict(trackers or {}),
    }


# the report's rows as tracker scalars: (row name, tag, unit suffix, scale to that unit). Peak memory in MiB: a tracker
# stores scalars as float32 (TensorBoard's simple_value), exact to the byte only below 16 MiB
REPORT_SCALARS = (
    ("peak memory per rank (max over ranks)", "peak_memory", "_MiB", 1 / 2**20),
    ("step time (median, steady state)", "step_time", "_s", 1.0),
    ("throughput (all ranks)", "throughput", "_tokens_per_s", 1.0),
    ("training loop (steps + checkpoints)", "train_loop", "_s", 1.0),
)


def report_scalars(report: dict) -> list[tuple[str, float]]:
    """The predicted-vs-measured figures as (tag, value) for a tracker (launching/train.py writes them through DeepSpeed's
    monitor at the run's end): Report/predicted_X, Report/measured_X and Report/ratio_X (measured / predicted) for
    each row that has the figure."""
    rows = {r["name"]: r for r in report.get("rows", ())}
    out = []
    for name, tag, unit, scale in REPORT_SCALARS:
        r = rows.get(name)
        if r is None:
            continue
        for kind in ("predicted", "measured"):
            if r.get(kind) is not None:
                out.append((f"Report/{kind}_{tag}{unit}", float(r[kind]) * scale))
        if r.get("ratio") is not None:
            out.append((f"Report/ratio_{tag}", float(r["ratio"])))
    return out


def _fmt(value, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "s":
        return fmt_seconds(value)
    if unit == "tokens/s":
        return f"{value:,.0f} tok/s"
    return str(value)


def format_report(report: dict) -> str:
    out = []
    head = "run report"
    if report.get("setup"):
        head += f": {report['setup']}"
    out.append(head + f"  ({report.get('steps') or 0} steps, {report.get('world_size') or 0} ranks)")
    out.append(f"  {'':<44} {'predicted':>14} {'measured':>14} {'meas/pred':>10}")
    for r in report["rows"]:
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
        out.append(f"  {r['name']:<44} {_fmt(r['predicted'], r['unit']):>14} {_fmt(r['measured'], r['unit']):>14} {ratio:>10}")
    if report["per_rank"]:
        method = report.get("memory_method") or "unknown"
        out.append(f"  peak memory by rank (measured as {method}):")
        for r in report["per_rank"]:
            ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
            extra = f"  reserved {fmt_bytes(r['measured_reserved_bytes'])}" if r.get("measured_reserved_bytes") else ""
            out.append(f"    rank {r['rank']:<3} predicted {_fmt(r['predicted_bytes'], 'bytes'):>11}  "
                       f"measured {_fmt(r['measured_bytes'], 'bytes'):>11}  {ratio:>7}{extra}")
    source = (report.get("prediction") or {}).get("time_source")
    if source:
        out.append(f"  step time predicted from {source}")
    if report.get("efficiency_to_match") is not None:
        out.append(f"  efficiency: predicted with {report['efficiency']:.3g}; {report['efficiency_to_match']:.3g} would have "
                   "matched the measured step time (or run `zerokit calibrate` once: plans on this machine then use it)")
    out.append(f"  restarts: {report.get('restarts', 0)}, steps redone: {report.get('redone_steps', 0)}")
    for tracker, where in (report.get("trackers") or {}).items():
        out.append(f"  curves ({tracker}): {where}")
    if report.get("memory_method") == "live_tensor_bytes" and not (report.get("measured") or {}).get("timed_without_meter"):
        out.append("  note: CPU memory is counted per op by a dispatch-mode meter; measured step times include "
                   "its overhead (about +30% on the tiny model)")
    return "\n".join(out)


def write_report(output_dir: str | os.PathLike, report: dict) -> tuple[Path, Path]:
    from zerokit.core.fsutil import atomic_write_text

    out = Path(output_dir)
    txt, js = out / "report.txt", out / "report.json"
    atomic_write_text(txt, format_report(report) + "\n")
    atomic_write_text(js, json.dumps(report, indent=2, default=str) + "\n")
    return txt, js
