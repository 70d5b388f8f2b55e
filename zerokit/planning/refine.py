"""Refinements of a plan, as plain functions on typed plans: traced activations replacing the analytic ones,
and what a hardware profile changed. The measuring itself is zerokit.measure's; this only reads its results."""

from __future__ import annotations

from zerokit.estimate.memory import fit_problems
from zerokit.planning.planner import Plan

# The memory model's terms that a trace of forward + backward measures directly. Kept analytic:
# logits_output (the logits a training loop's outputs object keeps alive through backward belong to
# the loop: train.py, the HF Trainer) and loss_backward_transient (the nll gradient alive with the
# logits gradient, measured in real runs; the trace's MemTracker snapshot does not hold it).
ANALYTIC_ACTIVATION_TERMS = ("activations", "activations_checkpoints", "activations_recompute", "activations_final_norm",
                             "logits_and_loss", "logits_grad", "attention_backward")


LAYER_ACTIVATION_TERMS = ("activations", "activations_checkpoints", "activations_recompute")



def apply_activation_trace(plan: Plan, traced: dict) -> None:
    """`zerokit plan --trace`: replace the chosen setup's analytic activation terms with a traced measure.

    `traced` is what measure.trace.trace_activation_memory returns for the plan's micro batch, sequence
    length, precision and checkpointing (the real HF modules under FakeTensorMode). In every phase of the
    memory model that holds layer activations, the analytic activation and logits terms are replaced: by the
    traced peak (activations + temporaries) in the phase where the analytic activations are largest, by the
    activations held after forward in the others; then the peak phase and the fit are taken again, against
    the plan's own budget (its --memory-fraction).
    """
    if plan.best is None:
        return
    ev = plan.best
    mem = ev.memory
    analytic = {name: sum(t.get(k, 0) for k in ANALYTIC_ACTIVATION_TERMS) for name, t in mem.phase_terms.items()}
    # phases that hold layer activations (not those holding only the outputs' logits after backward)
    with_acts = [name for name, t in mem.phase_terms.items() if any(k in t for k in LAYER_ACTIVATION_TERMS)]
    top = max(with_acts, key=analytic.get)
    for name, terms in mem.phase_terms.items():
        if name not in with_acts:
            continue
        for k in ANALYTIC_ACTIVATION_TERMS:
            terms.pop(k, None)
        key = "peak_activation_bytes" if name == top else "activation_bytes"
        terms["activations_traced"] = int(traced[key])
    mem.phases = {name: sum(t.values()) for name, t in mem.phase_terms.items()}
    mem.peak_phase = max(mem.phases, key=mem.phases.get)
    mem.per_gpu = dict(mem.phase_terms[mem.peak_phase])
    mem.notes.append(
        f"activations traced under FakeTensorMode ({traced['attn_implementation']}) in {traced['wall_s']:.1f} s: "
        f"{traced['peak_activation_bytes']:,} bytes at peak vs {analytic[top]:,} analytic"
    )
    ev.reasons = fit_problems(mem, plan.cluster, ev.budget)
    ev.fits = not ev.reasons
    plan.fits = ev.fits


def calibration_effect(calibrated: Plan, catalog: Plan | None, profile_path: str) -> str:
    """Whether the measured hardware profile changed the planner's choice against catalog peaks
    (`catalog`: the same plan on the catalog accelerator; None when the catalog figures give no plan)."""
    if catalog is None:
        return "calibrated: the catalog figures alone give no plan to compare with"
    old = catalog.choice.label if catalog.fits else "nothing fits"
    new = calibrated.choice.label if calibrated.fits else "nothing fits"
    if old == new:
        return f"calibrated with {profile_path}: same choice as catalog peaks ({new})"
    return f"calibrated with {profile_path}: choice changed from {old} (catalog peaks) to {new}"
