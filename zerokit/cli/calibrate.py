"""`zerokit calibrate`: measure this machine and write a hardware profile for --hardware-profile."""

from __future__ import annotations

import os
import sys

from zerokit.cli.common import add_options
from zerokit.core.errors import EXIT_OK


def add_calibrate_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this machine and write a hardware profile for --hardware-profile",
                       epilog="exit 3, one line and no profile written, when the machine was too busy to measure "
                              "(a degenerate fit or spread repeats still after re-measuring: zerokit.spec.profile.SANITY)")
    add_options(p, "calibrate")
    p.set_defaults(func=cmd_calibrate)


# wall time of a calibration on a 2-core CPU machine, for the progress line's estimate of what is left: quick and full
# as measure.calibrate.run_calibration gives them; quick for one model (--model, --finetune full) as
# bench/results/first_run.txt measured it
EXPECTED_S = {(True, False): 130, (False, False): 554, (True, True): 90, (False, True): 480}


def progress_line(quick: bool, scoped: bool = False):
    """Each calibration stage on stderr with the time spent and an estimate of what is left."""
    import time

    t0, total = time.monotonic(), EXPECTED_S[quick, scoped]

    def say(msg: str) -> None:
        spent = time.monotonic() - t0
        left = f"~{max(total - spent, 0) / 60:.0f} min left" if spent < total else "nearly done"
        print(f"calibrate [{spent / 60:4.1f} min, {left}] {msg}", file=sys.stderr, flush=True)

    return say


def cmd_calibrate(args) -> int:
    from zerokit.measure.calibrate import format_profile, run_calibration

    from zerokit.spec.profile import local_profile_path

    if args.from_run:  # learn from a run instead of measuring (launching/learn.py)
        from zerokit.launching import learn

        print(learn.describe(*learn.learn(args.from_run, args.output)))
        return EXIT_OK
    if args.output is None:
        args.output = local_profile_path() or "hardware_profile.json"
    if args.if_missing:
        from zerokit.core.errors import ZerokitError
        from zerokit.spec.profile import HardwareProfile, measured_here

        try:
            prof = HardwareProfile.from_file(args.output) if os.path.isfile(args.output) else None
            # a quick profile is kept only when a quick one is asked for (the full one adds the engine costs)
            if prof is not None and measured_here(prof) and (args.quick or not prof.quick):
                print(f"{args.output}: already measured on this machine", file=sys.stderr)
                return EXIT_OK
        except ZerokitError:
            pass  # unreadable: measure again
    gated = None
    if args.model:  # time what a plan of this model prices (run_calibration: its block family, one 16-bit precision)
        from zerokit.spec.model import load_model_spec

        gated = load_model_spec(args.model).gated_mlp
    profile = run_calibration(args.output, quick=args.quick, log=progress_line(args.quick, scoped=gated is not None),
                              precisions=(args.precision,) if args.precision else None, adapters=args.finetune != "full",
                              gated_mlp=gated)
    print(format_profile(profile))  # the summary; every measured point is in the file
    own = os.path.abspath(args.output) == os.path.abspath(local_profile_path() or "")
    print(f"wrote {args.output}" + (" (plans on this machine use it without --hardware-profile)" if own else ""),
          file=sys.stderr)
    return EXIT_OK
