"""`zerokit check CONFIG`: validate a ds_config.json a user already has, then check that it fits."""

from __future__ import annotations

import json
import sys

from zerokit.cli.common import (
    add_finetune_args,
    apply_finetune,
    finetune_from_args,
    load_cluster,
    load_model,
    load_workload,
    nonempty,
    positive_int,
)
from zerokit.core.errors import EXIT_INVALID, ZerokitError
from zerokit.core.quiet import verbose


def add_check_parser(sub, parents) -> None:
    p = sub.add_parser("check", parents=parents, help="validate an existing ds_config.json and check that it fits")
    p.add_argument("config", type=nonempty, help="ds_config.json to check")
    p.add_argument("--model", dest="model", type=nonempty, help="HF model id, local directory or bundled name")
    p.add_argument("--activation-checkpointing", choices=("on", "off"),
                   help="override what the config says (its activation_checkpointing block)")
    p.add_argument("--tiled-loss", choices=("on", "off"), default="off",
                   help="your script computes the loss with DeepSpeed's TiledFusedLogitsLoss (no config key says so)")
    p.add_argument("--tiled-mlp", choices=("on", "off"), default="off",
                   help="your script runs its MLPs through DeepSpeed's TiledMLP")
    p.add_argument("--micro-batch", type=positive_int, dest="micro_batch_size",
                   help='for "auto" configs: judge this per-device batch (the Trainer\'s --per_device_train_batch_size; '
                        'default: search for the largest that fits)')
    p.add_argument("--grad-accum", type=positive_int, dest="gradient_accumulation_steps",
                   help='for "auto" configs: the accumulation the HF Trainer will fill in (default 1)')
    p.add_argument("--precision", choices=("bf16", "fp16", "fp32"),
                   help='for "auto" precision: the Trainer\'s --bf16/--fp16 (default: the best the GPU supports)')
    p.add_argument("--client-optimizer", choices=("adamw_torch", "adamw_torch_fused"),
                   help="for a config without an optimizer block: what the script updates with (the HF Trainer's "
                        "--optim; default: its default for the torch installed here, adamw_torch_fused from torch 2.8); "
                        "adamw_torch keeps two fp32 temporaries of the partition in the step")
    p.add_argument("--json", action="store_true")
    add_finetune_args(p)
    p.set_defaults(func=cmd_check)


def cmd_check(args) -> int:
    from zerokit.config.check import check_config
    from zerokit.config.rules import load_config_file

    config = load_config_file(args.config)
    has_model = bool(getattr(args, "model", None) or getattr(args, "params", None))
    model = load_model(args) if has_model else None
    finetune = finetune_from_args(args)
    if not finetune.is_full:
        if model is None:
            raise ZerokitError(f"--finetune {finetune.mode}/--freeze count the model's modules: give --model")
        model = apply_finetune(args, model, finetune)
    cluster = load_cluster(args)
    trainer_values = {}
    if args.micro_batch_size:
        trainer_values["train_micro_batch_size_per_gpu"] = args.micro_batch_size
    if args.gradient_accumulation_steps:
        trainer_values["gradient_accumulation_steps"] = args.gradient_accumulation_steps
    ckpt = None if args.activation_checkpointing is None else args.activation_checkpointing == "on"
    result = check_config(config, args.config, model, cluster, load_workload(args, model), activation_checkpointing=ckpt,
                          trainer_values=trainer_values or None, precision=args.precision, answer_auto=True,
                          client_optimizer=args.client_optimizer,
                          tiled={"tiled_loss": args.tiled_loss == "on", "tiled_mlp": args.tiled_mlp == "on"})
    result.finetune, result.model = finetune, model
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return result.exit_code
    from zerokit.report.plan_text import format_check

    if not result.valid:  # an error: one line on stderr naming the first problem (-v: the whole table before it)
        if verbose():
            print(format_check(result), file=sys.stderr)
        raise ZerokitError(f"{args.config} is not a valid DeepSpeed config for {result.world_size} ranks: "
                           f"{result.problem()}", exit_code=EXIT_INVALID)
    print(format_check(result))
    return result.exit_code
