"""The time model: step time from FLOPs, ZeRO communication and offload traffic; total training time.

step = compute + communication + offload (no overlap assumed: conservative, and the efficiency
factor a calibration measures absorbs what overlap recovers).

- compute: training FLOPs 6·Ψ·tokens (8·Ψ·tokens with full recompute) plus attention
  12·L·s·(a·d) per token (forward + backward, Korthikanti et al. 2022; shared/reference
  memory-and-time.md), over peak x efficiency of every rank.
- communication, bytes each rank sends per optimizer step with ring collectives ((N-1)/N):
  stage 0/1: one gradient all-reduce (2x model) per step; stage 2: a reduce-scatter every micro
  step plus one parameter all-gather; stage 3: two parameter all-gathers (forward, backward; a third
  with recompute) and a reduce-scatter every micro step: the ZeRO paper's 1.5x of data parallelism.
- offload: 16-bit gradients down and parameters up over PCIe, the CPU Adam step on Ψ/nodes
  parameters per node, NVMe reads and writes of the swapped state.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from zerokit.hardware import Cluster
from zerokit.model_spec import ModelSpec
from zerokit.zero_setup import Workload, ZeroSetup, steps_per_epoch

# DeepSpeedCPUAdam throughput per node when no calibration is given. ZeRO-Offload paper
# (Ren et al. 2021, Table 3): CPU-Adam updates 1B params in ~0.22-0.44 s on a dual-socket server.
DEFAULT_CPU_ADAM_PARAMS_PER_S = 2.5e9
# Sequential NVMe bandwidth per node (a single PCIe Gen4 drive), GB/s.
DEFAULT_NVME_BW = 3.0


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

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.step_seconds if self.step_seconds else 0.0

    def gpu_hours(self, world_size: int) -> float | None:
        return None if self.total_seconds is None else self.total_seconds * world_size / 3600

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tokens_per_second"] = self.tokens_per_second
        return d


def matmul_params(model: ModelSpec) -> int:
    """Parameters that take part in matmuls per token: the input embedding is a lookup (no FLOPs);
    a tied embedding still runs once, as the LM head."""
    input_embedding = model.vocab_size * model.hidden_size
    p = model.active_params - (0 if model.tied_embeddings else input_embedding)
    return max(p, 0)


def flops_per_token(model: ModelSpec, seq_len: int, activation_checkpointing: bool) -> float:
    passes = 8 if activation_checkpointing else 6  # recompute adds a second forward (2 of 6)
    attention = 12 * model.num_layers * seq_len * model.num_attention_heads * model.head_dim
    if activation_checkpointing:
        attention = attention * 4 // 3
    return passes * matmul_params(model) + attention


def collective_bytes_per_step(model: ModelSpec, cluster: Cluster, setup: ZeroSetup) -> float:
    """Bytes each rank moves per optimizer step (ring algorithms)."""
    n = cluster.world_size
    if n == 1:
        return 0.0
    ring = (n - 1) / n
    e = 4 if setup.precision == "fp32" else 2
    model_bytes = e * model.params
    accum = setup.gradient_accumulation_steps
    if setup.zero_stage in (0, 1):
        return 2 * model_bytes * ring  # all-reduce = reduce-scatter + all-gather, once per step
    if setup.zero_stage == 2:
        return (accum + 1) * model_bytes * ring
    gathers = 3 if setup.activation_checkpointing else 2
    return accum * (gathers + 1) * model_bytes * ring


def link_bandwidth(cluster: Cluster) -> float:
    """Bytes/s per rank for collectives: the slowest link a ring crosses."""
    acc = cluster.accelerator
    gbs = acc.intra_node_bw if cluster.nodes == 1 else min(acc.intra_node_bw, acc.inter_node_bw)
    return gbs * 1e9


def offload_seconds(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, cpu_adam_params_per_s: float) -> float:
    if setup.offload_optimizer == "none" and setup.offload_param == "none":
        return 0.0
    acc = cluster.accelerator
    n = cluster.world_size
    e = 4 if setup.precision == "fp32" else 2
    shard = model.params / n
    seconds = 0.0
    pcie = acc.pcie_bw * 1e9 if acc.pcie_bw else math.inf  # a CPU "device" copies nothing
    if setup.offload_optimizer != "none":
        # gradients down every micro step (stage 2/3 copy the reduced partition), params up once
        seconds += (setup.gradient_accumulation_steps + 1) * e * shard / pcie
        seconds += (model.params / cluster.nodes) / cpu_adam_params_per_s
        if setup.offload_optimizer == "nvme" and setup.zero_stage == 3:
            seconds += 2 * 16 * model.params / cluster.nodes / (DEFAULT_NVME_BW * 1e9)  # read + write
    if setup.offload_param != "none":
        passes = 3 if setup.activation_checkpointing else 2
        seconds += setup.gradient_accumulation_steps * passes * e * shard / pcie
        if setup.offload_param == "nvme":
            seconds += setup.gradient_accumulation_steps * passes * e * model.params / cluster.nodes / (DEFAULT_NVME_BW * 1e9)
    return seconds


def estimate_time(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, workload: Workload) -> TimeEstimate:
    acc = cluster.accelerator
    n = cluster.world_size
    global_batch = setup.micro_batch_size * setup.gradient_accumulation_steps * n
    tokens = global_batch * workload.seq_len
    flops = flops_per_token(model, workload.seq_len, setup.activation_checkpointing) * tokens
    peak = acc.peak_flops(setup.precision) * acc.efficiency
    if acc.is_cpu:
        peak /= cluster.gpus_per_node  # CPU ranks on one node share its cores
    compute = flops / (n * peak) if peak else math.inf
    comm = collective_bytes_per_step(model, cluster, setup) / link_bandwidth(cluster)
    cpu_adam = acc.cpu_adam_params_per_s or DEFAULT_CPU_ADAM_PARAMS_PER_S
    offload = offload_seconds(model, cluster, setup, cpu_adam)
    step = compute + comm + offload
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
    )
