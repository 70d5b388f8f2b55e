"""Step time on a GPU without a calibration: each kind of work at the rate published for it, not one efficiency.

A rank's micro step is priced as the sum of what bounds each part of it (docs/time-model.md):

- dense matmuls (every Linear: forward, both backward GEMMs, recompute; timing.flops_per_token at seq_len 0) at the
  accelerator's Maximum Achievable Matmul FLOPS: the best matmul a brute-force search over shapes reached, per GPU
  (stas00/ml-engineering, compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table"), held
  in gpus.json as matmul_fraction = MAMF / the datasheet peak;
- attention's score matmuls as the kernel runs them: FlashAttention-2 and sdpa's flash backend skip the masked half of
  a causal product and recompute the scores in backward (2 matmuls forward, 5 backward: backward FLOPs = 2.5 x
  forward, the FA2 paper's own accounting, Dao 2023, section 4.1), at gpus.json attention_fraction of the peak
  (flash3: FlashAttention-3's flash3_fraction, the same FLOPs);
  eager attention computes every score with batched matmuls and writes them to memory;
- memory-bound element-wise work (norms, rotary, activations, residual adds, dropout, eager softmax, the loss over
  the vocabulary) at the datasheet HBM bandwidth, counting the bytes each op of the transformers module reads and
  writes (elementwise_bytes_per_token);
- the optimizer step on the rank's partition, memory-bound (optimizer_bytes_per_param).

Communication overlaps compute as DeepSpeed schedules it (exposed_communication). The host's side (PyTorch's
dispatch, DeepSpeed's hooks) is timing.gpu_host_seconds, from a calibration on one H200 node; the data loader and the
training loop around the engine are not priced.

What first principles cannot know (how close a model's own matmul shapes come to MAMF, how long the host takes, how
much of ZeRO-3's traffic really hides, the collectives', PCIe's and CPU Adam's real rates) is a TimeFit: a few
figures fitted on the fit half of the public corpus of published runs (bench/fit_time.py, zerokit/data/time_fit.json),
each inside the bounds its physical source allows (FIT_BOUNDS). gpu_step applies them to a step's priced parts
(GpuStepParts), so the fit and every plan combine the parts the same way.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

from zerokit.core.resources import bundled_data

from zerokit.spec.features import ZENFLOW
from zerokit.spec.hardware import Accelerator
from zerokit.spec.model import ModelSpec
from zerokit.spec.optimizer import Optimizer
from zerokit.spec.setup import ZeroSetup, bytes_per_element

# FlashAttention-2's backward runs 5 matmuls to the forward's 2 (it recomputes the scores): 2.5 x the forward's FLOPs
# (Dao 2023, "FlashAttention-2", section 4.1). Eager attention's backward is two matmuls per forward matmul.
FLASH_BACKWARD_FLOPS = 2.5
EAGER_BACKWARD_FLOPS = 2.0
# An element-wise op's backward reads the gradient and the saved input and writes the input's gradient (3 tensors)
# where its forward read one and wrote one (2); a binary op 5 to 3. The backward moves ~1.5x the forward's bytes.
ELEMENTWISE_BACKWARD_BYTES = 1.5
# Activations whose transformers module is a chain of separate element-wise kernels (tensor passes, each op's reads
# and writes, per intermediate element): NewGELUActivation (gelu_new) is
# 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))): pow, 2 scalar muls, add, tanh, scalar add, 2 muls = 18;
# FastGELUActivation (gelu_fast) one pass fewer; QuickGELUActivation x * sigmoid(1.702 x): scalar mul, sigmoid, mul = 7.
# Every other activation (silu, gelu, gelu_pytorch_tanh, relu) is one fused torch kernel: read and write, 2.
UNFUSED_ACTIVATION_PASSES = {"gelu_new": 18, "gelu_fast": 16, "quick_gelu": 7}


@dataclass(frozen=True)
class GpuCompute:
    """One rank's compute per optimizer step, by what bounds it (seconds)."""

    matmul_seconds: float
    attention_seconds: float
    memory_seconds: float  # element-wise work and the loss at HBM bandwidth
    optimizer_seconds: float
    backward_seconds: float  # the part of the first three that runs in backward (what gradient reduction hides behind)
    matmul_backward_seconds: float = 0.0  # the matmuls' share of backward_seconds (rescaled with the matmul rate)

    @property
    def compute_seconds(self) -> float:
        return self.matmul_seconds + self.attention_seconds + self.memory_seconds


def backward_layers(model: ModelSpec, activation_checkpointing: bool) -> int:
    """Decoder layers that run a backward: all of them, but a fine-tune's layers below its first trainable parameter
    get no gradient (Trained.grad_start_layer), unless checkpointing, whose enable_input_require_grads sends the
    gradient down to the embeddings (memory.activation_terms)."""
    if model.trained.trainable_matmul_params is None or activation_checkpointing:
        return model.num_layers
    return model.num_layers - min(model.trained.grad_start_layer, model.num_layers)


def attention_flops_per_token(model: ModelSpec, seq_len: int, activation_checkpointing: bool, attention: str,
                              backward_layers: int | None = None) -> tuple[float, float]:
    """(forward, backward incl. recompute) FLOPs of the score matmuls per token, as the kernel runs them.

    Forward: QK^T and PV, 2 x 2 s a d per layer over the keys each query attends. A flash kernel (flash, sdpa) skips
    the blocks a causal mask hides, about half (the FA2 paper divides causal FLOPs by 2); a sliding window of w keys
    caps them at w. Eager computes all s scores and masks them afterwards. backward_layers: layers that run a backward
    (a fine-tune frozen below its first trainable layer runs fewer), all by default."""
    layers = model.num_layers
    backward_layers = layers if backward_layers is None else backward_layers
    ad = model.num_attention_heads * model.head_dim
    if attention == "eager":
        per_layer = [4.0 * seq_len * ad] * layers
        backward = EAGER_BACKWARD_FLOPS
    else:
        window = model.sliding_window or seq_len
        sliding = min(model.sliding_window_layers, layers) if model.sliding_window else 0
        per_layer = ([4.0 * ad * min(seq_len / 2, window)] * sliding
                     + [4.0 * ad * seq_len / 2] * (layers - sliding))
        backward = FLASH_BACKWARD_FLOPS
    forward = sum(per_layer)
    mean = forward / layers if layers else 0.0
    back = backward * mean * backward_layers + (forward if activation_checkpointing else 0.0)
    return forward, back


def fuses_elementwise(setup: ZeroSetup) -> bool:
    """Whether the step's element-wise chains run fused, one pass each (elementwise_bytes_per_token's `fused`):
    torch.compile's Inductor fuses pointwise ops into single kernels (Ansel et al., "PyTorch 2", ASPLOS 2024), at
    ZeRO-0, where no ZeRO hook splits the graph; DeepSpeed measured ZeRO1+Compile and ZeRO3+Compile no faster than
    eager ("ZeRO-3 includes many conditional branches ... it splits the computation into multiple graph segments",
    DeepSpeed's blogs/deepcompile: ZeRO1+Compile below ZeRO1+Eager), so there it is priced as eager. DeepCompile
    compiles the whole step with ZeRO's operations as graph ops: fused at every stage it runs."""
    return setup.compile == "deepcompile" or (setup.compile == "torch" and setup.zero_stage == 0)


def elementwise_bytes_per_token(model: ModelSpec, seq_len: int, precision: str, attention: str,
                                fused: bool = False) -> float:
    """Bytes one token's forward moves through HBM in element-wise work, all layers, from the transformers modules:

    - norms, per hidden element: LlamaRMSNorm in 16 bits casts to fp32 (read e, write 4), squares (4 + 4), means (4),
      scales (4 + 4), casts back (4 + e), multiplies by the weight (e + e): 20 + 4 + 4e + 4 = 36 bytes at e = 2, 28 in
      fp32 (no casts; the weight multiply 4 + 4); a LayerNorm is one fused kernel, read and write: 2e;
    - two residual adds a layer (read 2, write 1: 3e each, per hidden element);
    - rotary on q and k (apply_rotary_pos_emb: q * cos, rotate_half's negate and cat, * sin, add: 12e per element of
      q and k), for rotary models (not learned position tables, not ALiBi);
    - the MLP's activation (fused: 2e; UNFUSED_ACTIVATION_PASSES) and a gated MLP's gate * up (3e), per intermediate
      element of each routed expert; an MoE layer also copies every token in and out of its k experts (4e h k);
    - dropout where the config trains with it (read, write and a 1-byte mask per element): two on the residual
      branches;
    - eager attention, per score (all s keys): the score write and its read by the PV matmul (2e), scaling (2e), the
      mask (3e), softmax into fp32 and back (e + 4 + 4 + e), attention dropout (2e + 1).

    Under --liger-kernels on (ModelSpec.liger_kernels) Liger's Triton kernels replace three of these with one pass
    each (Liger-Kernel src/liger_kernel/ops): its RMSNorm reads x and writes y (2e; _rms_norm_forward_kernel), its
    rotary rewrites q and k in place (2e; _triton_rope), its SwiGLU/GEGLU reads gate and up and writes their product
    (3e; silu_mul / geglu forward), each per element (`fused`, a compiled step, fuses_elementwise: the same one pass
    each, what a fused kernel must read and write); backward keeps ELEMENTWISE_BACKWARD_BYTES (RMSNorm's reads dy,
    x and writes dx: 3e, 1.5x).
    """
    e = bytes_per_element(precision)
    h, layers = model.hidden_size, model.num_layers
    liger = model.liger_kernels or fused  # a compiled step fuses the same chains into one pass each
    if model.norm == "rmsnorm":
        norm = 2.0 * e if liger else 28.0 if e == 4 else 28.0 + 4 * e  # the two casts, the 16-bit weight multiply
    else:
        norm = 2.0 * e
    per_layer = model.norms_per_layer * norm * h + 2 * 3 * e * h
    if not model.learned_positions and model.supports_sdpa:  # rotary (BLOOM's ALiBi has no sdpa path and no rotary)
        per_layer += (2 if liger else 12) * e * (model.num_attention_heads + model.num_kv_heads) * model.head_dim
    inter = model.intermediate_size * model.experts_per_token
    passes = UNFUSED_ACTIVATION_PASSES.get(model.mlp_activation, 2)
    if liger and model.gated_mlp:
        per_layer += 3 * e * inter
    else:
        per_layer += passes * e * inter + (3 * e * inter if model.gated_mlp else 0)
    if model.num_experts > 1:
        per_layer += 4 * e * h * model.experts_per_token
    if model.hidden_dropout > 0:
        per_layer += 2 * (2 * e + 1) * h
    if attention == "eager":
        score = 2 * e + 2 * e + 3 * e + (e + 4 + 4 + e) + ((2 * e + 1) if model.attention_dropout > 0 else 0)
        per_layer += score * model.num_attention_heads * seq_len
    return layers * per_layer


def logit_bytes_per_token(model: ModelSpec, precision: str) -> float:
    """Bytes the loss moves per token over the vocabulary, forward and backward: transformers' ForCausalLMLoss upcasts
    the logits (read e, write 4), cross_entropy's log_softmax reads and writes them (4 + 4), its backward reads the
    output and the gradient and writes one (12), and the cast's backward writes the 16-bit gradient (4 + e).
    Liger's fused linear cross-entropy (--liger-kernels on) runs one kernel over each chunk of logits in forward:
    an online-softmax pass reads them, a second reads them again and writes the gradient in place
    (liger_cross_entropy_kernel): 3e; its backward only scales the gradients it kept."""
    e = bytes_per_element(precision)
    if model.liger_kernels:
        return model.vocab_size * 3.0 * e
    return model.vocab_size * (e + 4 + 8 + 12 + 4 + e)


def optimizer_bytes_per_param(optimizer: Optimizer, precision: str) -> float:
    """Bytes a GPU optimizer step moves per trainable parameter it updates: the fp32 master weight read and written
    (8), the optimizer's state read and written (2 x state_bytes: Adam's two moments, 16), the fp32 gradient read (4);
    in mixed precision the 16-bit gradient cast into fp32 (e + 4) and the updated master copied back to 16 bits
    (4 + e). DeepSpeed's FusedAdam is one pass over these (multi_tensor_adam)."""
    e = bytes_per_element(precision)
    moved = 8 + 2 * optimizer.state_bytes + 4
    if e != 4:
        moved += (e + 4) + (4 + e)
    return float(moved)


def gpu_compute(model: ModelSpec, acc: Accelerator, setup: ZeroSetup, seq_len: int, attention: str,
                optimizer: Optimizer, dense_flops_per_token: float, dense_forward_flops_per_token: float,
                zero_ranks: int, attention_span: int | None = None) -> GpuCompute:
    """One rank's compute per optimizer step (model: what the rank holds, an AutoTP shard; dense_flops_per_token:
    timing.flops_per_token at seq_len 0 plus what a tiled MLP recomputes; dense_forward_flops_per_token: its forward,
    2 per matmul weight; attention_span: Workload.attention_span, the keys a query reads at most). Tokens per rank:
    the micro batch's, less what Ulysses hands the other SP ranks (each rank then attends all s keys for its share of
    the heads: the same FLOPs as its share of the tokens over all heads)."""
    tokens = setup.micro_batch_size * seq_len / setup.sequence_parallel
    accum = setup.gradient_accumulation_steps
    peak = acc.peak_flops(setup.precision)
    matmul_rate = peak * acc.matmul_fraction
    attention_rate = peak * acc.attention_rate_fraction(attention)
    hbm = acc.hbm_gbps * 1e9
    grad_layers = backward_layers(model, setup.activation_checkpointing)
    span = attention_span or seq_len  # packed documents: the varlen kernel attends within each (Workload.doc_len)
    attn_fwd, attn_bwd = attention_flops_per_token(model, span, setup.activation_checkpointing, attention, grad_layers)
    dense_fwd = dense_forward_flops_per_token  # the rest of flops_per_token is backward and recompute
    dense_bwd = max(0.0, dense_flops_per_token - dense_fwd)
    element_fwd = elementwise_bytes_per_token(model, seq_len, setup.precision, attention, fuses_elementwise(setup))
    back_share = grad_layers / model.num_layers if model.num_layers else 0.0
    element_bwd = element_fwd * (ELEMENTWISE_BACKWARD_BYTES * back_share + (1 if setup.activation_checkpointing else 0))
    logits = logit_bytes_per_token(model, setup.precision)
    matmul = accum * tokens * (dense_fwd + dense_bwd) / matmul_rate
    attn = accum * tokens * (attn_fwd + attn_bwd) / attention_rate
    memory = accum * tokens * (element_fwd + element_bwd + logits) / hbm
    matmul_backward = accum * tokens * dense_bwd / matmul_rate
    backward = matmul_backward + accum * tokens * (attn_bwd / attention_rate + element_bwd / hbm)
    share = model.trainable / (zero_ranks if setup.zero_stage >= 1 else 1)
    opt = share * optimizer_bytes_per_param(optimizer, setup.precision) / hbm if setup.offload_optimizer == "none" else 0.0
    if setup.offload_engine == "zenflow":  # the top-k columns' Adam runs on the GPU every step (ZENFLOW)
        opt = ZENFLOW["topk_ratio"] * share * optimizer_bytes_per_param(optimizer, setup.precision) / hbm
    return GpuCompute(matmul, attn, memory, opt, backward, matmul_backward)


def exposed_communication(stage: int, overlap_comm: bool, gradient_seconds: float, parameter_seconds: float,
                          compute: GpuCompute, zero3_overlap: float = 1.0) -> float:
    """What of ZeRO's communication the step waits for, as DeepSpeed schedules it.

    Stage 0: the gradient all-reduce runs after backward (DeepSpeedEngine.allreduce_gradients), all of it exposed.
    Stages 1-2 with overlap_comm: each gradient bucket is reduced on a side stream while backward goes on
    (stage_1_and_2.py reduce_ipg_grads), hidden up to the backward's length; the updated partitions are gathered
    after the optimizer step, exposed. Stage 3 with overlap_comm: the next modules' parameters are prefetched while
    the current ones compute and the gradients reduce-scattered on a side stream (stage3.py, partitioned_param_
    coordinator.py), hidden up to zero3_overlap of the whole compute (TimeFit: the share that really hides, 1 in
    principle). Without overlap_comm every byte waits."""
    if not overlap_comm or stage == 0:
        return gradient_seconds + parameter_seconds
    if stage in (1, 2):
        return max(0.0, gradient_seconds - compute.backward_seconds) + parameter_seconds
    return max(0.0, gradient_seconds + parameter_seconds - zero3_overlap * compute.compute_seconds)


# Each fitted figure's bounds: a fit may not leave them (bench/fit_time.py searches inside them;
# tests/test_published_runs.py checks the committed figures). Where a bound is a physical fact it is cited; where it
# is a modelling choice it says so.
FIT_BOUNDS = {
    # MAMF is the best matmul a search over shapes reached: a model's own matmuls cannot beat it (1.0). Below ~115 of
    # A100's 312 TFLOP/s "suggests a problem" (EleutherAI, "Transformer Math 101"): 115 / 271.2 (A100 MAMF) = 0.42
    "matmul_efficiency": (0.42, 1.0),
    # the hidden size at which a model's matmuls reach half their large-shape rate: from none (0) to the corpus's
    # smallest model's hidden size (GPT-2 small, 768); a modelling bound
    "matmul_half_hidden": (0.0, 768.0),
    # the host (torch dispatch, DeepSpeed's hooks) was measured on one H200 node (16-core Xeon, torch 2.11, DeepSpeed
    # 0.19): other host CPUs and older torch / DeepSpeed releases run the same Python slower or faster; a modelling
    # bound, 2x faster to 3x slower
    "host_scale": (0.5, 3.0),
    # the share of compute ZeRO-3's prefetched gathers and side-stream reduce-scatters hide behind: a share
    "zero3_overlap": (0.0, 1.0),
    # NCCL's bus bandwidth over the catalog's link rates (ring_node_share across nodes): at most the links; a published
    # 2-node H100 all-reduce reached 90% of the rate the catalog's figures give (timing.ring_node_share); 40% is a
    # modelling floor for small buckets and contended fabrics
    "collective_efficiency": (0.4, 1.0),
    # DeepSpeedCPUAdam over the 2.5e9 params/s default (timing.DEFAULT_CPU_ADAM_PARAMS_PER_S, from the ZeRO-Offload
    # paper's 1B-parameter step of 0.22-0.44 s): host CPUs differ in cores and memory channels; a modelling bound
    "cpu_adam_scale": (0.25, 2.0),
    # the share of the datasheet's PCIe rate host-device copies reach: at most all of it; half is a modelling floor
    # (pageable rather than pinned buffers)
    "pcie_efficiency": (0.5, 1.0),
}


@dataclass(frozen=True)
class TimeFit:
    """The GPU time model's fitted figures (FIT_BOUNDS says what each means and bounds it). The defaults are first
    principles' answers: every matmul at MAMF, the host as measured, all of ZeRO-3's traffic hidden, the catalog's
    links, CPU Adam and PCIe at their published rates."""

    matmul_efficiency: dict = field(default_factory=dict)  # accelerator generation -> share of MAMF
    matmul_efficiency_pooled: float = 1.0  # a generation the fit never saw
    matmul_half_hidden: float = 0.0
    host_scale: float = 1.0
    zero3_overlap: float = 1.0
    collective_efficiency: float = 1.0
    cpu_adam_scale: float = 1.0
    pcie_efficiency: float = 1.0

    def matmul_share(self, generation: str, hidden_size: int) -> float:
        """The share of MAMF a model's matmuls reach: the generation's efficiency, less for small hidden sizes
        (h / (h + matmul_half_hidden): a GEMM's rate falls as its dimensions shrink below the tiles a GPU fills)."""
        eff = self.matmul_efficiency.get(generation, self.matmul_efficiency_pooled)
        return eff * hidden_size / (hidden_size + self.matmul_half_hidden) if hidden_size else eff

    def describe(self, parts: "GpuStepParts") -> str:
        """The figures that priced a step, in one line."""
        return (f"matmuls at {self.matmul_share(parts.generation, parts.hidden_size):.0%} of MAMF, host x"
                f"{self.host_scale:.2f}, NCCL at {self.collective_efficiency:.0%} of the links"
                + (f", ZeRO-3 traffic hidden behind {self.zero3_overlap:.0%} of compute" if parts.stage == 3 else "")
                + (f", CPU Adam x{self.cpu_adam_scale:.2f}, PCIe at {self.pcie_efficiency:.0%}"
                   if parts.cpu_adam_seconds or parts.pcie_seconds else ""))

    @classmethod
    def from_dict(cls, d: dict) -> "TimeFit":
        return cls(**{k: (dict(v) if isinstance(v, dict) else float(v)) for k, v in d.items()
                      if k in cls.__dataclass_fields__})

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@lru_cache(maxsize=1)
def time_fit() -> TimeFit:
    """The committed fit (zerokit/data/time_fit.json "figures", written by bench/fit_time.py); first principles'
    TimeFit() where none is bundled."""
    path = bundled_data("time_fit.json")
    return TimeFit.from_dict(json.loads(path.read_text())["figures"]) if path.exists() else TimeFit()


@dataclass(frozen=True)
class GpuStepParts:
    """A GPU step's parts at the published rates (MAMF, the catalog's links, the default CPU Adam and PCIe rates, the
    H200 host), before a TimeFit scales them: what bench/fit_time.py fits on and gpu_step combines."""

    generation: str
    hidden_size: int
    stage: int
    overlap_comm: bool
    compute: GpuCompute
    host_seconds: float
    gradient_comm_seconds: float  # ZeRO's gradient reduction, which may overlap compute
    parameter_comm_seconds: float  # ZeRO's parameter gathers
    sync_comm_seconds: float  # AutoTP's, Ulysses' and hpZ's intra-node collectives: waited for
    cpu_adam_seconds: float = 0.0
    pcie_seconds: float = 0.0  # offload's and checkpoint offload's host-device copies
    nvme_seconds: float = 0.0
    # DeepCompile schedules ZeRO-3's prefetches in its graph (its proactive prefetching pass): all of the traffic may
    # hide behind compute, whatever share eager ZeRO-3's hooks were fitted to hide
    scheduled_prefetch: bool = False
    offload_engine: str = "zero-offload"  # ZeroSetup.offload_engine: how the CPU's optimizer step meets the GPU's


@dataclass(frozen=True)
class GpuStep:
    """One optimizer step of one rank, its parts after the fit (seconds)."""

    matmul_seconds: float
    attention_seconds: float
    memory_seconds: float
    host_seconds: float
    optimizer_seconds: float
    communication_seconds: float  # what the step waits for
    communication_hidden_seconds: float
    offload_seconds: float

    @property
    def compute_seconds(self) -> float:
        return self.matmul_seconds + self.attention_seconds + self.memory_seconds + self.host_seconds

    @property
    def step_seconds(self) -> float:
        return self.compute_seconds + self.optimizer_seconds + self.communication_seconds + self.offload_seconds


# SuperOffload's GraceAdam "is 3x faster than PyTorch Adam ... and 1.3x faster than CPU-Adam" (DeepSpeed's
# blogs/deepspeed-superoffload)
GRACE_ADAM_OVER_CPU_ADAM = 1.3
# ZenFlow "≈ 2x lower PCIe traffic" than ZeRO-Offload (DeepSpeed's blogs/deepspeed-zenflow)
ZENFLOW_PCIE_SHARE = 0.5


def offload_step_seconds(parts: GpuStepParts, fit: TimeFit, device_seconds: float) -> float:
    """What the step waits for of the offloaded optimizer, by its engine (ZeroSetup.offload_engine):
    - ZeRO-Offload: DeepSpeedCPUAdam runs after backward while the GPU waits, and the copies cross PCIe: all of it;
    - ZenFlow (ZENFLOW, as render writes it): the CPU updates the other columns once every update_interval steps, in
      a worker beside the GPU's forward and backward (overlap_step): a step waits for what of its share outlasts the
      device's work; the copies are half ZeRO-Offload's (ZENFLOW_PCIE_SHARE); the top-k Adam is GPU work
      (gpu_compute's optimizer_seconds);
    - SuperOffload: GraceAdam (GRACE_ADAM_OVER_CPU_ADAM x CPU-Adam) runs beside the GPU's next step, rolled back if
      that step is skipped (SuperOffloadOptimizer_Stage3): what outlasts the device's work, plus the copies."""
    adam = parts.cpu_adam_seconds / fit.cpu_adam_scale
    pcie = parts.pcie_seconds / fit.pcie_efficiency
    if parts.offload_engine == "zenflow":
        adam = max(0.0, adam / ZENFLOW["update_interval"] - device_seconds)
        pcie *= ZENFLOW_PCIE_SHARE
    elif parts.offload_engine == "superoffload":
        adam = max(0.0, adam / GRACE_ADAM_OVER_CPU_ADAM - device_seconds)
    return adam + pcie + parts.nvme_seconds


def gpu_step(parts: GpuStepParts, fit: TimeFit) -> GpuStep:
    """The step a TimeFit makes of the priced parts: matmuls at the fitted share of MAMF, the host scaled, ZeRO's
    traffic at the fitted bus bandwidth and overlapping as exposed_communication schedules it, offload at the fitted
    CPU Adam and PCIe rates. TimeFit() gives the unfitted model."""
    c = parts.compute
    share = fit.matmul_share(parts.generation, parts.hidden_size)
    matmul = c.matmul_seconds / share
    scaled = replace(c, matmul_seconds=matmul,
                     backward_seconds=c.backward_seconds + c.matmul_backward_seconds * (1 / share - 1))
    bus = fit.collective_efficiency
    grads, params = parts.gradient_comm_seconds / bus, parts.parameter_comm_seconds / bus
    overlap = 1.0 if parts.scheduled_prefetch else fit.zero3_overlap
    exposed = exposed_communication(parts.stage, parts.overlap_comm, grads, params, scaled, overlap)
    offload = offload_step_seconds(parts, fit, scaled.compute_seconds)
    return GpuStep(matmul, c.attention_seconds, c.memory_seconds, parts.host_seconds * fit.host_scale,
                   c.optimizer_seconds, exposed + parts.sync_comm_seconds / bus, grads + params - exposed,
                   offload if math.isfinite(offload) else math.inf)
