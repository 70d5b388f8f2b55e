"""`zerokit serve`: the planner as a web page (zerokit/serve), on 127.0.0.1 unless --host says otherwise."""

from __future__ import annotations

import sys

from zerokit.cli.common import add_options
from zerokit.core.errors import EXIT_OK, ZerokitError
from zerokit.core.options import flag


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="the planner as a web page: answers as you edit, ds_config downloads, "
                                     "shareable links, a ds_config check")
    add_options(p, "serve")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args) -> int:
    from pathlib import Path

    from zerokit.serve import serve

    if args.models_dir and not Path(args.models_dir).is_dir():
        raise ZerokitError(f"{flag('models-dir')} {args.models_dir} is not a directory: give the folder that holds "
                           "your model directories")

    def ready(url):
        print(f"zerokit serve: {url} (Ctrl-C stops)", flush=True)
        if args.host not in ("127.0.0.1", "localhost", "::1"):
            print(f"note: listening on {args.host}: anyone who reaches this machine can plan here", file=sys.stderr)

    try:
        serve(args.host, args.port, args.models_dir, ready=ready)
    except OSError as e:
        raise ZerokitError(f"cannot listen on {args.host}:{args.port}: {e.strerror}: choose another {flag('port')} "
                           f"(0 takes a free one) or {flag('host')}") from None
    return EXIT_OK
