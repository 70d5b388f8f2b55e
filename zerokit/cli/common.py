"""What every command shares: number types, the one-line usage error, the option groups, and the only place a
Namespace becomes typed objects (model spec, hardware, workload, pins)."""

from __future__ import annotations

import argparse
import math
import sys

from zerokit.core.errors import EXIT_INVALID, ZerokitError
from zerokit.core.limits import MAX_COUNT, MAX_GPUS_PER_NODE, MAX_WORLD_SIZE

DEFAULT_PLAN_SEQ_LEN = 2048  # plan, render, check: tokens per sample unless --seq-len (capped at the model's maximum)


def _number(text: str, cast, valid, unreadable: str, invalid: str):
    """`text` as cast(text) when valid(value); else argparse's one-line error with the message that applies."""
    try:
        v = cast(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected {unreadable}, got {text!r}") from None
    if not valid(v):
        raise argparse.ArgumentTypeError(f"expected {invalid}, got {text!r}")
    return v


# the bounds are zerokit.core.limits'; each says where it comes from
def nonneg_int(text: str) -> int:
    return _number(text, int, lambda v: 0 <= v <= MAX_COUNT, "a whole number", f"0 or more, up to {MAX_COUNT:,}")


def positive_int(text: str) -> int:
    return _number(text, int, lambda v: 1 <= v <= MAX_COUNT, "a positive integer", f"a positive integer up to {MAX_COUNT:,}")


def gpus_per_node(text: str) -> int:
    return _number(text, int, lambda v: 1 <= v <= MAX_GPUS_PER_NODE, "a positive integer",
                   f"a positive integer up to {MAX_GPUS_PER_NODE} (the ranks one host can run)")


def node_count(text: str) -> int:
    return _number(text, int, lambda v: 1 <= v <= MAX_WORLD_SIZE, "a positive integer",
                   f"a positive integer up to {MAX_WORLD_SIZE:,}")


def positive_float(text: str) -> float:
    return _number(text, float, lambda v: 0 < v < math.inf, "a positive number", "a positive finite number")


def fraction(text: str) -> float:
    return _number(text, float, lambda v: 0 < v <= 1, "a number", "a fraction above 0 and at most 1")


def port(text: str) -> int:
    return _number(text, int, lambda v: 1 <= v <= 65535, "a port number", "a TCP port, 1 to 65535")


def nonempty(text: str) -> str:
    """A name or path that must not be empty (argparse takes "" as given)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a value, got an empty string")
    return text


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line with exit code 2 (no usage dump)."""

    def error(self, message):
        line = str(ZerokitError(message))  # one line whatever the user typed (ZerokitError escapes line breaks)
        self.exit(EXIT_INVALID, f"error: {line} (see `{self.prog} --help`)\n")


def hardware_parent() -> argparse.ArgumentParser:
    p = _Parser(add_help=False)
    g = p.add_argument_group("hardware (the same on every command)")
    g.add_argument("--gpu", type=nonempty,
                   help="accelerator from the catalog as you would write it or nvidia-smi prints it (a100-80gb, H100, "
                        "'NVIDIA A100-SXM4-80GB', rtx-4090, cpu, ...), or auto for this machine's GPUs; default "
                        "a100-80gb, or cpu for launch on a machine without CUDA")
    g.add_argument("--gpu-memory", type=nonempty, metavar="SIZE", help="memory per GPU, overrides the catalog (e.g. 80GB, 24GiB)")
    g.add_argument("--gpus-per-node", type=gpus_per_node, metavar="N")
    g.add_argument("--nodes", type=node_count, metavar="N")
    g.add_argument("--hostfile", type=nonempty, metavar="FILE", help="DeepSpeed hostfile (`host slots=N` per line): sets nodes and GPUs per node")
    g.add_argument("--cpu-memory", type=nonempty, metavar="SIZE", help="host RAM per node (checked when given)")
    g.add_argument("--nvme-path", type=nonempty, metavar="DIR", help="NVMe mount for ZeRO-Infinity offload")
    g.add_argument("--nvme-size", type=nonempty, metavar="SIZE", help="free NVMe per node (default: free space at --nvme-path)")
    g.add_argument("--hardware-profile", type=nonempty, metavar="FILE",
                   help="measured profile from `zerokit calibrate` (default: the one calibrate wrote on this machine, "
                        "when it measured the --gpu planned for; none: the catalog's figures)")
    from zerokit.spec.hardware import DIST_BACKENDS

    g.add_argument("--dist-backend", choices=DIST_BACKENDS,
                   help="how the ranks communicate (deepspeed.init_distributed(dist_backend=...)); default: DeepSpeed's "
                        "for the accelerator (nccl on NVIDIA GPUs, gloo on cpu); priced in the step time")
    return p


def model_parent() -> argparse.ArgumentParser:
    p = _Parser(add_help=False)
    g = p.add_argument_group("model")
    g.add_argument("--params", type=nonempty, metavar="N", help="bare parameter count (7e9, 7B, 125M) instead of a model config")
    g.add_argument("--hidden-size", type=positive_int)
    g.add_argument("--num-layers", type=positive_int)
    g.add_argument("--vocab-size", type=positive_int)
    return p


def workload_parent() -> argparse.ArgumentParser:
    p = _Parser(add_help=False)
    g = p.add_argument_group("workload")
    g.add_argument("--seq-len", type=positive_int, default=None,
                   help=f"tokens per sample (default {DEFAULT_PLAN_SEQ_LEN}, or the model's maximum when smaller)")
    g.add_argument("--global-batch", type=positive_int, metavar="N",
                   help="samples per optimizer step = micro x accumulation x GPUs per node x nodes")
    g.add_argument("--samples", type=positive_int, metavar="N", help="training samples per epoch (for total time)")
    g.add_argument("--epochs", type=positive_float, default=1.0)
    g.add_argument("--attention", choices=("sdpa", "flash", "eager"), default="sdpa")
    return p


def setup_parent() -> argparse.ArgumentParser:
    p = _Parser(add_help=False)
    g = p.add_argument_group("pin a setup dimension (the planner chooses the rest)")
    g.add_argument("--stage", type=int, choices=(0, 1, 2, 3), dest="zero_stage")
    g.add_argument("--offload-optimizer", choices=("none", "cpu", "nvme"))
    g.add_argument("--offload-param", choices=("none", "cpu", "nvme"))
    g.add_argument("--precision", choices=("bf16", "fp16", "fp32"))
    g.add_argument("--micro-batch", type=positive_int, dest="micro_batch_size")
    g.add_argument("--grad-accum", type=positive_int, dest="gradient_accumulation_steps")
    g.add_argument("--activation-checkpointing", choices=("on", "off"))
    g.add_argument("--tensor-parallel", type=positive_int, metavar="N", dest="tensor_parallel",
                   help="AutoTP ranks per model replica (1: none; ZeRO-0/1/2, full fine-tune)")
    g.add_argument("--sequence-parallel", type=positive_int, metavar="N", dest="sequence_parallel",
                   help="Ulysses sequence-parallel ranks per sequence (1: none)")
    g.add_argument("--hpz", type=positive_int, metavar="N", dest="hpz_partition_size",
                   help="ZeRO++ hpZ secondary partition size, ranks (ZeRO-3; 1: none)")
    g.add_argument("--tiled-loss", choices=("on", "off"), help="logits and loss one slice of tokens at a time (ALST)")
    g.add_argument("--tiled-mlp", choices=("on", "off"), help="each MLP one slice of tokens at a time (ALST)")
    g.add_argument("--memory-fraction", type=fraction, default=None,
                   help="share of GPU memory a plan may use (default 0.95; the rest absorbs fragmentation)")
    return p


# ---------------------------------------------------------------------------------------------
# Namespace -> typed objects


def hardware_from_args(args):
    from zerokit.spec.hardware import HardwareOptions

    return HardwareOptions(gpu=args.gpu, gpu_memory=args.gpu_memory, gpus_per_node=args.gpus_per_node,
                           nodes=args.nodes, hostfile=args.hostfile, cpu_memory=args.cpu_memory,
                           nvme_path=args.nvme_path, nvme_size=args.nvme_size, hardware_profile=args.hardware_profile,
                           dist_backend=getattr(args, "dist_backend", None))


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
    """The ModelSpec: from --params (pure arithmetic) or the model the resolver finds."""
    if getattr(args, "params", None):
        if getattr(args, "model", None):
            raise ZerokitError("give either a model or --params, not both")
        from zerokit.core.units import parse_param_count
        from zerokit.spec.model import spec_from_params

        return spec_from_params(parse_param_count(args.params, "--params"), hidden_size=args.hidden_size,
                                num_layers=args.num_layers, vocab_size=args.vocab_size)
    if not getattr(args, "model", None):
        raise ZerokitError("no model given: pass a model id/directory/bundled name (e.g. tiny-llama) or --params N")
    from zerokit.spec.model import load_model_spec

    return load_model_spec(args.model)


def load_workload(args, model=None):
    """The Workload; with the model, its --seq-len held to the model's positions (ModelSpec.check_seq_len)."""
    from zerokit.spec.setup import Workload

    seq_len = args.seq_len
    if seq_len is None:
        seq_len = min(DEFAULT_PLAN_SEQ_LEN, (model.max_positions if model is not None else None) or DEFAULT_PLAN_SEQ_LEN)
    elif model is not None:
        model.check_seq_len(seq_len)
    return Workload(seq_len=seq_len, global_batch=args.global_batch, samples=args.samples, epochs=args.epochs,
                    attention=args.attention)


def add_finetune_args(p) -> None:
    g = p.add_argument_group("fine-tuning (what trains: gradients and optimizer states exist for it only)")
    g.add_argument("--finetune", choices=("full", "lora", "qlora"), default="full",
                   help="full: every weight trains (default); lora: peft LoRA adapters on a frozen base; qlora: LoRA "
                        "on a base quantized to 4-bit NF4 by bitsandbytes")
    g.add_argument("--lora-r", type=int, default=None, metavar="N", help="LoRA rank (default 16)")
    g.add_argument("--lora-alpha", type=float, default=None, help="LoRA alpha (default 8, peft's)")
    g.add_argument("--lora-dropout", type=float, default=None, help="LoRA dropout (default 0)")
    g.add_argument("--lora-targets", type=nonempty, default=None, metavar="all-linear|NAME,NAME",
                   help="modules that get adapters: all-linear (peft's meaning: every Linear but the LM head; default) "
                        "or module names such as q_proj,v_proj")
    g.add_argument("--bnb-4bit-quant-storage", choices=("uint8", "bf16", "fp16", "fp32"), default=None,
                   help="qlora: the dtype the packed 4-bit weights are stored in (BitsAndBytesConfig; default uint8)")
    g.add_argument("--bnb-4bit-use-double-quant", choices=("on", "off"), default=None,
                   help="qlora: quantize the quantization constants too (default on, as the QLoRA paper)")
    g.add_argument("--freeze", action="append", default=None, metavar="PATTERN",
                   help="full fine-tune with the parameters whose names contain PATTERN frozen, or match it as a glob "
                        "over the whole name when it has *?[ (repeatable; e.g. embed_tokens, layers.0., '*layers.[0-9].*')")


def finetune_from_args(args):
    from zerokit.spec.finetune import Finetune

    mode = getattr(args, "finetune", None) or "full"
    lora = {k: getattr(args, k, None) for k in ("lora_r", "lora_alpha", "lora_dropout", "lora_targets")}
    quant = {k: getattr(args, k, None) for k in ("bnb_4bit_quant_storage", "bnb_4bit_use_double_quant")}
    given = [f"--{k.replace('_', '-')}" for k, v in lora.items() if v is not None]
    if mode == "full" and given:
        raise ZerokitError(f"{given[0]} needs --finetune lora or qlora")
    given = [f"--{k.replace('_', '-')}" for k, v in quant.items() if v is not None]
    if mode != "qlora" and given:
        raise ZerokitError(f"{given[0]} needs --finetune qlora")
    if quant["bnb_4bit_use_double_quant"] is not None:
        quant["bnb_4bit_use_double_quant"] = quant["bnb_4bit_use_double_quant"] == "on"
    return Finetune(mode=mode, freeze=tuple(getattr(args, "freeze", None) or ()),
                    **{k: v for k, v in {**lora, **quant}.items() if v is not None})


def apply_finetune(args, model, finetune):
    """The ModelSpec as fine-tuned, counted from the model's real module shapes (spec/finetune.py)."""
    if getattr(args, "params", None):
        raise ZerokitError(f"--finetune {finetune.mode}/--freeze count the model's modules: give a model config, "
                           "not --params")
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
            pins[key] = v == "on"
    return {k: v for k, v in pins.items() if v is not None}


def memory_fraction_from_args(args) -> float:
    from zerokit.estimate.memory import DEFAULT_MEMORY_FRACTION

    return getattr(args, "memory_fraction", None) or DEFAULT_MEMORY_FRACTION  # bounded by its type, fraction()
