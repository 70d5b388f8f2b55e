"""Human-readable tables for plan and check (the --json output carries the same numbers)."""

from __future__ import annotations

from zerokit.core.options import flag
from zerokit.core.units import fmt_bytes, fmt_seconds
from zerokit.spec.setup import bytes_per_element

TERM_LABELS = {
    "parameters": "parameters",
    "gradients": "gradients",
    "master_weights": "fp32 master weights",
    "optimizer_states": "Adam moments (m, v)",
    "fp32_gradients": "fp32 gradient partition",
    "bf16_optimizer_grad_accum": "gradient accumulation buffer (BF16 optimizer)",
    "stage3_gathered_params": "stage-3 gathered layer (params+grads)",
    "reduce_buckets": "reduce buckets",
    "gradient_partition_buffer": "gradient partition (this micro step's, mid-backward)",
    "reduce_gradient": "gradient being reduced (the largest tensor)",
    "reduce_comm_cast": "its copy in the communication dtype",
    "reduce_scatter_flat": "reduce-scatter's flat buffer",
    "reduce_scatter_gloo_copy": "gloo reduce-scatter's input copy (CPU ranks)",
    "stage3_persistent_params": "stage-3 persistent parameters (kept whole)",
    "stage3_prefetch": "stage-3 prefetch bucket",
    "activations": "activations",
    "pipeline_in_flight": "in-flight micro-batches (pipeline)",
    "activations_checkpoints": "activation checkpoints (layer inputs)",
    "activations_recompute": "recomputed layer (backward)",
    "logits_and_loss": "logits + loss",
    "logits_grad": "logits gradient",
    "activations_traced": "activations + logits (traced)",
    "activations_final_norm": "final norm (checkpointing)",
    "loss_backward_transient": "loss backward (nll gradient)",
    "logits_output": "logits held by the outputs",
    "optimizer_step_temporaries": "optimizer step temporaries",
    "gradient_flat_copy": "flattened gradient copy (step)",
    "fp16_flatten_copies": "fp16 optimizer's fp32 gradient copies (step)",
    "stage3_live_params": "stage-3 gathered parameters",
    "fp32_gradients_offloaded": "fp32 gradients (offloaded)",
    "offload_grad_buffer": "offload gradient buffers",
    "offload_param_partition": "parameter partition (offloaded)",
    "cuda_context": "CUDA context (outside torch's allocator)",
    "cublas_workspace": "cuBLAS workspace",
    "qwz_gather_buffers": "qwZ int8 gather + fp16 dequantize buffers",
    "qgz_reduce_buffers": "qgZ int4 gradient buffers",
    "parameters_frozen_int8": "frozen parameters (int8, qwZ)",
    "optimizer_states_offloaded": "optimizer states (offloaded)",
    "activation_checkpoints_offloaded": "activation checkpoints (offloaded)",
    "parameters_offloaded": "parameters (offloaded)",
    "model_loading": "model loading (peak at start)",
    "pinned_staging_buffers": "pinned staging buffers (x1.5)",
    "optimizer_swap_buffers": "optimizer swap buffers",
    "param_swap_buffers": "parameter swap buffers",
    "hpz_secondary_partition": "hpZ secondary parameter partition",
    "tiled_loss_input_grad": "tiled/fused loss: hidden-state gradient",
    "tiled_loss_head_grad": "tiled/fused loss: LM head gradient",
    "tiled_mlp_backward": "tiled MLP backward (one slice)",
    "tiled_mlp_weight_grads": "tiled MLP weight gradients (accumulating)",
    "sp_all_to_all_buffers": "Ulysses all-to-all buffers (one layer)",
    "hidden_state_grads": "hidden-state gradients (recomputed layer)",
    "recompute_layer_backward": "recomputed layer's backward buffers",
    "reentrant_recompute_output": "recomputed layer's output (reentrant)",
}


def _terms_table(title: str, terms: dict, total: int, budget: int | None) -> list[str]:
    lines = [f"  {title}"]
    for k, v in terms.items():
        if v:
            lines.append(f"    {TERM_LABELS.get(k, k):<40} {fmt_bytes(v):>12}")
    tail = f"    {'total':<40} {fmt_bytes(total):>12}"
    if budget:
        tail += f"   of {fmt_bytes(budget)} ({total / budget:.0%})"
    lines.append(tail)
    return lines


def format_memory(memory, budget, cluster) -> list[str]:
    where = "per rank (host RAM)" if cluster.accelerator.is_cpu else "per GPU"
    lines = _terms_table(f"memory {where}", memory.per_gpu, memory.per_gpu_total, budget.gpu_bytes)
    lines += _nvidia_smi_lines(memory)
    if memory.per_node_cpu:
        lines += _terms_table("host RAM per node", memory.per_node_cpu, memory.per_node_cpu_total, budget.cpu_bytes)
    if memory.nvme:
        lines += _terms_table("NVMe per node", memory.nvme, memory.nvme_total, budget.nvme_bytes)
    for note in memory.notes:
        lines.append(f"  note: {note}")
    return lines


def _nvidia_smi_lines(memory) -> list[str]:
    """The allocated peak (the fit's figure) and, apart, what nvidia-smi will show (estimate/reserved.py)."""
    smi = getattr(memory, "nvidia_smi", None)
    if smi is None:  # the cpu accelerator: nvidia-smi has nothing to show
        return []
    t = smi.terms
    reserve = smi.allocator_reserved() - t["allocated_peak_bytes"]
    return [
        f"    {'allocated peak (what the fit is judged on)':<42} {fmt_bytes(memory.per_gpu_total):>10}",
        f"    nvidia-smi will show about {fmt_bytes(smi.nvidia_smi_bytes)} (range {fmt_bytes(smi.low_bytes)} to "
        f"{fmt_bytes(smi.high_bytes)}), derived from sources, not measured:",
        f"      allocated {fmt_bytes(t['allocated_peak_bytes'])} (without the context allowance) + CUDA context "
        f"{fmt_bytes(t['cuda_context_bytes'])} + NCCL buffers {fmt_bytes(t['nccl_buffers_bytes'])}",
        f"      + allocator reserve {fmt_bytes(reserve)} (block rounding {fmt_bytes(t['allocator_rounding_bytes'])}, "
        f"ZeRO-3 gather/release {fmt_bytes(t['zero3_churn_reserve_bytes'])})",
    ]


def format_time(t, world_size: int) -> list[str]:
    lines = [
        "  time",
        f"    step                                     {fmt_seconds(t.step_seconds):>12}"
        f"  (compute {fmt_seconds(t.compute_seconds)}, comm {fmt_seconds(t.communication_seconds)}, "
        f"offload {fmt_seconds(t.offload_seconds)})"
        + (f"; comm at {t.link_gbps:.3g} GB/s" if t.communication_seconds else ""),
    ]
    if t.pipeline_bubble:  # estimate/pipeline.py: (m + p - 1) slots of the slowest stage, then the reduction
        lines.append(f"      pipeline: {t.pipeline_bubble:.0%} of the slots idle (the bubble), sends between stages "
                     f"{fmt_seconds(t.pipeline_p2p_seconds)}; the parts below are the slowest stage's, one micro-batch")
    if t.matmul_seconds:  # the GPU time model's parts (estimate/gpu_time.py)
        lines.append(f"      compute: matmuls {fmt_seconds(t.matmul_seconds)}, attention {fmt_seconds(t.attention_seconds)}, "
                     f"memory-bound {fmt_seconds(t.memory_bound_seconds)}"
                     + (f"; {fmt_seconds(t.communication_hidden_seconds)} of comm overlapped"
                        if t.communication_hidden_seconds else ""))
    if t.step_seconds_low is not None:
        lines.append(f"    likely step range                        {fmt_seconds(t.step_seconds_low):>12}"
                     f"  to {fmt_seconds(t.step_seconds_high)} ({t.range_basis})")
    lines += [
        f"    tokens/s (all GPUs)                      {t.tokens_per_second:>12,.0f}",
        f"    global batch                             {t.global_batch:>12}",
    ]
    if t.steps is not None:
        lines += [
            f"    steps (epochs x per epoch)               {t.steps:>12,}  ({t.steps_per_epoch:,} per epoch)",
            f"    total                                    {fmt_seconds(t.total_seconds):>12}"
            f"  ({t.gpu_hours(world_size):,.1f} GPU-hours)"
            + (f"; likely {fmt_seconds(t.total_seconds_low)} to {fmt_seconds(t.total_seconds_high)}"
               if t.total_seconds_low is not None else ""),
        ]
    return lines


def finetune_lines(f, m) -> list[str]:
    """What trains (spec.finetune.Finetune) of the model as counted (spec.model.ModelSpec); nothing for a full fine-tune."""
    if f is None or m is None or f.is_full:
        return []
    return [f"finetune  {f.label}: {m.trainable:,} trainable of {m.params:,} parameters ({m.trainable / m.params:.2%}); "
            "gradients, master weights and optimizer states for those only"]


def parallel_lines(s, world_size: int) -> list[str]:
    """How the ranks split and what is tiled, when anything beyond data parallelism is used."""
    if (s.tensor_parallel == s.sequence_parallel == s.hpz_partition_size == s.pipeline_parallel == 1
            and not (s.tiled_loss or s.tiled_mlp)):
        return []
    line = (f"  parallelism: {s.data_parallel(world_size)} data x {s.tensor_parallel} tensor x {s.sequence_parallel} "
            f"sequence-parallel ranks" + (f" x {s.pipeline_parallel} pipeline stages" if s.pipeline_parallel > 1 else "")
            + f"; ZeRO partitions over {s.zero_ranks(world_size)}")
    if s.hpz_partition_size > 1:
        line += f"; hpZ secondary partition over {s.hpz_partition_size}"
    tiled = [n for n, on in (("loss", s.tiled_loss), ("MLP", s.tiled_mlp)) if on]
    if tiled:
        line += f"; tiled {' and '.join(tiled)}"
    if s.sequence_parallel > 1:  # DeepSpeed's engine overrides communication_data_type under SP (engine.py)
        line += f"; gradients reduced in {s.gradient_comm_precision} (seq_parallel_communication_data_type"
        line += (f"; {flag('seq-parallel-comm-dtype')} {s.precision} halves that traffic)"
                 if bytes_per_element(s.gradient_comm_precision) > bytes_per_element(s.precision) else ")")
    return [line]


def link_lines(c) -> list[str]:
    """The links a multi-GPU plan prices its collectives on (GB/s per GPU, one direction)."""
    if c.world_size == 1 or c.accelerator.is_cpu:
        return []
    acc = c.accelerator
    line = f"links     {acc.intra_node_bw:g} GB/s per GPU within a node"
    if c.nodes > 1:
        line += f", {acc.inter_node_bw:g} GB/s per GPU between nodes"
    return [line + f" ({flag('intra-node-bandwidth')} / {flag('inter-node-bandwidth')} set yours)"]


def at_the_edge(label: str) -> str:
    """The verdict line of a plan or check at the edge (planning/search.py verdict)."""
    return (f"AT THE EDGE: {label} (fits the memory model, but not with the memory that grows with the sequence at "
            "the factor where published long-sequence runs ended: docs/long-context.md)")


def format_plan(plan) -> str:
    m, c, w = plan.model, plan.cluster, plan.workload
    exact = "exact" if m.exact else f"estimated from {flag('params')}"
    out = [
        f"model     {m.name}: {m.params:,} parameters ({exact}), {m.num_layers} layers, hidden {m.hidden_size}, "
        f"vocab {m.vocab_size}",
        f"hardware  {c.nodes} node(s) x {c.gpus_per_node} {c.accelerator.name} "
        f"({fmt_bytes(c.accelerator.memory_bytes)} each)"
        + (f", host RAM {fmt_bytes(c.cpu_memory_bytes)}/node" if c.cpu_memory_bytes else "")
        + (f", NVMe {fmt_bytes(c.nvme_bytes)}/node" if c.nvme_bytes else "")
        + (f" [{flag('gpu')} auto: {c.accelerator.detected}]" if c.accelerator.detected else "")
        + (f", backend {c.comm_backend}" + (" (DeepSpeed's default)" if c.dist_backend is None else "")
           if c.world_size > 1 else ""),
        *link_lines(c),
        f"workload  seq {w.seq_len}, attention {w.attention}"
        + (f" within packed {w.attention_span}-token documents" if w.doc_len else "")
        + (", reentrant checkpointing" if w.checkpoint_reentrant else "")
        + (", a loop that keeps only the loss (HF Trainer)" if not w.outputs_held else "")
        + (f", Liger kernels{' ' + m.liger_version if m.liger_version else ''} (RMSNorm, SwiGLU, fused linear "
           "cross-entropy)" if m.liger_kernels else "")
        + (f", global batch {w.global_batch}" if w.global_batch else ""),
        *finetune_lines(plan.finetune, plan.model),
        "",
    ]
    if plan.best is None:
        out.append("NOTHING FITS")
        return "\n".join(out)
    s = plan.best.setup
    if plan.verdict == "at the edge":
        out.append(at_the_edge(s.label))
    else:
        out.append(("FITS: " if plan.fits else "DOES NOT FIT. Least-memory setup: ") + s.label)
    out.append(f"  ZeRO stage {s.zero_stage}, offload optimizer {s.offload_optimizer}, offload params {s.offload_param}, "
               f"{s.precision}, micro batch {s.micro_batch_size} x accumulation {s.gradient_accumulation_steps}, "
               f"activation checkpointing {'on' if s.activation_checkpointing else 'off'}"
               f"{' (layer inputs offloaded to host memory)' if s.checkpoint_offload else ''}")
    out += parallel_lines(s, c.world_size)
    for r in plan.best.reasons:
        out.append(f"  - {r}")
    out += format_memory(plan.best.memory, plan.budget, c)
    out += format_time(plan.best.time, c.world_size)
    out.append(f"    step time priced on {c.time_source}")
    t = plan.best.time
    if t.gpu_parts is not None:  # the GPU time model: then the figures fitted on published runs
        from zerokit.estimate.gpu_time import time_fit

        out.append(f"    then fitted on published runs (docs/time-model.md): {time_fit().describe(t.gpu_parts)}")
    if t.learned_from:
        out.append(f"    then x{t.learned_factor:.3g}: measured / predicted of the run learned here nearest this plan, "
                   f"{t.learned_from}")
    for note in plan.notes:
        out.append(f"  note: {note}")
    if plan.suggestions:
        out.append("  to make it fit:")
        out += [f"    - {x}" for x in plan.suggestions]
    if plan.rejected:
        out.append("  other setups:")
        for r in plan.rejected[:12]:
            out.append(f"    {r['label']:<44} {fmt_bytes(r['per_gpu_bytes']):>11}  {r['reason']}")
        if len(plan.rejected) > 12:
            out.append(f"    ... {len(plan.rejected) - 12} more (see {flag('json')})")
    return "\n".join(out)


def plan_html(plan, deadline=None) -> str:
    """A plan as HTML for a notebook (zerokit.api.Plan._repr_html_): the verdict, the chosen setup beside the others
    (per-GPU memory, step time, why each loses), and the whole text table folded under them. Every value escaped."""
    import html

    text = format_plan(plan)
    if deadline is not None:
        text = f"{format_deadline(deadline, plan.workload)}\n{text}"
    e = html.escape
    if plan.best is None:
        return f"<div><b>NOTHING FITS</b><pre>{e(text)}</pre></div>"
    b = plan.best
    verdict = ("<b style='color:#1a7f37'>FITS</b>" if plan.fits
               else "<b style='color:#cf222e'>DOES NOT FIT</b> (least memory)")
    rows = [(b.setup.label, b.memory.per_gpu_total, b.time.step_seconds, "chosen" if plan.fits else "least memory")]
    rows += [(r["label"], r["per_gpu_bytes"], r["step_seconds"], r["reason"]) for r in plan.rejected[:12]]
    cells = "".join(f"<tr><td>{e(label)}</td><td style='text-align:right'>{e(fmt_bytes(mem))}</td>"
                    f"<td style='text-align:right'>{e(fmt_seconds(step))}</td><td>{e(why)}</td></tr>"
                    for label, mem, step, why in rows)
    return (f"<div>{verdict}: {e(b.setup.label)}, {e(fmt_bytes(b.memory.per_gpu_total))} per GPU of "
            f"{e(fmt_bytes(plan.budget.gpu_bytes))}, step {e(fmt_seconds(b.time.step_seconds))}"
            "<table><tr><th>setup</th><th>per GPU</th><th>step</th><th></th></tr>" + cells + "</table>"
            f"<details><summary>the whole plan</summary><pre>{e(text)}</pre></details></div>")


def format_check(result) -> str:
    out = [f"check {result.config_path} (world size {result.world_size})"]
    for f in result.findings:
        out.append(f"  {f.level}: {f.key}: {f.message}")
    if result.deepspeed_error:
        out.append(f"  error: DeepSpeed rejects it: {result.deepspeed_error}")
    if not result.valid:
        out.append("INVALID")
        return "\n".join(out)
    out.append("  DeepSpeed's config classes accept it")
    par = result.parallelism
    if par is not None and (par.model_parallel > 1 or par.hpz_partition_size > 1):
        d = par.to_dict(result.world_size)
        stages = f" x {d['pipeline_parallel']} pipeline stages" if d["pipeline_parallel"] > 1 else ""
        out.append(f"  parallelism: {d['data_parallel']} data x {d['tensor_parallel']} tensor x "
                   f"{d['sequence_parallel']} sequence-parallel ranks{stages}; hpZ partition {d['hpz_partition_size']}")
    for a in result.assumed:  # what each "auto" was taken to be
        value = f"{a['value']:,}" if isinstance(a["value"], int) and not isinstance(a["value"], bool) else a["value"]
        out.append(f"  assumed: {a['key']} = {value}: {a['why']}")
    ev = result.evaluation
    if ev is None:
        out.append(f"VALID (no {flag('model')} given: memory not checked)")
        return "\n".join(out)
    if result.finetune is not None:
        out += ["  " + line for line in finetune_lines(result.finetune, result.model)]
    search = result.search
    if search is None and result.verdict == "at the edge":
        out.append(at_the_edge(ev.setup.label))
    elif search is None:
        out.append(("FITS: " if ev.fits else "DOES NOT FIT: ") + ev.setup.label)
    elif search.largest == 0:
        out.append("DOES NOT FIT even at micro batch 1: " + ev.setup.label)
    else:
        why = ("the search stops there" if search.too_big is None else
               f"{search.largest + 1} does not: {'; '.join(search.too_big.reasons)}")
        out.append(f"FITS up to micro batch {search.largest} per GPU ({why}): {ev.setup.label}")
    if getattr(result, "seq_len_search", None) is not None:
        out.append(f"  {result.seq_len_search.note}")
    for r in ev.reasons:
        out.append(f"  - {r}")
    cluster = result.cluster
    out += format_memory(ev.memory, ev.budget, cluster) + format_time(ev.time, cluster.world_size)
    return "\n".join(out)


def _length(workload) -> str:
    return f"{workload.samples:,} samples x {workload.epochs:g} epoch(s)" if workload.samples else f"(no {flag('samples')})"


def format_deadline(answer, workload) -> str:
    """The --deadline answer above the plan made for it: the count chosen and every count it searched."""
    r = answer.row
    head = (f"deadline  {fmt_seconds(answer.deadline_seconds)} for {_length(workload)}: {r.gpus:,} x {r.gpu} "
            f"({r.nodes} node(s) x {r.gpus_per_node}) finish in {fmt_seconds(r.total_seconds)}, the fewest GPUs that "
            "do; the plan below is for them")
    if r.total_seconds_high is not None:
        head += (f"\n          likely {fmt_seconds(r.total_seconds_low)} to {fmt_seconds(r.total_seconds_high)}"
                 + (": the slow end misses the deadline, plan a margin (more GPUs, or measure a short run with "
                    "`zerokit launch` and plan again: it learns from it)" if r.total_seconds_high > answer.deadline_seconds
                    else ": within the deadline at both ends"))
    fitting = [x for x in answer.rows if x.fits]
    shown = ", ".join(f"{x.gpus:,}: {fmt_seconds(x.total_seconds)}" for x in fitting[-8:])
    unfit = len(answer.rows) - len(fitting)
    return (f"{head}\n          searched {len(answer.rows)} GPU counts from 1 to {r.gpus:,}"
            + (f" ({unfit} do not fit or do not divide the global batch)" if unfit else "")
            + (f"; total time at the last {min(8, len(fitting))} that fit: {shown}" if fitting else "") + "\n")


def format_scale_rows(rows, workload, deadline_s: float | None) -> str:
    """--compare-gpus: one row per GPU kind (with --deadline, the fewest of each that meet it)."""
    title = f"GPUs compared for {_length(workload)}"
    if deadline_s is not None:
        title += f", each at the fewest GPUs that finish within {fmt_seconds(deadline_s)}"
    lines = [title, f"  {'gpu':<14}{'GPUs':>7}  {'nodes x GPUs':<13}{'setup':<46}{'step':>10}{'total':>12}"
             f"{'GPU-hours':>12}  likely total"]
    for r in rows:
        shape = f"{r.nodes} x {r.gpus_per_node}"
        if not r.fits:
            lines.append(f"  {r.gpu:<14}{r.gpus:>7}  {shape:<13}does not fit: {r.why_not}")
            continue
        total = fmt_seconds(r.total_seconds) if r.total_seconds is not None else "-"
        hours = f"{r.gpu_hours:,.0f}" if r.gpu_hours is not None else "-"
        miss = "  misses the deadline (the fastest)" if r.meets_deadline is False else ""
        likely = (f"  {fmt_seconds(r.total_seconds_low)} to {fmt_seconds(r.total_seconds_high)}"
                  if r.total_seconds_high is not None else "")
        fallback = f"  (FlashAttention-2: no FlashAttention-3 on {r.gpu})" if r.attention == "flash" else ""
        lines.append(f"  {r.gpu:<14}{r.gpus:>7}  {shape:<13}{r.setup:<46}{fmt_seconds(r.step_seconds):>10}"
                     f"{total:>12}{hours:>12}{likely}{miss}{fallback}")
    if workload.samples is None:
        lines.append(f"  total time and GPU-hours need the run's length: give {flag('samples')} N")
    return "\n".join(lines)
