"""`zerokit plan --plot FILE.svg|png`: the per-GPU memory of the chosen setup beside the others, as stacked bars.

One horizontal bar per setup, stacked by the memory model's named terms (zerokit.estimate.memory, the names and
order of the text plan's TERM_LABELS, one colour per term in every picture), with the per-GPU budget as a line.
Shown: the chosen setup first, then the best of every other ZeRO stage x offload variant the planner evaluated
(its fastest fitting setup, else its least-memory one), each labelled with the planner's reason.

check_plot_path runs before planning and imports nothing; plot_memory imports matplotlib (the `plot` extra).
"""

from __future__ import annotations

import io
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path

from zerokit.core.errors import ZerokitError
from zerokit.core.fsutil import atomic_write_bytes, check_writable_file
from zerokit.core.options import flag
from zerokit.core.units import GiB, fmt_bytes
from zerokit.planning.planner import Plan, evaluate
from zerokit.report.plan_text import TERM_LABELS
from zerokit.spec.setup import ZeroSetup

FORMATS = {".svg": "svg", ".png": "png"}  # what matplotlib writes without extra libraries
INSTALL_HINT = "pip install 'zerokit[plot]'"


@dataclass(frozen=True)
class Bar:
    label: str  # ZeroSetup.label
    note: str  # "chosen" or the planner's reason for not choosing it
    terms_bytes: dict[str, int]  # per-GPU terms at the peak phase, as MemoryEstimate.per_gpu
    chosen: bool

    @property
    def total_bytes(self) -> int:
        return sum(self.terms_bytes.values())


def check_plot_path(path: str) -> Path:
    """Refuse, before any planning, a picture that could not be written: format, folder, matplotlib."""
    import importlib.util

    p = Path(path)
    if p.suffix.lower() not in FORMATS:
        kind = f"a {p.suffix} file" if p.suffix else "a file without an extension"
        raise ZerokitError(f"{flag('plot')} {path}: cannot draw {kind}: end the name in {' or '.join(FORMATS)}")
    if p.is_dir():
        raise ZerokitError(f"{flag('plot')} {path} is a folder: give a file name ending in {' or '.join(FORMATS)}")
    check_writable_file(p, f"{flag('plot')} {path}")  # missing folders are created when it is drawn (mkdir -p)
    if importlib.util.find_spec("matplotlib") is None:
        raise ZerokitError(f"{flag('plot')} needs matplotlib, which is not installed: {INSTALL_HINT}")
    return p


def shown_setups(plan: Plan) -> list[Bar]:
    """The chosen setup, then the best setup of every other (stage, optimizer offload, param offload) variant.

    plan.rejected keeps totals, not terms: its setups are evaluated again here with the planner's own evaluate()
    and the plan's budget fraction (make_plan's callers all use the default ZeroKnobs, so the terms sum to the
    rejected entry's per_gpu_bytes; a bar whose terms would not is drawn as its plain total instead).
    """
    def variant(setup: dict) -> tuple:
        return setup["zero_stage"], setup["offload_optimizer"], setup["offload_param"]

    bars: list[Bar] = []
    chosen_variant = None
    if plan.best is not None:
        chosen_variant = variant(plan.best.setup.to_dict())
        note = "chosen" if plan.fits else "least memory, does not fit: " + "; ".join(plan.best.reasons)
        bars.append(Bar(plan.best.setup.label, note, dict(plan.best.memory.per_gpu), True))
    best: dict[tuple, tuple] = {}  # variant -> (rejected entry, evaluation), in the planner's order
    for r in plan.rejected:
        key = variant(r["setup"])
        if key == chosen_variant:
            continue
        ev = evaluate(plan.model, plan.cluster, plan.workload, ZeroSetup(**r["setup"]),
                      memory_fraction=plan.memory_fraction)
        old = best.get(key)
        if (old is None or (ev.fits and not old[1].fits)
                or (ev.fits == old[1].fits and _better(ev, old[1]))):
            best[key] = (r, ev)
    for r, ev in best.values():
        terms = dict(ev.memory.per_gpu)
        if sum(terms.values()) != r["per_gpu_bytes"]:
            terms = {"total": r["per_gpu_bytes"]}
        bars.append(Bar(r["label"], r["reason"], terms, False))
    return bars


def _better(ev, old) -> bool:
    """Among fitting setups the faster (the planner's ranking); among failing ones the one needing least memory."""
    if ev.fits:
        return ev.time.tokens_per_second > old.time.tokens_per_second
    return ev.memory.per_gpu_total < old.memory.per_gpu_total


def plot_memory(plan: Plan, path: str | os.PathLike):
    """Draw shown_setups(plan) to path (.svg or .png, by its extension), atomically; returns the Figure.

    The figure is drawn off-screen (Figure + the Agg canvas, no pyplot: nothing global, no display needed) and
    saved to memory first, so a failure leaves no file; the file then appears whole via os.replace.
    """
    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ZerokitError(f"{flag('plot')} {path}: end the name in {' or '.join(FORMATS)}")
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle
    except ImportError:
        raise ZerokitError(f"{flag('plot')} needs matplotlib, which is not installed: {INSTALL_HINT}") from None

    bars = shown_setups(plan)
    order = list(TERM_LABELS)
    present = sorted({k for b in bars for k, v in b.terms_bytes.items() if v},
                     key=lambda k: (order.index(k) if k in order else len(order), k))
    colors = list(matplotlib.colormaps["tab20"].colors) + list(matplotlib.colormaps["tab20b"].colors)

    def color(term: str):  # fixed per term name, so the same term looks the same in every picture
        i = order.index(term) if term in order else len(order) + sum(map(ord, term))
        return colors[i % len(colors)]

    cluster = plan.cluster
    where = "rank" if cluster.accelerator.is_cpu else "GPU"
    budget_gib = plan.budget.gpu_bytes / GiB
    fig = Figure(figsize=(12, 1.6 + 0.7 * len(bars)), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ys = range(len(bars))
    left = [0.0] * len(bars)
    for term in present:  # one call per term: ax.containers[i] holds term i of every bar
        widths = [b.terms_bytes.get(term, 0) / GiB for b in bars]
        ax.barh(ys, widths, left=left, height=0.6, color=color(term), label=TERM_LABELS.get(term, term),
                edgecolor="white", linewidth=[0.4 if w else 0 for w in widths])
        left = [a + w for a, w in zip(left, widths)]
    for y, b in zip(ys, bars):
        if b.chosen:  # outlined as a whole (a patch, not a bar: ax.containers stay one per term)
            ax.add_patch(Rectangle((0, y - 0.3), b.total_bytes / GiB, 0.6, fill=False, edgecolor="black", linewidth=1.6))
        ax.text(b.total_bytes / GiB, y, f" {fmt_bytes(b.total_bytes)}", va="center", fontsize=8,
                fontweight="bold" if b.chosen else "normal")
    ax.axvline(budget_gib, color="crimson", linestyle="--", linewidth=1.5,
               label=f"budget {budget_gib:.1f} GiB per {where} ({plan.memory_fraction:.0%} of "
                     f"{plan.budget.gpu_bytes / plan.memory_fraction / GiB:.1f} GiB)")
    ax.set_yticks(list(ys), [b.label + "\n" + textwrap.fill(textwrap.shorten(b.note, 120, placeholder=" ..."), 64)
                             for b in bars], fontsize=8)
    for tick, b in zip(ax.get_yticklabels(), bars):
        tick.set_fontweight("bold" if b.chosen else "normal")
    ax.invert_yaxis()  # the chosen setup on top
    ax.set_xlim(0, max([budget_gib] + [b.total_bytes / GiB for b in bars]) * 1.15)
    ax.set_xlabel(f"GiB per {where} (peak of a training step, predicted)")
    ax.set_title(f"{plan.model.name}: memory per {where}, {cluster.nodes} node(s) x {cluster.gpus_per_node} "
                 f"{cluster.accelerator.name} (world size {cluster.world_size})", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)

    buf = io.BytesIO()
    # svg.fonttype none: text stays <text> (searchable, smaller) instead of glyph paths; no date: same plan, same bytes
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "zerokit"}):
        fig.savefig(buf, format=fmt, bbox_inches="tight", metadata={"Date": None} if fmt == "svg" else None)
    try:
        atomic_write_bytes(path, buf.getvalue())
    except OSError as e:
        raise ZerokitError(f"cannot write {path}: {e.strerror}: choose a writable folder for {flag('plot')}") from None
    return fig


