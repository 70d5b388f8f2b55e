"""`zerokit launch`, running: write the run directory, start the deepspeed launcher through the restart
supervisor (launching/runner.py), then write the predicted-vs-measured report."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys

from zerokit.core.errors import EXIT_INVALID, EXIT_OK, ZerokitError
from zerokit.core.fsutil import atomic_write_text
from zerokit.core.options import flag
from zerokit.launching.checkpoints import CKPT_SUBDIR, config_rejection, convert_to_universal
from zerokit.launching.command import build_launch_command, render_sbatch
from zerokit.launching.prepare import LaunchPlan
from zerokit.report.run_dir import launch_record_path


def describe_command(plan: LaunchPlan, resume: bool) -> str:
    """The exact command and environment, as shell lines (what --dry-run prints)."""
    argv, env = build_launch_command(plan.launch_spec(resume))
    if plan.uses_own_loop:
        what = f"{plan.steps} steps | seq {plan.seq_len} | {plan.samples} sequences ({plan.total_tokens:,} tokens)"
    else:
        what = f"your script {plan.script.target} | seq {plan.seq_len} (planned)" + (
            f" | {plan.steps} steps" if plan.steps else "")
    lines = [f"# {plan.setup.label} | {plan.cluster.world_size} ranks | {what}", "# environment:"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines += ["# command:", shlex.join(argv)]
    if plan.uses_own_loop:
        if plan.request.k8s:  # what the pods' ranks are told (launching/k8s.py)
            from zerokit.launching import k8s

            opts = k8s.rank_options(plan)
        else:
            opts = plan.rank_options(resume)
        lines += [f"# rank options ({plan.rank_options_path}):", json.dumps(opts.to_dict())]
    return "\n".join(lines)


def convert_for_resize(plan: LaunchPlan) -> str:
    """A --resume on another world size: DeepSpeed's universal checkpoint of the latest step (once), before
    anything in the run directory changes, so a refused conversion leaves the run as it was. The one line saying
    so."""
    rs, cfg = plan.resize, plan.ds_config
    if rs.needs_conversion:
        convert_to_universal(plan.out_abs / CKPT_SUBDIR, rs)
        how = f"converted to a universal checkpoint for {rs.new_world_size} rank{'s' * (rs.new_world_size > 1)}"
    else:
        how = f"ZeRO-0 keeps the whole optimizer state: loaded as it is on {rs.new_world_size} rank" + (
            "s" * (rs.new_world_size > 1))
    from zerokit.config.read import parallelism_from_config

    micro, accum = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]
    par = parallelism_from_config(cfg)
    replicas = par.data_parallel(rs.new_world_size)
    across = (f"{rs.new_world_size} rank{'s' * (rs.new_world_size > 1)}" if replicas == rs.new_world_size else
              f"{replicas} data-parallel replica{'s' * (replicas > 1)} (TP {par.tensor_parallel} on {rs.new_world_size} ranks)")
    return (f"checkpoint step {rs.old.step} was written by {rs.old.world_size} rank{'s' * (rs.old.world_size > 1)}; "
            f"{how}; global batch {micro * accum * replicas} held: micro {micro} x accumulation {accum} x {across}")


def write_run_directory(plan: LaunchPlan) -> None:
    """The config and the packed tokens every rank memory-maps (and, for pdsh, DeepSpeed's .deepspeed_env)."""
    from zerokit.config.render import write_json_atomic
    from zerokit.launching import data as zdata

    if plan.resize is not None:
        print(convert_for_resize(plan), flush=True)
    plan.out_abs.mkdir(parents=True, exist_ok=True)
    write_json_atomic(plan.cfg_path, plan.ds_config)
    if plan.uses_own_loop:  # a user's script brings its own data and reads its own options
        zdata.write_data(plan.data, plan.files, plan.tokenizer, plan.tokens_path.parent)  # tokens (labels, mask)
        if plan.request.k8s:  # the pods' ranks: bundled names, resume on a restarted pod (launching/k8s.py)
            from zerokit.launching import k8s

            k8s.rank_options(plan).save(plan.rank_options_path)
        else:
            plan.rank_options(plan.request.resume).save(plan.rank_options_path)
    if plan.multi_node and not plan.request.sbatch:  # the sbatch script exports the same variables itself
        from zerokit.spec.hostfile import write_deepspeed_env

        write_deepspeed_env(os.getcwd(), plan.env)


def write_sbatch(plan: LaunchPlan) -> str:
    req = plan.request
    script = render_sbatch(plan.launch_spec(req.resume), job_name=f"zerokit-{plan.out_abs.name}",
                           nodes=plan.cluster.nodes, gpus_per_node=plan.cluster.gpus_per_node,
                           time_limit=req.time_limit, partition=req.partition, output_dir=str(plan.out_abs))
    atomic_write_text(req.sbatch, script, mode=0o755)
    return (f"wrote {req.sbatch} for {plan.setup.label} on {plan.cluster.nodes} node(s); submit with: "
            f"sbatch {shlex.quote(req.sbatch)}")


def write_k8s(plan: LaunchPlan) -> str:
    """The PyTorchJob manifest (launching/k8s.py) at --k8s FILE; the one line saying what it runs and how to submit it."""
    from zerokit.launching import k8s

    req = plan.request
    job = k8s.job(plan)
    atomic_write_text(req.k8s, job.manifest)
    return (f"wrote {req.k8s}: PyTorchJob {job.name} for {plan.setup.label}, {job.pods} pod{'s' * (job.pods > 1)} x "
            f"{job.ranks_per_pod} rank{'s' * (job.ranks_per_pod > 1)}, run directory {plan.out_abs} on claim {job.claim}; "
            f"submit with: kubectl apply -f {shlex.quote(req.k8s)}")


def learn_from(plan: LaunchPlan, result, measured: dict) -> None:
    """A run planned on a hardware profile that finished and measured its steps: its step time goes into that
    profile (launching/learn.py), so the next plan near it on this hardware is priced on what it measured."""
    if not (plan.prediction.get("profile_path") and result.ok and measured.get("step_seconds")):
        return
    from zerokit.launching import learn

    try:
        print(learn.describe(*learn.learn(plan.out_abs)))
    except ZerokitError as e:  # the run's own outcome stands; learning from it is a bonus
        print(f"note: not learned from this run: {e}", file=sys.stderr)


def run(plan: LaunchPlan, report: bool = True) -> int:
    """Train: launch.json, the launcher under the restart supervisor, the report. Returns the exit code."""
    from zerokit.config.render import write_json_atomic
    from zerokit.launching.runner import run_with_restarts

    req, out = plan.request, plan.out_abs
    argv0, env0 = build_launch_command(plan.launch_spec(req.resume))
    write_json_atomic(launch_record_path(out), {
        "command": argv0, "env": env0, "steps": plan.steps, "save_every": plan.save_every, "seq_len": plan.seq_len,
        "model": plan.model.source, "tokenizer": plan.tokenizer, "data": [str(f) for f in plan.files],
        "setup": plan.setup.to_dict(), "prediction": plan.prediction, "max_restarts": req.max_restarts,
        "script": None if plan.uses_own_loop else list(req.script_command),
        "dist_backend": plan.cluster.dist_backend,  # --dist-backend given to the ranks; None: DeepSpeed's default
        # what trains (a --resume must train the same: prepare.check_resume_finetune), and --merge
        "finetune": req.finetune.to_dict(), "merge": req.merge,
    })
    print(describe_command(plan, req.resume), file=sys.stderr, flush=True)

    def make(resume: bool, attempt: int):
        return build_launch_command(plan.launch_spec(resume))

    result = run_with_restarts(make, out, max_restarts=req.max_restarts, resume=req.resume,
                               shm_port=None if plan.multi_node else plan.port)
    rejected = None if plan.deepspeed_checked else config_rejection(out)
    if rejected:  # the ranks' DeepSpeed refused the config (prepare.deepspeed_check_in_ranks): the directory was new
        shutil.rmtree(out, ignore_errors=True)
        raise ZerokitError(f"{req.config} is not a valid DeepSpeed config for {plan.cluster.world_size} ranks: "
                           f"{rejected}", exit_code=EXIT_INVALID)
    if report:
        from zerokit.report.run_report import build_report, format_report, read_metrics, summarize_metrics, write_report

        measured = summarize_metrics(read_metrics(out))
        rep = build_report(plan.prediction, measured, result.to_dict(), trackers=plan.tracker_locations)
        write_report(out, rep)
        print(format_report(rep))
        learn_from(plan, result, measured)
        if not plan.uses_own_loop and not measured.get("ranks"):
            print(f"note: no metrics in {plan.out / 'metrics'}: add zerokit.integrations.hf.ZerokitCallback to your "
                  "Trainer's callbacks to measure what was predicted", file=sys.stderr)
    if not report:  # the report names them otherwise
        for tracker, where in plan.tracker_locations.items():
            print(f"curves ({tracker}): {where}")
    if result.interrupted:
        print("interrupted: every rank was stopped", file=sys.stderr)
        return result.returncode
    if not result.ok:
        again = (f"resume with {flag('resume')} {flag('output-dir')} {plan.out}" if plan.uses_own_loop else
                 "rerun it: your script resumes from its own checkpoints")
        raise ZerokitError(f"training failed (launcher exit code {result.returncode}) after {result.restarts} restarts: "
                           f"see the rank output above; {again}",
                           exit_code=result.returncode if 0 < result.returncode < 128 else 1)
    if plan.uses_own_loop:
        print(f"done: {plan.steps} steps, {result.restarts} restarts ({result.redone_steps} steps redone); "
              f"weights in {plan.out / 'final'}")
    else:
        print(f"done: {plan.script.target} exited 0 after {result.restarts} restarts; run directory {plan.out}")
    return EXIT_OK
