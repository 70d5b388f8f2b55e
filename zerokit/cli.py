"""The `zerokit` command: thin parsers over library functions.

Heavy imports (torch, deepspeed, transformers) happen inside the commands that need them, so
`zerokit --help` and `zerokit plan --params 7e9` start instantly.
"""

from __future__ import annotations

import argparse
import json
import sys

from zerokit.errors import EXIT_DOES_NOT_FIT, EXIT_INVALID, EXIT_OK, ZerokitError


def nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {text!r}")
    return v


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line with exit code 2 (no usage dump)."""

    def error(self, message):
        self.exit(EXIT_INVALID, f"error: {message} (see `{self.prog} --help`)\n")


def hardware_parent() -> argparse.ArgumentParser:
    p = _Parser(add_help=False)
    g = p.add_argument_group("hardware (the same on every command)")
    g.add_argument("--gpu", help="accelerator from the catalog (a100-80gb, h100-80gb, h200, l40s, a10g, v100-32gb, "
                                 "rtx4090, cpu, ...); default a100-80gb, or cpu for launch on a machine without CUDA")
    g.add_argument("--gpu-memory", metavar="SIZE", help="memory per GPU, overrides the catalog (e.g. 80GB, 24GiB)")
    g.add_argument("--gpus-per-node", type=positive_int, metavar="N")
    g.add_argument("--nodes", type=positive_int, metavar="N")
    g.add_argument("--hostfile", metavar="FILE", help="DeepSpeed hostfile (`host slots=N` per line): sets nodes and GPUs per node")
    g.add_argument("--cpu-memory", metavar="SIZE", help="host RAM per node (checked when given)")
    g.add_argument("--nvme-path", metavar="DIR", help="NVMe mount for ZeRO-Infinity offload")
    g.add_argument("--nvme-size", metavar="SIZE", help="free NVMe per node (default: free space at --nvme-path)")
    g.add_argument("--hardware-profile", metavar="FILE", help="measured profile from `zerokit calibrate`")
    return p


def model_parent() -> argparse.ArgumentParser:
    p = _Parser(add_help=False)
    g = p.add_argument_group("model")
    g.add_argument("--params", metavar="N", help="bare parameter count (7e9, 7B, 125M) instead of a model config")
    g.add_argument("--hidden-size", type=positive_int)
    g.add_argument("--num-layers", type=positive_int)
    g.add_argument("--vocab-size", type=positive_int)
    return p


def workload_parent() -> argparse.ArgumentParser:
    p = _Parser(add_help=False)
    g = p.add_argument_group("workload")
    g.add_argument("--seq-len", type=positive_int, default=2048, help="tokens per sample (default 2048)")
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
    g.add_argument("--memory-fraction", type=positive_float, default=None,
                   help="share of GPU memory a plan may use (default 0.95; the rest absorbs fragmentation)")
    return p


def build_parser() -> argparse.ArgumentParser:
    from zerokit import __version__

    parser = _Parser(prog="zerokit", description="Will it fit, which ZeRO setup, how long: and run it with DeepSpeed.")
    parser.add_argument("--version", action="version", version=f"zerokit {__version__}")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    hw, mdl, wl, st = hardware_parent(), model_parent(), workload_parent(), setup_parent()

    p = sub.add_parser("plan", parents=[mdl, wl, st, hw], help="memory breakdown, best ZeRO setup, step and total time")
    p.add_argument("model", nargs="?", help="HF model id, local directory with config.json, or bundled name (tiny-llama, llama-3-8b, ...)")
    p.add_argument("--trace", action="store_true", help="measure activations by tracing the model under FakeTensorMode (slower)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("render", parents=[mdl, wl, st, hw], help="plan, then write the ds_config.json")
    p.add_argument("model", nargs="?")
    p.add_argument("-o", "--output", default="ds_config.json", help="where to write (default ds_config.json; - for stdout)")
    p.add_argument("--profile", choices=("deepspeed", "hf"), default="deepspeed",
                   help="deepspeed: every value concrete; hf: 'auto' where the HF Trainer fills values")
    p.add_argument("--json", action="store_true", help="print the plan as JSON as well")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("check", parents=[mdl, wl, hw], help="validate an existing ds_config.json and check that it fits")
    p.add_argument("config", help="ds_config.json to check")
    p.add_argument("--model", dest="model", help="HF model id, local directory or bundled name")
    p.add_argument("--activation-checkpointing", choices=("on", "off"),
                   help="override what the config says (its activation_checkpointing block)")
    p.add_argument("--micro-batch", type=positive_int, dest="micro_batch_size",
                   help='for "auto" configs: the per-device batch the HF Trainer will fill in (default: its default, 8)')
    p.add_argument("--grad-accum", type=positive_int, dest="gradient_accumulation_steps",
                   help='for "auto" configs: the accumulation the HF Trainer will fill in (default 1)')
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_check)

    try:
        from zerokit.launch.cli import add_launch_parser
    except ImportError:  # launch not installed in this build
        pass
    else:
        add_launch_parser(sub, hw)

    p = sub.add_parser("calibrate", help="measure this machine and write a hardware profile for --hardware-profile")
    p.add_argument("-o", "--output", default="hardware_profile.json")
    p.add_argument("--quick", action="store_true", help="fewer and smaller points, no engine costs (~1 min on 2 cores)")
    p.set_defaults(func=cmd_calibrate)
    return parser


# ---------------------------------------------------------------------------------------------
# Shared argument handling


def load_model(args):
    from zerokit import model_spec

    if getattr(args, "params", None):
        if getattr(args, "model", None):
            raise ZerokitError("give either a model or --params, not both")
        from zerokit.units import parse_count

        return model_spec.spec_from_params(parse_count(args.params, "--params"), hidden_size=args.hidden_size,
                                           num_layers=args.num_layers, vocab_size=args.vocab_size)
    if not getattr(args, "model", None):
        raise ZerokitError("no model given: pass a model id/directory/bundled name (e.g. tiny-llama) or --params N")
    return model_spec.load_model_spec(args.model)


def load_cluster(args, default_gpu: str | None = None):
    from zerokit.hardware import build_cluster

    return build_cluster(gpu=args.gpu or default_gpu, gpu_memory=args.gpu_memory, gpus_per_node=args.gpus_per_node,
                         nodes=args.nodes, hostfile=args.hostfile, cpu_memory=args.cpu_memory,
                         nvme_path=args.nvme_path, nvme_size=args.nvme_size, hardware_profile=args.hardware_profile)


def load_workload(args):
    from zerokit.zero_setup import Workload

    return Workload(seq_len=args.seq_len, global_batch=args.global_batch, samples=args.samples, epochs=args.epochs,
                    attention=args.attention)


def pins_from_args(args) -> dict:
    pins = {k: getattr(args, k, None) for k in ("zero_stage", "offload_optimizer", "offload_param", "precision",
                                                "micro_batch_size", "gradient_accumulation_steps")}
    ac = getattr(args, "activation_checkpointing", None)
    if ac is not None:
        pins["activation_checkpointing"] = ac == "on"
    return {k: v for k, v in pins.items() if v is not None}


def build_plan(args):
    from zerokit.memory import DEFAULT_MEMORY_FRACTION
    from zerokit.planner import make_plan

    model = load_model(args)
    cluster = load_cluster(args)
    workload = load_workload(args)
    fraction = args.memory_fraction or DEFAULT_MEMORY_FRACTION
    if fraction > 1:
        raise ZerokitError(f"--memory-fraction must be at most 1, got {fraction}")
    plan = make_plan(model, cluster, workload, pins_from_args(args), memory_fraction=fraction)
    if args.hardware_profile:
        plan.notes.append(_calibration_effect(plan, model, workload, args, fraction))
    if getattr(args, "trace", False):
        from zerokit.trace import apply_trace_to_plan

        apply_trace_to_plan(plan, args.model)
    if plan.best is not None:
        from zerokit.render import render_ds_config

        plan.ds_config = render_ds_config(plan.best.setup, cluster, model, workload,
                                          profile=getattr(args, "profile", "deepspeed"))
    return plan


def _calibration_effect(plan, model, workload, args, fraction) -> str:
    """Say whether the measured hardware profile changed the planner's choice against catalog peaks."""
    from argparse import Namespace

    from zerokit.planner import make_plan

    catalog_args = Namespace(**{**vars(args), "hardware_profile": None})
    try:
        before = make_plan(model, load_cluster(catalog_args), workload, pins_from_args(args), memory_fraction=fraction)
    except ZerokitError:
        return "calibrated: the catalog figures alone give no plan to compare with"
    old = before.choice.label if before.fits else "nothing fits"
    new = plan.choice.label if plan.fits else "nothing fits"
    if old == new:
        return f"calibrated with {args.hardware_profile}: same choice as catalog peaks ({new})"
    return f"calibrated with {args.hardware_profile}: choice changed from {old} (catalog peaks) to {new}"


# ---------------------------------------------------------------------------------------------
# Commands


def cmd_plan(args) -> int:
    plan = build_plan(args)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        from zerokit.report_text import format_plan

        print(format_plan(plan))
    return EXIT_OK if plan.fits else EXIT_DOES_NOT_FIT


def cmd_render(args) -> int:
    plan = build_plan(args)
    if plan.ds_config is None or not plan.fits:
        from zerokit.report_text import format_plan

        print(format_plan(plan), file=sys.stderr)
        raise ZerokitError("nothing fits, no ds_config written: see the suggestions above", exit_code=EXIT_DOES_NOT_FIT)
    text = json.dumps(plan.ds_config, indent=2) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    else:
        from zerokit.render import write_json_atomic

        write_json_atomic(args.output, plan.ds_config)
        if args.json:
            print(json.dumps(plan.to_dict(), indent=2))
        else:
            print(f"wrote {args.output} ({plan.choice.label})")
    return EXIT_OK


def cmd_check(args) -> int:
    from zerokit.check import run_check

    result = run_check(args)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        from zerokit.report_text import format_check

        print(format_check(result))
    return result.exit_code


def cmd_calibrate(args) -> int:
    from zerokit.calibrate import format_profile, run_calibration

    profile = run_calibration(args.output, quick=args.quick, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(format_profile(profile))  # the summary; every measured point is in the file
    print(f"wrote {args.output}", file=sys.stderr)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_INVALID
    try:
        return args.func(args)
    except ZerokitError as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `zerokit plan ... | head`: the reader left; not an error
        sys.stdout = None
        return EXIT_OK
    except Exception as e:  # an unexpected failure: still one line unless --debug
        if args.debug:
            raise
        print(f"error: {type(e).__name__}: {e} (rerun with --debug for the traceback)", file=sys.stderr)
        return EXIT_INVALID


if __name__ == "__main__":
    raise SystemExit(main())
