"""The time model: step time from FLOPs, ZeRO communication and offload traffic; total training time.

step = compute + communication + offload. On a GPU without a calibration, compute is priced kernel by kind
(estimate/gpu_time.py: matmuls at the GPU's Maximum Achievable Matmul FLOPS, attention at its FlashAttention rate,
element-wise work at HBM bandwidth, the optimizer step) and ZeRO's communication overlaps it as DeepSpeed schedules
it; elsewhere nothing overlaps (the costs a calibration fits absorb what overlap recovers).

- compute: training FLOPs 6·Ψ·tokens (8·Ψ·tokens with full recompute) plus attention
  12·L·s·(a·d) per token (forward + backward, Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models"), over peak x efficiency of every rank where the catalog has no
  kernel figures for the accelerator.
- communication, bytes each rank sends per optimizer step with ring collectives ((N-1)/N):
  stage 0/1: one gradient all-reduce (2x model) per step; stage 2: a reduce-scatter every micro
  step plus one parameter all-gather; stage 3: two parameter all-gathers (forward, backward; a third
  with recompute) and a reduce-scatter every micro step: the ZeRO paper's 1.5x of data parallelism.
  Gradients travel in the config's communication_data_type, parameters in the training precision; the
  bandwidth is that of the backend the ranks use (--dist-backend, link_bandwidth).
- offload: 16-bit gradients down and parameters up over PCIe, the CPU Adam step on Ψ/nodes
  parameters per node, NVMe reads and writes of the swapped state.

With a hardware profile from `zerokit calibrate` that has compute timings (cluster.profile.timing), the
compute term is priced the way small models actually behave (docs/memory-model.md, "Time"):
  per micro step = fixed cost + layers x per-layer cost + recomputed layers x their cost + FLOPs x cost
  per FLOP + attention score, activation and logit elements x their costs, the seven costs fitted on the
  forward + backward of real HF models timed on every rank at once (measure/compute_fit.py, compute_features);
  communication adds the measured per-call latency for every collective call (bucketed reduces,
  per-layer ZeRO-3 gathers); the optimizer step is priced at the measured torch AdamW rate (on the
  rank's partition) when nothing is offloaded; the DeepSpeed engine's own cost (hooks, optimizer
  wrapper) is added as measured on real engines per ZeRO stage (measure/engine_fit.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from zerokit.core.errors import ZerokitError
from zerokit.core.resources import bundled_data

from zerokit.estimate.gpu_time import GpuStepParts, backward_layers, gpu_compute, gpu_step, time_fit
from zerokit.estimate.memory import checkpoint_offload_bytes
from zerokit.spec.hardware import Cluster
from zerokit.spec.model import ModelSpec, trainable_gradient_sizes
from zerokit.spec.optimizer import ADAMW, DEFAULT_OPTIMIZER, Optimizer, optimizer_named
from zerokit.spec.profile import ADAPTER_FEATURES, COMPUTE_FEATURES, nearest_learned_run
from zerokit.spec.setup import QWZ_BYTES_PER_ELEMENT, Workload, ZeroKnobs, ZeroSetup, bytes_per_element, steps_per_epoch

# DeepSpeedCPUAdam throughput per node when no calibration is given. ZeRO-Offload paper
# (Ren et al. 2021, Table 3): CPU-Adam updates 1B params in ~0.22-0.44 s on a dual-socket server.
DEFAULT_CPU_ADAM_PARAMS_PER_S = 2.5e9
# Sequential NVMe bandwidth per node (a single PCIe Gen4 drive), GB/s.
DEFAULT_NVME_BW = 3.0
# gloo on GPUs, bus bandwidth GB/s. The catalog's GPU links are NCCL's (NVLink, InfiniBand with GPUDirect); torch's
# ProcessGroupGloo copies CUDA tensors to pinned host memory, reduces them with its CPU ring over TCP and copies them
# back (AsyncAllreduceCUDAHostWork, described in https://github.com/pytorch/pytorch/pull/170239), so it moves at a
# host TCP ring's pace whatever the GPU link: published 0.57-1.11 GB/s for gloo's all-reduce of 16 MB-1 GB between
# AWS GPU instances, where NCCL reached 1.15-1.67 GB/s on the same links
# (https://discuss.pytorch.org/t/why-gloos-performance-is-much-worse-than-nccl/194008), 1.07 GB/s for gloo's ring
# all-reduce of 20 MB between two Xeons over 40 GbE (https://github.com/pytorch/gloo/issues/248). The higher
# published figure, at most the catalog's; a profile that measured gloo (`zerokit calibrate`) replaces it.
# mpi on GPUs keeps the catalog's figures: torch's ProcessGroupMPI takes CUDA tensors only from a CUDA-aware MPI,
# which uses the same NVLink / InfiniBand paths (on 2 nodes x 1 T4, MPI's fp32 all-reduce matched or beat NCCL's:
# https://github.com/mlbench/mlbench-benchmarks/issues/44). On `cpu` the catalog's figures are gloo's (this
# project's machines); mpi and ccl are priced at them too, no published comparison being at hand: calibrate.
GLOO_ON_GPU_BUSBW_GBPS = 1.1


@dataclass
class TimeEstimate:
    step_seconds: float
    compute_seconds: float
    communication_seconds: float
    offload_seconds: float
    flops_per_step: float
    tokens_per_step: int
    global_batch: int
    steps_per_epoch: int | None
    steps: int | None
    total_seconds: float | None
    efficiency: float | None = None  # the accelerator's efficiency factor used (None: calibrated terms)
    optimizer_seconds: float = 0.0  # the optimizer step when nothing is offloaded (calibrated only)
    engine_seconds: float = 0.0  # the DeepSpeed engine's own cost, measured by `zerokit calibrate` (calibrated only)
    calibrated: bool = False
    link_gbps: float = 0.0  # the bus bandwidth communication was priced at (link_bandwidth: the backend's)
    # measured / predicted of the run learned on this hardware that scaled every term (1.0: none), and which run
    learned_factor: float = 1.0
    learned_from: str | None = None
    # the GPU time model's parts of compute_seconds (estimate/gpu_time.py; 0 where it did not price the step), and the
    # communication that overlaps compute as DeepSpeed schedules it (not in communication_seconds)
    matmul_seconds: float = 0.0
    attention_seconds: float = 0.0
    memory_bound_seconds: float = 0.0
    communication_hidden_seconds: float = 0.0
    # the host's dispatch, launches and DeepSpeed hooks of a GPU step (gpu_host_seconds), in compute_seconds
    host_seconds: float = 0.0
    # where the measured step time is likely to fall: the central 80% of what this kind of prediction missed by on
    # the runs it was checked against (step_range); None where nothing was checked (the catalog's rough CPU figures)
    step_seconds_low: float | None = None
    step_seconds_high: float | None = None
    range_basis: str | None = None
    # the GPU time model's parts before the fitted figures (gpu_time.GpuStepParts): what bench/fit_time.py refits
    gpu_parts: GpuStepParts | None = field(default=None, repr=False)
    # pipeline stages (estimate/pipeline.py): the idle share of the slots, (p - 1) / (m + p - 1), and the blocking
    # sends between stages, in communication_seconds; 0 without stages
    pipeline_bubble: float = 0.0
    pipeline_p2p_seconds: float = 0.0

    @property
    def total_seconds_low(self) -> float | None:
        return None if self.total_seconds is None or self.step_seconds_low is None else \
            self.steps * self.step_seconds_low

    @property
    def total_seconds_high(self) -> float | None:
        return None if self.total_seconds is None or self.step_seconds_high is None else \
            self.steps * self.step_seconds_high

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.step_seconds if self.step_seconds else 0.0

    def gpu_hours(self, world_size: int) -> float | None:
        return None if self.total_seconds is None else self.total_seconds * world_size / 3600

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("gpu_parts")
        d["tokens_per_second"] = self.tokens_per_second
        d["total_seconds_low"], d["total_seconds_high"] = self.total_seconds_low, self.total_seconds_high
        return d


@lru_cache(maxsize=1)
def _gpu_host() -> dict:
    return json.loads(bundled_data("gpu_host.json").read_text())


def gpu_host_seconds(model: ModelSpec, setup: ZeroSetup, calls: int) -> float:
    """The host's share of a GPU step without a profile (zerokit/data/gpu_host.json, measured on one H200 node):
    PyTorch's dispatch and launches per micro step, per layer and per recomputed layer, DeepSpeed's engine per ZeRO
    stage (engine_seconds) and, at ZeRO-3, the hooks on the modules peft adds (peft_module_seconds). Added to the
    device's work, as the calibration fitted them (measure/compute_fit.py: fixed costs beside the FLOP and element
    terms, all summed; launches run ahead of the device, but the engine's synchronisations, the loss scaler's and the
    gradient norm's, wait for it). calls: collective_calls_per_step."""
    host = _gpu_host()
    c = host["compute"]["bf16"]
    layers, accum = model.num_layers, setup.gradient_accumulation_steps
    per_micro = c["micro"] + layers * c["layer"] + (layers * c["recompute"] if setup.activation_checkpointing else 0.0)
    engine = host["engine_overhead"]
    # DeepCompile keeps the engine's per-parameter work: its graph calls one allgather_param and one release_param op
    # per parameter (deepspeed/compile/passes/zero3_compile.py add_gather_and_release), as many as the hooks it
    # replaces, so the stage's engine cost stands
    seconds = accum * per_micro + engine_seconds(engine, setup.precision, setup.zero_stage, layers, accum,
                                                 setup.activation_checkpointing,
                                                 offload=setup.offload_optimizer != "none", calls=calls)
    return seconds + peft_module_seconds(engine, c, model, setup)


@lru_cache(maxsize=1)
def _time_ranges() -> dict:
    return json.loads(bundled_data("time_range.json").read_text())


def step_range(step_seconds: float, basis: str) -> tuple[float, float, str]:
    """(low, high, what it rests on) for a predicted step: predicted / the 90th and 10th percentile of predicted /
    measured over the runs that checked this kind of prediction (zerokit/data/time_range.json, written by
    bench/published_runs.py --write-range): "catalog_gpu" for the GPU time model on the catalog's figures (published
    DeepSpeed runs), "calibrated" for a measured profile (zerokit's CPU accuracy tables)."""
    entry = _time_ranges()[basis]
    return step_seconds / entry["ratio_high"], step_seconds / entry["ratio_low"], entry["basis"]


def matmul_params(model: ModelSpec) -> int:
    """Parameters that take part in matmuls per token: the input embedding is a lookup (no FLOPs);
    a tied embedding still runs once, as the LM head."""
    input_embedding = model.vocab_size * model.hidden_size
    p = model.active_params - (0 if model.tied_embeddings else input_embedding)
    return max(p, 0)


def flops_per_token(model: ModelSpec, seq_len: int, activation_checkpointing: bool) -> float:
    """Training FLOPs per token: forward 2 per matmul weight, backward 2 for the input gradient and 2 for the weight
    gradient, recompute another forward; attention's two matmuls 4 s a d per layer forward, 8 backward.

    A fine-tune (with_finetune's counts, read from the module tree) runs fewer: a frozen weight needs no weight-gradient
    GEMM (autograd computes mm's mat2 gradient only when the weight requires it: should_compute_output), so a frozen
    Linear's backward is one GEMM, about its forward; layers before the first trainable parameter run no backward at
    all (no gradient reaches them), unless checkpointing, whose enable_input_require_grads sends the gradient down to
    the embeddings (memory.activation_terms). LoRA adapters are in the counts already: 2 r (in + out) per token per
    adapted Linear forward, 3x that with backward."""
    p = matmul_params(model)
    s_ad = seq_len * model.num_attention_heads * model.head_dim
    if model.trained.trainable_matmul_params is None:
        passes = 8 if activation_checkpointing else 6  # recompute adds a second forward (2 of 6)
        attention = 12 * model.num_layers * s_ad
        if activation_checkpointing:
            attention = attention * 4 // 3
        return passes * p + attention
    active = model.active_params / max(1, model.params)  # MoE: the active share (the counts are of every expert)
    trainable = model.trained.trainable_matmul_params * active
    backward_input = p if activation_checkpointing else min(p, model.trained.backward_matmul_params * active)
    grad_layers = backward_layers(model, activation_checkpointing)
    flops = 2 * p + 2 * backward_input + 2 * trainable + 4 * model.num_layers * s_ad + 8 * grad_layers * s_ad
    if activation_checkpointing:
        flops += 2 * p + 4 * model.num_layers * s_ad
    return flops


def tiled_mlp_flops_per_token(model: ModelSpec, tiled_mlp: bool) -> float:
    """What TiledMLP adds per token: every MLP's forward once more, in its backward (compute_features)."""
    if not tiled_mlp:
        return 0.0
    mats = 3 if model.gated_mlp else 2
    return 2 * mats * model.hidden_size * model.intermediate_size * model.experts_per_token * model.num_layers


def dequantized_elements(model: ModelSpec, activation_checkpointing: bool) -> float:
    """QLoRA: 4-bit weight elements bitsandbytes dequantizes to the compute dtype per micro step: every quantized weight
    in forward (its gemm_4bit: dequantize_4bit then linear), again in backward for the input gradient
    (MatMul4Bit.backward: `F.dequantize_4bit(B, ctx.state)`), and in recompute. Memory-bound element-wise work,
    independent of the tokens: compute_features' "dequant", fitted on QLoRA models (measure/compute_fit.fit_adapters)."""
    if not model.trained.quantized_params:
        return 0.0
    return model.trained.quantized_params * (3 if activation_checkpointing else 2)


@dataclass(frozen=True)
class CollectiveBytes:
    """Bytes each rank sends per optimizer step (ring algorithms), by what travels."""

    gradients: float  # the gradient all-reduce / reduce-scatter, in communication_data_type
    parameters: float  # the parameter all-gathers, in the training precision
    # what stays inside a node (intra_node_bandwidth): AutoTP's activation all-reduces, Ulysses' all-to-alls, and the
    # ZeRO-3 gathers hpZ serves from its secondary partition
    intra_node: float = 0.0

    @property
    def total(self) -> float:
        return self.gradients + self.parameters + self.intra_node


def collective_bytes(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, knobs: ZeroKnobs | None = None) -> CollectiveBytes:
    """Gradients are cast to communication_data_type before they are reduced (DeepSpeedEngine.allreduce_bucket at
    stage 0, stage_1_and_2.py average_tensor / allreduce_bucket at 1-2, stage3.py __avg_scatter_contiguous_grads
    at 3); parameters are gathered in their own dtype, the training precision. Only trainable parameters have
    gradients, and ZeRO-1/2 gather only the partitions the optimizer updated (its flat groups hold trainable
    parameters); ZeRO-3 gathers every weight, frozen or not."""
    model = model.tensor_parallel_shard(setup.tensor_parallel)
    n = setup.zero_ranks(cluster.world_size)  # ZeRO's group: data x sequence-parallel ranks
    if n == 1:
        return CollectiveBytes(0.0, 0.0)
    ring = (n - 1) / n
    grads = bytes_per_element(setup.gradient_comm_precision) * model.trainable * ring
    params = bytes_per_element(setup.precision) * model.trainable * ring
    accum = setup.gradient_accumulation_steps
    if setup.zero_stage == 0:
        return CollectiveBytes(2 * grads, 0.0)  # all-reduce = reduce-scatter + all-gather, of the gradients
    if setup.zero_stage == 1:
        return CollectiveBytes(grads, params)  # gradients reduced once per step, the updated partitions gathered
    if setup.zero_stage == 2:
        return CollectiveBytes(accum * grads, params)
    gathers = 3 if setup.activation_checkpointing else 2
    # ZeRO-3 gathers every weight, frozen or not, a 4-bit one at its stored size (ModelSpec.weight_bytes: DeepSpeed gathers
    # param.ds_tensor in param.dtype, uint8 for a packed Params4bit). Persistent parameters (stage3_param_persistence_
    # threshold) are gathered once per step rather than per pass; not subtracted here: for real models they are the
    # norms and biases, ~1e-5 of the bytes (the ZeRO paper's 1.5x holds, tests/test_timing.py)
    weights = model.weight_bytes(bytes_per_element(setup.precision))
    knobs = knobs or ZeroKnobs.for_model(model)
    qgz_intra = 0.0
    if not cluster.accelerator.is_cpu:  # ZeRO++'s quantizer runs on CUDA only (config.lint flags it elsewhere)
        e = bytes_per_element(setup.precision)
        if knobs.zero_quantized_weights or setup.quantized_weights:  # qwZ: every gather int8 + scales (partition_parameters.py quantize=True)
            weights -= (e - QWZ_BYTES_PER_ELEMENT) * (model.params - model.trained.quantized_params)
        elif knobs.zero_quantized_nontrainable_weights:  # the frozen weights' gathers only
            weights -= (e - QWZ_BYTES_PER_ELEMENT) * model.frozen_unquantized_params
        if (knobs.zero_quantized_gradients or setup.quantized_gradients) and cluster.nodes > 1:
            # qgZ (coalesced_collectives.py all_to_all_quant_reduce): int4 (half a byte per element) through an all-to-all
            # within the node, then 1/L of it (reduced) through an all-to-all across the nodes, L the GPUs per node;
            # instead of the reduce-scatter of the gradients. ZeRO++ (Wang et al. 2023, section 3.3): 4x less traffic
            local = max(1, cluster.gpus_per_node)
            grads = 0.5 * model.trainable / local * (cluster.nodes - 1) / cluster.nodes
            qgz_intra = accum * 0.5 * model.trainable * (local - 1) / local
    hpz = min(setup.hpz_partition_size, n)
    if hpz > 1:
        # hpZ: the forward gathers over every ZeRO rank; backward's (and recompute's) gather the secondary partition
        # within the hpz group of consecutive ranks, a node or less (stage3.py / partition_parameters.py
        # _all_gather_params with ds_secondary_tensor)
        return CollectiveBytes(accum * grads, accum * weights * ring,
                               intra_node=accum * (gathers - 1) * weights * (hpz - 1) / hpz + qgz_intra)
    return CollectiveBytes(accum * grads, accum * gathers * weights * ring, intra_node=qgz_intra)


def model_parallel_bytes(model: ModelSpec, setup: ZeroSetup, seq_len: int) -> float:
    """Bytes each rank moves per optimizer step inside its TP or SP group (a node: planner.parallel_degrees).

    AutoTP (module_inject/layers.py, model = the full model): every row-parallel Linear (o_proj, down_proj) all-reduces
    its output in forward (RowParallel), every column-parallel one (q, k, v, gate, up; GPT-2's fused c_attn and c_fc)
    all-reduces its input's gradient in backward (ColumnParallel), each tokens x h in the training dtype, ring
    2 (tp-1)/tp; the LM head all-gathers its logits (tokens x V) and all-reduces its input's gradient.
    Ulysses (ulysses_sp.py): q, k, v and the attention output go through an all-to-all in forward and their gradients
    in backward, each rank sending (sp-1)/sp of the local tokens x heads x head_dim, K/V at max(k, sp) heads.
    Checkpointing's recompute repeats the forward's collectives."""
    e = bytes_per_element(setup.precision)
    tp, sp = setup.tensor_parallel, setup.sequence_parallel
    forward_passes = 2 if setup.activation_checkpointing else 1
    tokens = setup.micro_batch_size * seq_len
    total = 0.0
    if tp > 1:
        h = model.hidden_size
        all_reduce = 2 * (tp - 1) / tp * tokens * h * e
        column = 5 if model.gated_mlp else 2
        per_layer = forward_passes * 2 * all_reduce + column * all_reduce
        # the head's input gradient, and its logits' gather unless Megatron's vocab-parallel cross-entropy reads them
        # in place (ModelSpec.vocab_parallel); none on a pipeline stage without the head (vocab 0: stage_view)
        gather = 0 if model.vocab_parallel else (tp - 1) / tp * tokens * model.vocab_size * e * forward_passes
        head = gather + all_reduce if model.vocab_size else 0
        total = model.num_layers * per_layer + head
    elif sp > 1:
        local = tokens / sp
        heads = 2 * model.num_attention_heads + 2 * max(model.num_kv_heads, sp)
        per_layer = (forward_passes + 1) * (sp - 1) / sp * local * heads * model.head_dim * e
        total = model.num_layers * per_layer
    return setup.gradient_accumulation_steps * total


def collective_bytes_per_step(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, knobs: ZeroKnobs | None = None) -> float:
    """Bytes each rank moves per optimizer step (ring algorithms)."""
    return collective_bytes(model, cluster, setup, knobs).total


def ring_node_share(cluster: Cluster) -> float:
    """Of the bytes a ring collective moves per rank, (N-1)/N of the data, the share each GPU's NIC carries between
    nodes, N ranks on `nodes` nodes of G GPUs. Every node must take in the other nodes' data, (nodes-1)/nodes of it,
    and NCCL spreads that over the node's NICs (a ring per channel, the channels over the NICs): a GPU's NIC carries
    ((nodes-1)/nodes) / ((N-1)/N) / G of the ring's per-rank bytes. Measured: nccl-tests all_reduce_perf over 2 nodes
    of 8 H100 with 25 GB/s of NIC per GPU reached a bus bandwidth of 338.8 GB/s at 8 GiB, 13.6x one NIC's rate; this
    rule gives min(450, 25 / 0.0667) = 375 GB/s (github.com/lessizzmore/create-a3mega-ztan-fork, ztan-NCCL-test-result;
    tests/test_published_runs.py)."""
    g, nodes = max(1, cluster.gpus_per_node), cluster.nodes
    n = g * nodes
    return ((nodes - 1) / nodes) / ((n - 1) / n) / g


def link_bandwidth(cluster: Cluster, ring: bool = True) -> float:
    """Bytes/s per rank for collectives over the cluster's backend (cluster.comm_backend): what `zerokit calibrate`
    measured over that backend, else the catalog's: within a node its link; across nodes a ring collective (ZeRO's
    all-reduce, reduce-scatter, all-gather) runs at the slower of the node's links and its NICs' share
    (ring_node_share), an all-to-all (ring=False: Ulysses over nodes), whose every rank sends off-node alone, at the
    per-GPU fabric share; gloo on GPUs at most GLOO_ON_GPU_BUSBW_GBPS (host-staged)."""
    acc, backend = cluster.accelerator, cluster.comm_backend
    measured = cluster.profile.all_reduce_busbw_gbps(backend) if cluster.profile is not None else None
    intra = measured or acc.intra_node_bw
    if cluster.nodes == 1:
        gbs = intra
    elif ring and not acc.is_cpu:
        gbs = min(intra, acc.inter_node_bw / ring_node_share(cluster))
    else:
        gbs = min(intra, acc.inter_node_bw)
    if backend == "gloo" and not acc.is_cpu and not measured:
        gbs = min(gbs, GLOO_ON_GPU_BUSBW_GBPS)
    return gbs * 1e9


def ring_steps(ranks: int) -> int:
    """Message steps of a ring collective over `ranks` ranks (n - 1: each rank passes its chunk once around; Thakur,
    Rabenseifner and Gropp 2005, "Optimization of Collective Communication Operations in MPICH"), at least 1: the
    per-call latency a profile measures between 2 ranks is one step."""
    return max(1, ranks - 1)


def model_parallel_calls(model: ModelSpec, setup: ZeroSetup) -> CollectiveCalls:
    """The collective calls behind model_parallel_bytes, per optimizer step (model: the full model). AutoTP: per micro
    step the all-reduces of every row-parallel output (forward, recompute) and column-parallel input gradient, the LM
    head's input gradient, and its logits' all_gather_into_tensor (layers.py GatherFromTensorParallelRegion) per
    forward; per step one more all-reduce, the gradient norm over the TP group (stage_1_and_2.py
    get_grad_norm_direct: _model_parallel_all_reduce). Counted on a real TP 2 step (tests/test_timing.py): 30
    all-reduces + ZeRO-1's own. Ulysses: four all-to-alls per layer each way (in `reduces`, priced at the profile's
    all-to-all latency), the position_ids all_gather of every attention forward (UlyssesSPAttentionHF.forward) and
    the loss's two; counted on a real SP 2 step of tiny-llama: 32 all_to_all_single, 6 all_gather."""
    tp, sp = setup.tensor_parallel, setup.sequence_parallel
    forward_passes = 2 if setup.activation_checkpointing else 1
    accum = setup.gradient_accumulation_steps
    if tp > 1:
        column = 5 if model.gated_mlp else 2
        per_micro = model.num_layers * (2 * forward_passes + column) + 1
        return CollectiveCalls(accum * per_micro + (1 if setup.zero_stage >= 1 else 0), accum * forward_passes)
    if sp > 1:
        # + the loss's two all_gathers (launching/parallel.sp_group_loss, as transformers' deepspeed_sp_compute_loss)
        return CollectiveCalls(accum * model.num_layers * 4 * (forward_passes + 1),
                               accum * (model.num_layers * forward_passes + 2))
    return CollectiveCalls(0, 0)


def zero_call_seconds(terms, model: ModelSpec, cluster: Cluster, setup: ZeroSetup, knobs=None,
                      calls: CollectiveCalls | None = None) -> float:
    """What ZeRO's collective calls (collective_calls_per_step; model: what one rank holds) cost per optimizer step
    beyond their bytes, before a CPU node's oversubscription (estimate_time multiplies all communication by it).
    A ring over n ranks takes n - 1 message steps (ring_steps), so a call costs its per-step latency x ring_steps(n).
    Over more than 2 ranks, where the profile fitted that latency inside real steps on a wider ring
    (engine_fit.measure_zero_ring_calls: ZeRO-3 engines on 4 ranks, engine_overhead.by_precision[p]["3"]["ring"]),
    that fitted latency for every call: calls timed back to back between 2 ranks, x 3 ring steps x 2 for 4 ranks on 2
    cores, priced the 4-rank ZeRO-3 (hpZ) rows 26-52% over (bench/results/accuracy_cpu_parallel.txt as of 6b037c4);
    with the fit, on fresh runs, -5.4% and +6.0% (the table now).
    Else the back-to-back latencies per kind (spec.profile.TimingTerms gives older profiles' shared latency to both),
    which were measured on the profile's benchmark ring (TimingTerms.latency_ranks: 2 on a CPU, the GPUs of the node
    it ran on) and so already hold ring_steps(those ranks) steps. Over 2 ranks the 2-rank engine fits
    (engine_fit.measure_engine_overhead) were fitted against the back-to-back latencies, so those price them.
    calls: the step's collective_calls_per_step where the caller has them already."""
    calls = calls or collective_calls_per_step(model, cluster, setup, knobs)
    n = setup.zero_ranks(cluster.world_size)
    fitted = zero_ring_fit(terms.engine_overhead, setup.precision) if setup.zero_stage == 3 and n > 2 else None
    if fitted is not None:
        return (calls.reduces + calls.gathers) * ring_steps(n) * fitted
    return ((calls.reduces * terms.all_reduce_latency_s + calls.gathers * terms.all_gather_latency_s)
            * ring_steps(n) / ring_steps(terms.latency_ranks))


def zero_call_steps(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, knobs=None) -> int:
    """ZeRO's calls of a step (collective_calls_per_step, all kinds) x their ring steps: what a fitted ring latency
    multiplies, and what engine_fit.measure_zero_ring_calls fits it over."""
    calls = collective_calls_per_step(model, cluster, setup, knobs)
    return (calls.reduces + calls.gathers) * ring_steps(setup.zero_ranks(cluster.world_size))


def zero_ring_fit(engine: dict | None, precision: str) -> float | None:
    """The fitted seconds per ZeRO-3 call and ring step on a ring of more than 2 ranks
    (engine_fit.measure_zero_ring_calls), None when the profile has none."""
    per_call = ((engine_fits(engine, precision).get("3") or {}).get("ring") or {}).get("per_call_s")
    return float(per_call) if isinstance(per_call, (int, float)) and per_call >= 0 else None


def model_parallel_call_seconds(terms, model: ModelSpec, setup: ZeroSetup) -> float:
    """What the TP or SP group's collective calls (model_parallel_calls; model = the full model) cost per optimizer step
    beyond their bytes. Where the profile fitted it on real TP 2 / SP 2 engines (engine_fit.measure_model_parallel_calls:
    engine_overhead.by_precision[precision]["tp" | "sp"].per_call_s), that cost per call: a call inside a step waits
    for the group's slowest rank and runs beside the other ranks' compute, which calls timed back to back do not.
    Measured on the 2-core machine, the back-to-back latencies priced TP 2 rows 9-33% over and SP 2 rows 14-26% under
    (bench/results/accuracy_cpu_parallel.txt as of dd53276); with the fit, on fresh runs, every TP and SP row is within
    -13.0% to +10.2% (the table now). Else the back-to-back latencies (all-to-all for Ulysses' exchanges,
    all-reduce for AutoTP's, all-gather for the gathers), per ring step as zero_call_seconds prices them."""
    tp, sp = setup.tensor_parallel, setup.sequence_parallel
    if tp * sp == 1:
        return 0.0
    fit = model_parallel_fit(terms.engine_overhead, setup.precision, "sp" if sp > 1 else "tp")
    if fit is not None:
        return model_parallel_call_steps(model, setup) * fit
    calls = model_parallel_calls(model, setup)
    reduce = terms.all_to_all_latency_s if sp > 1 else terms.all_reduce_latency_s
    return ((calls.reduces * reduce + calls.gathers * terms.all_gather_latency_s)
            * ring_steps(tp * sp) / ring_steps(terms.latency_ranks))


def model_parallel_call_steps(model: ModelSpec, setup: ZeroSetup) -> int:
    """The TP / SP calls of a step (model_parallel_calls, all kinds) x their ring steps: what a fitted cost per call
    multiplies, and what engine_fit.measure_model_parallel_calls fits it over."""
    calls = model_parallel_calls(model, setup)
    return (calls.reduces + calls.gathers) * ring_steps(setup.tensor_parallel * setup.sequence_parallel)


def model_parallel_fit(engine: dict | None, precision: str, kind: str) -> float | None:
    """The fitted seconds per TP ("tp") or SP ("sp") call (engine_fit.measure_model_parallel_calls), None when the
    profile has none."""
    per_call = (engine_fits(engine, precision).get(kind) or {}).get("per_call_s")
    return float(per_call) if isinstance(per_call, (int, float)) and per_call >= 0 else None


def intra_node_bandwidth(cluster: Cluster) -> float:
    """Bytes/s per rank for collectives that stay inside a node: link_bandwidth's rule for one node."""
    acc, backend = cluster.accelerator, cluster.comm_backend
    measured = cluster.profile.all_reduce_busbw_gbps(backend) if cluster.profile is not None else None
    gbs = measured or acc.intra_node_bw
    if backend == "gloo" and not acc.is_cpu and not measured:
        gbs = min(gbs, GLOO_ON_GPU_BUSBW_GBPS)
    return gbs * 1e9


@dataclass(frozen=True)
class OffloadSeconds:
    """ZeRO-Offload's time per step, by what bounds it."""

    cpu_adam: float = 0.0  # DeepSpeedCPUAdam on the node's share
    pcie: float = 0.0  # gradients down, parameters up
    nvme: float = 0.0  # ZeRO-Infinity's swaps

    @property
    def total(self) -> float:
        return self.cpu_adam + self.pcie + self.nvme


def offload_seconds(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, cpu_adam_params_per_s: float,
                    optimizer: Optimizer = ADAMW) -> OffloadSeconds:
    if setup.offload_optimizer == "none" and setup.offload_param == "none":
        return OffloadSeconds()
    acc = cluster.accelerator
    n = setup.zero_ranks(cluster.world_size)  # model: what one rank holds (an AutoTP shard)
    e = bytes_per_element(setup.precision)
    shard = model.params / n
    adam = pcie_s = nvme = 0.0
    pcie = acc.pcie_bw * 1e9 if acc.pcie_bw else math.inf  # a CPU "device" copies nothing
    if setup.offload_optimizer != "none":
        # gradients down every micro step (stage 2/3 copy the reduced partition), params up once: trainable only
        trainable_shard = model.trainable / n
        pcie_s += (setup.gradient_accumulation_steps + 1) * e * trainable_shard / pcie
        adam += (model.trainable * setup.tensor_parallel / cluster.nodes) / cpu_adam_params_per_s
        if setup.offload_optimizer == "nvme" and setup.zero_stage == 3:
            # read + write of the fp32 master, the optimizer's state and the fp32 gradient (Adam: 16 bytes)
            swapped = 4 + optimizer.state_bytes + 4
            nvme += 2 * swapped * model.trainable / cluster.nodes / (DEFAULT_NVME_BW * 1e9)
    if setup.offload_param != "none":
        passes = 3 if setup.activation_checkpointing else 2
        pcie_s += setup.gradient_accumulation_steps * passes * e * shard / pcie
        if setup.offload_param == "nvme":
            nvme += setup.gradient_accumulation_steps * passes * e * model.params / cluster.nodes / (DEFAULT_NVME_BW * 1e9)
    return OffloadSeconds(adam, pcie_s, nvme)


def reduce_bucket_calls(sizes: list[int], bucket_elements: int) -> int:
    """Gradient reductions one backward issues: DeepSpeed (stage_1_and_2.py
    reduce_independent_p_g_buckets_and_remove_grads, stage3.py the same rule) reduces the bucket before a
    gradient that would overflow it, then adds that gradient; a gradient larger than the bucket is one
    reduction of its own."""
    calls, filled = 0, 0
    for n in sizes:
        if filled and filled + n > bucket_elements:
            calls += 1
            filled = 0
        filled += n
    return calls + (1 if filled else 0)


@dataclass(frozen=True)
class CollectiveCalls:
    """Collective calls each rank makes per optimizer step, by kind (their per-call latencies differ)."""
    reduces: int  # gradient all-reduces / reduce-scatters
    gathers: int  # parameter all-gathers


def collective_calls_per_step(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, knobs=None) -> CollectiveCalls:
    """Collective calls each rank makes per optimizer step with the rendered (hidden-size) buckets or the
    given knobs: bucketed gradient reduces every micro step, the ZeRO-1/2 parameter all-gather after the
    step, ZeRO-3's per-layer gathers (forward, backward, recompute)."""
    if cluster.world_size == 1:
        return CollectiveCalls(0, 0)
    knobs = knobs or ZeroKnobs.for_model(model)
    accum = setup.gradient_accumulation_steps
    if setup.zero_stage == 0:
        return CollectiveCalls(1, 0)  # engine.buffered_allreduce_fallback: one flat all-reduce of up to 5e8 elements
    # only trainable parameters have gradients to reduce (a LoRA model's few adapter tensors fill a handful of buckets)
    sizes = trainable_gradient_sizes(model)
    reduces = reduce_bucket_calls(list(sizes), max(1, knobs.reduce_bucket_size))
    # ZeRO-1/2's gather of the updated partitions skips a data-parallel group of one rank (runtime/utils.py
    # all_gather_into_tensor_dp_groups: `if dp_world_size == 1: continue`; an AutoTP job with TP = world); its
    # reductions still run (measured: tests/test_timing.py, TP 2 on 2 ranks)
    gathers = 0 if setup.zero_ranks(cluster.world_size) == 1 else 1
    if setup.zero_stage in (1, 2):
        # bucketed reduces every micro step at ZeRO-2, only at the accumulation boundary at ZeRO-1
        # (stage_1_and_2.py reduce_ready_partitions_and_remove_grads: `partition_gradients or
        # is_gradient_accumulation_boundary`); at the step the gradient norm's all-reduce, in mixed
        # precision the overflow check's; one all_gather_into_tensor of the updated partitions. Counted in
        # real 2-rank tiny-llama steps: 36 all-reduces in fp32, 37 in bf16 (35 buckets here + 1 / + 2).
        micro = accum if setup.zero_stage == 2 else 1
        return CollectiveCalls(micro * reduces + 1 + (setup.precision != "fp32"), gathers)
    # ZeRO-3: one (coalesced, prefetched) gather per layer plus the embedding and the LM head in forward;
    # backward and recompute gather again only when the model exceeds the live window
    # (stage3_max_live_parameters / max_reuse_distance: the parameters stay gathered otherwise, see
    # memory.phase_terms).
    window = min(knobs.stage3_max_live_parameters, knobs.stage3_max_reuse_distance)
    passes = 1 if model.params <= window else (3 if setup.activation_checkpointing else 2)
    return CollectiveCalls(accum * reduces, accum * passes * (model.num_layers + 2))


# What one micro step's forward + backward is priced on with a calibrated profile, each at its measured
# seconds per unit (measure/compute_fit.py fits them on real HF models; spec.profile.COMPUTE_FEATURES names
# them): a fixed cost per micro step (embedding, final norm, loss launches), per layer, and per recomputed
# layer (activation checkpointing re-runs each layer's forward under torch.utils.checkpoint), the FLOPs
# (recompute's included), the attention score elements (micro batch x heads x seq^2 per layer: softmax, mask
# and dropout over them are memory-bound), the layers' activation elements (tokens x (hidden + intermediate)
# per layer: norms, activation functions, residual adds, dtype casts, all memory-bound) and the logits
# (tokens x vocab: the loss's fp32 upcast and log-softmax). Recompute repeats the forward, about a third of
# forward + backward: the scores and activation elements count 4/3 under checkpointing, as the FLOPs do.


# Submodules of the decoder layer engine_fit.py calibrates on (measure/engine_fit.py synthetic_engine_config, a
# LlamaDecoderLayer): the layer, self_attn, q/k/v/o_proj, mlp, gate/up/down_proj, act_fn, two RMSNorms.
CALIBRATION_MODULES_PER_LAYER = 13


def compute_features(model: ModelSpec, micro_batch: int, seq_len: int, activation_checkpointing: bool,
                     sequence_parallel: int = 1, tiled_mlp: bool = False, attention_span: int | None = None
                     ) -> dict[str, float]:
    """One rank's features per micro step. Under Ulysses a rank computes seq_len / sp tokens, each attending over the
    whole sequence (1/sp of the heads over every token: the same FLOPs and scores). TiledMLP runs each MLP's forward
    again in backward (ulysses_sp.py TiledMLP.backward: `fn(self, x_shard)` under enable_grad): its FLOPs and its
    intermediate elements once more (tiled_mlp_flops_per_token). attention_span: the keys a query reads at most
    (Workload.attention_span: a packed document), the sequence by default."""
    span = attention_span or seq_len
    passes = 4 / 3 if activation_checkpointing else 1.0
    tokens = micro_batch * seq_len // sequence_parallel
    layers = model.num_layers
    # a recomputed layer's fixed cost is torch.utils.checkpoint replaying its ops one module at a time; what peft's extra
    # modules add to it is priced by peft_module_seconds, with their other per-module costs
    recompute = layers
    # LoRA (spec.profile.ADAPTER_FEATURES): adapted Linears per micro step (read off the module tree: lora_slots), and
    # their in + out elements over the tokens; recompute repeats the forward's share as for the activations (the
    # recomputed module calls are in "recompute" above). Why: priced on FLOPs alone, a LoRA model's forward + backward
    # came out cheaper than the full model's (no weight-gradient GEMMs), while measured it cost more (tiny-llama r=8,
    # one rank: +1.5 to +6 ms over the full model, against -2 to -9 ms predicted; the ZeRO-0 grid rows were -17% and
    # -25%). The calibration's LoRA points (profile compute_timing adapter_points) show what the terms give.
    adapters = layers * sum(model.trained.lora_slots) if model.trained.lora_r else 0
    mlp_again = layers * tokens * model.intermediate_size if tiled_mlp else 0
    if sequence_parallel > 1:
        # Ulysses' copies around each all-to-all, forward and backward: q, k, v and the output made contiguous before
        # the exchange and again after it (ulysses_sp.py _combine_local_sequences, _partition_global_sequence: two
        # .contiguous() each), memory-bound like the activation elements; K/V at max(k, sp) heads
        kv = max(model.num_kv_heads, sequence_parallel)
        mlp_again += passes * layers * tokens * 2 * 2 * (2 * model.num_attention_heads + 2 * kv) * model.head_dim
    return {"micro": 1.0, "layer": float(layers), "recompute": float(recompute if activation_checkpointing else 0),
            "flop": (flops_per_token(model, span, activation_checkpointing) + tiled_mlp_flops_per_token(model, tiled_mlp)) * tokens,
            "score": passes * layers * tokens * model.num_attention_heads * span,
            "activation": passes * layers * tokens * (model.hidden_size + model.intermediate_size) + mlp_again,
            "logit": float(tokens * model.vocab_size),
            "adapter": float(adapters),
            "adapter_element": passes * layers * tokens * model.trained.lora_io_per_layer if adapters else 0.0,
            "dequant": dequantized_elements(model, activation_checkpointing),
            # each dequantization is a call (bitsandbytes functional.dequantize_4bit, through MatMul4Bit) whatever its size
            "dequant_call": float(model.trained.quantized_tensors * (3 if activation_checkpointing else 2))}


def _calibrated_compute(model: ModelSpec, setup: ZeroSetup, workload: Workload, coef: dict[str, float]) -> float:
    """One rank's compute per optimizer step: each micro step's features at the measured cost per unit."""
    feats = compute_features(model, setup.micro_batch_size, workload.seq_len, setup.activation_checkpointing,
                             setup.sequence_parallel, setup.tiled_mlp, workload.attention_span)
    coef = {"dequant": coef.get("activation", 0.0), **coef}  # profiles before the dequant fit: an activation element
    return setup.gradient_accumulation_steps * sum(coef.get(n, 0.0) * feats[n] for n in COMPUTE_FEATURES + ADAPTER_FEATURES)


def checkpoint_offload_seconds(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, workload: Workload) -> float:
    """Activation-checkpoint offload's PCIe time per step: every offloaded layer input goes to the host in forward and
    back in backward, each micro step (checkpoint_offload_bytes), at the accelerator's PCIe bandwidth. Counted
    in full, not hidden behind compute: DeepSpeed copies on a side stream, but ALST's authors found the offload
    blocking ("isn't yet efficient (blocking)", ArcticTraining's notes), and the recompute waits for its input. A CPU
    rank copies within its own memory (pcie_bw None: no time)."""
    pcie = cluster.accelerator.pcie_bw
    if not setup.checkpoint_offload or not pcie:
        return 0.0
    moved = checkpoint_offload_bytes(model, setup, workload)
    return setup.gradient_accumulation_steps * 2 * moved / (pcie * 1e9)


def estimate_time(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, workload: Workload, knobs=None) -> TimeEstimate:
    acc = cluster.accelerator
    # a TP or SP group trains on one batch together: the global batch counts data-parallel replicas
    global_batch = setup.micro_batch_size * setup.gradient_accumulation_steps * setup.data_parallel(cluster.world_size)
    tokens = global_batch * workload.seq_len
    flops = (flops_per_token(model, workload.attention_span, setup.activation_checkpointing)
             + tiled_mlp_flops_per_token(model, setup.tiled_mlp)) * tokens
    full_model = model
    model = model.tensor_parallel_shard(setup.tensor_parallel)  # what one rank computes and updates
    n = setup.zero_ranks(cluster.world_size)
    terms = cluster.profile.timing if cluster.profile is not None else None
    coef = terms.compute_coefficients(model.gated_mlp, setup.precision) if terms else None
    link = link_bandwidth(cluster)
    moved = collective_bytes(full_model, cluster, setup, knobs)
    comm = (moved.gradients + moved.parameters) / link
    # Ulysses over more GPUs than a node has (whole nodes) sends its all-to-alls over the nodes' links
    mp_link = (link_bandwidth(cluster, ring=False) if setup.sequence_parallel > cluster.gpus_per_node
               else intra_node_bandwidth(cluster))
    sync_comm = moved.intra_node / intra_node_bandwidth(cluster) + model_parallel_bytes(full_model, setup, workload.seq_len) / mp_link
    comm += sync_comm
    cpu_adam = acc.cpu_adam_params_per_s or DEFAULT_CPU_ADAM_PARAMS_PER_S
    if terms and terms.cpu_adam_params_per_s:
        cpu_adam = terms.cpu_adam_params_per_s
    optimizer_spec = optimizer_named(knobs.optimizer if knobs is not None else DEFAULT_OPTIMIZER)
    offload_parts = offload_seconds(model, cluster, setup, cpu_adam, optimizer_spec)
    checkpoint_pcie = checkpoint_offload_seconds(model, cluster, setup, workload)
    offload = offload_parts.total + checkpoint_pcie
    optimizer = engine = hidden = host = 0.0
    parts = (0.0, 0.0, 0.0)
    gpu_parts = None
    if coef:
        compute = _calibrated_compute(model, setup, workload, coef)
        calls = collective_calls_per_step(model, cluster, setup, knobs)
        comm += (zero_call_seconds(terms, model, cluster, setup, knobs, calls)
                 + model_parallel_call_seconds(terms, full_model, setup))
        engine = engine_seconds(terms.engine_overhead, setup.precision, setup.zero_stage, model.num_layers,
                                setup.gradient_accumulation_steps, setup.activation_checkpointing,
                                offload=setup.offload_optimizer != "none", calls=calls.reduces + calls.gathers)
        engine += peft_module_seconds(terms.engine_overhead, coef, model, setup)
        adamw = terms.torch_adamw_params_per_s
        if adamw and setup.offload_optimizer == "none":
            # every rank updates its partition (all of it at stage 0); the ranks of a CPU node share its cores
            share = model.trainable / (n if setup.zero_stage >= 1 else 1)
            optimizer = share / (adamw / cluster.gpus_per_node if acc.is_cpu else adamw)
    elif acc.prices_kernels:  # a GPU without a calibration: each kind of work at its published rate, then the fit
        dense = flops_per_token(model, 0, setup.activation_checkpointing) + tiled_mlp_flops_per_token(model, setup.tiled_mlp)
        kernels = gpu_compute(model, acc, setup, workload.seq_len, workload.attention, optimizer_spec, dense,
                              2.0 * matmul_params(model), n, workload.attention_span)
        calls = collective_calls_per_step(model, cluster, setup, knobs)
        gpu_parts = GpuStepParts(
            generation=acc.generation, hidden_size=model.hidden_size, stage=setup.zero_stage,
            overlap_comm=(knobs or ZeroKnobs.for_model(model)).overlap_comm,  # what render writes when no config is given
            compute=kernels, host_seconds=gpu_host_seconds(model, setup, calls.reduces + calls.gathers),
            gradient_comm_seconds=moved.gradients / link, parameter_comm_seconds=moved.parameters / link,
            sync_comm_seconds=sync_comm, cpu_adam_seconds=offload_parts.cpu_adam,
            pcie_seconds=offload_parts.pcie + checkpoint_pcie, nvme_seconds=offload_parts.nvme,
            scheduled_prefetch=setup.compile == "deepcompile", offload_engine=setup.offload_engine)
        step_parts = gpu_step(gpu_parts, time_fit())
        host, optimizer = step_parts.host_seconds, step_parts.optimizer_seconds
        compute, comm, offload = step_parts.compute_seconds, step_parts.communication_seconds, step_parts.offload_seconds
        hidden = step_parts.communication_hidden_seconds
        parts = (step_parts.matmul_seconds, step_parts.attention_seconds, step_parts.memory_seconds)
    else:
        peak = acc.peak_flops(setup.precision) * acc.efficiency
        if acc.is_cpu:
            peak /= cluster.gpus_per_node  # CPU ranks on one node share its cores
        compute = flops / (cluster.world_size * peak) if peak else math.inf
    if coef and acc.is_cpu:
        # CPU ranks beyond the cores the profile was measured with share them: all of a rank's work (compute, the
        # engine's Python, gloo's copies) runs that much slower (HardwareProfile.cpu_oversubscription; measured: 4
        # ranks on 2 cores, bench/results/accuracy_cpu_parallel.txt)
        share = cluster.profile.cpu_oversubscription(cluster.gpus_per_node)
        compute, comm, optimizer, engine = (share * x for x in (compute, comm, optimizer, engine))
    learned = learned_run(cluster, full_model, setup, workload)
    if learned is not None:  # a run measured on this hardware near this plan: its measured / predicted, on every term
        compute, comm, offload, optimizer, engine = (learned.ratio * x for x in (compute, comm, offload, optimizer,
                                                                                 engine))
        parts = tuple(learned.ratio * x for x in parts)
    step = compute + comm + offload + optimizer + engine
    basis = "calibrated" if coef or learned is not None else "catalog_gpu" if acc.prices_kernels else None
    low, high, range_basis = step_range(step, basis) if basis and math.isfinite(step) else (None, None, None)
    spe = steps_per_epoch(workload.samples, global_batch) if workload.samples else None
    steps = math.ceil(workload.epochs * spe) if spe else None
    total = steps * step if steps is not None else None
    return TimeEstimate(
        step_seconds=step,
        compute_seconds=compute,
        communication_seconds=comm,
        offload_seconds=offload,
        flops_per_step=flops,
        tokens_per_step=tokens,
        global_batch=global_batch,
        steps_per_epoch=spe,
        steps=steps,
        total_seconds=total,
        efficiency=None if coef or acc.prices_kernels else acc.efficiency,
        optimizer_seconds=optimizer,
        engine_seconds=engine,
        calibrated=bool(coef),
        link_gbps=link / 1e9,
        learned_factor=learned.ratio if learned is not None else 1.0,
        learned_from=f"{learned.run_dir} ({learned.setup}, {learned.recorded})" if learned is not None else None,
        matmul_seconds=parts[0], attention_seconds=parts[1], memory_bound_seconds=parts[2],
        communication_hidden_seconds=hidden, host_seconds=host,
        step_seconds_low=low, step_seconds_high=high, range_basis=range_basis, gpu_parts=gpu_parts,
    )


def learned_run(cluster: Cluster, model: ModelSpec, setup: ZeroSetup, workload: Workload):
    """The run measured on this hardware that corrects this plan (spec.profile.nearest_learned_run), or None."""
    if cluster.profile is None:
        return None
    return nearest_learned_run(cluster.profile.learned, cluster.accelerator.name, setup.precision,
                               setup.zero_stage, model.params, cluster.world_size,
                               setup.micro_batch_size * workload.seq_len)




def peft_module_seconds(engine: dict | None, coef: dict | None, model: ModelSpec, setup: ZeroSetup) -> float:
    """What the modules peft adds to every decoder layer (Trained.extra_modules_per_layer: tiny-llama all-linear
    13 -> 83) cost a real step beyond the adapters' compute (compute_features' adapter terms, fitted on peft models
    outside DeepSpeed): per module and micro step, and once more per module a checkpointed layer recomputes. A profile
    that timed the synthetic engines with LoRA at every stage (engine_fit.measure_peft_module_costs: the stage's
    per_peft_module_s and per_peft_module_recompute_s) prices them at what those measured: on this CPU ~0.02 ms a module
    at ZeRO-0/1/2 and ~0.2 ms at ZeRO-3, whose fetch/release hooks run on every submodule (parameter_offload.py
    _register_deepspeed_module), recompute included. Profiles before that: ZeRO-3's hooks alone
    (zero3_module_hook_seconds) and recompute at the recomputed layer's fixed cost over its 13 modules per module,
    which the engines measured 2-6x too high (checkpointed LoRA engines 30-52 ms over at 8 layers, 2026-11-26)."""
    modules = model.trained.extra_modules_per_layer * model.num_layers * setup.gradient_accumulation_steps
    if not modules:
        return 0.0
    fit = engine_fits(engine, setup.precision).get(str(setup.zero_stage)) or {}
    if fit.get("per_peft_module_recompute_s") is not None:
        per_module = float(fit["per_peft_module_s"])
        if setup.activation_checkpointing:
            per_module += float(fit["per_peft_module_recompute_s"])
        return per_module * modules
    seconds = zero3_module_hook_seconds(engine, model, setup) if setup.zero_stage == 3 else 0.0
    if setup.activation_checkpointing and coef:
        seconds += float(coef.get("recompute", 0.0)) * modules / CALIBRATION_MODULES_PER_LAYER
    return seconds


def zero3_module_hook_seconds(engine: dict | None, model: ModelSpec, setup: ZeroSetup) -> float:
    """What peft's extra modules add to a ZeRO-3 step: DeepSpeed hooks every submodule (parameter_offload.py
    _register_deepspeed_module: fetch, release and trace on each forward and backward), and a LoRA layer has 5-6x the
    modules of a plain one (tiny-llama all-linear: 13 -> 83). The cost of one module's hooks is the calibrated ZeRO-3
    per-layer cost over the calibration layer's 13 modules, from the cheaper precision: hook calls are Python,
    whatever the dtype, and fp32's per-layer figure carries more than the hooks. Measured, tiny-llama LoRA ZeRO-3 bf16:
    154 ms per step against 86 ms predicted without this term (bench/results/accuracy_cpu_finetune.txt). A profile
    that timed ZeRO-3 LoRA engines (per_peft_module_s) prices a module at what they measured instead: the rule above
    counted peft's unused ModuleDicts as called, and the adapters' own compute is in compute_features now."""
    by = (engine or {}).get("by_precision") or {}
    measured = {p: float(f["3"]["per_peft_module_s"]) for p, f in by.items()
                if (f.get("3") or {}).get("per_peft_module_s") is not None}
    per_layer = [float(f["3"]["per_layer_micro_s"]) for f in by.values() if f.get("3")]
    if measured:  # measured on ZeRO-3 LoRA engines (measure/engine_fit.measure_zero3_peft_hooks); another precision's
        # where this one was not (hook calls are Python, whatever the dtype)
        per_module = measured.get(setup.precision, min(measured.values()))
    elif per_layer:
        per_module = min(per_layer) / CALIBRATION_MODULES_PER_LAYER
    else:
        return 0.0
    return per_module * model.trained.extra_modules_per_layer * model.num_layers * setup.gradient_accumulation_steps


def engine_fits(engine: dict | None, precision: str) -> dict:
    """A profile's engine fits (measure/engine_fit.py) for `precision`: a precision that was not measured (fp16 on a bf16
    machine) takes the other 16-bit one's, else any; {} without a measurement."""
    by = (engine or {}).get("by_precision") or {}
    return by.get(precision) or by.get("bf16" if precision == "fp16" else "fp16") or next(iter(by.values()), None) or {}


def engine_seconds(engine: dict | None, precision: str, stage: int, layers: int, accum: int,
                   checkpointing: bool = False, offload: bool = False, calls: int | None = None) -> float:
    """The fitted engine cost (measure/engine_fit.py measures it on real engines) of one optimizer step (0 without a
    measurement for the stage); a precision that was not measured (fp16 on a bf16 machine) takes the other 16-bit one,
    else any. A ZeRO-1/2 fit with per_call_s prices that per collective call of the step (`calls`:
    collective_calls_per_step, all kinds) in place of per layer and micro step: what ZeRO-1/2's engine adds grows with
    its gradient buckets, and a LoRA model fills a few buckets per step whatever its depth (engine_fit.PER_CALL_STAGES
    says what was measured)."""
    fit = engine_fits(engine, precision).get(str(stage))
    if not fit:
        return 0.0
    recompute = float(fit.get("per_layer_recompute_s", 0.0)) if checkpointing else 0.0
    if fit.get("per_call_s") is not None and calls is not None:
        seconds = float(fit["per_step_s"]) + float(fit["per_call_s"]) * calls + recompute * layers * accum
    else:
        seconds = float(fit["per_step_s"]) + (float(fit["per_layer_micro_s"]) + recompute) * layers * accum
    off = fit.get("offload") if offload else None
    if off:
        seconds += float(off["per_step_s"]) + float(off["per_layer_micro_s"]) * layers * accum
    return seconds


def efficiency_from_run(predicted_step_s: float, measured_step_s: float, current_efficiency: float) -> float:
    """The efficiency that would have made the prediction match the measured step time.
    Step time scales as 1/efficiency, so new = current * predicted / measured, clamped to [0.01, 1]."""
    for name, v in (("predicted_step_s", predicted_step_s), ("measured_step_s", measured_step_s),
                    ("current_efficiency", current_efficiency)):
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")):
            raise ZerokitError(f"{name} must be a positive number, got {v!r}")
    return max(0.01, min(1.0, current_efficiency * predicted_step_s / measured_step_s))
