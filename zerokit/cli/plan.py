"""`zerokit plan` and `zerokit render`: zerokit.api's plan, printed as a table or JSON, and its ds_config written."""

from __future__ import annotations

import json
import sys

from zerokit.cli.common import add_options, to_request
from zerokit.core.errors import EXIT_DOES_NOT_FIT, EXIT_OK


def add_plan_parser(sub) -> None:
    p = sub.add_parser("plan", help="memory breakdown, best ZeRO setup, step and total time")
    add_options(p, "plan")
    p.set_defaults(func=cmd_plan)


def add_render_parser(sub) -> None:
    p = sub.add_parser("render", help="plan, then write the ds_config.json")
    add_options(p, "render")
    p.set_defaults(func=cmd_render)


def cmd_plan(args) -> int:
    from zerokit import api

    req = to_request(args)
    if args.plot:  # a picture that cannot be written is refused before the planning
        from zerokit.report.plot import check_plot_path

        check_plot_path(args.plot)
    answer = api.compare_request(req) if args.compare_gpus else api.plan_request(req)
    if args.plot:  # drawn before anything is printed: a failure is one error line
        from zerokit.report.plot import plot_memory

        plot_memory(answer._inner, args.plot)
    print(json.dumps(answer.to_dict(), indent=2) if args.json else answer.text())
    if args.plot:
        print(f"plot      wrote {args.plot} (per-GPU memory by term, the chosen setup first)",
              file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK if answer.fits else EXIT_DOES_NOT_FIT


def cmd_render(args) -> int:
    from zerokit import api

    args.output = args.output or "ds_config.json"
    args.profile = args.profile or "deepspeed"
    req = to_request(args)
    try:
        plan = api.render_request(req)
    except api.NothingFits as e:
        print(e.plan.text(), file=sys.stderr)
        raise
    if args.output == "-":
        sys.stdout.write(json.dumps(plan.ds_config, indent=2) + "\n")
    elif args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(f"wrote {' and '.join(plan.written)} ({plan.choice.label})")
    return EXIT_OK
