"""Add the all-to-all per-call latency (Ulysses' exchange) to a hardware profile measured before `zerokit calibrate`
timed it: the same collective benchmark (measure/calibrate.measure_collectives, 4 KiB per rank, the profile's ranks
and threads), keeping every other figure of the profile as it is.

    python bench/calibrate_all_to_all.py bench/results/accuracy_cpu_profile.json [-o OUT.json]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", help="a zerokit hardware profile JSON measured on this machine")
    ap.add_argument("-o", "--output", help="where to write the profile with the latency (default: in place)")
    args = ap.parse_args(argv)

    from zerokit.core.errors import ZerokitError
    from zerokit.core.fsutil import atomic_write_text
    from zerokit.measure.calibrate import measure_collectives
    from zerokit.spec.profile import load_profile

    try:
        prof = load_profile(args.profile)  # one line naming the fix for a missing or foreign file
    except ZerokitError as e:
        raise SystemExit(f"error: {e}") from None
    world = int((prof.get("collectives") or {}).get("world_size") or 2)
    if prof["device"]["type"] == "cpu":
        os.environ.setdefault("OMP_NUM_THREADS", str(prof.get("compute_threads") or 1))
    coll = measure_collectives(world, [4096], iters=50)
    prof["all_to_all_latency_s"] = coll["all_to_all_latency_s"]
    prof.setdefault("notes", []).append(
        f"all_to_all_latency_s added {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')} by "
        f"bench/calibrate_all_to_all.py ({world} ranks, 4 KiB; this run's all-reduce: {coll['all_reduce_latency_s'] * 1e3:.2f} ms)")
    print(f"all-to-all {coll['all_to_all_latency_s'] * 1e3:.3f} ms, all-reduce {coll['all_reduce_latency_s'] * 1e3:.3f} ms, "
          f"all-gather {coll['all_gather_latency_s'] * 1e3:.3f} ms per 4 KiB call ({world} ranks)")
    atomic_write_text(args.output or args.profile, json.dumps(prof, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
