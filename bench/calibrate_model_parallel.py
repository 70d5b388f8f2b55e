"""Add what a TP or SP collective call costs inside a step (measure/engine_fit.measure_model_parallel_calls) to a
hardware profile measured before the fit existed.

`zerokit calibrate` measures it itself (after the engine costs). This runs only the TP 2 and SP 2 synthetic engines
on the profile's ranks and fits their cost per call beyond everything the profile already prices, which stays as it
is (so predictions without TP or SP, and any table made with them, do not change).

    python bench/calibrate_model_parallel.py bench/results/accuracy_cpu_profile.json [-o OUT.json]
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
    args = ap.parse_args(argv)

    from zerokit.core.errors import ZerokitError
    from zerokit.core.fsutil import atomic_write_text
    from zerokit.measure.calibrate import measure_model_parallel
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
    t0 = time.perf_counter()
    measure_model_parallel(prof, precs, world, prof.get("compute_threads"), notes,
                           lambda m: print(m, file=sys.stderr, flush=True))
    wall = time.perf_counter() - t0
    notes.append(f"TP/SP call costs added {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')} by "
                 f"bench/calibrate_model_parallel.py ({wall:.0f} s), against this profile's other terms")
    for prec, fits in prof["engine_overhead"]["by_precision"].items():
        for kind in ("tp", "sp"):
            if kind in fits:
                runs = ", ".join(f"{r['layers']} layer(s) {r['seconds'] * 1e3:.1f} ms ({r['mp_calls']} calls, "
                                 f"{r['predicted_s'] * 1e3:.1f} ms without them)" for r in fits[kind]["runs"])
                print(f"{kind.upper()} {prec}: {fits[kind]['per_call_s'] * 1e3:.3f} ms per call; {runs}")
    atomic_write_text(args.output or args.profile, json.dumps(prof, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
