"""`zerokit launch`: plan (or take) a ds_config, check it fits, then run it under the deepspeed launcher.

    zerokit launch --model tiny-llama --plan --gpus-per-node 2 --steps 20
    zerokit launch --model DIR --data corpus/ --config ds_config.json --output-dir runs/x --save-every 50
    zerokit launch ... --dry-run            # print the exact command, env and config; run and write nothing
    zerokit launch ... --k8s job.yaml --k8s-image IMAGE --k8s-volume CLAIM:/mnt/shared   # a Kubeflow PyTorchJob
    zerokit launch --model DIR --gpus-per-node 8 -- python train.py --deepspeed {ds_config}   # your own script

This module only parses: launch/prepare.py validates and plans (writing nothing), launch/execute.py writes
the run directory, runs the ranks through the restart supervisor and writes the report.
"""

from __future__ import annotations

import argparse
import json
import sys

from zerokit.cli.common import (
    add_options,
    finetune_from_args,
    gpu_name_note,
    hardware_from_args,
    memory_fraction_from_args,
    pins_from_args,
)
from zerokit.core.errors import EXIT_OK, ZerokitError
from zerokit.core.options import flag


OWN_SCRIPT_HELP = (
    "After `--`: `python train.py ARGS` (or `python -m pkg.train ARGS`) runs on every rank under the deepspeed "
    "launcher instead of zerokit's loop, once the setup is checked to fit. In ARGS, {ds_config} becomes the "
    "config's path, and {micro_batch}, {grad_accum}, {seq_len}, {steps}, {world_size}, {output_dir} what the plan "
    "chose; a script built on TrainingArguments that names no {ds_config} gets `--deepspeed CONFIG` appended. "
    "--max-restarts reruns the same command after a crash: your script resumes from its own checkpoints (e.g. the "
    "Trainer's resume_from_checkpoint). Add zerokit.integrations.hf.ZerokitCallback to your Trainer for the "
    "predicted-vs-measured report. --finetune/--lora-*/--freeze say what your script trains: they size the plan "
    "only (your script applies peft itself); --merge is zerokit's loop's only.")


def add_launch_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "launch",
        help="check the setup fits, then train with the deepspeed launcher (restarts, checkpoints, report)",
        description="Train MODEL on DATA with DeepSpeed: plan or take a ds_config, refuse what does not fit, "
                    "run every rank under the deepspeed launcher, restart from the latest checkpoint after a "
                    "crash, and report predicted vs measured memory and speed.",
    )
    add_options(p, "launch")
    own = p.add_argument_group("your own training script", OWN_SCRIPT_HELP)
    own.add_argument("script_argv", nargs=argparse.REMAINDER, metavar="-- python SCRIPT ARGS",
                     help="your training script and its arguments")
    p.set_defaults(func=run_launch)
    return p


def request_from_args(args):
    if not args.model:
        raise ZerokitError(f"no model given: {flag('model')} ID|DIR|bundled name (e.g. tiny-llama), or `model:` in "
                           "the -c run file")
    if args.profile == "accelerate":
        raise ZerokitError(f"{flag('profile')} accelerate is render's (it writes accelerate_config.yaml): launch takes "
                           "hf or deepspeed")
    gpu_name_note(args)
    from zerokit.launch.prepare import LaunchRequest

    return LaunchRequest(
        model=args.model, hardware=hardware_from_args(args), data=args.data, tokenizer=args.tokenizer, config=args.config,
        data_format=args.data_format, packing={"on": True, "off": False}.get(args.packing), data_split=args.data_split,
        data_config=args.data_config,
        pins=pins_from_args(args), memory_fraction=memory_fraction_from_args(args), output_dir=args.output_dir,
        steps=args.steps, epochs=args.epochs, save_every=args.save_every, resume=args.resume,
        max_restarts=args.max_restarts, seq_len=args.seq_len, global_batch=args.global_batch, lr=args.lr,
        warmup_steps=args.warmup_steps, seed=args.seed, master_port=args.master_port, launcher=args.launcher,
        master_addr=args.master_addr, sbatch=args.sbatch, time_limit=args.time_limit, partition=args.partition,
        k8s=args.k8s, k8s_image=args.k8s_image, k8s_volume=args.k8s_volume, gpus_per_pod=args.gpus_per_pod,
        dry_run=args.dry_run, script_command=tuple(script_command(args)), samples=args.samples, profile=args.profile,
        finetune=finetune_from_args(args), merge=args.merge, no_save=args.no_save,
        report_to=tuple(args.report_to or ()), report_dir=args.report_dir,
    )


def script_command(args) -> list[str]:
    """What followed `--` (argparse keeps the `--` in a REMAINDER); checks what needs it is there."""
    cmd = list(args.script_argv or [])
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    if not cmd:
        if not (args.plan or args.config):
            raise ZerokitError(f"give {flag('plan')} (the planner chooses) or {flag('config')} DS_CONFIG, or your own "
                               "script after `--`: e.g. `-- python train.py --deepspeed {ds_config}`")
        for name in ("samples", "profile"):
            if getattr(args, name) is not None:
                raise ZerokitError(f"{flag(name)} is for your own script (after `--`): drop it, or give the script")
    return cmd


def run_launch(args) -> int:
    from zerokit.launch import execute
    from zerokit.launch.prepare import prepare_launch

    plan = prepare_launch(request_from_args(args))
    if args.dry_run:
        print(execute.describe_command(plan, args.resume))
        print(f"# ds_config ({plan.cfg_path}):")
        print(json.dumps(plan.ds_config, indent=2))
        if args.k8s:
            from zerokit.launch import k8s

            print(f"# {args.k8s} (not written):")
            print(k8s.job(plan).manifest, end="")
        print("# dry run: nothing was written or started")
        return EXIT_OK
    execute.write_run_directory(plan)
    if args.sbatch:
        print(execute.write_sbatch(plan))
        return EXIT_OK
    if args.k8s:
        print(execute.write_k8s(plan))
        return EXIT_OK
    sys.stderr.flush()
    return execute.run(plan, report=not args.no_report)
