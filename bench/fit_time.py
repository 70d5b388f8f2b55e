"""Fit the GPU time model's few unknowable figures on the fit half of the public corpus; judge it on the held-out half.

The corpus is bench/data/published_runs.yaml: measured DeepSpeed (and FSDP) training runs, each with its source, quote,
setup and the arithmetic from the published figure to a step time. bench/data/split.yaml puts every source (`group`:
one paper, blog post, README or issue thread) in one half, once (`--split` assigns the groups it does not list yet
and never moves one it lists). Only the fit half's runs enter the fit.

What is fitted (estimate/gpu_time.py TimeFit, each inside FIT_BOUNDS): the share of MAMF a model's matmuls reach per
GPU generation and how it falls with a small hidden size, the host's time over the H200 calibration, the share of
compute ZeRO-3's traffic hides behind, the collectives' bus bandwidth over the catalog's links, CPU Adam's rate and
PCIe's efficiency under offload. Everything else stays derived. The loss is the mean pseudo-Huber of log(predicted /
measured) over the fit half (delta 0.25: a run that is off by more than ~1.3x counts linearly, so one wrong corpus
entry cannot drag a figure), plus a pull of each figure toward first principles' value (SHRINK, in log space; a
generation's matmul efficiency toward the pooled one): a figure that no run informs stays where physics puts it.
The search is coordinate descent (golden section over each figure's bounds, in log space for the scales), from
first principles' values, until no figure moves: deterministic, no randomness.

Each run is planned once (bench/published_runs.py predict, the same build_plan `zerokit plan` runs, every dimension
pinned, --hardware-profile none); a candidate fit recombines the run's priced parts (TimeEstimate.gpu_parts) with
gpu_step, the function every plan uses, so the fit and the plans cannot drift apart.

Writes zerokit/data/time_fit.json (the figures, their bounds, the fit half's run ids, the command) and the
"catalog_gpu" range of zerokit/data/time_range.json from the held-out half's residuals under the fitted figures.

Usage: python bench/fit_time.py [--split] [--write]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import published_runs as pr

SPLIT = REPO / "bench" / "data" / "split.yaml"
FIT_JSON = REPO / "zerokit" / "data" / "time_fit.json"
RANGE_JSON = REPO / "zerokit" / "data" / "time_range.json"
FIT_COMMAND = "python bench/fit_time.py --write"
HUBER_DELTA = 0.25
# the pull toward first principles: SHRINK x (log figure - log prior)^2 per figure, against the fit half's mean loss
SHRINK = 0.01
# groups that earlier rounds chose features against (bench/data/published_runs.yaml before issue 42): they can
# inform a fit but can no longer judge one, so they go to the fit half whatever the rule below says
SEEN_GROUPS = ("ds-autotuning-hf", "ds-azure-blog", "megatron-ds-bert-pile", "colossalai-4342", "ms-swift")


def load_split(path: Path = SPLIT) -> dict[str, str]:
    import yaml

    if not path.exists():
        return {}
    return dict(yaml.safe_load(path.read_text())["groups"])


def assign_split(runs: list[dict], split: dict[str, str], seen=lambda group: group in SEEN_GROUPS) -> dict[str, str]:
    """Every group not yet in `split` joins a half; those already there never move. Groups `seen` (SEEN_GROUPS: sources
    earlier rules were chosen against) go to "fit"; the others in the order of the SHA-256 of their name (no one picks
    it), each to the half with fewer runs so far, so the halves stay about the same size without anyone choosing which
    source lands where. bench/long_context.py splits its evidence by the same rule."""
    counts = {"fit": 0, "held_out": 0}
    sizes: dict[str, int] = {}
    for run in runs:
        sizes[run["group"]] = sizes.get(run["group"], 0) + 1
    for group, half in split.items():
        counts[half] += sizes.get(group, 0)
    out = dict(split)
    for group in sorted(g for g in sizes if g not in out and seen(g)):
        out[group] = "fit"
        counts["fit"] += sizes[group]
    for group in sorted((g for g in sizes if g not in out), key=lambda g: hashlib.sha256(g.encode()).hexdigest()):
        half = "fit" if counts["fit"] <= counts["held_out"] else "held_out"
        out[group] = half
        counts[half] += sizes[group]
    return out


def write_split(split: dict[str, str], path: Path = SPLIT) -> None:
    head = ("# The corpus split, made once by `python bench/fit_time.py --split` (bench/fit_time.py assign_split) before\n"
            "# any fitting: each source (a run's `group`) in one half. A group listed here never moves; a new group is\n"
            "# assigned by the same rule. Only the fit half informs zerokit/data/time_fit.json.\n")
    lines = [f"  {g}: {h}" for g, h in sorted(split.items())]
    path.write_text(head + "groups:\n" + "\n".join(lines) + "\n")


# what the fit learns from and the targets judge: runs through DeepSpeed's engine (Megatron-DeepSpeed's included).
# FSDP, Megatron-LM and other frameworks' runs are in the corpus as their own group, reported beside, never fitted.
FITTED_FRAMEWORK = pr.FITTED_FRAMEWORK


def halves(runs: list[dict], split: dict[str, str]) -> tuple[list[dict], list[dict]]:
    missing = sorted({r["group"] for r in runs} - set(split))
    if missing:
        raise pr.CorpusError(f"groups without a half in {SPLIT.relative_to(REPO)}: {', '.join(missing)}: run "
                             f"python bench/fit_time.py --split")
    return [r for r in runs if split[r["group"]] == "fit"], [r for r in runs if split[r["group"]] == "held_out"]


def pseudo_huber(x: float, delta: float = HUBER_DELTA) -> float:
    return delta * delta * (math.sqrt(1 + (x / delta) ** 2) - 1)


# the figures the search moves, and how: (name, generation or None, log-space search)
def parameters(generations: list[str]) -> list[tuple[str, str | None, bool]]:
    return ([("matmul_efficiency_pooled", None, True)]
            + [("matmul_efficiency", g, True) for g in generations]
            + [("matmul_half_hidden", None, False), ("host_scale", None, True), ("zero3_overlap", None, False),
               ("collective_efficiency", None, True), ("cpu_adam_scale", None, True), ("pcie_efficiency", None, True)])


def get(fit, name: str, gen: str | None) -> float:
    if gen is None:
        return getattr(fit, name)
    return fit.matmul_efficiency.get(gen, fit.matmul_efficiency_pooled)


def put(fit, name: str, gen: str | None, value: float):
    from dataclasses import replace

    if gen is None:
        return replace(fit, **{name: value})
    return replace(fit, matmul_efficiency={**fit.matmul_efficiency, gen: value})


def bounds(name: str) -> tuple[float, float]:
    from zerokit.estimate.gpu_time import FIT_BOUNDS

    return FIT_BOUNDS["matmul_efficiency" if name.startswith("matmul_efficiency") else name]


def penalty(fit, generations: list[str]) -> float:
    """The pull toward first principles (every figure 1, matmul_half_hidden 0), a generation's efficiency toward the
    pooled one."""
    hi = bounds("matmul_half_hidden")[1]
    p = sum(math.log(getattr(fit, n)) ** 2 for n in ("matmul_efficiency_pooled", "host_scale", "zero3_overlap",
                                                     "collective_efficiency", "cpu_adam_scale", "pcie_efficiency")
            if getattr(fit, n) > 0)
    p += sum(math.log(fit.matmul_efficiency[g] / fit.matmul_efficiency_pooled) ** 2 for g in generations
             if g in fit.matmul_efficiency)
    p += (fit.matmul_half_hidden / hi) ** 2
    return SHRINK * p


def step(parts, fit) -> float:
    from zerokit.estimate.gpu_time import gpu_step

    return gpu_step(parts, fit).step_seconds


def loss(rows: list[tuple[dict, object]], fit, generations: list[str]) -> float:
    total = sum(pseudo_huber(math.log(step(parts, fit) / float(run["step_seconds"]))) for run, parts in rows)
    return total / len(rows) + penalty(fit, generations)


def golden(f, lo: float, hi: float, iters: int = 40) -> float:
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iters):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def fit_figures(rows: list[tuple[dict, object]], sweeps: int = 30):
    """Coordinate descent from TimeFit() (first principles) over every figure within its bounds."""
    from zerokit.estimate.gpu_time import TimeFit

    generations = sorted({parts.generation for _, parts in rows})
    fit = TimeFit(matmul_efficiency={g: 1.0 for g in generations})
    best = loss(rows, fit, generations)
    for _ in range(sweeps):
        before = best
        for name, gen, logspace in parameters(generations):
            lo, hi = bounds(name)
            if logspace:
                def f(x, name=name, gen=gen):
                    return loss(rows, put(fit, name, gen, math.exp(x)), generations)
                x = math.exp(golden(f, math.log(lo), math.log(hi)))
            else:
                def f(x, name=name, gen=gen):
                    return loss(rows, put(fit, name, gen, x), generations)
                x = golden(f, lo, hi)
            candidate = put(fit, name, gen, x)
            value = loss(rows, candidate, generations)
            if value < best:
                fit, best = candidate, value
        if before - best < 1e-9:
            break
    return fit, best


def rounded(fit):
    """The figures as committed (4 significant digits), so the JSON and every plan use the same numbers."""
    from zerokit.estimate.gpu_time import TimeFit

    d = fit.to_dict()
    r = {k: ({g: float(f"{x:.4g}") for g, x in v.items()} if isinstance(v, dict) else float(f"{v:.4g}"))
         for k, v in d.items()}
    return TimeFit.from_dict(r)


def planned_rows(runs: list[dict]) -> list[tuple[dict, object]]:
    rows = []
    for run in runs:
        p = pr.predict(run)
        if p["parts"] is None:
            raise pr.CorpusError(f"run {run['id']}: its GPU has no kernel figures in zerokit/data/gpus.json, so the "
                                 f"GPU time model does not price it: add them, or leave the run out")
        rows.append((run, p["parts"]))
    return rows


def held_out_ratios(rows: list[tuple[dict, object]], fit) -> list[float]:
    """predicted / measured of the held-out runs under the fitted figures: what the likely range rests on."""
    return [step(parts, fit) / float(run["step_seconds"]) for run, parts in rows]


def fit_json(fit, fit_runs: list[dict], held: list[dict], value: float) -> dict:
    from zerokit.estimate.gpu_time import FIT_BOUNDS

    return {
        "_about": "The GPU time model's fitted figures (estimate/gpu_time.py TimeFit; FIT_BOUNDS bounds each), fitted on "
                  "the fit half of bench/data/published_runs.yaml as split by bench/data/split.yaml. Written by "
                  f"`{FIT_COMMAND}`; tests/test_published_runs.py refits and compares.",
        "figures": fit.to_dict(),
        "bounds": {k: list(v) for k, v in FIT_BOUNDS.items()},
        "data": "bench/data/published_runs.yaml",
        "split": "bench/data/split.yaml",
        "command": FIT_COMMAND,
        "loss": round(value, 6),
        "fit_runs": sorted(r["id"] for r in fit_runs),
        "held_out_runs": len(held),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", action="store_true", help="assign the groups split.yaml does not list yet, then stop")
    ap.add_argument("--write", action="store_true", help="write zerokit/data/time_fit.json and the range")
    a = ap.parse_args(argv)
    try:
        runs = pr.load_runs()
    except pr.CorpusError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.split:
        split = assign_split(runs, load_split())
        write_split(split)
        fit_n = sum(split[r["group"]] == "fit" for r in runs)
        print(f"{len(split)} groups: {fit_n} runs in the fit half, {len(runs) - fit_n} held out")
        return 0
    try:
        fit_runs, held = halves([r for r in runs if r["framework"] == FITTED_FRAMEWORK], load_split())
        fit_rows, held_rows = planned_rows(fit_runs), planned_rows(held)
    except pr.CorpusError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    fit, value = fit_figures(fit_rows)
    fit = rounded(fit)
    print(json.dumps(fit.to_dict(), indent=1))
    if a.write:
        FIT_JSON.write_text(json.dumps(fit_json(fit, fit_runs, held, value), indent=2) + "\n")
        ratios = held_out_ratios(held_rows, fit)
        RANGE_JSON.write_text(json.dumps(pr.range_data(ratios, FIT_COMMAND), indent=2) + "\n")
        print(f"wrote {FIT_JSON.relative_to(REPO)} and {RANGE_JSON.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
