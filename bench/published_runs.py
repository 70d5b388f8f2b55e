"""zerokit's step time against published, measured DeepSpeed training runs (issue 27, item 3).

Each run in bench/data/published_runs.yaml (source URL, quote, setup, measured step seconds) is planned with zerokit's
own planner pinned to the run's setup: the same `build_plan` that `zerokit plan` runs, on the catalog's figures
(`--hardware-profile none`: a calibration of this machine must not leak into GPU predictions). The predicted step time
is printed as a ratio to the measured one, beside the rule of thumb

    6 * N * tokens / (GPUs * peak * 0.40)

on the same run (N the model's parameters as zerokit counts them, tokens the step's tokens, peak the datasheet dense
peak of zerokit/data/gpus.json for the run's precision; 0.40 the MFU of EleutherAI's "Transformer Math 101").
Summary: median and max of |log ratio| as a ratio (max(r, 1/r)), and the share of runs within 1.25x.

This only measures zerokit's time model; it changes nothing in it. No run here informed any rule of zerokit.

Usage: python bench/published_runs.py [--only REGEX] [--out bench/results/published_runs.txt]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "bench" / "data" / "published_runs.yaml"
RULE_MFU = 0.40  # EleutherAI "Transformer Math 101": 115-150 of 312 TFLOP/s on A100 is well tuned, ~0.4 of peak
WITHIN = 1.25  # the "three runs in four within 1.25x" target
RANGE_COMMAND = "python bench/published_runs.py --out bench/results/published_runs.txt --write-range"

# setup key -> zerokit plan flag; the values are pinned so the planner evaluates exactly the published setup
FLAGS = {
    "gpu": "--gpu", "gpus_per_node": "--gpus-per-node", "nodes": "--nodes", "params": "--params",
    "hidden_size": "--hidden-size", "num_layers": "--num-layers", "vocab_size": "--vocab-size",
    "stage": "--stage", "offload_optimizer": "--offload-optimizer", "offload_param": "--offload-param",
    "precision": "--precision", "micro_batch": "--micro-batch", "grad_accum": "--grad-accum", "seq_len": "--seq-len",
    "activation_checkpointing": "--activation-checkpointing", "sequence_parallel": "--sequence-parallel",
    "tensor_parallel": "--tensor-parallel", "attention": "--attention", "doc_len": "--doc-len",
    "liger_kernels": "--liger-kernels",
}
# what a complete entry states (tests/test_published_runs.py checks these)
REQUIRED_RUN = ("id", "source", "quote", "setup", "measured", "step_seconds", "conversion")
REQUIRED_SETUP = ("gpu", "gpus_per_node", "nodes", "stage", "offload_optimizer", "offload_param", "precision",
                  "micro_batch", "grad_accum", "seq_len", "activation_checkpointing")


def load_runs(path: Path = DATA) -> list[dict]:
    import yaml

    return yaml.safe_load(path.read_text())["runs"]


def plan_argv(setup: dict) -> list[str]:
    """The `zerokit plan` command line that pins every dimension of a published setup."""
    argv = ["plan"]
    if "model" in setup:
        argv.append(str(setup["model"]))
    for key, flag in FLAGS.items():
        if key in setup:
            value = setup[key]
            if isinstance(value, float) and key == "params":
                value = f"{value:.6g}"
            argv += [flag, str(value)]
    return argv + ["--hardware-profile", "none"]


def predict(run: dict) -> dict:
    """zerokit's plan of one run (pinned) and the rule of thumb on the same run."""
    from zerokit.cli import parse
    from zerokit.cli.plan import build_plan

    setup = run["setup"]
    args = parse(plan_argv(setup))
    plan = build_plan(args)
    ev = plan.best  # the chosen setup, or the smallest when nothing fits: its time is priced either way
    t = ev.time
    acc = plan.cluster.accelerator
    gpus = int(setup["gpus_per_node"]) * int(setup["nodes"])
    peak = acc.peak_flops(setup["precision"])
    params = plan.model.params
    rule = 6 * params * t.tokens_per_step / (gpus * peak * RULE_MFU)
    return {"predicted": t.step_seconds, "rule": rule, "fits": plan.fits, "label": ev.setup.label,
            "tokens": t.tokens_per_step, "params": params}


def spread(ratios: list[float]) -> tuple[float, float, float]:
    """(median, max) of max(r, 1/r), and the share of runs within WITHIN x."""
    folds = [math.exp(abs(math.log(r))) for r in ratios]
    return statistics.median(folds), max(folds), sum(f <= WITHIN for f in folds) / len(folds)


def central_ratios(ratios: list[float]) -> tuple[float, float]:
    """The 10th and 90th percentiles of predicted / measured (statistics.quantiles, inclusive): the ratios 80% of the
    runs fall between, what a plan's range rests on (zerokit/data/time_range.json)."""
    deciles = statistics.quantiles(ratios, n=10, method="inclusive")
    return deciles[0], deciles[-1]


# zerokit's own calibrated predictions against real DeepSpeed jobs on this project's CPUs: the range of a plan priced
# on a measured profile (time_range.json "calibrated")
CALIBRATED_TABLES = ("accuracy_cpu", "accuracy_cpu_parallel", "accuracy_cpu_finetune")


def calibrated_ratios() -> list[float]:
    """predicted / measured step time of every rank row in CALIBRATED_TABLES (1 + time_err)."""
    rows = []
    for name in CALIBRATED_TABLES:
        rows += json.loads((REPO / "bench" / "results" / f"{name}.json").read_text())["rows"]
    return [1 + float(r["time_err"]) for r in rows if r.get("time_err") is not None]


def range_data(zk: list[float], cmd: str) -> dict:
    """time_range.json: each basis's central ratios, where they come from and how many runs they rest on."""
    low, high = central_ratios(zk)
    cal = calibrated_ratios()
    c_low, c_high = central_ratios(cal)
    return {
        "_about": "predicted / measured step time, 10th and 90th percentiles: a plan's step time range is "
                  "[predicted / ratio_high, predicted / ratio_low] (estimate/timing.py step_range). Written by "
                  "bench/published_runs.py --write-range; tests/test_published_runs.py recomputes it.",
        "catalog_gpu": {"ratio_low": round(low, 4), "ratio_high": round(high, 4), "runs": len(zk),
                        "basis": f"80% of {len(zk)} published DeepSpeed runs (bench/results/published_runs.txt)",
                        "command": cmd},
        "calibrated": {"ratio_low": round(c_low, 4), "ratio_high": round(c_high, 4), "runs": len(cal),
                       "basis": f"80% of {len(cal)} real DeepSpeed ranks predicted on a measured profile "
                                f"(bench/results/{', '.join(CALIBRATED_TABLES)})"},
    }


def size_class(params: float) -> str:
    return "<1B" if params < 1e9 else "1-10B" if params < 10e9 else "10-100B" if params < 100e9 else ">=100B"


# packed runs: their document length is an estimate (the data file says from what); these multiples of it show how
# much the verdict rests on it, up to the whole sequence (no packing)
DOC_LEN_FACTORS = (0.5, 1.0, 2.0, 3.0)


def doc_len_sensitivity(rows: list[tuple]) -> list[str]:
    """Each packed run's ratio at DOC_LEN_FACTORS x its stated document length and at the whole sequence."""
    packed = [(run, r) for run, _, r, _ in rows if "doc_len" in run["setup"]]
    if not packed:
        return []
    out = ["", "packed runs (--doc-len, an estimate of the documents' length): the ratio if the documents were "
                + ", ".join(f"x{f:g}" for f in DOC_LEN_FACTORS) + " that long, and with no packing"]
    for run, _ in packed:
        s = run["setup"]
        cells = []
        for f in DOC_LEN_FACTORS:
            doc = min(int(s["doc_len"] * f), int(s["seq_len"]))
            r = predict({**run, "setup": {**s, "doc_len": doc}})["predicted"] / float(run["step_seconds"])
            cells.append(f"{doc}: {r:.2f}")
        whole = {k: v for k, v in s.items() if k != "doc_len"}
        r = predict({**run, "setup": whole})["predicted"] / float(run["step_seconds"])
        out.append(f"  {run['id']:44} " + "  ".join(cells) + f"  whole {s['seq_len']}: {r:.2f}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="regex over run ids")
    ap.add_argument("--out", help="also write the table here")
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--write-range", action="store_true",
                    help="write the central ratios to zerokit/data/time_range.json (the whole set only)")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    runs = [r for r in load_runs(Path(a.data)) if not a.only or re.search(a.only, r["id"])]
    if not runs:
        print("no run matches", file=sys.stderr)
        return 2

    cmd = "python bench/published_runs.py" + "".join(f" {x}" for x in (argv if argv is not None else sys.argv[1:]))
    lines = [f"command: {cmd}",
             f"data: bench/data/published_runs.yaml ({len(runs)} runs); zerokit planned with --hardware-profile none "
             f"(the catalog's figures: estimate/gpu_time.py), every setup dimension pinned",
             f"rule of thumb: 6 * N * tokens / (GPUs * peak * {RULE_MFU:.2f}), peak from zerokit/data/gpus.json",
             "runs that informed any zerokit rule: none (the set only checks the time model)",
             "ratio = predicted / measured step time (> 1: predicted slower than measured); 6N mfu = the measured "
             "step's 6*N*tokens over GPUs x peak (attention and recompute not counted: a sanity check on the setup)",
             "fits: whether zerokit's memory model fits the pinned setup (its time is priced either way)", ""]
    head = f"{'run':44} {'gpu':10} {'gpus':>5} {'z':>1} {'measured s':>11} {'zerokit s':>10} {'ratio':>6} " \
           f"{'rule s':>10} {'ratio':>6} {'6N mfu':>6}  fits"
    lines += [head, "-" * len(head)]
    zk, rt, rows = [], [], []
    for run in runs:
        s = run["setup"]
        p = predict(run)
        measured = float(run["step_seconds"])
        r_zk, r_rule = p["predicted"] / measured, p["rule"] / measured
        zk.append(r_zk)
        rt.append(r_rule)
        rows.append((run, p, r_zk, r_rule))
        gpus = int(s["gpus_per_node"]) * int(s["nodes"])
        lines.append(f"{run['id']:44} {s['gpu']:10} {gpus:>5} {s['stage']:>1} {measured:>11.4g} "
                     f"{p['predicted']:>10.4g} {r_zk:>6.2f} {p['rule']:>10.4g} {r_rule:>6.2f} {RULE_MFU * r_rule:>6.0%}  "
                     f"{'yes' if p['fits'] else 'NO'}")
    lines.append("")
    for name, ratios in (("zerokit", zk), ("rule of thumb", rt)):
        med, worst, share = spread(ratios)
        lines.append(f"{name:14} median x{med:.2f}  max x{worst:.2f}  within {WITHIN}x: "
                     f"{share:.0%} ({round(share * len(ratios))}/{len(ratios)})")
    if len(zk) > 1:  # a quantile needs two runs (--only may select one)
        low, high = central_ratios(zk)
        lines.append(f"central 80% of zerokit's ratios: x{low:.2f} to x{high:.2f} (a plan's range: predicted / "
                     f"{high:.2f} to predicted / {low:.2f}; zerokit/data/time_range.json)")
    lines.append("")
    # where the misses sit: by GPU, model size and stage (median signed ratio, so the direction shows)
    for title, key in (("gpu", lambda run, p: run["setup"]["gpu"]),
                       ("model size", lambda run, p: size_class(p["params"])),
                       ("ZeRO stage", lambda run, p: f"ZeRO-{run['setup']['stage']}")):
        groups: dict[str, list[tuple[float, float]]] = {}
        for run, p, r_zk, r_rule in rows:
            groups.setdefault(key(run, p), []).append((r_zk, r_rule))
        lines.append(f"by {title}: " + "; ".join(
            f"{g} n={len(v)} zerokit x{statistics.median(x for x, _ in v):.2f} "
            f"rule x{statistics.median(y for _, y in v):.2f}" for g, v in sorted(groups.items())))
    lines += doc_len_sensitivity(rows)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
    if a.write_range:
        if a.only:
            print("--write-range takes the whole set: drop --only", file=sys.stderr)
            return 2
        (REPO / "zerokit" / "data" / "time_range.json").write_text(json.dumps(range_data(zk, RANGE_COMMAND), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
