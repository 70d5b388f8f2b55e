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
from zerokit.cli.common import _Parser, add_options, complete, to_request
from zerokit.cli.launch import add_launch_parser
from zerokit.cli.plan import add_plan_parser, add_render_parser
from zerokit.cli.serve import add_serve_parser
from zerokit.core.errors import EXIT_INVALID, EXIT_OK, ZerokitError
from zerokit.core.quiet import VERBOSE_ENV


def build_parser() -> argparse.ArgumentParser:
    from zerokit import __version__

    parser = _Parser(prog="zerokit", description="Will it fit, which ZeRO setup, how long: and run it with DeepSpeed.")
    parser.add_argument("--version", action="version", version=f"zerokit {__version__}")
    add_options(parser, "zerokit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    add_plan_parser(sub)
    add_render_parser(sub)
    add_check_parser(sub)
    add_launch_parser(sub)
    add_calibrate_parser(sub)
    add_serve_parser(sub)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line as a command runs it: flags over the -c run file over the declared defaults (ZerokitError
    for a bad run file)."""
    args = build_parser().parse_args(argv)
    return complete(args, args.command or "zerokit")


def request(argv: list[str]):
    """A command line as zerokit.api's Request (parsed, completed, nothing printed): for benchmarks and tests that
    hold an argv and want the API's objects."""
    return to_request(parse(argv), echo=False)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    debug = getattr(args, "debug", False)
    if debug or getattr(args, "verbose", False):
        os.environ[VERBOSE_ENV] = "1"  # read by zerokit.core.quiet here and in the ranks
    if not getattr(args, "command", None):
        print("error: no command given: zerokit plan|render|check|launch|calibrate|serve ... (see `zerokit --help`)",
              file=sys.stderr)
        return EXIT_INVALID
    try:
        args = complete(args, args.command)
        return args.func(args)
    except ZerokitError as e:
        if debug:
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
        if debug:
            raise
        print(f"error: {type(e).__name__}: {e} (rerun with --debug for the traceback)", file=sys.stderr)
        return EXIT_INVALID


if __name__ == "__main__":
    raise SystemExit(main())
