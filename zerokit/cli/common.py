"""What every command shares: the one-line usage error, the parser made from the option declarations
(zerokit.core.options), the run file merged under the command line, and the namespace handed to zerokit.api as its
Request (where options become a model spec, hardware, workload and pins)."""

from __future__ import annotations

import argparse

from zerokit.core.errors import EXIT_INVALID, ZerokitError
from zerokit.core.options import Option, complete_values, for_command, read_run_file


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
    """The namespace as the command runs it: the command line, over the run file (-c), over the declared defaults
    (core.options.complete_values)."""
    path = getattr(args, "config_file", None)
    from_file = read_run_file(path, command) if path else {}
    for key, value in complete_values(vars(args), command, from_file, path).items():
        setattr(args, key, value)
    return args


def to_request(args: argparse.Namespace, echo: bool = True):
    """The completed namespace as the API's Request (zerokit.api): what every command hands down; echo: its notes and
    warnings printed on stderr as they come (the commands), or only kept (benchmarks and tests)."""
    from zerokit.api import Request

    return Request(args.command, {k: v for k, v in vars(args).items() if k not in ("func", "command")}, echo=echo)

