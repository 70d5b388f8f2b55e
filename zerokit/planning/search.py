"""`--seq-len max`: the longest sequence that fits, found by search over the memory model.

Every term the memory model prices grows with the sequence or stays (activations, logits, their gradients and
buffers are linear in the tokens; eager attention's scores quadratic), so the fit is monotone in the sequence length
for one setup, and the planner's best over setups is monotone too (what fits at s fits at any shorter s). Doubling
finds a length that does not fit, bisection the boundary: about 2 log2(answer) fit checks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache

from zerokit.core.errors import EXIT_DOES_NOT_FIT, ZerokitError
from zerokit.core.limits import MAX_SEQ_LEN
from zerokit.core.options import flag
from zerokit.core.resources import bundled_data
from zerokit.core.units import fmt_bytes


@dataclass
class SeqLenSearch:
    """The answer: the longest sequence (a multiple of `granule`) that fits, and what binds one step longer."""

    longest: int
    granule: int  # the search's step: the sequence-parallel degree(s) must divide the sequence
    limit: int  # the longest the model's positions allow (a learned table) or zerokit's bound (MAX_SEQ_LEN)
    binds: str  # why longest + granule does not fit (or "the model's positions" at the limit)
    # where the longest sequence that really runs is likely to be (likely_range): (low, high, what it rests on); None
    # where no published maximum checked this kind of answer (a CPU)
    likely: tuple[int, int, str] | None = None
    # the memory model's own longest (longest is shorter where the sequence's memory at seq_memory_factor binds first)
    memory_bound: int | None = None
    factor: float = 1.0  # seq_memory_factor the answer was cut with

    def to_dict(self) -> dict:
        out = {"max_seq_len": self.longest, "granule": self.granule, "limit": self.limit, "binds": self.binds,
               "memory_bound_seq_len": self.memory_bound or self.longest, "seq_memory_factor": self.factor}
        if self.likely:
            out.update(likely_low=self.likely[0], likely_high=self.likely[1], range_basis=self.likely[2])
        return out

    @property
    def note(self) -> str:
        bound = self.memory_bound or self.longest
        if bound > self.longest:
            note = (f"longest sequence that fits: {self.longest} tokens (a multiple of {self.granule}), with the "
                    f"memory that grows with the sequence at {self.factor:g}x what the model counts, where published "
                    f"long-sequence runs ended (bench/results/long_context.txt); the memory model alone: {bound} "
                    f"tokens, at {bound + self.granule} tokens: {self.binds}")
        else:
            note = (f"longest sequence that fits: {self.longest} tokens (a multiple of {self.granule}); at "
                    f"{self.longest + self.granule} tokens: {self.binds}")
        if self.likely:
            low, high, basis = self.likely
            note += f"; likely {low} to {high} tokens: {basis}"
        return note


@lru_cache(maxsize=1)
def _seq_len_ranges() -> dict:
    path = bundled_data("seq_len_range.json")  # absent only while bench/alst_max_seq.py --write-range first makes it
    return json.loads(path.read_text()) if path.exists() else {}


def likely_range(longest: int, granule: int, sequence_parallel: int, on_gpu: bool) -> tuple[int, int, str] | None:
    """(low, high, what it rests on) for a longest sequence on a GPU: longest x the lowest and highest published /
    zerokit ratio over ALST's published maxima, with Ulysses (sequence_parallel > 1) or without
    (zerokit/data/seq_len_range.json, written by bench/alst_max_seq.py --write-range), in multiples of granule. The
    Ulysses maxima reached 0.88-0.95x of zerokit's answers (at liger-kernel 0.5.x's 32-bit cap) and 0.73-0.81x of the
    memory model's alone: which bound them is not published (docs/long-context.md), and the range spans both where the
    single number cannot. None on a CPU: no published maximum was measured there."""
    if not on_gpu:
        return None
    entry = _seq_len_ranges().get("ulysses" if sequence_parallel > 1 else "one_sequence_per_rank")
    if entry is None:
        return None
    low, high = (int(longest * entry[k]) // granule * granule for k in ("ratio_low", "ratio_high"))
    return low, high, f"{entry['basis']} reached {entry['ratio_low']:.2f}-{entry['ratio_high']:.2f}x of zerokit's longest"


@lru_cache(maxsize=1)
def _long_context_fit() -> dict:
    path = bundled_data("long_context_fit.json")
    return json.loads(path.read_text()) if path.exists() else {}


def seq_memory_factor(cluster, seq_len: int | None = None) -> float:
    """How much more than the memory model counts the memory that grows with the sequence takes where published
    long-sequence runs ended (zerokit/data/long_context_fit.json, fitted on the fit half of
    bench/data/long_context_evidence.yaml by bench/long_context.py --fit, inside [1, 2]: the CUDA caching allocator's
    rounding and fragmentation at multi-GB blocks and buffers no term names). 1 where no fit is bundled, on CPU ranks
    (every published run was on GPUs), and for a sequence shorter than the shortest the fit saw (`from_seq_len`): no
    evidence there says the memory runs over."""
    fit = _long_context_fit()
    if (not fit or cluster.accelerator.is_cpu
            or (seq_len is not None and seq_len < int(fit.get("from_seq_len", 0)))):
        return 1.0
    return float(fit["seq_memory_factor"])


def phase_bytes(est) -> dict[str, dict[str, int]]:
    """A MemoryEstimate's per-GPU terms at each phase of the step (estimate.memory.phase_terms)."""
    return {p: dict(terms) for p, terms in est.phase_terms.items()}


def fixed_bytes(model, cluster, workload, setup, knobs=None) -> dict[str, dict[str, int]]:
    """The setup's per-GPU terms at each phase at the shortest sequence it runs (one token per sequence-parallel rank):
    a term with the same bytes at a length does not grow with the sequence (model states, buffers, the context, a
    reduction's copies)."""
    from zerokit.estimate.pipeline import setup_memory

    tiny = replace(workload, seq_len=max(1, setup.sequence_parallel), doc_len=None)
    return phase_bytes(setup_memory(model, cluster, setup, tiny, knobs))


def edge_bytes(fixed: dict[str, dict[str, int]], at: dict[str, dict[str, int]], factor: float) -> float:
    """The peak at a length if what grows with the sequence takes `factor` times what the model counts: in each phase
    of the step, the terms whose bytes differ from the shortest sequence's at `factor`, the rest as counted; the
    largest phase. Term by term, so a constant that exists at one moment (the end of backward's copies) or inside one
    alternative of a term (the recomputed layer's largest moment) is not taken off another's growth."""
    def peak(phase: str, terms: dict[str, int]) -> float:
        base = fixed.get(phase, {})
        growing = sum(v for k, v in terms.items() if v != base.get(k))
        return sum(terms.values()) + (factor - 1) * growing

    return max(peak(p, terms) for p, terms in at.items())


def verdict(model, cluster, workload, evaluation, factor: float | None = None, knobs=None) -> str:
    """"fits", "at the edge" (the memory model fits it, but with the sequence's memory at seq_memory_factor, where
    published long-sequence runs ended, it would not) or "does not fit"."""
    if not evaluation.fits:
        return "does not fit"
    factor = seq_memory_factor(cluster, workload.seq_len) if factor is None else factor
    if factor <= 1.0:
        return "fits"
    fixed = fixed_bytes(model, cluster, workload, evaluation.setup, knobs)
    over = edge_bytes(fixed, phase_bytes(evaluation.memory), factor) > evaluation.budget.gpu_bytes
    return "at the edge" if over else "fits"


def safe_units(total_at, fixed: dict[str, dict[str, int]], budget: int, factor: float, best: int) -> int:
    """The largest n <= best (units of the granule) whose memory, the sequence's part at `factor`, stays in the
    budget; total_at(n): the setup's memory model totals by phase at n units (phase_bytes). 0: not even one unit."""
    def fits(n: int) -> bool:
        return edge_bytes(fixed, total_at(n), factor) <= budget

    if factor <= 1.0 or fits(best):
        return best
    return _longest_from(fits, 1, best) if fits(1) else 0


def safe_longest(model, cluster, workload, setup, budget_bytes: int, granule: int, best: int,
                 factor: float | None = None, knobs=None) -> int:
    """The longest multiple of granule, up to best units, at which `setup` stays in the budget with the sequence's
    memory at `factor` (seq_memory_factor): the answer `--seq-len max` gives (longest_plan), in units of granule."""
    from zerokit.estimate.pipeline import setup_memory

    factor = seq_memory_factor(cluster, best * granule) if factor is None else factor
    if factor <= 1.0:
        return best
    fixed = fixed_bytes(model, cluster, workload, setup, knobs)

    def total_at(units: int) -> dict[str, dict[str, int]]:
        return phase_bytes(setup_memory(model, cluster, setup, replace(workload, seq_len=units * granule), knobs))

    return safe_units(total_at, fixed, budget_bytes, factor, best)


def longest_fitting(judge, granule: int = 1, limit: int = MAX_SEQ_LEN):
    """(n, judged at n, judged at n + granule or None at the limit) for judge(seq_len) -> an object with .fits: the
    largest multiple n of granule up to limit that fits, 0 when granule itself does not (then both judged are at
    granule). The search is _longest_from's; every judgement is kept, so the two returned are ones it made."""
    granule = max(1, granule)
    top = limit // granule  # in units of granule
    first = judge(granule)
    if not first.fits:
        return 0, first, first
    judged = {1: first}

    def fits(units: int) -> bool:
        judged[units] = judge(units * granule)
        return judged[units].fits

    n = _longest_from(fits, 1, top)
    return n * granule, judged[n], judged.get(n + 1) if n < top else None


def binding(evaluation) -> str:
    """What binds at a length that does not fit: a kernel limit it hits (spec/liger.py), the budget it exceeds and the
    largest per-GPU term there."""
    if evaluation is None:
        return "the model's positions (its learned position table)"
    reasons = "; ".join(evaluation.reasons) or "does not fit"
    terms = evaluation.memory.per_gpu
    if terms and len(evaluation.reasons) > len(evaluation.memory.kernel_limits):  # a memory budget binds too
        name = max(terms, key=terms.get)
        reasons += f" (largest term: {name} {fmt_bytes(terms[name])}, with {evaluation.setup.label})"
    return reasons


def seq_len_limit(model) -> int:
    """How far the search goes: a learned position table's rows (a longer sequence cannot run), else MAX_SEQ_LEN."""
    if model is not None and model.learned_positions and model.max_positions:
        return min(model.max_positions, MAX_SEQ_LEN)
    return MAX_SEQ_LEN


def plan_granule(cluster, pins: dict) -> int:
    """The step of the search: a pinned SP degree, else the GPUs of a node (every SP degree the planner tries divides
    them, planner.parallel_options), so that a sequence-parallel setup stays a candidate at every length tried."""
    return pins.get("sequence_parallel") or max(1, cluster.gpus_per_node)


def candidate_setups(model, cluster, workload, pins: dict) -> list:
    """Every setup make_plan may choose (planner.parallel_options x planner._families, paired by planner.compatible),
    each at its smallest micro batch: memory grows with the micro batch, so a family fits some length at all only
    there."""
    from zerokit.planning.planner import _families, _micro_batches, compatible, parallel_options
    from zerokit.spec.setup import ZeroSetup

    pairs: dict[int, tuple[int, int] | None] = {}
    out = []
    for par in parallel_options(model, cluster, workload, pins):
        for fam in _families(cluster, pins):
            if not compatible(fam, par):
                continue
            mp = par["tensor_parallel"] * par["sequence_parallel"] * par["pipeline_parallel"]
            if mp not in pairs:
                try:
                    pairs[mp] = _micro_batches(cluster, workload, pins, mp)[0]
                except ZerokitError:
                    if mp == 1:
                        raise
                    pairs[mp] = None  # the pinned batch does not split over this many replicas (as make_plan)
            if pairs[mp] is not None:
                micro, accum = pairs[mp]
                out.append(ZeroSetup(micro_batch_size=micro, gradient_accumulation_steps=accum, **{**fam, **par}))
    return out


def _frugal_first(setup) -> tuple:
    """Setups that save the most activation memory first (more sequence-parallel ranks, checkpoints offloaded,
    checkpointing, tiling, offload, ZeRO-3): the longest sequence is most often theirs, so few later ones beat it."""
    return (-setup.sequence_parallel * setup.tensor_parallel, not setup.checkpoint_offload,
            not setup.activation_checkpointing, not setup.tiled_mlp, not setup.tiled_loss,
            setup.offload_param == "none", setup.offload_optimizer == "none", -setup.zero_stage)


def longest_plan(model, cluster, workload, pins: dict, memory_fraction: float):
    """(the plan at the longest sequence that fits, SeqLenSearch). Nothing fits even at one granule: ZerokitError,
    exit 1, naming what binds.

    The answer is the largest of the candidates' own longest sequences (candidate_setups; each one's fit is monotone
    in the length). With the best so far in hand, a candidate is judged once, one granule past it; only one that
    fits there is searched further (doubling, then bisection, from the best so far). Frugal setups come first
    (_frugal_first), so most candidates cost that one judgement. The plan at the answer is make_plan's own choice
    among the families that fit there, and its other rows are the choice's neighbours, each with its own longest
    (neighbour_rows)."""
    from zerokit.planning.planner import evaluate, family_key, make_plan

    granule = plan_granule(cluster, pins)
    top = seq_len_limit(model) // granule  # in units of granule
    candidates = sorted(candidate_setups(model, cluster, replace(workload, seq_len=granule), pins), key=_frugal_first)

    def judge(setup, units: int):
        return evaluate(model, cluster, replace(workload, seq_len=units * granule), setup, None, memory_fraction)

    best, least_at_first = 0, None  # the longest so far (units); the least-memory evaluation at one granule
    for setup in candidates:
        if best >= top:
            break
        ev = judge(setup, best + 1)
        if not ev.fits:
            if best == 0 and (least_at_first is None or ev.memory.per_gpu_total < least_at_first.memory.per_gpu_total):
                least_at_first = ev
            continue
        best = _longest_from(lambda units, s=setup: judge(s, units).fits, best + 1, top)
    if best == 0:
        raise ZerokitError(f"{flag('seq-len')} max: nothing fits even at {granule} token{'s' if granule > 1 else ''}: "
                           f"{binding(least_at_first)}", exit_code=EXIT_DOES_NOT_FIT)
    survivors = [s for s in candidates if judge(s, best).fits]
    beyond = None
    if best < top:  # what binds one granule longer: the least-memory survivor there
        beyond = min((judge(s, best + 1) for s in survivors), key=lambda ev: ev.memory.per_gpu_total)
    bound = best * granule
    plan = make_plan(model, cluster, replace(workload, seq_len=bound), pins, memory_fraction=memory_fraction,
                     within={family_key(s) for s in survivors})
    factor = seq_memory_factor(cluster, bound)
    safe = best
    if plan.best is not None and factor > 1.0:
        # the answer a user copies: the chosen setup's longest with the sequence's memory at the fitted factor
        safe = max(1, safe_longest(model, cluster, workload, plan.best.setup, plan.budget.gpu_bytes, granule, best,
                                   factor))
        if safe < best:
            plan = make_plan(model, cluster, replace(workload, seq_len=safe * granule), pins,
                             memory_fraction=memory_fraction, within={family_key(plan.best.setup)})
    if plan.best is not None:
        neighbour_rows(plan, candidates, survivors, judge, granule, best)
    likely = likely_range(bound, granule, plan.choice.sequence_parallel, not cluster.accelerator.is_cpu)
    return plan, SeqLenSearch(safe * granule, granule, top * granule, binding(beyond), likely, bound, factor)


def _longest_from(fits, lo: int, top: int) -> int:
    """The largest n in [lo, top] with fits(n), given fits(lo): doubling past lo, then bisection."""
    step, hi = lo, None
    while hi is None and lo < top:
        m = min(lo + step, top)
        if fits(m):
            lo, step = m, step * 2
        else:
            hi = m
    if hi is None:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def neighbour_rows(plan, candidates, survivors, judge, granule: int, best: int) -> None:
    """A --seq-len max plan's other rows: the families that fit the answer too (make_plan's ranking, as for any plan),
    then every candidate one field away from the choice (planner.FAMILY_FIELDS: one less SP degree, no tiled MLP,
    checkpoints kept on the GPU, another stage or offload ...) with the longest sequence it reaches itself, longest
    first: what each part of the chosen setup buys. Each is found by bisection below the answer."""
    from zerokit.planning.planner import FAMILY_FIELDS, family_key

    longest = best * granule
    for row in plan.rejected:
        row["max_seq_len"] = longest
    choice = family_key(plan.best.setup)
    kept = {family_key(s) for s in survivors}
    rows = []
    for setup in candidates:
        key = family_key(setup)
        if key in kept or sum(a != b for a, b in zip(key, choice)) != 1:
            continue
        first = judge(setup, 1)
        units = _longest_from(lambda n, s=setup: judge(s, n).fits, 1, best) if first.fits else 0
        ev = judge(setup, units) if units else first
        changed = next(f for f, a, b in zip(FAMILY_FIELDS, key, choice) if a != b)
        reason = (f"reaches {units * granule:,} tokens ({units / best:.0%} of the longest)" if units
                  else f"fits no sequence: {binding(first)}")
        rows.append((units, ev, {"setup": setup.to_dict(), "label": setup.label, "reason": reason,
                                 "per_gpu_bytes": ev.memory.per_gpu_total, "step_seconds": ev.time.step_seconds,
                                 "tokens_per_second": ev.time.tokens_per_second, "max_seq_len": units * granule,
                                 "changed": changed}))
    rows.sort(key=lambda r: -r[0])
    plan.rejected += [r[2] for r in rows]
    plan.others += [r[1] for r in rows]
