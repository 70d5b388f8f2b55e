"""Learn from a finished run: its measured step time goes into the hardware profile it was planned on.

The next plan on that hardware near the run (the same accelerator, precision and ZeRO stage; parameters, tokens per
micro step and world size each within spec.profile.LEARNED_REACH) is scaled by the run's measured / predicted
(estimate.timing.learned_run), and says so. `zerokit launch` learns at the end of every run that was planned on a
profile; `zerokit calibrate --from-run RUN_DIR` learns from a run directory (a run started elsewhere, an --sbatch or
--k8s job, or one planned without a profile, into --output or this machine's profile).

What a run is compared with is the prediction before any learned correction (run_report.prediction_from_evaluation:
unlearned_step_seconds), so learning the same run twice gives the same ratio, and the steady-state median step time
is what run_report measures (summarize_metrics: warm-up steps dropped).
"""

from __future__ import annotations

import time
from pathlib import Path

from zerokit.core.errors import ZerokitError
from zerokit.core.options import flag
from zerokit.report.run_dir import LAUNCH_RECORD, launch_record
from zerokit.spec.profile import LEARNED_RUNS, MAX_LEARNED_RUNS, LearnedRun, learned_runs, load_profile


def prediction_keys(cluster, spec, seq_len: int) -> dict:
    """What launch.json's prediction needs beyond the Evaluation for a run to be learned from it later."""
    return {"accelerator": cluster.accelerator.name, "params": int(spec.params), "world_size": cluster.world_size,
            "seq_len": int(seq_len), "profile_path": cluster.profile.path if cluster.profile is not None else None}


def learned_run_from(run_dir: str | Path) -> LearnedRun:
    """The LearnedRun of a finished run directory (launch.json's prediction, the ranks' metrics)."""
    from zerokit.report.run_report import read_metrics, summarize_metrics

    run = Path(run_dir)
    launch = launch_record(run)
    if launch is None:
        raise ZerokitError(f"{run} has no readable {LAUNCH_RECORD}: give the {flag('output-dir')} of a `zerokit "
                           "launch` run")
    pred = launch.get("prediction") or {}
    needed = ("accelerator", "params", "world_size", "seq_len", "precision", "zero_stage", "micro_batch",
              "unlearned_step_seconds")
    missing = [k for k in needed if pred.get(k) is None]
    if missing:
        raise ZerokitError(f"{run}/launch.json's prediction lacks {', '.join(missing)}: it was written by an older "
                           "zerokit or without a plan; re-run it with this one to learn from it")
    measured = summarize_metrics(read_metrics(run))
    step = measured.get("step_seconds")
    if not step:
        raise ZerokitError(f"{run} has no measured step time (metrics/rank*.jsonl): a run that trained at least a few "
                           "steps, or a Trainer script with ZerokitCallback, is what can be learned from")
    return LearnedRun(accelerator=pred["accelerator"], precision=pred["precision"], zero_stage=int(pred["zero_stage"]),
                      params=int(pred["params"]), world_size=int(pred["world_size"]),
                      tokens_per_micro_step=int(pred["micro_batch"]) * int(pred["seq_len"]),
                      setup=str(pred.get("setup") or "?"), predicted_step_s=float(pred["unlearned_step_seconds"]),
                      measured_step_s=float(step), run_dir=str(run.resolve()),
                      recorded=time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def learn(run_dir: str | Path, profile_path: str | None = None) -> tuple[LearnedRun, str]:
    """Add the run to the profile (replacing an earlier learning of the same run directory), written atomically.
    profile_path: default the profile the run was planned on, else this machine's own."""
    from zerokit.config.render import write_json_atomic
    from zerokit.spec.profile import local_profile_path

    run = learned_run_from(run_dir)
    if profile_path is None:
        launch = launch_record(run_dir) or {}
        profile_path = (launch.get("prediction") or {}).get("profile_path") or local_profile_path()
    if not profile_path or not Path(profile_path).is_file():
        raise ZerokitError(f"no hardware profile at {profile_path} to learn into: a run is learned into the profile of "
                           f"the hardware it ran on; run `zerokit calibrate` there first, or give {flag('output')} "
                           "PROFILE")
    data = load_profile(profile_path)
    kept = [r.to_dict() for r in learned_runs(data) if r.run_dir != run.run_dir]
    data[LEARNED_RUNS] = (kept + [run.to_dict()])[-MAX_LEARNED_RUNS:]
    write_json_atomic(profile_path, data)
    return run, str(profile_path)


def describe(run: LearnedRun, path: str) -> str:
    return (f"learned: {run.setup} on {run.world_size} x {run.accelerator} measured {run.measured_step_s:.4g} s a step, "
            f"predicted {run.predicted_step_s:.4g} s (x{run.ratio:.3g}); plans near it on this hardware now use that "
            f"({path})")
