"""How many GPUs, and which: the total-time formula inverted.

zerokit's total time is epochs x steps x step time (estimate.timing.estimate_time), with steps = samples x epochs /
global batch. `--deadline` asks the reverse: the fewest GPUs of one kind whose best plan fits and finishes in time.
`--compare-gpus` makes the same plan on several GPU kinds. Both only re-run the planner (make_plan) on other
clusters: every row is a plan a user could get by passing that --gpu / --gpus-per-node / --nodes.

The global batch stays fixed (--global-batch): added GPUs split it, they do not grow it. The counts searched: a
single node's 1, 2, 4, ... GPUs (single GPUs are rented too), then whole nodes, every count to
16 and then steps of an eighth of the count and every power of two, so the count returned is at most ~1/8 above the fewest that would do.
The search stops once a count meets the deadline, or once the world size has grown 8x past the fastest count seen
(three doublings without a faster finish: communication or a fixed global batch has stopped the scaling).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator

from zerokit.core.errors import EXIT_DOES_NOT_FIT, ZerokitError
from zerokit.core.limits import MAX_WORLD_SIZE
from zerokit.core.options import flag
from zerokit.core.units import fmt_seconds
from zerokit.planning.planner import make_plan
from zerokit.spec.hardware import HardwareOptions
from zerokit.spec.model import ModelSpec
from zerokit.spec.setup import Workload

NODE_SIZE = 8  # GPUs per node when --gpus-per-node is not given: the HGX/DGX and cloud 8-GPU instances people rent
EXACT_NODES = 16  # every node count up to here; beyond, steps of an eighth
STOP_GROWTH = 8  # stop once the world size is this many times the fastest count's, with nothing faster since


@dataclass(frozen=True)
class Row:
    """One cluster's best plan, as a row of the deadline search or the GPU comparison."""

    gpu: str
    gpus_per_node: int
    nodes: int
    fits: bool
    setup: str | None  # the chosen setup's label
    step_seconds: float | None
    total_seconds: float | None  # None without --samples
    why_not: str | None = None  # the first reason the closest setup does not fit
    meets_deadline: bool | None = None  # with --deadline: whether total_seconds is within it
    # the likely range of the total (TimeEstimate.total_seconds_low/high); None without --samples or a checked basis
    total_seconds_low: float | None = None
    total_seconds_high: float | None = None
    # the attention kernel this row was priced with, where it is not the one asked for (--compare-gpus with flash3 on
    # a GPU FlashAttention-3 does not run on: FlashAttention-2, what the script would fall back to)
    attention: str | None = None

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def gpu_hours(self) -> float | None:
        return None if self.total_seconds is None else self.total_seconds * self.gpus / 3600

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "gpus_per_node": self.gpus_per_node, "nodes": self.nodes, "gpus": self.gpus,
                "fits": self.fits, "setup": self.setup, "step_seconds": self.step_seconds,
                "total_seconds": self.total_seconds, "gpu_hours": self.gpu_hours, "why_not": self.why_not,
                "meets_deadline": self.meets_deadline, "total_seconds_low": self.total_seconds_low,
                "total_seconds_high": self.total_seconds_high, "attention": self.attention}


@dataclass(frozen=True)
class DeadlineAnswer:
    deadline_seconds: float
    met: bool
    row: Row | None  # the fewest GPUs that meet it; None when none does
    fastest: Row | None  # when missed: the fastest finish seen (where adding GPUs stopped helping)
    rows: tuple[Row, ...]  # every count evaluated, in order

    def to_dict(self) -> dict:
        return {"deadline_seconds": self.deadline_seconds, "met": self.met,
                "choice": self.row.to_dict() if self.row else None,
                "fastest": self.fastest.to_dict() if self.fastest else None,
                "searched": [r.to_dict() for r in self.rows]}


def gpu_counts(gpus_per_node: int) -> Iterator[tuple[int, int]]:
    """(GPUs per node, nodes), fewest GPUs first: one node's powers of two below a full node, then whole nodes."""
    g = 1
    while g < gpus_per_node:
        yield g, 1
        g *= 2
    nodes = 1
    while nodes * gpus_per_node <= MAX_WORLD_SIZE:
        yield gpus_per_node, nodes
        # beyond EXACT_NODES steps of an eighth, never past the next power of two (global batches are powers of two)
        nodes += 1 if nodes < EXACT_NODES else min(max(1, nodes // 8), (1 << nodes.bit_length()) - nodes)


def evaluate_count(model: ModelSpec, hw: HardwareOptions, workload: Workload, pins: dict,
                   memory_fraction: float) -> Row:
    """The planner's best setup on `hw` (a row), or why nothing fits there."""
    cluster = hw.build()
    name = cluster.accelerator.name
    try:
        plan = make_plan(model, cluster, workload, pins, memory_fraction=memory_fraction)
    except ZerokitError as e:  # this count cannot run the workload at all (a global batch it does not divide)
        return Row(name, cluster.gpus_per_node, cluster.nodes, False, None, None, None, str(e))
    if plan.fits and plan.best is not None:
        t = plan.best.time
        return Row(name, cluster.gpus_per_node, cluster.nodes, True, plan.best.setup.label, t.step_seconds,
                   t.total_seconds, total_seconds_low=t.total_seconds_low, total_seconds_high=t.total_seconds_high)
    why = plan.best.reasons[0] if plan.best is not None and plan.best.reasons else "nothing fits"
    return Row(name, cluster.gpus_per_node, cluster.nodes, False, None, None, None, why)


def for_deadline(model: ModelSpec, hw: HardwareOptions, workload: Workload, pins: dict, deadline_s: float,
                 memory_fraction: float) -> DeadlineAnswer:
    """The fewest GPUs of hw's kind that fit and finish workload.samples x epochs within deadline_s."""
    if workload.samples is None:
        raise ZerokitError(f"{flag('deadline')} needs the run's length to finish in time: give {flag('samples')} N "
                           f"(samples per epoch) and, if not 1, {flag('epochs')}")
    if workload.global_batch is None:
        # without one, each added GPU adds samples to every step (micro batch x accumulation per GPU): the deadline
        # would always be met by a large enough global batch, which is a training hyperparameter, not a free choice
        raise ZerokitError(f"{flag('deadline')} adds GPUs at a fixed global batch (samples per optimizer step, a "
                           f"training hyperparameter): give {flag('global-batch')} N, e.g. 256")
    if hw.hostfile or hw.nodes is not None:
        raise ZerokitError(f"{flag('deadline')} chooses the number of nodes: drop "
                           f"{flag('hostfile') if hw.hostfile else flag('nodes')}")
    per_node = hw.gpus_per_node or NODE_SIZE
    rows: list[Row] = []
    fastest: Row | None = None
    for gpn, nodes in gpu_counts(per_node):
        row = evaluate_count(model, replace(hw, gpus_per_node=gpn, nodes=nodes), workload, pins, memory_fraction)
        rows.append(row)
        if row.fits:
            row = replace(row, meets_deadline=row.total_seconds <= deadline_s)
            rows[-1] = row
            if row.meets_deadline:
                return DeadlineAnswer(deadline_s, True, row, None, tuple(rows))
            if fastest is None or row.total_seconds < fastest.total_seconds:
                fastest = row
        if fastest is not None and row.gpus >= STOP_GROWTH * fastest.gpus:
            break
    return DeadlineAnswer(deadline_s, False, None, fastest, tuple(rows))


def deadline_missed(answer: DeadlineAnswer, gpu: str, workload: Workload) -> ZerokitError:
    """The one line (exit 1, as "does not fit") for a deadline no count meets: the minimum time and the count where
    adding GPUs stopped helping, or why no count fits."""
    length = f"{workload.samples:,} samples x {workload.epochs:g} epoch(s)"
    if answer.fastest is None:
        last = answer.rows[-1]
        return ZerokitError(f"{flag('deadline')}: no number of {gpu} GPUs (up to {last.gpus:,}) fits this run "
                            f"({answer.rows[0].why_not}): see `zerokit plan` without {flag('deadline')} for what "
                            "would fit", exit_code=EXIT_DOES_NOT_FIT)
    f = answer.fastest
    return ZerokitError(f"{flag('deadline')} {fmt_seconds(answer.deadline_seconds)} cannot be met on {gpu}: the fastest "
                        f"finish of {length} is {fmt_seconds(f.total_seconds)} on {f.gpus:,} GPUs ({f.nodes} x "
                        f"{f.gpus_per_node}); no count past it is faster (searched up to {answer.rows[-1].gpus:,}; "
                        f"a global batch of {workload.global_batch:,} runs on at most {workload.global_batch:,}): "
                        f"allow more time, fewer samples, or a faster {flag('gpu')}",
                        exit_code=EXIT_DOES_NOT_FIT)


def compare_gpus(model: ModelSpec, hw: HardwareOptions, gpus: tuple[str, ...], workload: Workload, pins: dict,
                 memory_fraction: float, deadline_s: float | None = None) -> list[Row]:
    """One row per GPU kind: the best plan on hw's node shape with that GPU; with a deadline, the fewest GPUs of that
    kind that meet it (the fastest finish when none does)."""
    from zerokit.spec.hardware import accelerator, resolve_gpu_name

    if hw.gpu_memory is not None:
        raise ZerokitError(f"{flag('compare-gpus')} takes each GPU's memory from the catalog: drop "
                           f"{flag('gpu-memory')}")
    keys = [resolve_gpu_name(name)[0] for name in gpus]  # an unknown name: one line with the closest ones
    if len(set(keys)) < len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise ZerokitError(f"{flag('compare-gpus')} names {dup} twice: give each GPU once")
    rows = []
    for key in keys:
        one = replace(hw, gpu=key)
        # FlashAttention-3 runs on Hopper only (Accelerator.attention_problem): elsewhere the row is priced with
        # FlashAttention-2 and says so, rather than refusing the whole comparison
        fallback = workload.attention == "flash3" and accelerator(key).attention_problem("flash3") is not None
        wl = replace(workload, attention="flash") if fallback else workload
        if deadline_s is None:
            row = evaluate_count(model, one, wl, pins, memory_fraction)
        else:
            answer = for_deadline(model, one, wl, pins, deadline_s, memory_fraction)
            row = answer.row or answer.fastest or answer.rows[0]
        rows.append(replace(row, attention="flash") if fallback else row)
    return rows
