"""A newcomer's first run, timed: `make demo`'s steps one by one, as the Makefile has them, on a fresh zerokit cache
(no hardware profile, no spec cache), and the step-time ratio its report gives.

    python bench/first_run.py                      # zerokit's share: calibrate, plan, render, check, launch
    python bench/first_run.py --with-setup         # also scripts/setup.sh (venv, pip, DeepSpeed's ops) in a clone

Without --with-setup the setup line (`bash scripts/setup.sh`) runs in this checkout, where it only checks what is
installed; with it, the repository is cloned into a temporary folder and set up from nothing but the pip cache and
the system packages. Results: bench/results/first_run.txt (the command is printed at its top).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def demo_steps(repo: Path) -> list[str]:
    """The demo's recipe lines as make would run them (`make -n`: printed, not run)."""
    out = subprocess.run(["make", "-n", "demo"], cwd=repo, capture_output=True, text=True, check=True).stdout
    return [line for line in out.replace("\\\n", " ").splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--with-setup", action="store_true", help="set up a fresh clone first (minutes of pip and ninja)")
    ap.add_argument("--results", default=str(REPO / "bench" / "results" / "first_run.txt"))
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="zerokit-first-run-"))
    try:
        repo = REPO
        if args.with_setup:
            repo = work / "zerokit"
            subprocess.run(["git", "clone", "-q", str(REPO), str(repo)], check=True)
        env = dict(os.environ, ZEROKIT_CACHE_DIR=str(work / "cache"), PATH=f"{repo / '.venv' / 'bin'}{os.pathsep}"
                   f"{os.environ.get('PATH', '')}", TORCH_EXTENSIONS_DIR=str(repo / ".cache" / "torch_extensions"))
        env.pop("ZEROKIT_HARDWARE_PROFILE", None)
        rows = []
        for line in demo_steps(repo):
            t = time.perf_counter()
            p = subprocess.run(["bash", "-c", line], cwd=repo, env=env, capture_output=True, text=True)
            dt = time.perf_counter() - t
            name = " ".join(line.split()[:2])
            print(f"{dt:7.1f} s  {name}", flush=True)
            if p.returncode != 0:
                print(p.stdout[-2000:] + p.stderr[-2000:], file=sys.stderr)
                return 1
            rows.append((name, dt))
        report = json.loads((repo / "runs" / "demo" / "run" / "report.json").read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)

    setup = sum(dt for name, dt in rows if "setup" in name)
    zerokit = sum(dt for name, dt in rows if name.startswith("zerokit"))
    lines = [f"# python bench/first_run.py{' --with-setup' if args.with_setup else ''}   "
             f"({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores)", ""]
    lines += [f"{dt:8.1f} s  {name}" for name, dt in rows]
    lines += ["", f"setup (scripts/setup.sh{'' if args.with_setup else ', already installed: checks only'}): {setup:.0f} s",
              f"zerokit's share (calibrate, plan, render, check, launch): {zerokit:.0f} s",
              f"demo in all: {setup + zerokit:.0f} s"]
    ratios = {k: v for k, v in _ratios(report).items() if v is not None}
    lines += [f"report: {k} measured / predicted = {v:.2f}x" for k, v in ratios.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.results).write_text(text)
    return 0


def _ratios(report: dict) -> dict:
    """The report's measured / predicted ratios (report/run_report.py build_report's rows)."""
    return {r["name"]: r.get("ratio") for r in report.get("rows", [])}


if __name__ == "__main__":
    raise SystemExit(main())
