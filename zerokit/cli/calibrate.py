"""`zerokit calibrate`: measure this machine and write a hardware profile for --hardware-profile."""

from __future__ import annotations

import sys

from zerokit.cli.common import nonempty
from zerokit.core.errors import EXIT_OK


def add_calibrate_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this machine and write a hardware profile for --hardware-profile",
                       epilog="exit 3, one line and no profile written, when the machine was too busy to measure "
                              "(a degenerate fit or spread repeats still after re-measuring: zerokit.spec.profile.SANITY)")
    p.add_argument("-o", "--output", type=nonempty, default="hardware_profile.json")
    p.add_argument("--quick", action="store_true", help="fewer and smaller points, no engine costs (35-50 s on 2 cores)")
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args) -> int:
    from zerokit.measure.calibrate import format_profile, run_calibration

    profile = run_calibration(args.output, quick=args.quick, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(format_profile(profile))  # the summary; every measured point is in the file
    print(f"wrote {args.output}", file=sys.stderr)
    return EXIT_OK
