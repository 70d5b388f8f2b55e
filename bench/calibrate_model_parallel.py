"""Add what a TP or SP collective call costs inside a step (measure/engine_fit.measure_model_parallel_calls), and
on a CPU what a ZeRO-3 call costs per ring step on 4 ranks (engine_fit.measure_zero_ring_calls), to a hardware profile
measured before those fits existed.

`zerokit calibrate` measures both itself (after the engine costs). This runs only their synthetic engines and fits
their cost per call beyond everything the profile already prices, which stays as it is (so predictions without TP,
SP or a ZeRO-3 ring of more than 2 ranks, and any table made with them, do not change).

    python bench/calibrate_model_parallel.py bench/results/accuracy_cpu_profile.json [-o OUT.json] [--fits tp-sp,ring]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", help="a zerokit hardware profile JSON measured on this machine, with engine costs")
    ap.add_argument("-o", "--output", help="where to write the profile with the TP/SP call costs (default: in place)")
    ap.add_argument("--fits", default="tp-sp,ring",
                    help="which fits to (re)measure, comma-separated: tp-sp, ring (default both)")
    args = ap.parse_args(argv)
    fits_wanted = {f.strip() for f in args.fits.split(",") if f.strip()}
    if not fits_wanted or fits_wanted - {"tp-sp", "ring"}:
        raise SystemExit(f"error: --fits {args.fits!r}: name tp-sp, ring or both (comma-separated)")

    from zerokit.core.errors import ZerokitError
    from zerokit.core.fsutil import atomic_write_text
    from zerokit.measure.calibrate import measure_model_parallel, measure_zero_ring
    from zerokit.spec.profile import load_profile

    try:
        prof = load_profile(args.profile)  # the project's own reading: one line naming the fix for a bad file
    except ZerokitError as e:
        raise SystemExit(f"error: {e}") from None
    if not prof.get("engine_overhead"):
        raise SystemExit(f"{args.profile} has no engine costs (a quick profile): run a full `zerokit calibrate`")
    world = int((prof.get("collectives") or {}).get("world_size") or 2)
    precs = sorted(prof["engine_overhead"].get("by_precision") or {})
    notes = prof.setdefault("notes", [])
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731 - a one-line logger
    t0 = time.perf_counter()
    if "tp-sp" in fits_wanted:
        measure_model_parallel(prof, precs, world, prof.get("compute_threads"), notes, say)
    if "ring" in fits_wanted:
        if (prof.get("device") or {}).get("type") != "cpu":
            raise SystemExit("error: --fits ring is a CPU machine's fit (on GPUs the engines run on every GPU): "
                             "pass --fits tp-sp")
        measure_zero_ring(prof, precs, prof.get("compute_threads"), notes, say)
    wall = time.perf_counter() - t0
    notes.append(f"{' and '.join(sorted(fits_wanted))} call costs added "
                 f"{_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')} by "
                 f"bench/calibrate_model_parallel.py ({wall:.0f} s), against this profile's other terms")
    for prec, fits in prof["engine_overhead"]["by_precision"].items():
        for kind, fit, calls in (("TP", fits.get("tp"), "mp_calls"), ("SP", fits.get("sp"), "mp_calls"),
                                 ("ZeRO-3 ring", (fits.get("3") or {}).get("ring"), "ring_calls")):
            if fit:
                runs = ", ".join(f"{r['layers']} layer(s) {r['seconds'] * 1e3:.1f} ms ({r[calls]:g} call steps, "
                                 f"{r['predicted_s'] * 1e3:.1f} ms without them)" for r in fit["runs"])
                print(f"{kind} {prec}: {fit['per_call_s'] * 1e3:.3f} ms per call; {runs}")
    atomic_write_text(args.output or args.profile, json.dumps(prof, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
