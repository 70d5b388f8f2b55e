"""The `zerokit` command: thin parsers (one module per command) over library functions.

This package is the only place argparse is used and a Namespace becomes typed objects (common.py). Heavy
imports (torch, deepspeed, transformers) happen inside the commands that need them, so `zerokit --help` and
`zerokit plan --params 7e9` start instantly.
"""

from __future__ import annotations

import argparse
import os
import sys

from zerokit.cli.calibrate import add_calibrate_parser
from zerokit.cli.check import add_check_parser
from zerokit.cli.common import (
    _Parser,
    hardware_parent,
    model_parent,
    setup_parent,
    workload_parent,
)
from zerokit.cli.launch import add_launch_parser
from zerokit.cli.plan import add_plan_parser, add_render_parser
from zerokit.core.errors import EXIT_INVALID, EXIT_OK, ZerokitError
from zerokit.core.quiet import VERBOSE_ENV


def build_parser() -> argparse.ArgumentParser:
    from zerokit import __version__

    parser = _Parser(prog="zerokit", description="Will it fit, which ZeRO setup, how long: and run it with DeepSpeed.")
    parser.add_argument("--version", action="version", version=f"zerokit {__version__}")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks on errors (implies -v)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="let DeepSpeed, transformers and the hub client print their own warnings")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    hw, mdl, wl, st = hardware_parent(), model_parent(), workload_parent(), setup_parent()
    add_plan_parser(sub, [mdl, wl, st, hw])
    add_render_parser(sub, [mdl, wl, st, hw])
    add_check_parser(sub, [mdl, wl, hw])
    add_launch_parser(sub, [st, hw])
    add_calibrate_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verbose or args.debug:
        os.environ[VERBOSE_ENV] = "1"  # read by zerokit.core.quiet here and in the ranks
    if not getattr(args, "command", None):
        print("error: no command given: zerokit plan|render|check|launch|calibrate ... (see `zerokit --help`)",
              file=sys.stderr)
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
