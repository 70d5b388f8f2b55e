"""`zerokit plan` and `zerokit render`: the planner's choice, as a table or JSON, and as a ds_config.json."""

from __future__ import annotations

import json
import sys

from zerokit.cli.common import (
    add_options,
    apply_finetune,
    finetune_from_args,
    hardware_from_args,
    load_cluster,
    load_model,
    load_workload,
    memory_fraction_from_args,
    pins_from_args,
    seq_len_is_max,
    warn_seq_len,
)
from zerokit.core.errors import EXIT_DOES_NOT_FIT, EXIT_OK, ZerokitError
from zerokit.core.options import flag, option


def add_plan_parser(sub) -> None:
    p = sub.add_parser("plan", help="memory breakdown, best ZeRO setup, step and total time")
    add_options(p, "plan")
    p.set_defaults(func=cmd_plan)


def add_render_parser(sub) -> None:
    p = sub.add_parser("render", help="plan, then write the ds_config.json")
    add_options(p, "render")
    p.set_defaults(func=cmd_render)


def planned_model(args):
    """The ModelSpec as the fine-tune trains it (LoRA/QLoRA/--freeze counted from the model's modules)."""
    model = load_model(args)
    finetune = finetune_from_args(args)
    if not finetune.is_full:
        model = apply_finetune(args, model, finetune)
    return model


def build_plan(args, model=None):
    """The plan `zerokit plan` prints; `model`: planned_model(args), when the caller has it already."""
    from zerokit.plan.planner import make_plan

    model = model if model is not None else planned_model(args)
    finetune = finetune_from_args(args)
    cluster = load_cluster(args)
    workload = load_workload(args, model)
    fraction = memory_fraction_from_args(args)
    pins = pins_from_args(args)
    if seq_len_is_max(args):  # the longest sequence that fits, by search over the memory model
        from zerokit.plan.search import longest_plan

        plan, search = longest_plan(model, cluster, workload, pins, fraction)
        workload = plan.workload
        plan.seq_len_search = search
        plan.notes.append(search.note)
        warn_seq_len(model, workload.seq_len)
    else:
        plan = make_plan(model, cluster, workload, pins, memory_fraction=fraction)
    warning = model.check_seq_len(workload.seq_len)  # printed by load_workload / warn_seq_len: once
    plan.warnings += [warning] if warning else []
    plan.finetune = finetune
    if not plan.fits and finetune.is_full and args.model:  # would LoRA or QLoRA fit where the full fine-tune does not?
        from zerokit.plan.planner import finetune_suggestions
        from zerokit.spec.resolve import resolve_model

        plan.suggestions += finetune_suggestions(str(resolve_model(args.model).config_file()), model, cluster,
                                                 workload, pins, memory_fraction=fraction)
    if cluster.profile is not None:  # --hardware-profile, or this machine's own (spec.hardware.machine_profile_for)
        from zerokit.plan.refine import calibration_effect

        from dataclasses import replace

        try:  # the same plan on the catalog's figures
            catalog_cluster = replace(hardware_from_args(args), hardware_profile="none").build()
            catalog = make_plan(model, catalog_cluster, workload, pins, memory_fraction=fraction)
        except ZerokitError:
            catalog = None
        plan.notes.append(calibration_effect(plan, catalog, cluster.profile.path))
    if getattr(args, "trace", False) and plan.best is not None:
        s = plan.best.setup
        if not args.model:
            raise ZerokitError(f"{flag('trace')} needs a model config to trace: give a model id or directory, not "
                               f"{flag('params')}")
        if plan.model.liger_kernels:  # the trace runs transformers' own modules
            raise ZerokitError(f"{flag('trace')} traces transformers' own modules, not Liger's kernels (Triton, GPU "
                               f"only): drop {flag('trace')} or {flag('liger-kernels')}")
        if s.tensor_parallel > 1 or s.sequence_parallel > 1 or s.tiled_loss or s.tiled_mlp:
            # the trace runs the unsplit HF model on one process: it measures none of these
            raise ZerokitError(f"{flag('trace')} measures the unsplit model on one process, not {s.label}: pin "
                               f"{flag('tensor-parallel')} 1 {flag('sequence-parallel')} 1 {flag('tiled-loss')} off "
                               f"{flag('tiled-mlp')} off, or drop {flag('trace')}")
        from zerokit.measure.trace import trace_activation_memory
        from zerokit.plan.refine import apply_activation_trace
        from zerokit.spec.resolve import resolve_model

        setup = plan.best.setup
        traced = trace_activation_memory(
            str(resolve_model(args.model).config_file()), seq_len=workload.seq_len, micro_batch=setup.micro_batch_size,
            precision=setup.precision, activation_checkpointing=setup.activation_checkpointing,
            attn_implementation="eager" if workload.attention == "eager" else "sdpa",
        )
        apply_activation_trace(plan, traced)
    if plan.best is not None:
        from zerokit.config.render import render_ds_config

        profile = getattr(args, "profile", None) or "deepspeed"
        plan.ds_config = render_ds_config(plan.best.setup, cluster, model, workload,
                                          profile="hf" if profile == "accelerate" else profile)
        if model.trained.finetune_mode == "qlora" and plan.best.setup.zero_stage == 3:
            plan.notes.append("ds_config: stage3_param_persistence_threshold 0 (not 10 x hidden): a packed 4-bit weight "
                              "holds 1/2 to 1/8 of its weight's elements, and DeepSpeed keeps every parameter under the "
                              "threshold whole on every rank (ZeroKnobs.for_model)")
    return plan


def cmd_plan(args) -> int:
    if args.compare_gpus or args.deadline:
        if seq_len_is_max(args):  # each answers for one sequence length
            raise ZerokitError(f"{flag('seq-len')} max searches the length for one setup: give a length with "
                               f"{flag('deadline' if args.deadline else 'compare-gpus')}, or drop it")
        return cmd_scale(args)
    if args.plot:  # a picture that cannot be written is refused before the planning
        from zerokit.report.plot import check_plot_path

        check_plot_path(args.plot)
    plan = build_plan(args)
    if args.plot:  # drawn before anything is printed: a failure is one error line
        from zerokit.report.plot import plot_memory

        plot_memory(plan, args.plot)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        from zerokit.report.plan_text import format_plan

        print(format_plan(plan))
    if args.plot:
        print(f"plot      wrote {args.plot} (per-GPU memory by term, the chosen setup first)",
              file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK if plan.fits else EXIT_DOES_NOT_FIT


def cmd_scale(args) -> int:
    """--deadline (the fewest GPUs that finish in time; the plan is then made for that count) and --compare-gpus
    (one row per GPU kind), in text or JSON (plan.scale)."""
    from zerokit.plan import scale
    from zerokit.report.plan_text import format_deadline, format_scale_rows

    model = planned_model(args)
    workload = load_workload(args, model)
    hw, pins, fraction = hardware_from_args(args), pins_from_args(args), memory_fraction_from_args(args)
    if args.compare_gpus:
        for name in ("plot", "trace"):
            if getattr(args, name):
                raise ZerokitError(f"{flag('compare-gpus')} prints one row per GPU: drop {flag(name)}")
        rows = scale.compare_gpus(model, hw, args.compare_gpus, workload, pins, fraction, args.deadline)
        if args.json:
            print(json.dumps({"model": model.to_dict(), "workload": vars(workload).copy(),
                              "deadline_seconds": args.deadline, "compare": [r.to_dict() for r in rows]}, indent=2))
        else:
            print(format_scale_rows(rows, workload, args.deadline))
        return EXIT_OK if any(r.fits and r.meets_deadline is not False for r in rows) else EXIT_DOES_NOT_FIT
    gpu = hw.build().accelerator.name  # an unknown --gpu: its one line before the search
    answer = scale.for_deadline(model, hw, workload, pins, args.deadline, fraction)
    if not answer.met:
        raise scale.deadline_missed(answer, gpu, workload)
    args.gpus_per_node, args.nodes = answer.row.gpus_per_node, answer.row.nodes
    plan = build_plan(args, model)
    if args.plot:
        from zerokit.report.plot import check_plot_path, plot_memory

        check_plot_path(args.plot)
        plot_memory(plan, args.plot)
    if args.json:
        print(json.dumps({**plan.to_dict(), "deadline": answer.to_dict()}, indent=2))
    else:
        from zerokit.report.plan_text import format_plan

        print(format_deadline(answer, workload))
        print(format_plan(plan))
    return EXIT_OK if plan.fits else EXIT_DOES_NOT_FIT


def cmd_render(args) -> int:
    args.output = args.output or "ds_config.json"
    args.profile = args.profile or "deepspeed"
    if args.output != "-":  # a file that could not be written is refused before the planning
        from zerokit.core.fsutil import check_writable_file

        check_writable_file(args.output, f"{option('output').short} {args.output}")
    plan = build_plan(args)
    if plan.ds_config is None or not plan.fits:
        from zerokit.report.plan_text import format_plan

        print(format_plan(plan), file=sys.stderr)
        raise ZerokitError("nothing fits, no ds_config written: see the suggestions above", exit_code=EXIT_DOES_NOT_FIT)
    text = json.dumps(plan.ds_config, indent=2) + "\n"
    if args.output == "-":
        if args.profile == "accelerate":
            raise ZerokitError(f"{flag('profile')} accelerate writes two files (the ds_config and {ACCELERATE_YAML}): "
                               f"give {option('output').short} FILE instead of -")
        sys.stdout.write(text)
        return EXIT_OK
    from zerokit.config.render import write_json_atomic
    from zerokit.core.fsutil import missing_folders, remove_folders

    written = [args.output]
    created = missing_folders(args.output)  # -o into folders that do not exist: made as mkdir -p, by the first write
    yaml_path = write_accelerate_config(plan, args.output) if args.profile == "accelerate" else None
    try:
        write_json_atomic(args.output, plan.ds_config)
    except ZerokitError:
        if yaml_path is not None:
            yaml_path.unlink(missing_ok=True)  # nothing half-written: the pair or neither
            remove_folders(created)
        raise
    if yaml_path is not None:
        written.append(str(yaml_path))
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(f"wrote {' and '.join(written)} ({plan.choice.label})")
    return EXIT_OK


ACCELERATE_YAML = "accelerate_config.yaml"


def write_accelerate_config(plan, ds_config_output: str):
    """accelerate_config.yaml beside the ds_config (written atomically, before it: a failure leaves neither)."""
    from pathlib import Path

    from zerokit.config.render import render_accelerate_config
    from zerokit.core.fsutil import atomic_write_text

    ds_path = Path(ds_config_output).resolve()
    yaml_path = Path(ds_config_output).parent / ACCELERATE_YAML
    text = render_accelerate_config(plan.best.setup, plan.cluster, str(ds_path), str(yaml_path))
    try:
        atomic_write_text(yaml_path, text)
    except OSError as e:
        raise ZerokitError(f"cannot write {yaml_path}: {e.strerror}: choose a writable -o directory") from None
    return yaml_path
