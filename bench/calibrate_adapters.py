"""Add the LoRA/QLoRA costs (spec.profile.ADAPTER_FEATURES, and what each module peft adds costs a step at every ZeRO
stage) to a hardware profile measured before they existed.

`zerokit calibrate` measures them itself (with peft installed). This times only the LoRA and QLoRA versions of the
calibration's models on the same ranks, in the same lockstep, and fits their costs beyond the profile's own compute
coefficients, which stay as they are (so the profile's full fine-tune predictions, and any table made with them, do
not change); then the synthetic engines with LoRA at every stage (measure/engine_fit.measure_peft_module_costs).
--engines-only keeps the profile's adapter costs and refits only the latter.

    python bench/calibrate_adapters.py bench/results/accuracy_cpu_profile.json [-o OUT.json] [--engines-only]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", help="a zerokit hardware profile JSON measured on this machine")
    ap.add_argument("-o", "--output", help="where to write the profile with the adapter costs (default: in place)")
    ap.add_argument("--engines-only", action="store_true",
                    help="keep the profile's adapter compute costs; refit only the per-module engine costs")
    args = ap.parse_args(argv)

    from zerokit.core.fsutil import atomic_write_text
    from zerokit.measure.calibrate import measure_adapter_costs, measure_peft_modules
    from zerokit.measure.compute_fit import adapter_jobs

    from zerokit.core.errors import ZerokitError
    from zerokit.spec.profile import load_profile, slow_precisions

    try:
        prof = load_profile(args.profile)  # the project's own reading: one line naming the fix for a bad file
    except ZerokitError as e:
        raise SystemExit(f"error: {e}") from None
    timing = prof.get("compute_timing") or {}
    # as calibrate times them: not a precision under 1/SLOW_PRECISION_FACTOR of the best matmul (never planned; an
    # H200's fp32 is one), whose 24 extra models ran this past 215 s there
    slow = slow_precisions(prof.get("matmul_tflops") or {})
    precisions = sorted({p for by in timing.values() for p in by} - set(slow))
    if not precisions:
        raise SystemExit(f"{args.profile} has no compute_timing: run `zerokit calibrate` instead")
    on_gpu = prof["device"]["type"] == "cuda"
    jobs = adapter_jobs(precisions, on_gpu, bool(prof.get("quick")))
    if not jobs:
        raise SystemExit("peft is not installed: pip install 'zerokit[train]'")
    # the calibration's ranks: its collectives' (none on one GPU: one rank per GPU, as calibrate runs them), else 2
    world = int((prof.get("collectives") or {}).get("world_size")
                or (prof["device"].get("count") if on_gpu else None) or 2)
    spec = {"jobs": jobs, "min_time_s": 0.05 if prof.get("quick") else 0.3, "device": "cuda" if on_gpu else None}
    if not on_gpu:
        os.environ.setdefault("OMP_NUM_THREADS", str(prof.get("compute_threads") or 1))
    t0 = time.perf_counter()
    if not args.engines_only:
        print(f"LoRA adapters: {len(jobs)} HF models over {world} local ranks ...", file=sys.stderr, flush=True)
        measure_adapter_costs(timing, jobs, spec, world, prof.get("compute_threads"))
    notes = prof.setdefault("notes", [])
    if prof.get("engine_overhead"):  # then each peft module's engine cost per stage, priced with the adapter costs above
        precs = sorted(prof["engine_overhead"].get("by_precision") or {})
        measure_peft_modules(prof, precs, world, prof.get("compute_threads"), notes,
                             lambda m: print(m, file=sys.stderr, flush=True))
    wall = time.perf_counter() - t0
    what = "LoRA engine costs per peft module" if args.engines_only else "LoRA adapter costs (and the engines' per peft module)"
    notes.append(
        f"{what} added {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')} by "
        f"bench/calibrate_adapters.py ({wall:.0f} s), against this profile's compute coefficients")
    for family, by in timing.items():
        for prec, v in by.items():
            pts = v.get("adapter_points") or []
            err = max((abs(p["predicted"] - p["seconds"]) / p["seconds"] for p in pts), default=0.0)
            c = v["coef"]
            print(f"{family} {prec}: {c.get('adapter', 0) * 1e6:.1f} us per adapted Linear, "
                  f"{c.get('adapter_element', 0) * 1e9:.3f} ns per adapter element, "
                  f"{c.get('dequant', 0) * 1e9:.3f} ns per dequantized 4-bit element, "
                  f"{c.get('dequant_call', 0) * 1e6:.1f} us per dequantization; "
                  f"{len(pts)} points, max |err| {err:.1%}")
    for prec, fits in ((prof.get("engine_overhead") or {}).get("by_precision") or {}).items():
        for stage, fit in sorted(fits.items()):
            if isinstance(fit, dict) and fit.get("per_peft_module_recompute_s") is not None:
                print(f"ZeRO-{stage} {prec}: {fit['per_peft_module_s'] * 1e6:.1f} us per module peft adds, "
                      f"{fit['per_peft_module_recompute_s'] * 1e6:.1f} us more per recomputed one")
    atomic_write_text(args.output or args.profile, json.dumps(prof, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
