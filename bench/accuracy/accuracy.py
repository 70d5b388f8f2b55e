"""Pure arithmetic of the accuracy benchmark: per-row relative errors, the summary, the text table.

No torch, no DeepSpeed: tests/test_accuracy.py checks these functions directly.

Relative error = (predicted - measured) / measured: +10% means zerokit predicted 10% more than the run
used. The summary takes absolute values: median and max |relative error| over every (job, rank) row.
"""

from __future__ import annotations

import statistics

# Predicted per-rank terms grouped into what the CPU meter can tell apart. zerokit.launching.train logs the
# category mix at each phase's peak: tensors labelled by MemoryMeter.register_deepspeed_engine
# (parameters, buffers, gradients, optimizer_states; "other" = made before the engine was registered and
# not recognised by name, e.g. ZeRO-3's fp32 gradient partition under offload), the rest by the phase that
# created them: "forward" (activations, logits, ZeRO-3 parameters gathered in forward), "backward"
# (the loss's gradient of the logits; buckets and gradient partitions made lazily), "step" (the fp32
# gradient partition, optimizer temporaries). The grouping is approximate where a term's tensors are
# created in another phase than its name suggests; the total is exact.
TERM_GROUPS = {
    "params": ("parameters", "parameters_offloaded", "offload_param_partition"),
    "grads": ("gradients", "reduce_buckets", "fp32_gradients_offloaded", "offload_grad_buffer"),
    "optim": ("master_weights", "optimizer_states", "optimizer_states_offloaded"),
    "forward": ("activations", "activations_checkpoints", "activations_final_norm", "activations_recompute",
                "logits_and_loss", "logits_output", "stage3_live_params", "stage3_prefetch"),
    "backward": ("logits_grad", "loss_backward_transient"),
    "step": ("fp32_gradients", "optimizer_step_temporaries", "gradient_flat_copy", "fp16_flatten_copies"),
}
MEASURED_GROUPS = {
    "params": ("parameters", "buffers"),
    "grads": ("gradients", "other"),
    "optim": ("optimizer_states",),
    "forward": ("forward",),
    "backward": ("backward",),
    "step": ("step",),
}


def rel_err(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured, or None when either is missing or measured is 0."""
    if predicted is None or measured is None or not measured:
        return None
    return (predicted - measured) / measured


def summarize(values: list[float | None]) -> dict:
    """Median and max absolute relative error (and how many rows had a value)."""
    xs = [abs(v) for v in values if v is not None]
    if not xs:
        return {"n": 0, "median_abs": None, "max_abs": None}
    return {"n": len(xs), "median_abs": statistics.median(xs), "max_abs": max(xs)}


def group_terms(terms: dict[str, int], groups: dict[str, tuple[str, ...]]) -> dict[str, int]:
    return {g: sum(int(terms.get(k, 0)) for k in keys) for g, keys in groups.items()}


def summary_of_rows(rows: list[dict]) -> dict:
    """rows: dicts with mem_err and time_err (None allowed)."""
    return {"peak_memory": summarize([r.get("mem_err") for r in rows]),
            "step_time": summarize([r.get("time_err") for r in rows])}


def _mib(b) -> str:
    return "-" if b is None else f"{b / 2**20:8.2f}"


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:+6.1f}%"


def _ms(s) -> str:
    return "-" if s is None else f"{s * 1000:7.0f}"


def format_table(rows: list[dict], summary: dict) -> str:
    head = (f"{'job':<44} {'rk':>2} {'pred MiB':>8} {'meas MiB':>8} {'err':>7} {'phase':>8}  "
            f"{'pred ms':>7} {'meas ms':>7} {'err':>7}")
    out = [head, "-" * len(head)]
    for r in rows:
        out.append(f"{r['job']:<44} {r['rank']:>2} {_mib(r.get('pred_mem'))} {_mib(r.get('meas_mem'))} "
                   f"{_pct(r.get('mem_err')):>7} {r.get('peak_phase') or '-':>8}  "
                   f"{_ms(r.get('pred_time'))} {_ms(r.get('meas_time'))} {_pct(r.get('time_err')):>7}")
    out.append("")
    m, t = summary["peak_memory"], summary["step_time"]

    def line(name, s):
        if not s["n"]:
            return f"{name}: no rows"
        return f"{name}: median |err| {s['median_abs'] * 100:.1f}%, max |err| {s['max_abs'] * 100:.1f}% over {s['n']} rank rows"

    out.append(line("peak memory", m))
    out.append(line("step time  ", t))
    return "\n".join(out)


def format_terms(rows: list[dict]) -> str:
    """Term by term (CPU meter categories at the peak phase vs the prediction grouped the same way)."""
    groups = list(TERM_GROUPS)
    head = f"{'job':<44} {'rk':>2} " + " ".join(f"{g + ' p/m':>15}" for g in groups)
    out = [head, "-" * len(head)]
    for r in rows:
        pg, mg = r.get("pred_groups") or {}, r.get("meas_groups") or {}
        if not mg:
            continue
        cells = " ".join(f"{pg.get(g, 0) / 2**20:7.2f}/{mg.get(g, 0) / 2**20:7.2f}" for g in groups)
        out.append(f"{r['job']:<44} {r['rank']:>2} {cells}")
    return "\n".join(out)
