"""`zerokit launch`: plan (or take) a ds_config, check it fits, then run it under the deepspeed launcher.

    zerokit launch --model tiny-llama --plan --gpus-per-node 2 --steps 20
    zerokit launch --model DIR --data corpus/ --config ds_config.json --output-dir runs/x --save-every 50
    zerokit launch ... --dry-run            # print the exact command, env and config; run and write nothing
    zerokit launch ... --k8s job.yaml --k8s-image IMAGE --k8s-volume CLAIM:/mnt/shared   # a Kubeflow PyTorchJob
    zerokit launch --model DIR --gpus-per-node 8 -- python train.py --deepspeed {ds_config}   # your own script

This module only parses and prints: zerokit.api.run_launch builds the request, launching/prepare.py validates and
plans (writing nothing), launching/execute.py writes the run directory, runs the ranks through the restart
supervisor and writes the report.
"""

from __future__ import annotations

import argparse
import json

from zerokit.cli.common import add_options, to_request
from zerokit.core.errors import EXIT_OK


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


def run_launch(args) -> int:
    from zerokit import api

    req = to_request(args)
    result = api.run_launch(req, args.script_argv, report=not args.no_report)
    if args.dry_run:
        print(result.command)
        print(f"# ds_config ({result.plan.cfg_path}):")
        print(json.dumps(result.ds_config, indent=2))
        if args.k8s:
            from zerokit.launching import k8s

            print(f"# {args.k8s} (not written):")
            print(k8s.job(result.plan).manifest, end="")
        print("# dry run: nothing was written or started")
        return EXIT_OK
    if result.written is not None:  # the sbatch script or the Kubernetes manifest
        print(result.written)
        return EXIT_OK
    return result.exit_code
