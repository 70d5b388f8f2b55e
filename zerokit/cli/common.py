"""What every command shares: the one-line usage error, the parser made from the option declarations
(zerokit.core.options), the run file merged under the command line, and the only place a Namespace becomes typed
objects (model spec, hardware, workload, pins)."""

from __future__ import annotations

import argparse
import sys

from zerokit.core.errors import EXIT_INVALID, ZerokitError
from zerokit.core.options import SEQ_LEN_MAX, Option, flag, for_command, read_run_file

DEFAULT_PLAN_SEQ_LEN = 2048  # plan, render, check: tokens per sample unless --seq-len (capped at the model's maximum)


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line with exit code 2 (no usage dump)."""

    def error(self, message):
        line = str(ZerokitError(message))  # one line whatever the user typed (ZerokitError escapes line breaks)
        self.exit(EXIT_INVALID, f"error: {line} (see `{self.prog} --help`)\n")


def _argtype(opt: Option):
    """The declaration's value type as argparse wants it: ArgumentTypeError with what was expected."""

    def parse(text):
        try:
            return opt.type(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = opt.name  # argparse names the type in its messages
    return parse


def add_options(parser: argparse.ArgumentParser, command: str) -> None:
    """Every option declared for `command` (zerokit.core.options.OPTIONS), in its declared --help group. No
    defaults here: a parsed namespace holds what the command line gave, and `complete` adds the run file's values
    and then the declared defaults."""
    groups: dict[str, object] = {}
    tags = [o.exclusive for o in for_command(command) if o.exclusive and command not in o.positional]
    exclusive = {t: parser.add_mutually_exclusive_group() for t in set(tags) if tags.count(t) > 1}
    for opt in for_command(command):
        kw = dict(help=opt.help or None, default=argparse.SUPPRESS)
        if opt.is_switch:
            kw["action"] = "store_true"
        else:
            kw.update(type=_argtype(opt), choices=opt.choices, metavar=opt.metavar)
            if opt.repeat:
                kw["action"] = "append"
        if command in opt.positional:
            parser.add_argument(opt.key, nargs="?", **kw)
            continue
        if opt.exclusive in exclusive:
            target = exclusive[opt.exclusive]
        elif opt.group:
            if opt.group not in groups:
                groups[opt.group] = parser.add_argument_group(opt.group)
            target = groups[opt.group]
        else:
            target = parser
        names = ([opt.short] if opt.short else []) + [opt.flag] + ["--" + a for a in opt.aliases]
        target.add_argument(*names, dest=opt.key, **kw)


def complete(args: argparse.Namespace, command: str) -> argparse.Namespace:
    """The namespace as the command runs it: the command line, over the run file (-c), over the declared defaults.
    Options that exclude each other (Option.exclusive): one given on the command line drops the file's other."""
    given = set(vars(args))
    path = getattr(args, "config_file", None)
    from_file = read_run_file(path, command) if path else {}
    mine = for_command(command) + (for_command("zerokit") if command != "zerokit" else [])
    tags = {o.key: o.exclusive for o in mine if o.exclusive}
    for key, tag in tags.items():
        rivals = [o.key for o in mine if o.exclusive == tag and o.key != key]
        if key in from_file and any(r in given for r in rivals):
            del from_file[key]
        elif key in from_file and any(r in from_file for r in rivals):
            other = next(r for r in rivals if r in from_file)
            raise ZerokitError(f"{path}: {key.replace('_', '-')} and {other.replace('_', '-')} exclude each other: "
                               "keep one")
    for opt in mine:
        if opt.key in given:
            continue
        if opt.key in from_file:
            setattr(args, opt.key, from_file[opt.key])
        else:
            setattr(args, opt.key, False if opt.is_switch else opt.default)
    return args


# ---------------------------------------------------------------------------------------------
# Namespace -> typed objects


def hardware_from_args(args):
    from zerokit.spec.hardware import HardwareOptions

    return HardwareOptions(gpu=args.gpu, gpu_memory=args.gpu_memory, gpus_per_node=args.gpus_per_node,
                           nodes=args.nodes, hostfile=args.hostfile, cpu_memory=args.cpu_memory,
                           nvme_path=args.nvme_path, nvme_size=args.nvme_size, hardware_profile=args.hardware_profile,
                           dist_backend=getattr(args, "dist_backend", None),
                           intra_node_bandwidth=getattr(args, "intra_node_bandwidth", None),
                           inter_node_bandwidth=getattr(args, "inter_node_bandwidth", None))


def gpu_name_note(args) -> None:
    """A family named without its size ("--gpu A100") is planned for its largest entry: say so on stderr, once."""
    if args.gpu and args.gpu.strip().lower() != "auto":
        from zerokit.spec.hardware import resolve_gpu_name

        _, note = resolve_gpu_name(args.gpu)  # an unknown name raises its one line here already
        if note:
            print(f"note: {note}", file=sys.stderr)


def load_cluster(args):
    gpu_name_note(args)
    return hardware_from_args(args).build()


def load_model(args):
    """The ModelSpec: from --params (pure arithmetic) or the model the resolver finds; as Liger-Kernel patches it
    with --liger-kernels on (or a release number)."""
    model = _counted_model(args)
    liger = getattr(args, "liger_kernels", None)
    if liger in (None, "off"):
        return model
    return model.with_liger_kernels(None if liger == "on" else liger)


def _counted_model(args):
    if getattr(args, "params", None):
        if getattr(args, "model", None):
            raise ZerokitError(f"give either a model or {flag('params')}, not both")
        from zerokit.core.units import parse_param_count
        from zerokit.spec.model import spec_from_params

        return spec_from_params(parse_param_count(args.params, flag("params")), hidden_size=args.hidden_size,
                                num_layers=args.num_layers, vocab_size=args.vocab_size)
    if not getattr(args, "model", None):
        raise ZerokitError("no model given: pass a model id/directory/bundled name (e.g. tiny-llama) or "
                           f"{flag('params')} N")
    from zerokit.spec.model import load_model_spec

    return load_model_spec(args.model)


def load_workload(args, model=None):
    """The Workload; with the model, its --seq-len held to the model's positions (ModelSpec.check_seq_len)."""
    from zerokit.spec.setup import Workload

    seq_len = args.seq_len
    if seq_len == SEQ_LEN_MAX:
        seq_len = 1  # a placeholder: the caller searches (plan/search.py)
    elif seq_len is None:
        seq_len = min(DEFAULT_PLAN_SEQ_LEN, (model.max_positions if model is not None else None) or DEFAULT_PLAN_SEQ_LEN)
    elif model is not None:
        warn_seq_len(model, seq_len)
    doc_len = getattr(args, "doc_len", None)
    if doc_len is not None and args.seq_len != SEQ_LEN_MAX and doc_len > seq_len:
        raise ZerokitError(f"{flag('doc-len')} {doc_len} is longer than the {seq_len}-token sequence it is packed into: "
                           f"give at most {seq_len}, or leave it out for one document per sequence")
    return Workload(seq_len=seq_len, global_batch=args.global_batch, samples=args.samples, epochs=args.epochs or 1.0,
                    attention=args.attention, doc_len=doc_len,
                    checkpoint_reentrant=getattr(args, "checkpoint_reentrant", None) == "on",
                    outputs_held=getattr(args, "training_loop", None) != "trainer")


def warn_seq_len(model, seq_len: int) -> str | None:
    """ModelSpec.check_seq_len: refused past a learned position table; past rotary positions one warning line on
    stderr (also in --json's `warnings`, from the same rule). Returns the warning."""
    warning = model.check_seq_len(seq_len)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    return warning


def seq_len_is_max(args) -> bool:
    """--seq-len max: the longest sequence that fits (plan/search.py)."""
    return getattr(args, "seq_len", None) == SEQ_LEN_MAX


def finetune_from_args(args):
    from zerokit.spec.finetune import Finetune

    mode = getattr(args, "finetune", None) or "full"
    lora = {k: getattr(args, k, None) for k in ("lora_r", "lora_alpha", "lora_dropout", "lora_targets")}
    quant = {k: getattr(args, k, None) for k in ("bnb_4bit_quant_storage", "bnb_4bit_use_double_quant")}
    given = [flag(k.replace("_", "-")) for k, v in lora.items() if v is not None]
    if mode == "full" and given:
        raise ZerokitError(f"{given[0]} needs {flag('finetune')} lora or qlora")
    given = [flag(k.replace("_", "-")) for k, v in quant.items() if v is not None]
    if mode != "qlora" and given:
        raise ZerokitError(f"{given[0]} needs {flag('finetune')} qlora")
    if quant["bnb_4bit_use_double_quant"] is not None:
        quant["bnb_4bit_use_double_quant"] = quant["bnb_4bit_use_double_quant"] == "on"
    return Finetune(mode=mode, freeze=tuple(getattr(args, "freeze", None) or ()),
                    **{k: v for k, v in {**lora, **quant}.items() if v is not None})


def apply_finetune(args, model, finetune):
    """The ModelSpec as fine-tuned, counted from the model's real module shapes (spec/finetune.py)."""
    if getattr(args, "params", None):
        raise ZerokitError(f"{flag('finetune')} {finetune.mode}/{flag('freeze')} count the model's modules: give a "
                           f"model config, not {flag('params')}")
    from zerokit.spec.finetune import finetuned_spec
    from zerokit.spec.resolve import resolve_model

    return finetuned_spec(model, str(resolve_model(args.model).config_file()), finetune)


def pins_from_args(args) -> dict:
    pins = {k: getattr(args, k, None) for k in ("zero_stage", "offload_optimizer", "offload_param", "precision",
                                                "micro_batch_size", "gradient_accumulation_steps", "tensor_parallel",
                                                "sequence_parallel", "hpz_partition_size")}
    for key in ("activation_checkpointing", "tiled_loss", "tiled_mlp"):
        v = getattr(args, key, None)
        if v is not None:
            pins[key] = v in ("on", "offload")
    for key in ("compile", "offload_engine"):
        if getattr(args, key, None) is not None:
            pins[key] = getattr(args, key)
    for key in ("quantized_weights", "quantized_gradients"):
        v = getattr(args, f"zero_{key}", None)
        if v is not None:
            pins[key] = v == "on"
    if getattr(args, "activation_checkpointing", None) is not None:  # on: without offload (the planner's own reach)
        pins["checkpoint_offload"] = args.activation_checkpointing == "offload"
    return {k: v for k, v in pins.items() if v is not None}


def memory_fraction_from_args(args) -> float:
    from zerokit.estimate.memory import DEFAULT_MEMORY_FRACTION

    return getattr(args, "memory_fraction", None) or DEFAULT_MEMORY_FRACTION  # bounded by its type, options.fraction
