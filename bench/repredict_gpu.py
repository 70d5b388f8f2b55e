"""Re-predict the step time of GPU jobs measured earlier, with zerokit's time model as it is now (no GPU needed).

bench/accuracy/run.py writes each job's measured step time into bench/results/accuracy_<device>.json; the job
directories stay on the GPU machine. This script rebuilds each job's setup from bench/accuracy/run.py's grids (the
same `evaluate` the planner runs, on the catalog's figures for the GPU the jobs ran on) and prints predicted against
measured, so a change to the GPU time model is checked against real GPU steps without a GPU.

Usage: python bench/repredict_gpu.py [--results bench/results/accuracy_h200.json] [--gpu h200] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(REPO / "bench" / "results" / "accuracy_h200.json"))
    ap.add_argument("--gpu", default="h200", help="the catalog entry of the GPU the jobs ran on")
    ap.add_argument("--out", help="also write the table here")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "bench" / "accuracy"))
    import run as grid  # bench/accuracy/run.py

    try:
        data = json.loads(Path(a.results).read_text())
        measured = {r["job"]: r["meas_time"] for r in data["rows"] if r.get("meas_time")}
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: {a.results}: not a results file of bench/accuracy/run.py ({type(e).__name__}): give the .json it "
              "wrote (bench/results/accuracy_*.json)", file=sys.stderr)
        return 2
    path = Path(a.results).resolve()
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    jobs = {j.name: j for j in [*grid.ONE_GPU, *grid.LEND, *grid.LONG, *grid.full_grid()]}
    cluster = grid.make_cluster("cuda", int(data.get("ranks") or 1), a.gpu, None, None)
    cmd = "python bench/repredict_gpu.py" + "".join(f" {x}" for x in (argv if argv is not None else sys.argv[1:]))
    lines = [f"command: {cmd}", f"measured: {shown} ({data.get('machine', '')})",
             f"predicted: the catalog's figures for {a.gpu} (estimate/gpu_time.py), no hardware profile", "",
             f"{'job':45} {'meas ms':>8} {'pred ms':>8} {'ratio':>6} {'device ms':>10} {'host ms':>8}"]
    ratios = []
    for name, seconds in measured.items():
        job = jobs.get(name)
        if job is None:
            continue
        t = grid.predict(job, cluster, grid.render(job, cluster, 12))["time"]
        device = t["matmul_seconds"] + t["attention_seconds"] + t["memory_bound_seconds"]
        ratios.append(t["step_seconds"] / seconds)
        lines.append(f"{name:45} {seconds * 1e3:>8.1f} {t['step_seconds'] * 1e3:>8.1f} {ratios[-1]:>6.2f} "
                     f"{device * 1e3:>10.1f} {t['host_seconds'] * 1e3:>8.1f}")
    if not ratios:
        print(f"error: none of the {len(measured)} measured jobs in {a.results} is a job of bench/accuracy/run.py's "
              "grids: give a results file that run.py wrote", file=sys.stderr)
        return 2
    folds = sorted(max(r, 1 / r) for r in ratios)
    lines += ["", f"{len(ratios)} jobs: median x{statistics.median(folds):.2f}, max x{folds[-1]:.2f} "
                  "(max(ratio, 1/ratio); ratio = predicted / measured)"]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if a.out:
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
