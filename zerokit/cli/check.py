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
    seq_len_is_max,
    warn_seq_len,
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
    from zerokit.config.accelerate_yaml import is_accelerate_config, read_accelerate_config

    if is_accelerate_config(args.config):
        # an accelerate config (HF Trainer / TRL ALST): its ds_config, with the Ulysses degree of its
        # parallelism_config; its ranks unless the hardware flags give them
        acc = read_accelerate_config(args.config)
        config = acc.ds_config
        if acc.processes is not None and not (args.gpus_per_node or args.nodes or args.hostfile):
            if acc.processes % acc.machines:
                raise ZerokitError(f"{args.config}: num_processes {acc.processes} does not split over num_machines "
                                   f"{acc.machines}: give {flag('gpus-per-node')} and {flag('nodes')}")
            args.gpus_per_node, args.nodes = acc.processes // acc.machines, acc.machines
    else:
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
    ckpt = None if args.activation_checkpointing is None else args.activation_checkpointing in ("on", "offload")
    longest = seq_len_is_max(args)
    if longest and model is None:
        raise ZerokitError(f"{flag('seq-len')} max searches the memory model: give {flag('model')}")
    result = check_config(config, args.config, model, cluster, load_workload(args, model), activation_checkpointing=ckpt,
                          trainer_values=trainer_values or None, precision=args.precision, answer_auto=True,
                          client_optimizer=args.client_optimizer,
                          tiled={"tiled_loss": args.tiled_loss == "on", "tiled_mlp": args.tiled_mlp == "on",
                                 **({"compile": args.compile} if args.compile else {})},
                          checkpoint_offload=args.activation_checkpointing == "offload", longest_seq=longest)
    result.finetune, result.model = finetune, model
    if is_accelerate_config(args.config):
        result.findings += acc.ignored
    if is_accelerate_config(args.config) and acc.sequence_parallel > 1:
        # accelerate registers Ulysses itself (accelerator.py: UlyssesSPAttentionHF.register_with_transformers, its mpu
        # to deepspeed.initialize): lint's warning that the key alone splits nothing is not this launch's
        result.findings = [f for f in result.findings if f.key != "sequence_parallel_size"]
        result.assumed.append({"key": "sequence_parallel_size", "value": acc.sequence_parallel, "why": (
            f"parallelism_config_sp_size of {args.config}: accelerate registers Ulysses with this degree (ds_config "
            f"from {acc.source})")})
    if model is not None and result.workload is not None:
        if longest:
            warn_seq_len(model, result.workload.seq_len)  # the answer, past the rotary positions: said once
        warning = model.check_seq_len(result.workload.seq_len)
        result.warnings += [warning] if warning else []
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
