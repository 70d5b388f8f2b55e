"""`zerokit check CONFIG`: zerokit.api's check of a ds_config.json a user already has, printed."""

from __future__ import annotations

import json
import sys

from zerokit.cli.common import add_options, to_request
from zerokit.core.errors import EXIT_INVALID, ZerokitError
from zerokit.core.quiet import verbose


def add_check_parser(sub) -> None:
    p = sub.add_parser("check", help="validate an existing ds_config.json and check that it fits")
    add_options(p, "check")
    p.set_defaults(func=cmd_check)


def cmd_check(args) -> int:
    from zerokit import api

    req = to_request(args)
    result = api.check_request(req)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return result.exit_code
    if not result.valid:  # an error: one line on stderr naming the first problem (-v: the whole table before it)
        if verbose():
            print(result.text(), file=sys.stderr)
        raise ZerokitError(f"{result.config_path} is not a valid DeepSpeed config for {result.world_size} ranks: "
                           f"{result.problem()}", exit_code=EXIT_INVALID)
    print(result.text())
    return result.exit_code
