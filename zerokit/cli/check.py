"""`zerokit check CONFIG`: validate a ds_config.json a user already has, then check that it fits."""

from __future__ import annotations

import json
import sys

from zerokit.cli.common import (
    add_options,
    apply_finetune,
    finetune_from_args,
    load_cluster,
    load_model,
    load_workload,
)
from zerokit.core.errors import EXIT_INVALID, ZerokitError
from zerokit.core.options import flag
from zerokit.core.quiet import verbose


def add_check_parser(sub) -> None:
    p = sub.add_parser("check", help="validate an existing ds_config.json and check that it fits")
    add_options(p, "check")
    p.set_defaults(func=cmd_check)


def cmd_check(args) -> int:
    from zerokit.config.check import check_config
    from zerokit.config.read import load_config_file

    if not args.config:
        raise ZerokitError("no ds_config given: zerokit check DS_CONFIG (or `config:` in the -c run file)")
    config = load_config_file(args.config)
    has_model = bool(getattr(args, "model", None) or getattr(args, "params", None))
    model = load_model(args) if has_model else None
    finetune = finetune_from_args(args)
    if not finetune.is_full:
        if model is None:
            raise ZerokitError(f"{flag('finetune')} {finetune.mode}/{flag('freeze')} count the model's modules: give "
                               f"{flag('model')}")
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
