"""Pipeline parallelism as DeepSpeed's pipeline engine runs it (deepspeed/runtime/pipe): memory per stage, the step.

The model is a PipelineModule of PIPELINE_LAYERS: the input embedding, one layer per decoder layer, and the final norm
with the LM head (and the loss); launching/pipeline.py builds exactly that list. DeepSpeed cuts it into stages by
parameter count (module.py _partition_layers, method "parameters": runtime/utils.py partition_balanced, copied below),
so the stage holding the embedding or the head holds fewer decoder layers.

Memory, per stage (the plan is judged on the largest): the stage's own weights and model states (ZeRO-1 partitions the
optimizer over the stage's data-parallel group, pipe/topology.py), its layers' activations for every micro-batch in
flight, and the outputs it keeps to send. TrainSchedule (schedule.py, 1F1B) keeps min(stages - stage, micro-batches)
forward passes in flight on a stage (num_pipe_buffers), so stage 0 holds the most (Narayanan et al. 2021, section
2.2.1; Korthikanti et al. 2022, section 4.2.3). Only the last stage holds logits.

Time: (m + p - 1) pipeline slots of the slowest stage's forward and backward of one micro-batch (m micro-batches,
p stages: the bubble is (p - 1) / (m + p - 1) of it; Narayanan et al. 2021, section 2.2.1), each slot's blocking send
of the hidden states (p2p.py: dist.send/recv, forward activations and backward gradients), then the data-parallel
gradient reduction, which the engine runs after the last micro-batch and does not overlap with backward
(engine.py: enable_backward_allreduce=False; ReduceGrads at the schedule's last step), then the optimizer step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from zerokit.core.errors import ZerokitError
from zerokit.core.options import flag
from zerokit.estimate.memory import MemoryEstimate, activation_terms, dtype_bytes, estimate_memory
from zerokit.estimate.timing import (TimeEstimate, estimate_time, intra_node_bandwidth, link_bandwidth,
                                     model_parallel_bytes, step_range)
from zerokit.spec.hardware import Cluster
from zerokit.spec.model import ModelSpec
from zerokit.spec.setup import Workload, ZeroKnobs, ZeroSetup, steps_per_epoch

# the architectures launching/pipeline.py turns into a PipelineModule (their *ForCausalLM), and a bare --params count
# (Llama-shaped)
PIPELINE_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "params")
# phases in which a stage still holds its in-flight micro-batches (the last backward ends them; the step comes after)
_IN_FLIGHT_PHASES_EXCLUDED = ("backward_end", "step")


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """deepspeed.runtime.utils.partition_uniform: part boundaries, the remainder spread over the first parts."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk, residual = divmod(num_items, num_parts)
    parts = [p * chunk for p in range(num_parts + 1)]
    for i in range(residual):
        for j in range(i + 1, num_parts + 1):
            parts[j] += 1
    return parts


def partition_balanced(weights: list[int], num_parts: int) -> list[int]:
    """deepspeed.runtime.utils.partition_balanced, line for line in pure Python: the linear partition that minimises
    the spread (largest - smallest part), ties to the later cut (`>=`). Part boundaries, num_parts + 1 of them."""
    n, m = len(weights), num_parts
    if n <= m:
        return partition_uniform(n, m)
    inf = float("inf")
    dp_max = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_min = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_cost = [[inf] * (m + 1) for _ in range(n + 1)]
    position = [[0] * (m + 1) for _ in range(n + 1)]
    prefix = [0] * (n + 1)
    for i, w in enumerate(weights):
        prefix[i + 1] = prefix[i] + w
    dp_max[0][0] = 0
    dp_cost[0][0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                part = prefix[i] - prefix[k]
                max_sum = max(dp_max[k][j - 1], part)
                min_sum = min(dp_min[k][j - 1], part)
                cost = max_sum - min_sum
                if dp_cost[i][j] >= cost:
                    dp_cost[i][j], dp_max[i][j], dp_min[i][j], position[i][j] = cost, max_sum, min_sum, k
    parts = [n]
    for i in reversed(range(1, m + 1)):
        parts.append(position[parts[-1]][i])
    return parts[::-1]


def layer_weights(model: ModelSpec) -> list[int]:
    """Parameters of each PipelineModule layer as launching/pipeline.py pipeline_layers builds them and
    _count_layer_params counts them: the embedding; each decoder layer; the final norm with the LM head, or, tied, the
    final norm and then the head as a TiedLayerSpec of the embedding (its own copy, counted again)."""
    h, vh = model.hidden_size, model.vocab_size * model.hidden_size
    layers = model.params - vh * (1 if model.tied_embeddings else 2) - h
    per_layer = layers // model.num_layers
    decoder = [per_layer] * model.num_layers
    decoder[-1] += layers - per_layer * model.num_layers
    return [vh] + decoder + ([h, vh] if model.tied_embeddings else [h + vh])


@dataclass(frozen=True)
class Stage:
    layers: int  # decoder layers
    params: int  # what the stage holds (a tied embedding on both ends)
    has_embedding: bool
    has_head: bool
    in_flight: int  # micro-batches whose activations it holds at once (TrainSchedule.num_pipe_buffers without the floor)


# PipelineModule partition methods (module.py _partition_layers): "parameters" (zerokit's adapter), and the
# "type:<regex>" ones Megatron-DeepSpeed's GPTModelPipe uses, which count the layers whose class name matches:
# "type:transformer" (its default: decoder layers only) and "type:transformer|embedding" (BLOOM: the tied embedding on
# both ends counts as a layer). Each maps layer_weights' list (embedding, decoders, head) to the weights cut.
PARTITION_METHODS = ("parameters", "type:transformer", "type:transformer|embedding")


def stages(model: ModelSpec, setup: ZeroSetup, method: str = "parameters") -> list[Stage]:
    """The stages DeepSpeed cuts the PipelineModule into (partition_balanced over the method's weights)."""
    problem = pipeline_problem(model, setup.pipeline_parallel)
    if problem:
        raise ZerokitError(problem)
    weights = layer_weights(model)
    p, m = setup.pipeline_parallel, setup.gradient_accumulation_steps
    if method == "parameters":
        cut = weights
    elif method in PARTITION_METHODS:  # binary weights: 1 for a matching layer (module.py: binary_weights)
        embedding = int(method.endswith("embedding"))
        head = embedding if model.tied_embeddings else 0  # the tied head is the embedding layer again
        cut = [embedding] + [1] * model.num_layers + ([0, head] if model.tied_embeddings else [0])
    else:
        raise ZerokitError(f"unknown pipeline partition method {method!r}: use one of {', '.join(PARTITION_METHODS)}")
    bounds = partition_balanced(cut, p)
    out = []
    for s in range(p):
        lo, hi = bounds[s], bounds[s + 1]
        decoder = sum(1 for i in range(lo, hi) if 0 < i <= model.num_layers)
        out.append(Stage(decoder, sum(weights[lo:hi]), lo == 0, hi == len(weights), min(p - s, m)))
    return out


def pipeline_problem(model: ModelSpec, stage_count: int) -> str | None:
    """Why this model cannot run in `stage_count` pipeline stages (one line naming the fix), or None."""
    if stage_count <= 1:
        return None
    if model.model_type not in PIPELINE_MODEL_TYPES or model.num_experts > 1:
        return (f"{flag('pipeline-parallel')}: zerokit's PipelineModule adapter covers "
                f"{', '.join(t for t in PIPELINE_MODEL_TYPES if t != 'params')} decoders, not {model.model_type}"
                f"{' with experts' if model.num_experts > 1 else ''}: drop {flag('pipeline-parallel')}")
    if model.trained.trainable_params is not None:
        return (f"{flag('pipeline-parallel')} is planned for full fine-tunes (the adapter wraps the model's own "
                f"modules; LoRA, QLoRA and {flag('freeze')} are untried with stages): drop {flag('pipeline-parallel')} or "
                f"{flag('finetune')}/{flag('freeze')}")
    if stage_count > model.num_layers + 2:
        return (f"{flag('pipeline-parallel')} {stage_count} is more stages than the model has layers "
                f"({model.num_layers} decoder layers, the embedding and the head): use at most {model.num_layers}")
    return None


def stage_view(model: ModelSpec, stage: Stage, for_time: bool = False) -> ModelSpec:
    """The model as one stage holds and runs it. Only the last stage has logits (vocab there; its head runs as the
    matmul a tied head runs as). For time, the first stage keeps the vocabulary so that its embedding is priced as
    the lookup it is (timing.matmul_params subtracts an untied input embedding); for memory it holds no logits."""
    vocab = model.vocab_size if stage.has_head or (for_time and stage.has_embedding) else 0
    return replace(model, params=stage.params, num_layers=max(1, stage.layers), vocab_size=vocab,
                   tied_embeddings=stage.has_head, largest_layer_params=min(model.largest_layer_params, stage.params),
                   embedding_params=model.vocab_size * model.hidden_size * (stage.has_embedding + stage.has_head))


def stage_memory(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, workload: Workload, stage: Stage,
                 knobs: ZeroKnobs | None = None) -> MemoryEstimate:
    """One stage's memory: estimate_memory of its view for one micro-batch, plus what the other in-flight micro-batches
    keep (their saved activations, or checkpointed layer inputs) and the outputs a stage keeps for its sends, in
    every phase before the last backward ends."""
    view = stage_view(model, stage)
    est = estimate_memory(view, cluster, setup, workload, knobs)
    acts = activation_terms(view, setup, workload, cluster.accelerator.is_cpu)
    held = acts.get("activations_checkpoints", acts.get("activations", 0))
    tokens = setup.micro_batch_size * workload.seq_len
    outputs = 0 if stage.has_head else stage.in_flight * tokens * model.hidden_size * dtype_bytes(setup.precision)
    extra = (stage.in_flight - 1) * held + outputs
    if extra:
        for name, terms in est.phase_terms.items():
            if name not in _IN_FLIGHT_PHASES_EXCLUDED:
                terms["pipeline_in_flight"] = extra
        est.phases = {name: sum(t.values()) for name, t in est.phase_terms.items()}
        est.peak_phase = max(est.phases, key=lambda k: (est.phases[k], k == "backward"))
        est.per_gpu = dict(est.phase_terms[est.peak_phase])
    return est


def pipeline_memory(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, workload: Workload,
                    knobs: ZeroKnobs | None = None) -> MemoryEstimate:
    """The largest stage's memory, with a note naming the stages."""
    parts = stages(model, setup)
    ests = [stage_memory(model, cluster, setup, workload, st, knobs) for st in parts]
    worst = max(range(len(parts)), key=lambda i: ests[i].per_gpu_total)
    est = ests[worst]
    est.stage_totals = [e.per_gpu_total for e in ests]
    est.notes.append(f"pipeline: {len(parts)} stages of {', '.join(str(st.layers) for st in parts)} decoder layers "
                     f"(the embedding on stage 0, the head on stage {len(parts) - 1}); the memory is stage {worst}'s, "
                     f"which holds {parts[worst].in_flight} micro-batch(es) in flight")
    return est


def p2p_bandwidth(cluster: Cluster, setup: ZeroSetup) -> float:
    """Bytes/s of a send between adjacent stages: ranks are stage x data-parallel + replica (PipeDataParallelTopology),
    so neighbouring stages sit data-parallel ranks apart, on one node while a node holds both."""
    dp = setup.data_parallel(cluster.world_size)
    if cluster.nodes == 1 or 2 * dp <= cluster.gpus_per_node:
        return intra_node_bandwidth(cluster)
    return link_bandwidth(cluster, ring=False)


def pipeline_time(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, workload: Workload,
                  knobs: ZeroKnobs | None = None, method: str = "parameters") -> TimeEstimate:
    """(m + p - 1) slots of the slowest stage's forward and backward of one micro-batch and its sends, then the
    slowest stage's gradient reduction and optimizer step (not overlapped). method: stages' partition method."""
    parts = stages(model, setup, method)
    p, m = setup.pipeline_parallel, setup.gradient_accumulation_steps
    one = replace(setup, gradient_accumulation_steps=1)
    views = [stage_view(model, st, for_time=True) for st in parts]
    times = [estimate_time(view, cluster, one, workload, knobs) for view in views]
    # tensor parallelism's all-reduces block every micro-batch's forward and backward inside its slot (Megatron's
    # RowParallelLinear / AutoTP's LinearAllreduce); estimate_time of one micro-batch counts them once, in its comm
    tp_comm = [model_parallel_bytes(view, one, workload.seq_len) / intra_node_bandwidth(cluster) for view in views]
    slot = max(t.compute_seconds + mp for t, mp in zip(times, tp_comm))
    after = max(max(0.0, t.communication_seconds - mp) + t.communication_hidden_seconds + t.offload_seconds
                + t.optimizer_seconds + t.engine_seconds for t, mp in zip(times, tp_comm))
    tokens_micro = setup.micro_batch_size * workload.seq_len
    p2p = 2 * (m + p - 1) * tokens_micro * model.hidden_size * dtype_bytes(setup.precision) / p2p_bandwidth(cluster, setup)
    compute = (m + p - 1) * slot
    step = compute + p2p + after
    worst = max(times, key=lambda t: t.compute_seconds)
    global_batch = setup.micro_batch_size * m * setup.data_parallel(cluster.world_size)
    spe = steps_per_epoch(workload.samples, global_batch) if workload.samples else None
    steps = math.ceil(workload.epochs * spe) if spe else None
    low = high = basis = None
    if worst.range_basis is not None:
        low, high, basis = step_range(step, "calibrated" if worst.calibrated else "catalog_gpu")
    return replace(worst, step_seconds=step, compute_seconds=compute, communication_seconds=after + p2p,
                   communication_hidden_seconds=0.0, offload_seconds=0.0, optimizer_seconds=0.0, engine_seconds=0.0,
                   flops_per_step=sum(t.flops_per_step for t in times) * m,
                   tokens_per_step=global_batch * workload.seq_len, global_batch=global_batch, steps_per_epoch=spe,
                   steps=steps, total_seconds=steps * step if steps is not None else None,
                   step_seconds_low=low, step_seconds_high=high, range_basis=basis,
                   pipeline_bubble=(p - 1) / (m + p - 1), pipeline_p2p_seconds=p2p)


def setup_memory(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, workload: Workload,
                 knobs: ZeroKnobs | None = None) -> MemoryEstimate:
    """estimate_memory, or pipeline_memory for a setup with pipeline stages: what the planner and check judge."""
    if setup.pipeline_parallel > 1:
        return pipeline_memory(model, cluster, setup, workload, knobs)
    return estimate_memory(model, cluster, setup, workload, knobs)


def setup_time(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, workload: Workload, knobs=None) -> TimeEstimate:
    """estimate_time, or pipeline_time for a setup with pipeline stages."""
    if setup.pipeline_parallel > 1:
        return pipeline_time(model, cluster, setup, workload, knobs)
    return estimate_time(model, cluster, setup, workload, knobs)
