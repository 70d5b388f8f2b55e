"""zerokit's long-sequence memory against published long-sequence results, on a fit half and a held-out half (issue 45).

Each result in bench/data/long_context_evidence.yaml (source URL, verbatim quote, setup, and what was published) is
planned with zerokit's own planner pinned to its setup, on the catalog's figures (`--hardware-profile none`), and the
published fact is checked the way a user would rely on it:

- max:  the longest sequence the source reports for the setup, against `plan --seq-len max`'s answer (the length a
        user copies) and the memory model's own bound beside it; promised / published: within 15% is the target, and
        above 1.15x is the dangerous side (an OOM for the user who trusts it);
- fit:  a length the source ran: zerokit must not say "does not fit";
- oom:  a length that ran out of memory: zerokit must not say "fits" (it may say "at the edge");
- peak: a measured peak at a length: zerokit's allocated peak (or its nvidia-smi estimate, where the source read
        nvidia-smi) over the measured one.

Split once, by source (bench/data/long_context_split.yaml, the SHA-256 rule of bench/fit_time.py assign_split), before
any fit; `--fit` fits the one figure the code cannot tell, `seq_memory_factor` (how much more than the memory model
counts the memory that grows with the sequence takes: the CUDA caching allocator's rounding and fragmentation at
multi-GB blocks, buffers no term names), on the fit half only, inside [1, 2], and writes it to
zerokit/data/long_context_fit.json with the runs it came from.

Usage: python bench/long_context.py [--split] [--fit] [--out bench/results/long_context.txt]
       python bench/long_context.py --blind --data FILE --out FILE_RESULTS   (a later blind set, judged once)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import published_runs as pr  # bench/published_runs.py: one set of setup keys, their plan flags and pins

DATA = REPO / "bench" / "data" / "long_context_evidence.yaml"
SPLIT = REPO / "bench" / "data" / "long_context_split.yaml"
FIT_JSON = REPO / "zerokit" / "data" / "long_context_fit.json"
COMMAND = "python bench/long_context.py --out bench/results/long_context.txt"
FIT_COMMAND = "python bench/long_context.py --fit"
KINDS = ("max", "fit", "oom", "peak")
WITHIN = 0.15  # issue 45: maxima within 15%, none promised more than 1.15x
FACTOR_BOUNDS = (1.0, 2.0)  # the factor's physical bounds: at least what is counted, at most the allocator's worst case

REQUIRED = ("id", "group", "source", "quote", "kind", "seq_len", "setup")
# whose sequence parallelism the source ran (setup key sequence_parallel_kind, default ulysses): zerokit plans
# DeepSpeed's Ulysses; a ring (EasyContext's and 360-LLaMA-Factory's zigzag ring attention, ms-swift's ring) holds the
# same sequence share per rank and is priced as Ulysses here, and where Ulysses' rule refuses it the table says so
SEQUENCE_PARALLEL_KINDS = ("ulysses", "ring")
REQUIRED_SETUP = ("gpu", "gpus_per_node", "nodes", "stage", "precision")


class EvidenceError(Exception):
    """An entry that cannot be checked: one line naming it, the problem and the fix."""


def load(paths: list[Path]) -> list[dict]:
    import yaml

    out, seen = [], set()
    for path in paths:
        try:
            results = yaml.safe_load(path.read_text())["results"]
        except (OSError, yaml.YAMLError, TypeError, KeyError) as e:
            raise EvidenceError(f"{path}: not an evidence file ({type(e).__name__}): a YAML mapping with 'results'") from e
        for r in results:
            problem = check_entry(r)
            if problem is None and r["id"] in seen:
                problem = f"result {r['id']}: the id is used twice: give each its own"
            if problem:
                raise EvidenceError(problem)
            seen.add(r["id"])
            out.append(r)
    return out


def check_entry(r) -> str | None:
    if not isinstance(r, dict) or not isinstance(r.get("setup"), dict):
        return "not a result: give a mapping with " + ", ".join(REQUIRED)
    name = f"result {r.get('id', '?')}"
    missing = [k for k in REQUIRED if r.get(k) in (None, "")]
    if missing:
        return f"{name}: missing {', '.join(missing)}: every result states {', '.join(REQUIRED)}"
    if r["kind"] not in KINDS:
        return f"{name}: kind {r['kind']!r}: use one of {', '.join(KINDS)}"
    if r["kind"] == "peak" and not r.get("peak_gib"):
        return f"{name}: a peak states peak_gib (and peak_what)"
    setup = r["setup"]
    missing = [k for k in REQUIRED_SETUP if k not in setup]
    if missing:
        return f"{name}: setup lacks {', '.join(missing)}: state it, or the default taken, in assumptions"
    unknown = sorted(set(setup) - set(pr.FLAGS) - {"model", "sequence_parallel_kind"})
    if unknown:
        return (f"{name}: unknown setup key {unknown[0]}: use one of "
                f"{', '.join(['model', 'sequence_parallel_kind', *pr.FLAGS])}")
    if setup.get("sequence_parallel_kind", "ulysses") not in SEQUENCE_PARALLEL_KINDS:
        return (f"{name}: sequence_parallel_kind {setup['sequence_parallel_kind']!r}: use one of "
                f"{', '.join(SEQUENCE_PARALLEL_KINDS)}")
    if "model" not in setup and not all(k in setup for k in ("params", "hidden_size", "num_layers", "vocab_size")):
        return f"{name}: no model: give model, or params, hidden_size, num_layers and vocab_size"
    return named_problem(r)


def named_problem(r: dict) -> str | None:
    """What the entry names that zerokit lacks (a value no option takes, a GPU not in the catalog, a model it cannot
    resolve): the entry's error in every half and in a blind set, unlike a setup zerokit refuses to plan (plan_of)."""
    from zerokit.api import planned_model
    from zerokit.core.errors import ZerokitError
    from zerokit.spec.hardware import resolve_gpu_name

    try:
        req = pr.plan_request(plan_argv(r, r["seq_len"]))
        resolve_gpu_name(str(r["setup"]["gpu"]))
        planned_model(req)
    except ZerokitError as e:
        return f"result {r['id']}: {e}"
    return None


def plan_argv(r: dict, seq_len) -> list[str]:
    """bench/published_runs.py plan_argv of the result's setup at `seq_len` (its UNSTATED_PINS: no TP, SP, hpZ or
    tiling unless stated), one sequence per micro step unless stated."""
    setup = {"micro_batch": 1, "grad_accum": 1, **r["setup"], "seq_len": seq_len}
    if setup.get("liger_kernels") not in (None, False, "off") and setup.get("tiled_loss"):
        # a collector's "tiled_loss: true" beside Liger names Liger's own chunked fused cross-entropy, which
        # --liger-kernels prices (zerokit's --tiled-loss is ALST's TiledFusedLogitsLoss, refused beside Liger)
        setup["tiled_loss"] = False
    return pr.plan_argv(setup, r["source"])


def plan_of(r: dict, seq_len):
    """build_plan of the pinned setup; (plan, None) or (None, the one-line reason zerokit refuses it)."""
    from zerokit.api import build_plan
    from zerokit.core.errors import ZerokitError

    if r.get("fpdt"):
        return None, "FPDT (DeepSpeed's chunked, offloaded sequence parallelism) is not planned by zerokit"
    try:
        return build_plan(pr.plan_request(plan_argv(r, seq_len))), None
    except ZerokitError as e:
        if r["setup"].get("sequence_parallel_kind") == "ring":
            return None, f"the source ran ring attention, priced here as Ulysses, whose rule refuses it: {e}"
        return None, str(e)


def evaluate(r: dict) -> dict:
    """What zerokit says of one result: for a max, the answer a user copies and the memory model's bound; for
    fit/oom, the verdict at the length; for a peak, the predicted peak (GiB)."""
    if r["kind"] == "max":
        plan, why = plan_of(r, "max")
        if plan is None:
            return {"refused": why}
        s = plan.seq_len_search
        return {"answer": s.longest, "bound": getattr(s, "memory_bound", s.longest),
                "ratio": s.longest / r["seq_len"], "label": plan.best.setup.label}
    plan, why = plan_of(r, r["seq_len"])
    if plan is None:
        # a length zerokit refuses outright (not a memory verdict) is a "does not fit" only if it says so
        return {"refused": why, "verdict": "does not fit" if "does not fit" in why else None}
    out = {"verdict": getattr(plan, "verdict", "fits" if plan.fits else "does not fit"), "label": plan.best.setup.label}
    if r["kind"] == "peak":
        mem = plan.best.memory
        smi = mem.nvidia_smi
        nvidia = str(r.get("peak_what", "")).startswith("nvidia") and smi is not None
        predicted = (smi.nvidia_smi_bytes if nvidia else mem.per_gpu_total) / 2**30
        out.update(predicted_gib=predicted, ratio=predicted / float(r["peak_gib"]))
    return out


# sources the project's earlier long-context rules were checked against (bench/alst_max_seq.py: ALST's abstract,
# ArcticTraining's recipes, the HF Ulysses blog): seen, so in the fit half whatever their hash says
SEEN_SOURCES = ("alst-paper", "at-run-", "hf-ulysses-blog")


def max_rows(results: list[dict]) -> list[tuple[dict, object]]:
    """(result, plan) for each plannable maximum and length that ran: `plan --seq-len max` with no factor, so a fit can
    re-cut each answer with planning.search.safe_longest at any factor (what longest_plan does with the bundled one)."""
    from unittest import mock

    from zerokit.planning import search

    rows = []
    with mock.patch.object(search, "seq_memory_factor", lambda cluster, seq_len=None: 1.0):
        for r in results:
            if r["kind"] in ("max", "fit"):
                plan, _ = plan_of(r, "max")
                if plan is not None:
                    rows.append((r, plan))
    return rows


def safe_ratio(r: dict, plan, factor: float) -> float:
    """The answer at `factor` over the published maximum."""
    from zerokit.planning.search import safe_longest

    s = plan.seq_len_search
    units = safe_longest(plan.model, plan.cluster, plan.workload, plan.best.setup, plan.budget.gpu_bytes, s.granule,
                         s.longest // s.granule, factor)
    return units * s.granule / r["seq_len"]


def fit_factor(rows: list[tuple[dict, object]]) -> tuple[float, float]:
    """(factor, loss): the factor in FACTOR_BOUNDS, on a 0.01 grid, that minimises the mean pseudo-Huber (delta 0.25,
    as bench/fit_time.py) of log(answer / published) over the fit half's maxima, and of how far the answer falls short
    of each length that ran (a length that ran bounds the answer from below only)."""
    def loss(f: float) -> float:
        xs = [math.log(safe_ratio(r, p, f)) if r["kind"] == "max" else min(0.0, math.log(safe_ratio(r, p, f)))
              for r, p in rows]
        return statistics.fmean(0.0625 * (math.sqrt(1 + (x / 0.25) ** 2) - 1) for x in xs)

    grid = [round(FACTOR_BOUNDS[0] + i / 100, 2) for i in range(int((FACTOR_BOUNDS[1] - FACTOR_BOUNDS[0]) * 100) + 1)]
    best = min(grid, key=loss)
    return best, loss(best)


def assign_split(results: list[dict], split: dict[str, str]) -> dict[str, str]:
    """bench/fit_time.py assign_split's rule, with SEEN_SOURCES as the seen groups: those to the fit half, every other
    new source by the SHA-256 of its name to the half with fewer results so far; a listed source never moves."""
    from fit_time import assign_split as by_source

    return by_source(results, split, seen=lambda group: group.startswith(SEEN_SOURCES))


def load_split() -> dict[str, str]:
    import yaml

    return dict(yaml.safe_load(SPLIT.read_text())["groups"]) if SPLIT.exists() else {}


def write_split(split: dict[str, str]) -> None:
    head = ("# The long-context evidence split, made once by `python bench/long_context.py --split` before any fit: each\n"
            "# source (a result's `group`) in one half. A listed group never moves; a new one joins by the same rule.\n")
    SPLIT.write_text(head + "groups:\n" + "".join(f"  {g}: {h}\n" for g, h in sorted(split.items())))


def summary(rows: list[tuple[dict, dict]]) -> list[str]:
    """Per kind: maxima within 15% and promised above 1.15x; fits and OOMs called right; peaks within 15%."""
    out = []
    maxima = [e["ratio"] for r, e in rows if r["kind"] == "max" and "ratio" in e]
    if maxima:
        within = sum(abs(x - 1) <= WITHIN for x in maxima)
        over = sum(x > 1 + WITHIN for x in maxima)
        out.append(f"  maxima: {len(maxima)}; within 15%: {within} ({within / len(maxima):.0%}); promised more than "
                   f"1.15x: {over}; median promised/published {statistics.median(maxima):.2f}")
    for kind, right in (("fit", ("fits", "at the edge")), ("oom", ("does not fit", "at the edge"))):
        calls = [e.get("verdict") for r, e in rows if r["kind"] == kind]
        if calls:
            ok = sum(c in right for c in calls)
            edge = sum(c == "at the edge" for c in calls)
            out.append(f"  {kind}: {len(calls)}; called right: {ok} ({edge} of them 'at the edge')")
    peaks = [(e["ratio"], r.get("peak_what") != "unknown") for r, e in rows if r["kind"] == "peak" and "ratio" in e]
    if peaks:
        within = sum(abs(x - 1) <= WITHIN for x, _ in peaks)
        stated = [x for x, known in peaks if known]
        out.append(f"  peaks: {len(peaks)}; within 15%: {within}; median predicted/measured "
                   f"{statistics.median(x for x, _ in peaks):.2f}; where the source says what it read (nvidia-smi or "
                   f"the allocator): {len(stated)}, within 15%: {sum(abs(x - 1) <= WITHIN for x in stated)}; the "
                   f"rest are ambiguous (the source does not say whether it read nvidia-smi, torch's reserved or "
                   f"allocated memory)")
    refused = sum("refused" in e and e.get("verdict") is None for _, e in rows)
    if refused:
        out.append(f"  not planned (zerokit refuses the setup, each with its reason above): {refused}")
    return out


def table(results: list[dict], split: dict[str, str], cmd: str, data: list[Path] | None = None) -> str:
    """Every result, then each half's summary; a blind file's results (split "blind": sources in no half) are judged
    once by the committed factor, as their own half."""
    shown = ", ".join(str(p.resolve().relative_to(REPO)) for p in (data or [DATA]))
    where = (f"split: {SPLIT.relative_to(REPO)} (whole sources in each half)" if data in (None, [DATA]) else
             "sources in no half of the split: judged once by the committed factor (zerokit/data/long_context_fit.json)")
    lines = [f"command: {cmd}",
             f"data: {shown} ({len(results)} results, {len({r['group'] for r in results})} sources); {where}",
             "zerokit: planned with --hardware-profile none, every stated setup dimension pinned (TP 1, SP 1, hpZ 1, no "
             "tiling unless stated); max: the answer a user copies (and the memory model's bound); fit/oom: the verdict "
             "at the length; peak: predicted / measured (nvidia-smi's estimate where the source read nvidia-smi)", ""]
    rows = [(r, evaluate(r)) for r in results]
    head = f"{'result':52} {'half':8} {'kind':4} {'tokens':>10}  zerokit"
    lines += [head, "-" * len(head)]
    halves = ("fit", "held_out", "blind")
    for half in halves:
        for r, e in rows:
            if split.get(r["group"]) != half:
                continue
            if "refused" in e and e.get("verdict") is None:
                said = f"not planned: {e['refused']}"
            elif r["kind"] == "max":
                said = f"{e['answer']:,} ({e['ratio']:.2f}x; memory bound {e['bound']:,})"
            elif r["kind"] == "peak":
                said = f"{e['predicted_gib']:.1f} GiB vs {float(r['peak_gib']):.1f} ({e['ratio']:.2f}x), {e['verdict']}"
            else:
                said = e["verdict"] or e.get("refused")
            lines.append(f"{r['id'][:52]:52} {half:8} {r['kind']:4} {int(r['seq_len']):>10,}  {said}")
    for half in halves:
        part = [(r, e) for r, e in rows if split.get(r["group"]) == half]
        if part:
            lines += ["", f"{half.replace('_', '-')} half: {len(part)} results from {len({r['group'] for r, _ in part})} sources"]
            lines += summary(part)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, nargs="*", default=[DATA])
    ap.add_argument("--split", action="store_true", help="assign the sources the split does not list yet, then stop")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--half", choices=("fit", "held_out"), help="only this half (a fit looks at the fit half alone)")
    ap.add_argument("--fit", action="store_true", help="fit seq_memory_factor on the fit half's maxima; write it")
    ap.add_argument("--blind", action="store_true",
                    help="judge --data's results (sources in no half) once with the committed factor")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    try:
        results = load(a.data)
    except EvidenceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.split:
        split = assign_split(results, load_split())
        write_split(split)
        print(f"{len(split)} sources: {sum(split[r['group']] == 'fit' for r in results)} results in the fit half, "
              f"{sum(split[r['group']] == 'held_out' for r in results)} held out")
        return 0
    split = load_split()
    cmd = "python bench/long_context.py" + "".join(f" {x}" for x in (argv if argv is not None else sys.argv[1:]))
    if a.blind:
        known = sorted({r["group"] for r in results} & (set(split) | {r["group"] for r in load([DATA])}))
        if known:
            print(f"error: --blind judges sources in no half, and {len(known)} of these are known already (first: "
                  f"{known[0]}): drop --blind, or give a file of new sources", file=sys.stderr)
            return 2
        text = table(results, {r["group"]: "blind" for r in results}, cmd, a.data)
        print(text, end="")
        if a.out:
            a.out.write_text(text)
        return 0
    missing = sorted({r["group"] for r in results} - set(split))
    if missing:
        print(f"error: sources without a half: {', '.join(missing)}: run python bench/long_context.py --split",
              file=sys.stderr)
        return 2
    if a.fit:
        fit_results = [r for r in results if split[r["group"]] == "fit"]
        rows = max_rows(fit_results)
        factor, value = fit_factor(rows)
        FIT_JSON.write_text(json.dumps({
            "_about": "How much more than the memory model counts the memory that grows with the sequence takes where "
                      "published long-sequence runs ended (planning/search.py seq_memory_factor), fitted on the fit "
                      "half's maxima of bench/data/long_context_evidence.yaml (split: bench/data/long_context_split.yaml)"
                      f". Written by `{FIT_COMMAND}`; tests/test_long_context_evidence.py refits and compares.",
            "seq_memory_factor": factor, "bounds": list(FACTOR_BOUNDS), "loss": round(value, 6),
            # the shortest sequence the factor was fitted on: below it no evidence says the sequence's memory runs over
            "from_seq_len": min(int(r["seq_len"]) for r, _ in rows),
            "command": FIT_COMMAND, "fit_on": sorted(r["id"] for r, _ in rows),
            "fit_results": len(fit_results)}, indent=2) + "\n")
        print(f"seq_memory_factor {factor} (loss {value:.4f}) from {len(rows)} maxima and lengths that ran: wrote "
              f"{FIT_JSON.relative_to(REPO)}")
        return 0
    if a.half:
        results = [r for r in results if split[r["group"]] == a.half]
    text = table(results, split, COMMAND)
    print(text, end="")
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
