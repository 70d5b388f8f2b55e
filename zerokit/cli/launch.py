"""`zerokit launch`: plan (or take) a ds_config, check it fits, then run it under the deepspeed launcher.

    zerokit launch --model tiny-llama --plan --gpus-per-node 2 --steps 20
    zerokit launch --model DIR --data corpus/ --config ds_config.json --output-dir runs/x --save-every 50
    zerokit launch ... --dry-run            # print the exact command, env and config; run and write nothing
    zerokit launch --model DIR --gpus-per-node 8 -- python train.py --deepspeed {ds_config}   # your own script

This module only parses: launch/prepare.py validates and plans (writing nothing), launch/execute.py writes
the run directory, runs the ranks through the restart supervisor and writes the report.
"""

from __future__ import annotations

import argparse
import json
import sys

from zerokit.cli.common import (
    add_finetune_args,
    finetune_from_args,
    gpu_name_note,
    hardware_from_args,
    memory_fraction_from_args,
    nonempty,
    nonneg_int,
    pins_from_args,
    port,
    positive_float,
    positive_int,
)
from zerokit.core.errors import EXIT_OK, ZerokitError


def add_launch_parser(subparsers, parents: list) -> argparse.ArgumentParser:
    """Add the `launch` subcommand (parents: the setup-pin and hardware option groups)."""
    p = subparsers.add_parser(
        "launch", parents=parents,
        help="check the setup fits, then train with the deepspeed launcher (restarts, checkpoints, report)",
        description="Train MODEL on DATA with DeepSpeed: plan or take a ds_config, refuse what does not fit, "
                    "run every rank under the deepspeed launcher, restart from the latest checkpoint after a "
                    "crash, and report predicted vs measured memory and speed.",
    )
    p.add_argument("--model", required=True, type=nonempty,
                   help="HF id, local model directory (weights loaded if present), config-only directory, or "
                        "bundled config name (tiny-llama, ...) for random init")
    p.add_argument("--data", type=nonempty,
                   help="a .txt/.jsonl/.json/.csv/.parquet file or a directory of them, a directory saved with datasets' "
                        "save_to_disk, or a hub dataset id org/name; default: the bundled tiny corpus")
    p.add_argument("--data-format", choices=("text", "chat", "instruction"),
                   help="default: from the columns: \"messages\" (chat), prompt/response, instruction/input/output or "
                        "question/answer (instruction), \"text\" (text); chat and instruction are rendered with the "
                        "tokenizer's chat template and train on the assistant's tokens only")
    p.add_argument("--packing", choices=("on", "off"),
                   help="join examples into --seq-len blocks (on), or pad each to --seq-len (off); default on for text, "
                        "off for chat and instruction (TRL's SFT default: no example sees another)")
    p.add_argument("--data-split", type=nonempty, metavar="SPLIT", help="split of a hub or saved dataset (default train)")
    p.add_argument("--data-config", type=nonempty, metavar="NAME", help="configuration (subset) of a hub dataset")
    p.add_argument("--tokenizer", type=nonempty, metavar="DIR_OR_HUB_ID",
                   help="tokenizer for --data (default: the model's own; the bundled one for a random-init model)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--plan", action="store_true",
                     help="let the planner choose the setup and render the config (the default for your own script)")
    src.add_argument("--config", type=nonempty, metavar="DS_CONFIG", help="use this ds_config.json (checked first)")
    p.add_argument("--output-dir", type=nonempty, metavar="DIR", help="default runs/<model>-<time>")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--steps", type=positive_int, help="optimizer steps (default: one epoch)")
    length.add_argument("--epochs", type=positive_float, help="passes over the data (default 1)")
    p.add_argument("--save-every", type=nonneg_int, metavar="K",
                   help="checkpoint every K steps (default: 10 checkpoints when --max-restarts > 0, else only the last)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --output-dir from its latest checkpoint; on another number of GPUs it is "
                   "converted to DeepSpeed's universal checkpoint and the global batch is held")
    p.add_argument("--max-restarts", type=nonneg_int, default=0, metavar="R",
                   help="relaunch from the latest complete checkpoint up to R times if a rank dies")
    p.add_argument("--dry-run", action="store_true", help="print the command, environment and config; run nothing")
    p.add_argument("--seq-len", type=positive_int, help="tokens per sample (default min(512, the model's maximum))")
    p.add_argument("--global-batch", type=positive_int, metavar="N", help="samples per optimizer step (--plan)")
    p.add_argument("--lr", type=positive_float, help="peak learning rate (--plan; default 2e-5 for pretrained "
                                                     "weights, 1e-3 for a random-init model)")
    p.add_argument("--warmup-steps", type=nonneg_int, default=None, help="LR warm-up steps (--plan; default 1/10 of the run)")
    p.add_argument("--seed", type=nonneg_int, default=1234)
    p.add_argument("--master-port", type=port, help="rendezvous port (default: a free one)")
    p.add_argument("--no-report", action="store_true", help="skip the predicted-vs-measured report")
    add_finetune_args(p)  # the plan counts what trains; zerokit's loop freezes / adds peft LoRA / loads 4-bit
    p.add_argument("--merge", action="store_true",
                   help="--finetune lora/qlora: also write final/merged, the base with the adapter merged in (peft "
                        "merge_and_unload; QLoRA into the dequantized 4-bit base), loadable by "
                        "AutoModelForCausalLM.from_pretrained. final/ itself holds the adapter")
    own = p.add_argument_group(
        "your own training script",
        "After `--`: `python train.py ARGS` (or `python -m pkg.train ARGS`) runs on every rank under the deepspeed "
        "launcher instead of zerokit's loop, once the setup is checked to fit. In ARGS, {ds_config} becomes the "
        "config's path, and {micro_batch}, {grad_accum}, {seq_len}, {steps}, {world_size}, {output_dir} what the plan "
        "chose; a script built on TrainingArguments that names no {ds_config} gets `--deepspeed CONFIG` appended. "
        "--max-restarts reruns the same command after a crash: your script resumes from its own checkpoints (e.g. the "
        "Trainer's resume_from_checkpoint). Add zerokit.integrations.hf.ZerokitCallback to your Trainer for the "
        "predicted-vs-measured report. --finetune/--lora-*/--freeze say what your script trains: they size the plan "
        "only (your script applies peft itself); --merge is zerokit's loop's only.")
    own.add_argument("--samples", type=positive_int, metavar="N",
                     help="training samples per epoch in your script's data (for the total-time prediction)")
    own.add_argument("--profile", choices=("hf", "deepspeed"),
                     help='ds_config for your script: hf ("auto" values the HF Trainer fills; the default for a script '
                          "built on TrainingArguments) or deepspeed (every value explicit, for deepspeed.initialize)")
    own.add_argument("script_argv", nargs=argparse.REMAINDER, metavar="-- python SCRIPT ARGS",
                     help="your training script and its arguments")
    multi = p.add_argument_group("multi-node")
    multi.add_argument("--launcher", choices=("pdsh", "openmpi", "mpich", "slurm"),
                       help="DeepSpeed's multi-node launcher (default pdsh when --hostfile names other hosts)")
    multi.add_argument("--master-addr", type=nonempty, metavar="HOST", help="rendezvous address (default: DeepSpeed asks the first host)")
    multi.add_argument("--sbatch", type=nonempty, metavar="FILE",
                       help="prepare the run directory and write a Slurm batch script for this job instead of running it "
                            "(submit with: sbatch FILE)")
    multi.add_argument("--time-limit", default="04:00:00", help="--sbatch: Slurm time limit (default 04:00:00)")
    multi.add_argument("--partition", type=nonempty, help="--sbatch: Slurm partition")
    p.set_defaults(func=run_launch)
    return p


def request_from_args(args):
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
        dry_run=args.dry_run, script_command=tuple(script_command(args)), samples=args.samples, profile=args.profile,
        finetune=finetune_from_args(args), merge=args.merge,
    )


def script_command(args) -> list[str]:
    """What followed `--` (argparse keeps the `--` in a REMAINDER); checks what needs it is there."""
    cmd = list(args.script_argv or [])
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    if not cmd:
        if not (args.plan or args.config):
            raise ZerokitError("give --plan (the planner chooses) or --config DS_CONFIG, or your own script after "
                               "`--`: e.g. `-- python train.py --deepspeed {ds_config}`")
        for flag, value in (("--samples", args.samples), ("--profile", args.profile)):
            if value is not None:
                raise ZerokitError(f"{flag} is for your own script (after `--`): drop it, or give the script")
    return cmd


def run_launch(args) -> int:
    from zerokit.launch import execute
    from zerokit.launch.prepare import prepare_launch

    plan = prepare_launch(request_from_args(args))
    if args.dry_run:
        print(execute.describe_command(plan, args.resume))
        print(f"# ds_config ({plan.cfg_path}):")
        print(json.dumps(plan.ds_config, indent=2))
        print("# dry run: nothing was written or started")
        return EXIT_OK
    execute.write_run_directory(plan)
    if args.sbatch:
        print(execute.write_sbatch(plan))
        return EXIT_OK
    sys.stderr.flush()
    return execute.run(plan, report=not args.no_report)
