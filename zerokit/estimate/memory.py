"""The memory model: every byte a ZeRO training job needs, as named terms.

Per GPU (or per rank on a CPU target), per node of host RAM, per node of NVMe. Each term is a
plain number of bytes with a name a DeepSpeed user recognises, so `plan` can show the breakdown and
`launch` can measure the same quantities.

Notation: Ψ = parameters, N = data-parallel ranks (GPUs per node x nodes), T = tokens per micro
batch (micro batch x sequence length), E = bytes of the training dtype (2 for bf16/fp16, 4 for fp32).

Sources (see docs/memory-model.md for the full derivation):
- Model states: ZeRO paper (Rajbhandari et al. 2020) with DeepSpeed's own estimator convention of
  18 bytes/param for mixed-precision Adam state (2 grads16 + 4 grads32 + 4 master + 8 Adam moments,
  deepspeed/runtime/zero/stage_1_and_2.py estimate_zero2_model_states_mem_needs). zerokit adds
  what the estimator leaves out: the 16-bit parameter partition at stage 3 (2Ψ/N), the buffers the
  config allocates, activations, logits, and the CUDA context.
- Buffers: reduce buckets allocated at full `reduce_bucket_size` elements whatever the model size,
  doubled with overlap_comm (stage_1_and_2.py setup_buckets; stage3.py ipg buffer).
- Activations: Korthikanti et al. 2022 per-layer accounting, re-derived per architecture from what
  autograd saves in HF's implementations (RMSNorm upcasts to fp32, gated MLP keeps four i-wide tensors).
- Phases (phase_terms): the per-rank peak is the largest of four points of a step (start of backward,
  recompute, end of backward, optimizer step), each with only the terms live there, as measured per
  phase on real DeepSpeed runs (bench/accuracy, bench/results/accuracy_cpu.txt).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from zerokit.core.errors import ZerokitError
from zerokit.core.memo import by_identity
from zerokit.core.options import flag
from zerokit.core.units import GiB, MiB
from zerokit.estimate.reserved import CUDA_CONTEXT_BYTES as RESERVED_CUDA_CONTEXT_BYTES
from zerokit.estimate.reserved import ReservedEstimate, reserved_estimate
from zerokit.spec.hardware import Cluster
from zerokit.spec.liger import liger_limit_problem
from zerokit.spec.model import ModelSpec, gradient_sizes_in_backward_order, trainable_gradient_sizes
from zerokit.spec.optimizer import ADAMW, Optimizer, optimizer_named, step_optimizer
from zerokit.spec.setup import QWZ_BYTES_PER_ELEMENT, Workload, ZeroKnobs, ZeroSetup, bytes_per_element


# The fit's allowance for the CUDA context: no allocation of torch's, so not in max_memory_allocated, but on the GPU.
# Planners in the field add 0.65-1 GB (docs/memory-model.md, the `cuda_context` term);
# measured on an H200 in real DeepSpeed jobs, 1.29-1.68 GiB (estimate/reserved.py): the measured central figure.
CUDA_CONTEXT_BYTES = RESERVED_CUDA_CONTEXT_BYTES[0]
# torch's cuBLAS workspace, allocated through the caching allocator (so inside max_memory_allocated) once per cuBLAS
# handle and stream, at the first GEMM: measured 33,554,432 B on an H200 (torch 2.11: 96 MiB allocated after a first
# bf16 GEMM of two 32 MiB inputs into a 32 MiB output). Pre-Hopper GPUs get less by torch's defaults; the H200's
# figure is kept as the bound.
CUBLAS_WORKSPACE_BYTES = 32 * MiB
# Fraction of device memory a plan may use; the rest absorbs allocator fragmentation
# (Colossal-AI's planner uses 0.95).
DEFAULT_MEMORY_FRACTION = 0.95
# DeepSpeed's estimator multiplies host-side state by 1.5 for pinned/staging buffers
# (additional_buffer_factor in estimate_zero2/3_model_states_mem_needs).
HOST_BUFFER_FACTOR = 1.5
# ZeRO-Infinity swap buffers in pinned host memory per rank (DeepSpeed defaults:
# offload_param.buffer_count 5 x buffer_size 1e8 elements).
PARAM_SWAP_BUFFER_ELEMENTS = 5 * 100_000_000


def dtype_bytes(precision: str) -> int:
    return bytes_per_element(precision)


@dataclass
class MemoryEstimate:
    """Named byte counts. per_gpu holds the terms live at the peak phase (they sum to the peak);
    phases gives every phase's total (see phase_terms), peak_phase names the largest."""

    per_gpu: dict[str, int] = field(default_factory=dict)
    per_node_cpu: dict[str, int] = field(default_factory=dict)
    nvme: dict[str, int] = field(default_factory=dict)  # per node
    notes: list[str] = field(default_factory=list)
    phases: dict[str, int] = field(default_factory=dict)
    peak_phase: str = ""
    phase_terms: dict[str, dict[str, int]] = field(default_factory=dict)
    # what nvidia-smi will show beyond the allocated peak (reserved.py); None on CPU. Read it as nvidia_smi.
    reserved: ReservedEstimate | None = None
    # share of the parameter-shaped terms that belongs to trainable weights (0..1; trainable_split)
    trainable_fraction: dict[str, float] = field(default_factory=dict)
    # what stops the step whatever the memory, one line each: a kernel's 32-bit offsets (spec/liger.py); fit_problems
    # lists them first
    kernel_limits: list[str] = field(default_factory=list)
    # pipeline stages (estimate/pipeline.py): every stage's per-GPU total, stage 0 first; the figures above are the
    # largest stage's. Empty without stages
    stage_totals: list[int] = field(default_factory=list)

    def trainable_split(self, terms: dict[str, int]) -> dict[str, dict[str, int]]:
        """Every term as {"trainable", "frozen", "other"} bytes: what belongs to trainable weights (their gradients,
        master copy, optimizer states and step temporaries, their share of the weights), to frozen weights (the
        rest of the weights), and to neither (activations, logits, buffers, context). A full fine-tune has nothing
        frozen."""
        out = {}
        for name, nbytes in terms.items():
            share = self.trainable_fraction.get(name)
            if name in TRAINABLE_ONLY_TERMS:
                share = 1.0
            if share is None:
                out[name] = {"trainable": 0, "frozen": 0, "other": nbytes}
            else:
                t = round(nbytes * share)
                out[name] = {"trainable": t, "frozen": nbytes - t, "other": 0}
        return out

    @property
    def per_gpu_total(self) -> int:
        return sum(self.per_gpu.values())

    @property
    def nvidia_smi(self) -> ReservedEstimate | None:
        """What nvidia-smi will show: a separate figure, not what the fit is judged on. Rebased on the current
        allocated peak (a traced refinement may replace terms after estimate_memory) less the fit's own
        cuda_context allowance (the estimate has its own context term)."""
        if self.reserved is None:
            return None
        return self.reserved.rebased(self.per_gpu_total - self.per_gpu.get("cuda_context", 0))

    @property
    def per_node_cpu_total(self) -> int:
        return sum(self.per_node_cpu.values())

    @property
    def nvme_total(self) -> int:
        return sum(self.nvme.values())

    def to_dict(self) -> dict:
        smi = self.nvidia_smi
        return {
            "per_gpu": {"total_bytes": self.per_gpu_total, "terms": dict(self.per_gpu),
                        "trainable_split": self.trainable_split(self.per_gpu),
                        **(smi.to_dict() if smi else {})},
            "per_node_cpu": {"total_bytes": self.per_node_cpu_total, "terms": dict(self.per_node_cpu),
                             "trainable_split": self.trainable_split(self.per_node_cpu)},
            "nvme_per_node": {"total_bytes": self.nvme_total, "terms": dict(self.nvme)},
            "phases": dict(self.phases),
            "phase_terms": {k: dict(v) for k, v in self.phase_terms.items()},
            "peak_phase": self.peak_phase,
            "notes": list(self.notes),
            **({"stage_totals_bytes": list(self.stage_totals)} if self.stage_totals else {}),
        }


# Terms that exist for trainable parameters only (DeepSpeed's optimizer holds no state for frozen ones): the whole of
# each is "trainable" in MemoryEstimate.trainable_split.
TRAINABLE_ONLY_TERMS = frozenset({
    "gradients", "tiled_loss_head_grad", "master_weights", "optimizer_states", "fp32_gradients", "optimizer_step_temporaries",
    "fp16_flatten_copies", "gradient_flat_copy", "optimizer_states_offloaded", "fp32_gradients_offloaded", "offload_param_partition",
    "offload_grad_buffer", "optimizer_swap_buffers", "bf16_optimizer_grad_accum", "reduce_gradient", "reduce_comm_cast", "tiled_mlp_weight_grads",
    "reduce_scatter_flat", "reduce_scatter_gloo_copy"})

# The per-GPU terms that DeepSpeed's estimator calls "model states".
MODEL_STATE_TERMS = ("parameters", "gradients", "master_weights", "optimizer_states", "fp32_gradients",
                     "stage3_gathered_params")


def model_state_bytes_per_param(precision: str, optimizer: Optimizer = ADAMW) -> dict[str, int]:
    """Bytes per parameter of each model-state tensor before partitioning.

    Mixed precision: 16-bit params and grads, fp32 master copy, the optimizer's state (spec/optimizer.py: Adam's m and
    v, 8), and the fp32 gradient partition DeepSpeed materialises for the step (its estimator's 18 = 2+4+4+8 beyond
    the params, with Adam). fp32: params, grads, the optimizer's state; ZeRO stages >= 1 also clone an fp32 master
    partition (stage_1_and_2.py single_partition_of_fp32_groups is a .clone() even for fp32 models).
    """
    if precision == "fp32":
        return {"parameters": 4, "gradients": 4, "master_weights": 4, "optimizer_states": optimizer.state_bytes,
                "fp32_gradients": 0}
    return {"parameters": 2, "gradients": 2, "master_weights": 4, "optimizer_states": optimizer.state_bytes,
            "fp32_gradients": 4}


def activation_bytes_per_layer(model: ModelSpec, tokens: int, seq_len: int, precision: str, attention: str,
                               on_cpu: bool = False, explicit_mask: bool | None = None) -> int:
    """Bytes autograd keeps for one transformer layer's backward, for `tokens` = micro batch x seq.

    Derived from what HF's implementations save (names in comments), not copied from GPT-3's 34sbh,
    and checked against FakeTensorMode traces of the real modules (tests/test_activation_trace.py,
    bench/results/activation_trace.txt):
    - norms (model.norms_per_layer of them: 1 in a parallel attention + MLP block): RMSNorm (Llama
      family) upcasts to fp32 and saves the fp32 input (4h), the 16-bit cast (E h) and its output for
      the next Linear (E h); in fp32: input, normalised input, output (12h). Gemma's RMSNorm multiplies
      by (1 + w) in fp32 before the cast: the fp32 normalised input (4h) instead of the cast (E h).
      LayerNorm (GPT-2 family) saves its input (E h), output (E h) and mean/rstd per token.
    - attention: q, k, v as the attention kernel saves them (E (a + 2k) d) and the kernel output
      (E h), which o_proj saves too when the kernel writes it in (b, s, a, d) layout (flash kernels
      follow q's layout: after partial rotary's torch.cat (Phi) q is (b, a, s, d) and o_proj gets a
      copy: + E h); a fp32 log-sum-exp per head. Eager attention repeats K/V to all
      heads and keeps the fp32 softmax output and its cast ((4 + E) a s per token; Korthikanti's 5as^2b).
    - explicit mask with sdpa (the model's sliding window when seq_len >= window, or Falcon's
      always-built mask): HF's sdpa path repeats K/V to all heads (+ 2 E (a - k) d) and the kernel
      saves the bool mask converted to the query dtype, one per layer (+ E s per token; CPU flash and
      CUDA mem-efficient alike). `explicit_mask` None: whether the model's most expensive layer has one.
    - K/V heads broadcast into sdpa without enable_gqa (Falcon MQA): no fused kernel accepts unequal
      head counts (torch 2.13 sdp_utils_cpp.h check_batch_size_and_num_heads_dense, CPU and CUDA), so the
      math kernel runs: fp32 q/k/v (4 (a + 2k) d; K/V copied to all heads for a micro batch > 1), fp32
      probabilities (4 a s), no output or log-sum-exp kept; o_proj saves its own E h copy.
    - dropout masks: a bool (1 byte) per element on GPUs; on CPU torch keeps a mask in the input's
      dtype (E bytes; traced: resid dropout adds 2 E h per token).
    - attention dropout: eager adds the mask and dropped probabilities (mask + E bytes per score); sdpa
      with dropout on CPU falls back to the math kernel, measured at 12 bytes per score plus fp32 q/k/v
      copies (torch 2.13);
      on GPUs flash attention regenerates the mask and keeps nothing extra.
    - MLP: gated (gate out, act(gate), up out, product: 4 E i) or plain (fc out and act out: 2 E i;
      ReLU's backward reads its own output, which the next Linear keeps anyway: E i), plus three
      i-wide intermediates when the activation is a Python tanh-GELU (gelu_new, gelu_fast).
    - residual dropout: a mask per branch (2h masks per token).
    - q_norm / k_norm on the projected queries and keys (Qwen3, Gemma 3): _head_norm_bytes_per_token.
    """
    e = dtype_bytes(precision)
    mask = e if on_cpu else 1  # bytes per dropout-mask element
    h = model.hidden_size
    a, k, d = model.num_attention_heads, model.num_kv_heads, model.head_dim
    per_token = model.norms_per_layer * _norm_bytes_per_token(model, precision)
    if model.norm == "layernorm" or precision == "fp32" or model.liger_kernels:
        # norms reading one tensor (a parallel block's two) keep it once: LayerNorm saves its input, an
        # fp32 RMSNorm too (its .to(float32) is a no-op), Liger's RMSNorm too; a mixed-precision RMSNorm keeps its own
        # fp32 copy
        per_token -= (model.norms_per_layer - model.norm_inputs_per_layer) * e * h
    scores = a * seq_len  # attention scores per token
    if explicit_mask is None:
        explicit_mask = _masked_layers(model, seq_len) > 0
    if attention == "eager":
        # HF's eager path repeats K/V to every head (repeat_kv) and keeps the fp32 softmax output
        # plus its cast back to the training dtype for the second matmul.
        per_token += e * 3 * a * d + e * h
        per_token += (4 + (e if precision != "fp32" else 0)) * scores
        if model.attention_dropout > 0:
            per_token += (mask + e) * scores
    elif attention == "sdpa" and sdpa_runs_math_kernel(model, precision, on_cpu, explicit_mask):
        # math kernel (attention.cpp _scaled_dot_product_attention_math): q/k/v upcast to fp32 and
        # scaled, softmax kept in fp32 for the probabilities @ v matmul; o_proj's input is a copy.
        # torch.matmul broadcasts K/V over the heads as a stride-0 view for one sequence, but copies
        # them to every head for a micro batch > 1 (the (b, a) dims cannot be folded into one).
        # Traced (falcon-7b, seq 2048, micro batch 1): 700,292 B/token per layer, exactly this.
        # enable_gqa: the math kernel repeats K/V to every head (repeat_interleave: copies, any micro batch)
        kv = k if tokens == seq_len and model.sdpa_broadcast_kv else a
        per_token += 4 * (a + 2 * kv) * d + 4 * scores + e * h
    else:
        # the kernel's output, (b, s, a, d): a d wide, the hidden size except where heads x head_dim differ from it
        # (Gemma-2-9B) or the heads are split (an AutoTP rank: tp_shard; measured, bench/results/accuracy_cpu_parallel.txt)
        per_token += e * (a + 2 * k) * d + e * a * d
        per_token += 4 * a
        if model.attention_output_copy:
            per_token += e * a * d
        if model.fused_qkv_kept:
            # v, a view of the fused projection's output, keeps all of it: the q and k parts too (traced phi-3-mini)
            per_token += e * (a + k) * d
        if attention == "sdpa" and explicit_mask:
            # integrations/sdpa_attention.py: use_gqa_in_sdpa() is False with a mask on CUDA/CPU, so
            # repeat_kv; the kernel keeps the mask it converted from bool (traced: mistral-7b, s 4096)
            per_token += e * 2 * (a - k) * d + e * seq_len
        if model.attention_dropout > 0 and on_cpu:
            # math kernel: 12 bytes per score; bf16 adds fp32 copies of q/k/v (6h), fp32 keeps one
            # h-wide tensor fewer than the flash path; no log-sum-exp. Measured on real tensors with
            # zerokit.measure.meter (GPT-2 shapes, seq 128 and 512): 12.0 B/score + 6h (bf16) / -4h (fp32) - 4a.
            per_token += 12 * scores + (-4 if precision == "fp32" else 6) * h - 4 * a
    # a norm whose output no Linear reads (Gemma 2/3's post-norms into the residual add, Olmo 2's hidden-size q_norm into
    # the rotary embedding) keeps no output: traced, exact per layer
    per_token -= model.norm_outputs_unkept * e * h
    per_token += _head_norm_bytes_per_token(model, precision)
    per_token += _mlp_bytes_per_token(model, precision)
    if model.num_experts > 1:
        per_token += 4 * model.num_experts  # router logits (fp32)
        # each routed token's copy of its hidden state that the expert's first matmul keeps, and the expert's output the
        # routing-weight multiply keeps, with two int64 indices (transformers 5.23 MixtralExperts.forward:
        # `current_state = hidden_states[token_idx]`, `current_hidden_states * top_k_weights[token_idx, top_k_pos, None]`;
        # integrations/moe.py grouped_mm_experts_forward: `hidden_states[perm // num_top_k]`, `proj_out *
        # sample_weights_g`, perm and inv_perm). Traced: Mixtral and Qwen3-MoE layers (tests/test_activation_trace.py)
        per_token += model.experts_per_token * (2 * e * h + 16)
    if model.hidden_dropout > 0:
        per_token += 2 * h * mask
    return per_token * tokens


def sdpa_runs_math_kernel(model: ModelSpec, precision: str, on_cpu: bool, explicit_mask: bool) -> bool:
    """Whether sdpa falls back to torch's math kernel (fp32 scores kept, K/V copied; see activation_bytes_per_layer):
    - K/V heads broadcast without enable_gqa (Falcon MQA, model.sdpa_broadcast_kv): no fused kernel takes them;
    - on CUDA, grouped K/V heads in fp32: transformers passes enable_gqa=True when there is no mask
      (integrations/sdpa_attention.py use_gqa_in_sdpa), flash attention takes only fp16/bf16 and the memory-efficient
      kernel no grouped heads (torch sdp_utils.cpp: check_batch_size_and_num_heads_dense<false> in its constraints),
      so math runs and repeats K/V to every head (repeat_interleave). Measured on an H200 (torch 2.11, Llama 16/4
      heads, fp32, ZeRO-1): the flash-style rule predicted 27% under the allocated peak, this one 2.6%
      (bench/results/accuracy_h200.txt). CPU's flash kernel takes fp32 and the grouped heads: the CPU grid
      (bench/results/accuracy_cpu.txt) measures no score-sized tensor there."""
    if model.sdpa_broadcast_kv:
        return True
    grouped = model.num_kv_heads < model.num_attention_heads and model.head_dim <= 256
    return not on_cpu and precision == "fp32" and grouped and not explicit_mask


def _masked_layers(model: ModelSpec, seq_len: int) -> int:
    """Decoder layers for which transformers hands sdpa an explicit mask: every layer of Falcon; the
    sliding-window layers once the keys reach the window (masking_utils._ignore_causal_mask_sdpa does not
    skip the mask when kv_length >= window; traced: window 256 at seq 256 masks, at seq 255 not)."""
    if model.sdpa_mask:
        return model.num_layers
    if model.sliding_window is not None and seq_len >= model.sliding_window:
        return min(model.sliding_window_layers, model.num_layers)
    return 0


def _mlp_bytes_per_token(model: ModelSpec, precision: str) -> int:
    """What the MLP (experts_per_token experts for MoE) keeps per token (see activation_bytes_per_layer)."""
    e = dtype_bytes(precision)
    i = model.intermediate_size
    experts = model.experts_per_token if model.num_experts > 1 else 1
    if model.gated_mlp and model.liger_kernels:
        # Liger's SwiGLU/GEGLU (LigerSiLUMulFunction.forward: ctx.save_for_backward(a, b), the activation recomputed in
        # its backward kernel): gate out and up out, and the product down_proj keeps
        return 3 * e * i * experts
    if model.gated_mlp:
        mlp = 4 * e * i
    else:
        mlp = (1 if model.mlp_activation == "relu" else 2) * e * i
    if model.mlp_activation in PYTHON_GELUS:
        mlp += 3 * e * i
    return mlp * experts


# HF activations implemented as Python expressions: autograd keeps their intermediates.
PYTHON_GELUS = frozenset({"gelu_new", "gelu_fast"})


def _norm_bytes_per_token(model: ModelSpec, precision: str) -> int:
    """What one RMSNorm / LayerNorm keeps per token (see activation_bytes_per_layer)."""
    e = dtype_bytes(precision)
    h = model.hidden_size
    if model.norm == "rmsnorm" and model.liger_kernels:
        # Liger's RMSNorm (ops/rms_norm.py LigerRMSNormFunction.forward: ctx.save_for_backward(X, W, RSTD)): its input as
        # it came, a fp32 rstd per row (rms_norm_forward: rstd_dtype fp32 in the llama and gemma casting modes), and the
        # output the next Linear keeps. Under checkpointing the first norm's input is the checkpointed layer input
        # (activation_terms counts it there)
        return 2 * e * h + 4
    if model.norm == "rmsnorm":
        if precision == "fp32":
            return 12 * h + 4  # input, normalised input, output
        # mixed: fp32 input copy, the 16-bit cast the weight multiplies (Llama) or the fp32 normalised
        # input when the weight multiplies in fp32 (Gemma: traced 10h + 4 in bf16), the output
        return (4 + (4 if model.norm_fp32_weight else e) + e) * h + 4
    # input, output, mean and rstd (in the input's dtype on CPU; fp32 on CUDA: 4 bytes more in 16-bit)
    return 2 * e * h + 2 * e


def _head_norm_bytes_per_token(model: ModelSpec, precision: str) -> int:
    """What the q_norm / k_norm of one layer keep per token (model.head_norm_elements normalised in head_norm_rows
    vectors): an RMSNorm's saves less its output, which the rotary embedding after it does not keep (q * cos saves cos;
    rotate_half saves nothing): the fp32 input copy and the cast the weight multiplies (Gemma: the fp32 normalised
    input), in fp32 the input and the normalised input, a fp32 rsqrt per vector; Liger's RMSNorm its input and rstd.
    Traced (tests/test_activation_trace.py, Qwen3 with 8 heads, 2 KV heads, head dim 64): 3,880 B per token per layer
    in bf16, 5,160 in fp32, which the analytic model missed before."""
    n, rows = model.head_norm_elements, model.head_norm_rows
    if not n:
        return 0
    e = dtype_bytes(precision)
    if model.liger_kernels:
        per_element = e
    elif precision == "fp32":
        per_element = 8
    else:
        per_element = 4 + (4 if model.norm_fp32_weight else e)
    return per_element * n + 4 * rows


def _is_finetune_layout(model: ModelSpec) -> bool:
    """Whether the spec carries a fine-tune's module layout (with_finetune) that changes what autograd saves."""
    t = model.trained
    return bool(t.lora_r or any(t.frozen_slots) or t.frozen_norms or t.frozen_final_norm or t.frozen_head
                or t.grad_start_layer or t.grad_start_partial)


def _frozen_norm_delta(model: ModelSpec, precision: str, width: int | None = None) -> int:
    """What one norm no longer saves per token when its weight is frozen: RMSNorm's `weight * hidden.to(dtype)` saves
    the normalised input only for the weight's gradient (torch's mul backward saves `other` only when `self` needs a
    gradient: autograd codegen's should_compute_output; measured with zerokit.measure.meter, tests/test_finetune_model.py):
    its 16-bit cast (E h), Gemma's fp32 normalised input (4 h), in fp32 the normalised input (4 h). LayerNorm's
    native_layer_norm saves input, mean and rstd for the input's gradient anyway, and so does Liger's RMSNorm (an
    autograd.Function saves its tensors whenever any input needs a gradient): nothing. `width`: the elements it
    normalises per token (default the hidden size; the q/k norms' head_norm_elements)."""
    if model.norm != "rmsnorm" or model.liger_kernels:
        return 0
    e = dtype_bytes(precision)
    width = model.hidden_size if width is None else width
    if precision == "fp32" or model.norm_fp32_weight:
        return -4 * width
    return -e * width


def _norm_input_side(model: ModelSpec, precision: str, weight_frozen: bool) -> int:
    """What a norm saves per token only because its INPUT needs a gradient (a layer whose input has none skips it):
    RMSNorm's fp32 input copy (the pow's input; in fp32 the input itself) and rsqrt (4 h + 4); LayerNorm's input, mean
    and rstd, which native_layer_norm saves whenever anything needs a gradient (its weight included); Liger's RMSNorm
    likewise (its input and rstd)."""
    e = dtype_bytes(precision)
    h = model.hidden_size
    if model.liger_kernels:
        return e * h + 4 if weight_frozen else 0
    if model.norm == "rmsnorm":
        return 4 * h + 4
    return e * h + 2 * e if weight_frozen else 0


def finetune_layer_delta(model: ModelSpec, precision: str, attention: str, on_cpu: bool = False) -> int:
    """Bytes per token one decoder layer saves under the fine-tune's layout (model.lora_*, frozen_*) beyond what
    activation_bytes_per_layer counts for a full fine-tune. Measured on real modules with zerokit.measure.meter
    (tests/test_finetune_model.py, bench/results/finetune_memory.txt):
    - a frozen weight's matmul does not save its input: autograd saves mm/addmm's mat1 only when mat2 (the weight)
      needs a gradient (codegen's `if (grad_fn->should_compute_output(1))`; bitsandbytes' MatMul4Bit saves only the
      packed weight: `ctx.tensors = (None, B)`). A Linear input is then dropped unless something else keeps it: a
      trainable base weight reading it, a LoRA adapter without dropout (lora_A saves x), the attention kernel (sdpa/flash
      keep their output, which o_proj reads), ReLU (its backward reads its output).
    - frozen norm weights: _frozen_norm_delta per norm.
    - per adapted Linear (peft lora/layer.py Linear.forward: `result + lora_B(lora_A(dropout(x))) * scaling`): lora_B
      saves lora_A's r-wide output (r E); with lora_dropout > 0 each adapter has its own dropout: its output (E x in)
      saved by lora_A and its mask (E bytes per element on CPU, a bool on GPUs; see the dropout rule above), and x
      itself is no longer saved by the adapter. The scaling multiply by a Python float and the add save nothing.
    """
    e = dtype_bytes(precision)
    mask = e if on_cpu else 1
    h, i = model.hidden_size, model.intermediate_size
    experts = model.experts_per_token if model.num_experts > 1 else 1
    widths = (h, model.num_attention_heads * model.head_dim, h, i * experts)
    math_kernel = attention == "sdpa" and sdpa_runs_math_kernel(model, precision, on_cpu, False)
    kernel_keeps_output = attention != "eager" and not model.attention_output_copy and not math_kernel
    kept_anyway = (False, kernel_keeps_output, False, model.mlp_activation == "relu")
    adapters, frozen = model.trained.lora_slots, model.trained.frozen_slots
    dropout = model.trained.lora_dropout > 0
    saved = [not frozen[k] or (adapters[k] > 0 and not dropout) or kept_anyway[k] for k in range(4)]
    if model.norms_per_layer == 1:  # a parallel block's one norm output feeds attention and MLP: one tensor
        saved[0] = saved[2] = saved[0] or saved[2]
    delta = 0
    for k in range(4):
        if not saved[k] and not (k == 2 and model.norms_per_layer == 1):
            delta -= e * widths[k]
    if model.trained.frozen_norms:
        # the q/k norms' weights are frozen with the others: per element as a hidden-size norm's
        delta += model.norms_per_layer * _frozen_norm_delta(model, precision)
        delta += _frozen_norm_delta(model, precision, model.head_norm_elements)
    r = model.trained.lora_r
    for k in range(4):
        delta += adapters[k] * r * e
        if dropout:
            delta += adapters[k] * widths[k] * (e + mask)
    return delta


def finetune_partial_layer_delta(model: ModelSpec, precision: str, attention: str, on_cpu: bool,
                                 layer_bytes_per_token: int) -> int:
    """Bytes per token the first trainable layer saves less when its input has no gradient (frozen embeddings,
    model.trained.grad_start_partial): autograd records an op only when an input needs a gradient, so its first norm keeps only
    what its weight's gradient or a consumer needs (_norm_input_side), and when nothing in its attention or first norm
    trains, the attention block and the second norm's input side save nothing either."""
    e = dtype_bytes(precision)
    mask = e if on_cpu else 1
    delta = -_norm_input_side(model, precision, model.trained.frozen_norms)
    if model.trained.lora_dropout > 0 and model.trained.frozen_norms:
        # the attention input's adapters drop out a tensor with no gradient: native_dropout is not recorded, so no
        # mask is kept (lora_A still saves the dropped-out copy for its weight's gradient). Measured (meter, tiny-llama)
        delta -= model.trained.lora_slots[0] * model.hidden_size * mask
    if not model.trained.grad_start_attention:
        norms = model.norms_per_layer * _norm_bytes_per_token(model, precision)
        mlp = _mlp_bytes_per_token(model, precision) + (4 * model.num_experts if model.num_experts > 1 else 0)
        drop = 2 * model.hidden_size * mask if model.hidden_dropout > 0 else 0
        attention_part = layer_bytes_per_token - norms - mlp - drop
        delta -= attention_part + (model.hidden_size * mask if model.hidden_dropout > 0 else 0)
        if model.norms_per_layer > 1:
            delta -= _norm_input_side(model, precision, model.trained.frozen_norms)
    return delta


def final_norm_bytes_per_token(model: ModelSpec, precision: str) -> int:
    """The final norm's saved bytes per token: as a decoder norm (_norm_bytes_per_token), less its cast when its weight
    is frozen and its output when the LM head's weight is frozen (the head's matmul saves its input only for its weight's
    gradient: the rule of finetune_layer_delta)."""
    b = _norm_bytes_per_token(model, precision)
    if model.trained.frozen_final_norm:
        b += _frozen_norm_delta(model, precision)
    if model.trained.frozen_head:
        b -= dtype_bytes(precision) * model.hidden_size
    return b


def activation_terms(model: ModelSpec, setup: ZeroSetup, workload: Workload, on_cpu: bool = False) -> dict[str, int]:
    """Activations, logits and loss for one micro batch, per GPU.

    With math-kernel attention (sdpa_runs_math_kernel: Falcon's MQA; grouped heads in fp32 on CUDA) the step's peak is not at
    the start of backward but in the last layer's attention backward: `attention_backward` is what it
    adds on top of the start of backward (activations + logits_and_loss + logits_grad), 0 otherwise.
    """
    e = dtype_bytes(setup.precision)
    seq = workload.seq_len
    sp = setup.sequence_parallel
    # Ulysses: each rank holds seq / sp tokens of every sequence outside attention (and 1/sp of the heads over the
    # whole sequence inside it: the same bytes per rank); see sequence_parallel_view
    tokens = setup.micro_batch_size * seq // sp
    # an architecture transformers has no sdpa/flash path for runs eager attention whatever was asked
    attention = workload.attention if model.supports_sdpa else "eager"
    if sp > 1:
        model = sequence_parallel_view(model, sp)

    def layer(explicit_mask: bool) -> int:
        return activation_bytes_per_layer(model, tokens, seq, setup.precision, attention, on_cpu, explicit_mask)

    masked = _masked_layers(model, seq)
    unmasked_layer = layer(False)
    masked_layer = layer(True) if masked else unmasked_layer
    one_layer = max(masked_layer, unmasked_layer)  # what one recomputed layer costs at most
    all_layers = masked * masked_layer + (model.num_layers - masked) * unmasked_layer
    terms: dict[str, int] = {}
    final_norm = tokens * final_norm_bytes_per_token(model, setup.precision)
    if _is_finetune_layout(model):
        delta = tokens * finetune_layer_delta(model, setup.precision, attention, on_cpu)
        one_layer += delta
        if setup.activation_checkpointing:
            pass  # enable_input_require_grads: every layer's input has a gradient (below)
        else:
            # layers before the first trainable parameter save nothing (no gradient flows there)
            start = min(model.trained.grad_start_layer, model.num_layers)
            all_layers -= start * unmasked_layer
            all_layers += (model.num_layers - start) * delta
            if model.trained.grad_start_partial and start < model.num_layers:
                all_layers += tokens * finetune_partial_layer_delta(model, setup.precision, attention, on_cpu,
                                                                    unmasked_layer // tokens)
    merged = model.trained.merged_params_per_layer * e
    if merged:
        # LoRA on fused MoE experts: each layer's forward makes W + scaling B A of the adapted expert stacks in the
        # training dtype (peft lora/layer.py ParamWrapper._activate_lora), which the experts' matmuls save for backward:
        # kept by every layer a gradient reaches, or by the one recomputed layer under checkpointing
        one_layer += merged
        if not setup.activation_checkpointing:
            all_layers += (model.num_layers - min(model.trained.grad_start_layer, model.num_layers)) * merged
    if setup.tiled_mlp:
        # TiledMLP (ulysses_sp.py) runs the MLP under no_grad one slice at a time and saves only its input (the second
        # norm's output, which the norm's bytes count as the next Linear's): the MLP's intermediates are not kept
        if _is_finetune_layout(model):
            raise ZerokitError(f"{flag('tiled-mlp')} is modelled for full fine-tunes: drop it, or use "
                               f"{flag('finetune')} full")
        mlp = tokens * _mlp_bytes_per_token(model, setup.precision)
        one_layer -= mlp
        all_layers -= model.num_layers * mlp
        terms_mlp_backward = tiled_mlp_backward_bytes(model, setup, tokens, seq // sp)
    if setup.activation_checkpointing:
        # HF gradient checkpointing keeps each layer's input, then recomputes one layer at a time. With it
        # transformers calls enable_input_require_grads() (modeling_utils.activation_checkpointing_enable, for every
        # model whose main input is input_ids): the embedding output needs a gradient, so every layer is checkpointed
        # and recomputed whole even when the embeddings and first layers are frozen (use_reentrant=False by default).
        terms["activations_checkpoints"] = model.num_layers * tokens * model.hidden_size * e
        if setup.checkpoint_offload and not on_cpu:
            # the offloaded inputs live in host memory (estimate_memory: activation_checkpoints_offloaded); the GPU
            # keeps checkpoint_offload_gpu_layers of them. On a CPU rank host memory is its memory: the bytes stay.
            kept = min(model.num_layers, checkpoint_offload_gpu_layers(workload))
            terms["activations_checkpoints"] = kept * tokens * model.hidden_size * e
        if model.liger_kernels:
            # Liger's first norm saves its input as it came: the checkpointed layer input, counted above (non-reentrant
            # checkpointing hands the recompute the saved input itself, torch.utils.checkpoint _NoopSaveInputs)
            one_layer -= tokens * model.hidden_size * e
        terms["activations_recompute"] = one_layer + final_norm
    else:
        terms["activations"] = all_layers + final_norm
    # Logits as the LM head writes them (E) and the fp32 tensor the HF loss keeps (upcast /
    # log-softmax); the start of backward adds the fp32 gradient of the logits and, in mixed
    # precision, its cast back to E. Measured: traces of Llama configs under FakeTensorMode give
    # exactly 6V (bf16) / 8V (fp32) bytes per token kept, plus 6V / 4V in backward.
    v = model.vocab_size
    # a loop that keeps only the loss (Workload.outputs_held off): the LM head's logits are gone before backward; the
    # log-softmax output the loss saved stays (4 bytes each, the fp32 upcast of bf16 logits freed with them)
    terms["logits_and_loss"] = tokens * v * ((e if workload.outputs_held else 0) + 4)
    terms["logits_grad"] = tokens * v * (4 + (e if setup.precision != "fp32" else 0))
    if setup.tiled_loss:
        # TiledFusedLogitsLoss (ulysses_sp.py) runs the LM head, the loss and their backward one slice of tokens at a
        # time inside forward: the logits, their gradient and the loss's exist for one slice; it keeps the gradient of
        # its input (x_grad = zeros_like(hidden states), saved for backward) instead. The slice's logits are its
        # loss_fn's own (launching/parallel.py tiled_causal_lm_loss): gone when it returns, before the slice's backward,
        # which starts from the log-softmax output alone (4 bytes), as a loop that keeps only the loss does. Measured on
        # CPU launches (tests/test_long_context.py): with the 16-bit logits counted the plan was 9-12% over the peak.
        slice_tokens = -(-tokens // tiled_loss_shards(tokens, v))
        terms["logits_and_loss"] = slice_tokens * v * 4
        terms["logits_grad"] = slice_tokens * v * (4 + (e if setup.precision != "fp32" else 0))
        terms["tiled_loss_input_grad"] = tokens * model.hidden_size * e
    if model.liger_kernels:
        # Liger's fused linear cross-entropy (ops/fused_linear_cross_entropy.py fused_linear_cross_entropy_forward, the
        # loss of a Liger model given labels in training) computes the gradients in forward, one chunk of tokens at a
        # time (liger_loss_chunk_tokens): the chunk's logits in the training dtype, their gradient written in place by the
        # cross-entropy kernel; a fp32 loss per token; grad_input = zeros_like(hidden states), kept for backward (and
        # the LM head's grad_weight: phase_terms)
        if setup.tiled_loss:
            raise ZerokitError(f"{flag('liger-kernels')} on computes the loss with Liger's fused linear cross-entropy, "
                               f"in chunks already: drop {flag('tiled-loss')}")
        chunk = liger_loss_chunk_tokens(tokens, v, model.hidden_size)
        terms["logits_and_loss"] = chunk * v * e + 4 * tokens
        terms["logits_grad"] = 0
        terms["tiled_loss_input_grad"] = tokens * model.hidden_size * e
    if setup.tiled_mlp:
        terms["tiled_mlp_backward"] = terms_mlp_backward
    if sp > 1:
        # the backward all-to-all of one layer's q, k and v gradients (ulysses_sp.py _combine_local_sequences): each
        # _DimZeroAllToAll.backward makes a contiguous copy of its gradient and an output of that size (the training
        # dtype), freed before autograd runs the next of the three branches, so the largest one's pair is the most alive
        kv = model.num_kv_heads
        terms["sp_all_to_all_buffers"] = 2 * e * max(model.num_attention_heads, kv) * model.head_dim * tokens
    terms["attention_backward"] = 0
    if (attention == "sdpa" and sdpa_runs_math_kernel(model, setup.precision, on_cpu, masked > 0)
            and not setup.activation_checkpointing):
        # The math kernel's backward of the last layer (traced, falcon-7b: the peak op is
        # _softmax_backward_data) holds the fp32 gradients of the probabilities and of the scores
        # (8 B/score) while the layer's attention activations are still saved; by then the logits,
        # the final norm, the layer's MLP and o_proj input are freed, two h-wide gradients are alive,
        # and with tied embeddings the LM head's weight gradient (V h E) waits for the embedding's.
        h = model.hidden_size
        at_attention = (tokens * (8 * model.num_attention_heads * seq + e * h - _mlp_bytes_per_token(model, setup.precision))
                        - final_norm - terms["logits_and_loss"]
                        + (v * h * e if model.tied_embeddings else 0))
        terms["attention_backward"] = max(0, at_attention - terms["logits_grad"])
    return terms


# Activation-checkpoint offload (ZeroSetup.checkpoint_offload), as DeepSpeed 0.19.8's CheckpointHiddenStatesOffload
# (runtime/activation_checkpointing/offload_activations.py) runs it with its defaults: keep_last_count=1 keeps the
# newest layer input on the GPU ("the first backward needs them before a D2H would finish"), and backward restores one
# input at a time for its layer's recompute (_restore_tensor, freed once the layer's backward is done). So the GPU holds
# two layer inputs at the start of the recompute, the host the other num_layers - 1, in pinned buffers
# (_empty_cpu_like: pin_memory) reused from step to step (the buffer pool, up to 64).
CHECKPOINT_OFFLOAD_KEEP_LAST = 1


def checkpoint_offload_kept_layers(workload: Workload) -> int:
    """Layer inputs an offloading checkpoint never sends to the host. Reentrant offload (ArcticTraining's
    CheckpointFunctionWithCPUOffload, monkey_patches.py: `arg.detach().to("cpu")` in forward, `.to(ctx.x_device)` in
    backward; DeepSpeed's deepspeed.checkpointing with cpu_checkpointing alike) sends every layer's input, the last one
    too: none. Non-reentrant, DeepSpeed's CheckpointHiddenStatesOffload: CHECKPOINT_OFFLOAD_KEEP_LAST."""
    return 0 if workload.checkpoint_reentrant else CHECKPOINT_OFFLOAD_KEEP_LAST


def checkpoint_offload_gpu_layers(workload: Workload) -> int:
    """Layer inputs an offloading checkpoint keeps on the GPU at the recompute: those never sent, and the one brought
    back for its layer's recompute."""
    return checkpoint_offload_kept_layers(workload) + 1


def checkpoint_offload_bytes(model: ModelSpec, setup: ZeroSetup, workload: Workload) -> int:
    """Bytes of layer inputs one rank moves to host memory per micro batch (and back): every checkpointed layer's input
    (hidden states of seq / sp tokens, the training dtype) but those never sent (checkpoint_offload_kept_layers).
    model: what one rank holds."""
    if not setup.checkpoint_offload:
        return 0
    tokens = setup.micro_batch_size * workload.seq_len // setup.sequence_parallel
    sent = max(0, model.num_layers - checkpoint_offload_kept_layers(workload))
    return sent * tokens * model.hidden_size * bytes_per_element(setup.precision)


# zerokit's tiled loss slices the logits so that one slice's fp32 logits take at most this many bytes (the shards
# argument of TiledFusedLogitsLoss is the caller's choice; DeepSpeed's docstring example uses 2)
TILED_LOSS_SLICE_BYTES = GiB


def tiled_loss_shards(tokens: int, vocab_size: int) -> int:
    """Slices TiledFusedLogitsLoss runs the loss in: fp32 logits of at most TILED_LOSS_SLICE_BYTES each, at least 2."""
    return max(2, -(-tokens * vocab_size * 4 // TILED_LOSS_SLICE_BYTES))


def liger_loss_chunk_tokens(tokens: int, vocab_size: int, hidden_size: int) -> int:
    """Tokens per chunk of Liger's fused linear cross-entropy (fused_linear_cross_entropy_forward, v0.6.1 to 0.8.5:
    inc_factor = cdiv(V, H), chunk_size = min(next_power_of_2(cdiv(BT, inc_factor)), BT)): a chunk's logits about the
    size of the hidden states, up to twice."""
    inc_factor = -(-vocab_size // hidden_size)
    chunk = 1 << (-(-tokens // inc_factor) - 1).bit_length()
    return min(chunk, tokens)


def tiled_mlp_shards(local_seq: int, hidden_size: int) -> int:
    """Slices TiledMLP runs each MLP in: ceil(seqlen / hidden), the rule of DeepSpeed's own example (ulysses_sp.py
    TiledMLP docstring, tiled_mlp_forward), which ALST's integration uses."""
    return max(1, -(-local_seq // hidden_size))


def tiled_mlp_backward_bytes(model: ModelSpec, setup: ZeroSetup, tokens: int, local_seq: int) -> int:
    """What one TiledMLP backward holds beyond the saved activations: the gradient of its input (x_grad = zeros_like(x),
    E h per token) and one slice's MLP recomputed with grad enabled (its saved intermediates, _mlp_bytes_per_token)."""
    e = dtype_bytes(setup.precision)
    slice_tokens = -(-tokens // tiled_mlp_shards(local_seq, model.hidden_size))
    return tokens * model.hidden_size * e + slice_tokens * _mlp_bytes_per_token(model, setup.precision)


def tiled_mlp_weight_grads(model: ModelSpec, setup: ZeroSetup) -> int:
    """The MLP's weight gradients while its TiledMLP backward runs, at ZeRO-2/3: TiledMLP.backward (ulysses_sp.py) sets
    ds_grad_is_ready False on its weights until the last slice, so ZeRO's hook (stage_1_and_2.py, stage3.py) leaves
    each slice's gradient accumulating in param.grad instead of moving it to the bucket: the layer's MLP weights in the
    training dtype (measured: three tensors, 540,672 B in all, on tiny-llama at ZeRO-2 fp32, a snapshot at the peak). A full fine-tune's
    (the planner tiles no other); ZeRO-0/1 hold every gradient anyway (the gradients term)."""
    if not setup.tiled_mlp or setup.zero_stage < 2 or model.trained.trainable_params is not None:
        return 0
    return dtype_bytes(setup.precision) * (3 if model.gated_mlp else 2) * model.intermediate_size * model.hidden_size


@by_identity()
def sequence_parallel_view(model: ModelSpec, sp: int) -> ModelSpec:
    """The attention one Ulysses rank runs, priced per local token (deepspeed/runtime/sequence_parallel/ulysses_sp.py
    UlyssesSPAttentionHF): after the all-to-all the kernel sees a/sp query heads over the whole sequence (the same
    bytes as a heads over the rank's tokens) and max(1, k/sp) KV heads, each KV head repeated when k < sp
    (kv_replication_factor = sp // k): k' = max(k, sp) per local token. The kernel's output goes back through another
    all-to-all into a new tensor, which o_proj saves: the copy attention_output_copy prices."""
    return replace(model, num_kv_heads=max(model.num_kv_heads, sp), attention_output_copy=True)


def weight_bytes(model: ModelSpec, e: int) -> int:
    """Bytes of every parameter tensor as held (spec.model.ModelSpec.weight_bytes: 4-bit QLoRA weights packed)."""
    return model.weight_bytes(e)


@by_identity()
def param_tensor_sizes(model: ModelSpec) -> tuple[tuple[int, int, int], ...]:
    """(stored elements, bytes per element or 0 for the training dtype, count) of every parameter tensor: read from the
    module tree for a fine-tune (with_finetune), else the spec's shapes (spec.model.gradient_sizes_in_backward_order)."""
    if model.trained.param_tensors:
        return model.trained.param_tensors
    return tuple((n, 0, 1) for n in gradient_sizes_in_backward_order(model))


@by_identity()
def stage3_persistent_bytes(model: ModelSpec, e: int, threshold: int) -> int:
    """ZeRO-3 keeps a parameter whole on every rank once gathered when it has at most stage3_param_persistence_threshold
    elements (parameter_offload.py mark_persistent_parameters: `param.ds_numel <= param_threshold`; ds_numel is the
    stored numel, so a 4-bit weight counts at half its elements in uint8): gathered in the first forward, never released
    after a module's use, partitioned before the optimizer step and gathered again after it (stage3.py step ->
    _partition_all_parameters, _post_step -> persistent_parameters[0].all_gather)."""
    return sum(c * n * (b or e) for n, b, c in param_tensor_sizes(model) if n <= threshold)


def model_state_terms(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, optimizer: Optimizer = ADAMW) -> dict[str, int]:
    """Per-GPU model states for the ZeRO stage and offload choice. Every weight is held in the training dtype,
    frozen or not; gradients, the fp32 master copy and Adam's moments exist for trainable parameters only
    (DeepSpeed's optimizer drops requires_grad=False parameters at every stage: stage_1_and_2.py and stage3.py
    build their flat groups from the trainable ones; measured, docs/measured-on-cpu.md "Fine-tuning")."""
    n = setup.zero_ranks(cluster.world_size)
    trainable = model.trainable
    bpp = model_state_bytes_per_param(setup.precision, optimizer)
    stage = setup.zero_stage
    mixed = setup.precision != "fp32"

    def part(nbytes: int, partitioned: bool, count: int = trainable) -> int:
        return nbytes * count // n if partitioned else nbytes * count

    if setup.offload_param != "none":
        params = 0
    elif stage >= 3:
        # ZeRO-3 partitions every parameter tensor, a 4-bit one at its stored size (partition_parameters.py
        # _partition_param: partition_size = aligned numel / world, in param.dtype); bitsandbytes' QuantState tensors
        # are attributes of the Params4bit, not parameters: every rank keeps all of them
        params = weight_bytes(model, bpp["parameters"]) // n + model.trained.quant_state_bytes
    else:
        params = weight_bytes(model, bpp["parameters"]) + model.trained.quant_state_bytes
    terms = {
        "parameters": params,
        "gradients": part(bpp["gradients"], stage >= 2),
    }
    if stage == 0 and not mixed:
        # Plain data parallel in fp32: the torch optimizer updates the params in place.
        terms.update(master_weights=0, optimizer_states=optimizer.state_bytes * trainable, fp32_gradients=0)
    elif pipelined_bf16_optimizer(setup):
        # BF16_Optimizer partitions its fp32 master copy over the stage's data-parallel ranks and the optimizer steps
        # that partition (bf16_optimizer.py _setup_for_real_optimizer: fp32_groups_flat_partition); its gradient
        # buffer is grad_accum_terms', its step's fp32 copy of the gradient partition _step_extra_terms'
        terms.update(master_weights=part(bpp["master_weights"], True), fp32_gradients=0,
                     optimizer_states=part(bpp["optimizer_states"], True))
    else:
        opt = {k: part(bpp[k], stage >= 1) for k in ("master_weights", "optimizer_states", "fp32_gradients")}
        if setup.offload_optimizer != "none":
            opt = dict.fromkeys(opt, 0)
            if stage >= 2:
                terms["gradients"] = 0  # the gradient partition is copied to host memory as it is reduced
        terms.update(opt)
    if stage == 3:
        # Gathered working set: the largest layer's full params and grads (DeepSpeed's estimator: 4 x
        # largest layer in 16-bit).
        terms["stage3_gathered_params"] = 2 * bpp["parameters"] * model.largest_layer_params
    return terms


def buffer_terms(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, knobs: ZeroKnobs) -> dict[str, int]:
    """Communication buffers the config allocates on each GPU, from the actual config values."""
    e = dtype_bytes(setup.precision)
    stage = setup.zero_stage
    terms: dict[str, int] = {}
    if stage in (1, 2) and knobs.contiguous_gradients:
        # ZeRO-1 stages the fp32 accumulator in the bucket; ZeRO-2 keeps it in the training dtype.
        bucket_dtype = 4 if stage == 1 else e
        terms["reduce_buckets"] = knobs.reduce_bucket_size * bucket_dtype * (2 if knobs.overlap_comm else 1)
    elif stage == 3 and knobs.contiguous_gradients:
        terms["reduce_buckets"] = knobs.reduce_bucket_size * e
    if stage == 3 and setup.offload_param == "none":
        # Params gathered ahead of use; bounded by the bucket and by the model itself.
        terms["stage3_prefetch"] = min(knobs.stage3_prefetch_bucket_size, model.params) * e
    return terms


def host_terms(model: ModelSpec, cluster: Cluster, setup: ZeroSetup,
               optimizer: Optimizer = ADAMW) -> tuple[dict[str, int], dict[str, int]]:
    """Host RAM per node and NVMe per node for offloaded states and model loading."""
    psi, trainable = model.params, model.trainable
    nodes, gpn = cluster.nodes, cluster.gpus_per_node
    bpp = model_state_bytes_per_param(setup.precision, optimizer)
    cpu: dict[str, int] = {}
    nvme: dict[str, int] = {}
    opt_bytes = (bpp["master_weights"] + bpp["optimizer_states"] + bpp["fp32_gradients"]) * trainable // nodes
    if setup.offload_optimizer == "cpu":
        cpu["optimizer_states_offloaded"] = opt_bytes
    elif setup.offload_optimizer == "nvme" and setup.zero_stage == 3:
        nvme["optimizer_states"] = opt_bytes
        # Swap-in buffers for one sub-group of fp32 state at a time, per rank.
        cpu["optimizer_swap_buffers"] = gpn * 4 * 4 * min(trainable // cluster.world_size, 1_000_000_000)
    elif setup.offload_optimizer == "nvme":
        cpu["optimizer_states_offloaded"] = opt_bytes  # stage < 3: DeepSpeed falls back to CPU
    if setup.offload_param == "cpu":
        cpu["parameters_offloaded"] = weight_bytes(model, bpp["parameters"]) // nodes
    elif setup.offload_param == "nvme":
        nvme["parameters"] = bpp["parameters"] * psi // nodes
        cpu["param_swap_buffers"] = gpn * PARAM_SWAP_BUFFER_ELEMENTS * bpp["parameters"]
    # Loading: without zero.Init every local rank builds the full fp32 model on the host; stage 3
    # builds under zero.Init, one layer at a time (DeepSpeed's estimator, zero_init=1).
    if model.trained.quantized_params:
        # QLoRA: every rank's from_pretrained(quantization_config=BitsAndBytesConfig(load_in_4bit=True)) quantizes weight
        # by weight as it loads (integrations/bitsandbytes.py Bnb4bitQuantize), so it holds the quantized model and one
        # checkpoint tensor at a time, counted at 4 bytes (an fp32 checkpoint; a bf16 one holds half). Measured with the
        # meter around from_pretrained (bench/results/finetune_memory.txt): tiny-gpt2 2,142,080 B against this rule's
        # 2,140,928; tiny-llama 2,097,280 (the rule gives 2,510,400: its peak came before the LM head was loaded).
        # The adapters (QLoRA's trainable parameters) come after loading, with get_peft_model.
        # On a GPU the quantized weights land on the device (device_map={"": local_rank}, what `zerokit launch` passes):
        # the host holds the checkpoint tensor being quantized.
        e = bpp["parameters"]
        base = weight_bytes(model, e) - e * trainable + model.trained.quant_state_bytes
        held = base if cluster.accelerator.is_cpu else 0
        cpu["model_loading"] = gpn * (held + 4 * model.largest_layer_params)
    elif setup.zero_stage == 3:
        cpu["model_loading"] = 4 * model.largest_layer_params * gpn
    else:
        cpu["model_loading"] = 4 * psi * gpn
    steady = sum(v for k, v in cpu.items() if k != "model_loading")
    # Loading happens before the offloaded states exist: the peak is the larger of the two phases,
    # and DeepSpeed's estimator adds 50% for pinned staging buffers on top of it.
    peak = max(steady, cpu["model_loading"])
    if steady >= cpu["model_loading"]:
        cpu["model_loading"] = 0
    else:
        cpu = {"model_loading": cpu["model_loading"]}
    cpu["pinned_staging_buffers"] = int(peak * (HOST_BUFFER_FACTOR - 1))
    return cpu, nvme


# The per-rank phases at which a training step can peak (measured per phase by zerokit launch's
# metrics; bench/accuracy). See phase_terms.
PHASES = ("backward", "backward_reduce", "backward_recompute", "backward_end", "step")


def _stage3_terms(model: ModelSpec, setup: ZeroSetup, knobs: ZeroKnobs, states: dict[str, int], bufs: dict[str, int],
                  persistent: dict[str, int], live: dict[str, int], e: int, n: int, on_cpu: bool) -> tuple[int, int]:
    """phase_terms' ZeRO-3 terms: adds what every phase holds to persistent and the parameters forward gathers to
    live (taking the reduce bucket out of bufs); returns the bytes of the parameters kept whole
    (stage3_persistent_bytes) and of hpZ's secondary partition (0 without hpZ)."""
    # ZeRO-3 keeps its gradient partition and one reduce bucket for the whole run (stage3.py ipg
    # buffer; measured alive at every phase), so they are not in the per-phase gradient terms.
    persistent["gradients"] = states["gradients"]
    persistent["reduce_buckets"] = bufs.pop("reduce_buckets", 0)
    # Parameters gathered in forward stay gathered until backward uses them again while the live
    # count is under stage3_max_live_parameters and the reuse distance under
    # stage3_max_reuse_distance (measured: the whole 16-bit model of the grid's 1-12M-parameter
    # models alive at the start of backward); DeepSpeed's estimator's 2 x largest layer otherwise.
    window = min(knobs.stage3_max_live_parameters, knobs.stage3_max_reuse_distance)
    persistent_bytes = stage3_persistent_bytes(model, e, knobs.stage3_param_persistence_threshold)
    # Modules no gradient reaches (frozen embeddings, layers before the first trainable one) fire no backward hook:
    # once the trace is complete (the second step) the coordinator releases their parameters after forward, their
    # next use being the next step (measured: LoRA and --freeze at ZeRO-3, tiny-llama, the embedding's 1 MiB fp32
    # absent at the start of backward; bench/results/finetune_memory.txt). With checkpointing the gradient reaches
    # the embedding output (enable_input_require_grads) and they stay (measured).
    released = 0 if setup.activation_checkpointing else e * model.trained.no_backward_params + model.trained.no_backward_quantized_bytes
    live["stage3_live_params"] = min(weight_bytes(model, e) - released,
                                     persistent_bytes + e * max(window, 2 * model.largest_layer_params))
    if n == 1 and (setup.offload_param == "none" or on_cpu):
        # one rank holds every partition whole: all_gather_coalesced takes _no_gather_coalesced, and NoGatherHandle
        # points param.data at ds_tensor.data on the same device, a view, no copy (partition_parameters.py).
        # Measured on an H200 (bench/results/accuracy_h200.txt): ZeRO-3 at one rank peaked 471 MiB above ZeRO-0, its
        # gradient partition, not 940 (+ a gathered copy of the 469 MiB model)
        live["stage3_live_params"] = 0
    if setup.offload_param != "none" and on_cpu:
        persistent["parameters_offloaded"] = e * model.params // n
    hpz_bytes = 0
    if setup.hpz_partition_size > 1:
        # ZeRO++ hpZ: a parameter released after its gather keeps a secondary partition over its group of hpz
        # ranks, in its own dtype (partition_parameters.py _partition -> _partition_param_sec: ds_secondary_tensor
        # of ds_numel / hpz elements), which backward gathers from; stage3.py _post_step drops them all after the
        # optimizer step (invalidate_secondary_tensor). A model inside the live window (above) is released only at
        # the end of backward: the copies exist from there to the step. Measured on 4 ranks at hpz 2 (fp32
        # params / 2: 2,525,440 B on tiny-llama, alive after init and the first forward, gone after the step and
        # absent at the next start of backward; bench/results/accuracy_cpu_parallel.txt).
        hpz_bytes = weight_bytes(model, e) // setup.hpz_partition_size
        frozen = model.frozen_unquantized_params
        if knobs.zero_quantized_nontrainable_weights and not on_cpu and frozen > 0:
            # _partition_param_sec quantizes a frozen weight's secondary partition too: int8 + scales
            hpz_bytes -= int((e - QWZ_BYTES_PER_ELEMENT) * frozen) // setup.hpz_partition_size
        if model.params > window:
            persistent["hpz_secondary_partition"] = hpz_bytes
    return persistent_bytes, hpz_bytes


def zero3_reduce_terms(model: ModelSpec, setup: ZeroSetup, knobs: ZeroKnobs, n: int, on_cpu: bool) -> dict[str, int]:
    """What one ZeRO-3 gradient reduction adds while it runs, for the largest one: the largest trainable tensor, which
    is larger than the reduce bucket and so goes alone (stage3.py __add_grad_to_ipg_bucket copies into the bucket only
    what fits), else a full bucket of several. stage3.py __avg_scatter_grads casts the gradients to the communication
    dtype when it is not the training dtype (a copy; under Ulysses in the engine, fp32: ZeroSetup.gradient_comm_precision),
    and reduce_scatter_coalesced flattens them into one buffer unless one tensor divides evenly among the ranks. On CPU
    ranks gloo's reduce_scatter_tensor makes one more copy of its whole input (measured: a 4 MiB fp32 input, 4 MiB
    more live). Measured, Ulysses SP 2 on CPU ranks: the untied head's bf16 gradient and two fp32 copies of it
    (tests/test_long_context.py)."""
    sizes = trainable_gradient_sizes(model)
    if n == 1 or not model.trainable or not sizes:
        return {}  # one rank: _no_gather path, nothing reduced across ranks
    e, c = dtype_bytes(setup.precision), dtype_bytes(setup.gradient_comm_precision)
    largest = max(sizes)
    alone = largest > knobs.reduce_bucket_size
    elements = largest if alone else min(knobs.reduce_bucket_size, model.trainable)
    terms = {}
    if alone:
        terms["reduce_gradient"] = e * largest  # its own grad tensor; a bucketed one lives in the reduce bucket
    if c != e:
        terms["reduce_comm_cast"] = c * elements
    if not alone or largest % n:
        terms["reduce_scatter_flat"] = c * elements
    if on_cpu:
        terms["reduce_scatter_gloo_copy"] = c * elements
    return terms


def _one_layer_backward_terms(acts: dict[str, int]) -> dict[str, int]:
    """The activation terms that exist while one layer's backward runs, not before it: the tiled loss's hidden-state
    gradient, TiledMLP's backward slice, Ulysses' backward all-to-all, and the attention backward of Falcon's
    math-kernel attention, which peaks later in backward than its start (activation_terms)."""
    return {k: acts[k] for k in ("tiled_loss_input_grad", "tiled_mlp_backward", "sp_all_to_all_buffers",
                                 "attention_backward") if acts.get(k)}


def _backward_start_terms(model: ModelSpec, setup: ZeroSetup, acts: dict[str, int], bufs: dict[str, int],
                          zeropp: dict[str, dict[str, int]], persistent: dict[str, int], live: dict[str, int],
                          start_acts: dict[str, int], grads: dict[str, int], tokens: int, logits: int,
                          chunked_loss: bool, e: int) -> dict[str, int]:
    """phase_terms' "backward" phase: what one rank holds at the start of backward."""
    grad_bytes_per_logit = acts["logits_grad"] // logits if logits else 0
    if setup.tiled_loss:  # the loss's backward runs one slice at a time (activation_terms)
        logits = -(-tokens // tiled_loss_shards(tokens, model.vocab_size)) * model.vocab_size
        grad_bytes_per_logit = acts["logits_grad"] // logits if logits else 0
    loss_transient = logits * max(0, LOSS_BACKWARD_BYTES_PER_LOGIT - grad_bytes_per_logit)
    if model.liger_kernels:
        loss_transient = 0  # Liger's kernel writes the logits' gradient over them, in forward (activation_terms)
    backward = {**persistent, **live, **start_acts, "logits_and_loss": acts["logits_and_loss"], "logits_grad": acts["logits_grad"],
                "loss_backward_transient": loss_transient}
    if "stage3_prefetch" in bufs:
        backward["stage3_prefetch"] = bufs["stage3_prefetch"]
    if chunked_loss and not model.trained.frozen_head:
        # TiledFusedLogitsLoss runs the LM head's backward inside forward, slice after slice, so the head's weight
        # gradient (the training dtype, V x h) exists while every activation is still saved (ds_grad_is_ready holds
        # ZeRO's hook until the last slice). Measured, tiny-llama fp32 seq 256 on one rank: without it the tiled run
        # was predicted 1.7 MB (4.5%) under its 37.26 MB peak. Liger's fused loss likewise: grad_weight = zeros_like(weight)
        # accumulated chunk by chunk in forward, saved for backward
        backward["tiled_loss_head_grad"] = e * model.vocab_size * model.hidden_size
    # transients of one layer's backward, counted at the start of backward: an upper bound (they come once the logits'
    # gradient is used up)
    backward.update(_one_layer_backward_terms(acts))
    backward.update(zeropp["backward"])  # qgZ's per-tensor buffers, in backward's reductions
    if setup.gradient_accumulation_steps > 1:
        # from the second micro step on, the gradients accumulated so far are alive while the next
        # micro batch's activations are (ZeRO-3 keeps its partition in `persistent` already)
        backward.update(grads)
    return backward


def grad_accum_terms(model: ModelSpec, setup: ZeroSetup, knobs: ZeroKnobs, states: dict[str, int], n: int) -> dict[str, int]:
    """What a 16-bit model's gradient accumulation in fp32 (data_types.grad_accum_dtype, ZeroKnobs.grad_accum_dtype)
    changes, from the allocations DeepSpeed makes at init (so in every phase):
    - ZeRO-3: its gradient partition buffer (stage3.py grad_partitions_flat_buffer) is made in
      gradient_accumulation_dtype: 4 bytes per partition element, not 2;
    - ZeRO-1 with bf16 and no offload: the engine builds BF16_Optimizer (engine._do_optimizer_sanity_check), whose
      fp32_groups_gradients_flat is zeros_like the whole flat bf16 group in that dtype: 4 bytes per trainable
      parameter, not sharded (bf16_optimizer.py _setup_for_real_optimizer);
    - ZeRO-2 keeps its buffers in the model's dtype; at stage 0 DeepSpeed refuses the mix (NotImplementedError).
    Measured on 2 CPU ranks, tiny-llama bf16 (1,262,720 parameters): every phase +5,050,880 bytes at ZeRO-1 (4 per
    parameter), +1,262,720 at ZeRO-3 (2 more per partition element), none at ZeRO-2 (tests/test_memory.py).
    A bf16 pipeline at stage 0 builds BF16_Optimizer whatever the config says (pipelined_bf16_optimizer), with that
    buffer in bf16: 2 bytes per trainable parameter of the stage, not sharded."""
    if pipelined_bf16_optimizer(setup):
        return {"bf16_optimizer_grad_accum": 2 * model.trainable}
    if knobs.grad_accum_dtype != "fp32" or setup.precision == "fp32":
        return {}
    if setup.zero_stage == 3 and states.get("gradients"):
        return {"gradients": 4 * model.trainable // n}
    if setup.zero_stage == 1 and setup.precision == "bf16" and setup.offload_optimizer == "none":
        return {"bf16_optimizer_grad_accum": 4 * model.trainable}
    return {}


def pipelined_bf16_optimizer(setup: ZeroSetup) -> bool:
    """A bf16 pipeline without ZeRO: DeepSpeed's engine wraps the optimizer in BF16_Optimizer, which accumulates the
    gradients in the model's dtype (engine._do_optimizer_sanity_check: model_dtype == grad_accum_dtype, bf16 and
    pipeline_parallelism; an fp32 accumulation there is refused, config/lint.py). Without a pipeline the same config
    gets FP16_Optimizer's unsharded fp32 copy (DDP_BFLOAT16). Measured on 4 CPU ranks, 2 stages x 2 data-parallel
    (tests/test_pipeline_launch.py)."""
    return setup.zero_stage == 0 and setup.pipeline_parallel > 1 and setup.precision == "bf16"


def zero3_sub_group_elements(model: ModelSpec, n: int, knobs: ZeroKnobs) -> int:
    """The largest sub-group of a rank's ZeRO-3 partition: stage3.py _create_fp16_sub_groups adds whole parameters
    until a sub-group holds at least sub_group_size elements, so one holds at most sub_group_size plus its last
    parameter's partition (the largest module's, largest_layer_params / n); the partition when smaller."""
    partition = model.trainable // n
    return min(partition, knobs.sub_group_size + -(-model.largest_layer_params // n))


def _step_extra_terms(model: ModelSpec, setup: ZeroSetup, knobs: ZeroKnobs, optimizer: Optimizer, states: dict[str, int],
                      grads: dict[str, int], e: int, n: int, on_cpu: bool) -> dict[str, int]:
    """phase_terms' "step" phase beyond the persistent terms: what the optimizer's step adds."""
    trainable = model.trainable
    # the temporaries the optimizer's step makes per parameter it updates (spec/optimizer.py step_temporaries): the
    # unfused torch.optim.AdamW (what render writes for CPU targets without offload; on GPUs a config without an
    # optimizer block or with torch_adam: ZeroKnobs.optimizer) makes two fp32 temporaries of what it updates
    # (measured on CPU; on GPUs LLaMA-Factory#1221's OOM, tests/test_fp16_cpu.py); DeepSpeed's FusedAdam on GPUs
    # and DeepSpeedCPUAdam update in place.
    temporaries = step_optimizer(optimizer, on_cpu).step_temporaries if setup.offload_optimizer == "none" else 0
    if setup.offload_optimizer != "none" and setup.zero_stage >= 1:
        step_extra = {}  # the host copies above are all there is
    elif pipelined_bf16_optimizer(setup):
        # BF16_Optimizer.step casts the stage's gradient partition to fp32 for the optimizer (grad_partition.to(fp32),
        # freed after the step); the 16-bit gradients stay (the pipeline clears them at the next backward,
        # clear_lp_grads); the optimizer updates one flat fp32 partition
        step_extra = {**grads, "fp32_gradients": 4 * trainable // n}
        if temporaries:
            step_extra["optimizer_step_temporaries"] = temporaries * trainable // n
    elif setup.zero_stage == 0:
        # the full 16-bit gradients, in mixed precision the fp32 gradients the BF16 optimizer
        # accumulates, torch AdamW's temporaries per parameter tensor (the largest bounds them)
        step_extra = {**grads, "fp32_gradients": states["fp32_gradients"]}
        if temporaries:
            step_extra["optimizer_step_temporaries"] = temporaries * min(model.largest_layer_params, trainable)
        elif setup.precision == "fp16":
            # fp16 with FusedAdam is DeepSpeed's FP16_Optimizer (engine._configure_fp16_optimizer), whose step
            # builds the fp32 flat gradient as _flatten_dense_tensors([p.grad.to(fp32) for p in group])
            # (runtime/fp16/fused_optimizer.py FP16_Optimizer.step): every per-tensor fp32 copy is alive
            # while the flat one is written, next to the 16-bit gradients (freed after). Derived from the
            # source: FusedAdam cannot run on CPU; torch AdamW there gives FP16_UnfusedOptimizer (per
            # tensor, measured: no such copy, the bf16 terms above).
            step_extra["fp16_flatten_copies"] = 4 * trainable
    else:
        # inside the optimizer's step: the fp32 gradient partition (made for an fp32 model too), the 16-bit gradients
        # freed by then (measured on CPU: not alive at the step's peak at ZeRO-1/2). ZeRO-3 steps its partition one
        # sub-group at a time (stage3.py step: _prepare_sub_group makes the sub-group's fp32 gradient,
        # _release_sub_group sets it to None), so its fp32 gradient and the optimizer's temporaries are one
        # sub-group's. Measured, tiny-llama ZeRO-3 bf16 on 2 CPU ranks at sub_group_size 100,000: the step phase
        # 13.57 MB, 5.19 MB under its 18.76 MB at the default (tests/test_memory.py)
        updated = trainable // n if setup.zero_stage < 3 else zero3_sub_group_elements(model, n, knobs)
        step_extra = {"fp32_gradients": 4 * updated}
        if temporaries:
            step_extra["optimizer_step_temporaries"] = temporaries * updated
        # just before it: stage_1_and_2.py step() flattens the partition's 16-bit gradients (self.flatten, a torch.cat
        # copy) and casts the copy .to(fp32) while the gradients it copied are alive (freed after, by
        # free_grad_in_param_list); for an fp32 model the cast returns the copy itself. ZeRO-3 makes each sub-group's
        # fp32 gradient the same way (stage3.py _prepare_fp32_grad_for_sub_group: self.flatten(averaged_gradients)
        # .to(fp32)), its 16-bit partition buffer staying (the persistent "gradients"). With an optimizer that updates
        # in place (FusedAdam on GPUs) this moment is the step's peak. Measured on an H200: 3B Llama ZeRO-2 bf16, 4 bytes
        # per parameter above the in-step terms (bench/results/accuracy_gpu_lend_20261127_0251.txt); gpu-1b ZeRO-3 bf16
        # at 2K and 8K tokens, 1.77 GB above them, the copy of a sub-group of ~1.0e9 elements
        # (bench/results/accuracy_gpu_lend_20261128_1821.txt).
        whole = setup.zero_stage < 3  # ZeRO-1/2 cast the whole partition at once, ZeRO-3 a sub-group
        flat16 = e * trainable // n if whole else e * updated
        at_cast = {"gradients": flat16} if whole else {}
        at_cast["gradient_flat_copy"] = flat16
        if e != 4:
            at_cast["fp32_gradients"] = 4 * trainable // n if whole else 4 * updated
        if sum(at_cast.values()) > sum(step_extra.values()):
            step_extra = at_cast
    return step_extra


def phase_terms(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, workload: Workload,
                knobs: ZeroKnobs) -> dict[str, dict[str, int]]:
    """The per-rank terms live at each point where a step can peak (steady state: optimizer states exist).

    Measured with zerokit.measure.meter's live-tensor-byte meter on real 2-rank DeepSpeed runs
    (bench/results/accuracy_cpu.txt; docs/memory-model.md, "Phases"):
    - backward: the start of backward. Every activation is still saved, the loss's backward has
      written the fp32 gradient of the logits while the nll gradient is alive (8 bytes per logit in
      all, logits_grad + loss_backward_transient). No gradient or reduce bucket exists yet: DeepSpeed
      allocates the buckets at the first gradient hook (stage_1_and_2.py process_gradients ->
      setup_buckets) and the gradient partition at the first reduction; both are freed after the step.
      With activation checkpointing only the layer inputs and the final norm are saved at that point.
    - backward_recompute (checkpointing): the last layer recomputed while the logits the outputs hold
      are alive.
      With ZeRO-2 also the partition's contiguous gradient buffer and, with accumulation, the earlier
      micro steps' gradients.
    - backward_reduce (ZeRO-2 without checkpointing): a micro step's first reduction made that buffer;
      every activation, no loss tensor.
    - backward_end: every gradient (full at stage 0/1, the partition at 2/3) and the buckets, the logits
      the outputs still hold, no activations.
    - step: the optimizer step: gradients, the fp32 gradient partition and torch AdamW's foreach
      temporaries (two fp32 tensors the size of what it updates), the logits the outputs hold.
    The forward end never exceeds the start of backward (same activations, 8 bytes per logit less the
    logits the previous step's outputs held, freed when the new outputs replace them).
    """
    e = dtype_bytes(setup.precision)
    on_cpu = cluster.accelerator.is_cpu
    # every term below is of what one rank holds: an AutoTP rank holds its slice of the split weights
    # (ModelSpec.tensor_parallel_shard), and ZeRO partitions over setup.zero_ranks
    model = model.tensor_parallel_shard(setup.tensor_parallel)
    optimizer = optimizer_named(knobs.optimizer)
    states = model_state_terms(model, cluster, setup, optimizer)
    accum = grad_accum_terms(model, setup, knobs, states, setup.zero_ranks(cluster.world_size))
    states.update({k: v for k, v in accum.items() if k in states})
    bufs = buffer_terms(model, cluster, setup, knobs)
    acts = activation_terms(model, setup, workload, on_cpu)
    n = setup.zero_ranks(cluster.world_size)
    trainable = model.trainable
    tokens = setup.micro_batch_size * workload.seq_len // setup.sequence_parallel
    logits = tokens * model.vocab_size
    persistent = {k: states[k] for k in ("parameters", "master_weights", "optimizer_states")}
    persistent.update({k: v for k, v in accum.items() if k not in states})
    live = {}  # what forward gathers and backward still needs
    persistent_bytes = hpz_bytes = 0
    if setup.zero_stage == 3:
        persistent_bytes, hpz_bytes = _stage3_terms(model, setup, knobs, states, bufs, persistent, live, e, n, on_cpu)
    zeropp = zeropp_terms(model, cluster, setup, knobs)
    if "parameters_frozen_int8" in zeropp["persistent"]:
        persistent["parameters"] = max(0, persistent["parameters"] - e * model.frozen_unquantized_params // n)
    persistent.update(zeropp["persistent"])
    live.update(zeropp["live"])
    if on_cpu:
        persistent.update(cpu_offload_terms(model, cluster, setup, optimizer))
    if not on_cpu:
        persistent["cuda_context"] = CUDA_CONTEXT_BYTES
        persistent["cublas_workspace"] = CUBLAS_WORKSPACE_BYTES
    # the HF outputs object keeps the logits until replaced; a tiled loss returns none, nor does Liger's fused one
    # (LigerForCausalLMLoss: skip_logits in training)
    chunked_loss = setup.tiled_loss or model.liger_kernels
    held_logits = {} if chunked_loss or not workload.outputs_held else {"logits_output": logits * e}
    grads = {} if setup.zero_stage == 3 else {"gradients": states["gradients"]}
    if on_cpu and setup.offload_optimizer != "none" and setup.zero_stage >= 2:
        # the 16-bit gradient partition is "copied to the host": on a CPU target it stays in the rank
        # (measured alive at ZeRO-3 throughout, at ZeRO-2 from the first reduction)
        if setup.zero_stage == 3:
            persistent["gradients"] = e * trainable // n
        else:
            grads["gradients"] = e * trainable // n
    # backward start
    if setup.activation_checkpointing:
        final_norm = tokens * final_norm_bytes_per_token(model, setup.precision)
        start_acts = {"activations_checkpoints": acts["activations_checkpoints"], "activations_final_norm": final_norm}
    else:
        start_acts = {"activations": acts["activations"]}
    backward = _backward_start_terms(model, setup, acts, bufs, zeropp, persistent, live, start_acts, grads, tokens,
                                     logits, chunked_loss, e)
    phases = {"backward": backward}
    # ZeRO-2: a micro step's first reduction allocates the partition's contiguous gradient buffer (stage_1_and_2.py
    # copy_grads_in_partition: grads_in_partition, in the training dtype), dropped at the micro step's end
    # (_release_ipg_buffers), while most activations and, with accumulation, the earlier micro steps' gradients (views
    # of their own such buffer) are alive. Measured, a snapshot of the meter's live tensors: tiny-llama fp32, micro 1 x
    # accumulation 2, tiled loss: two partition-size buffers mid-backward (tests/test_parallel_launch.py).
    reducing = {}
    if setup.zero_stage == 2 and knobs.contiguous_gradients and setup.offload_optimizer == "none":
        reducing = {**(grads if setup.gradient_accumulation_steps > 1 else {}),
                    "gradient_partition_buffer": states["gradients"]}
        mlp_grads = tiled_mlp_weight_grads(model, setup)
        if mlp_grads:  # a TiledMLP backward is one of the layer backwards it spans
            reducing["tiled_mlp_weight_grads"] = mlp_grads
    if setup.activation_checkpointing:
        one_layer = acts["activations_recompute"] - start_acts["activations_final_norm"]
        phases["backward_recompute"] = {**persistent, **live, "activations_checkpoints": acts["activations_checkpoints"],
                                        "activations_recompute": one_layer, **held_logits, **bufs,
                                        **recompute_backward_terms(model, setup, workload, acts, on_cpu), **reducing}
    elif reducing:
        # the loss's backward is done (its logits, their gradient and the head's are gone), one layer's backward runs
        phases["backward_reduce"] = {**persistent, **live, **start_acts, **held_logits, **bufs,
                                     **_one_layer_backward_terms(acts), **reducing}
    if setup.zero_stage == 3:  # with the parameters offloaded too: the gradients are reduced on the GPU
        phases.update(_stage3_reduce_phase(model, setup, knobs, n, on_cpu, persistent, live, start_acts, held_logits,
                                           bufs, e))
    phases["backward_end"] = {**persistent, **grads, **held_logits, **bufs}
    if setup.zero_stage == 3 and setup.offload_param == "none":
        # the parameters backward released are gone, the persistent ones (stage3_persistent_bytes) stay whole
        phases["backward_end"]["stage3_persistent_params"] = persistent_bytes
    hpz_after_backward = {}
    if setup.zero_stage == 3 and setup.hpz_partition_size > 1 and "hpz_secondary_partition" not in persistent:
        hpz_after_backward = {"hpz_secondary_partition": hpz_bytes}  # made at the release that ends backward
        phases["backward_end"].update(hpz_after_backward)
    step_extra = _step_extra_terms(model, setup, knobs, optimizer, states, grads, e, n, on_cpu)
    phases["step"] = {**persistent, **step_extra, **held_logits, **hpz_after_backward}
    return phases


def _stage3_reduce_phase(model: ModelSpec, setup: ZeroSetup, knobs: ZeroKnobs, n: int, on_cpu: bool,
                         persistent: dict[str, int], live: dict[str, int], start_acts: dict[str, int],
                         held_logits: dict[str, int], bufs: dict[str, int], e: int) -> dict[str, dict[str, int]]:
    """phase_terms' ZeRO-3 "backward_reduce": the first reduction of backward, that of the untied LM head's gradient
    (the first gradient ready, and the largest tensor), with every saved activation still alive. A fused or tiled loss
    made that gradient in forward and it is reduced at the first hook of backward, the head's gathered weight still
    alive; otherwise the head's module has just released its weight (measured, tiny-llama-like h 1024 on 2 CPU ranks:
    the peak is 62.5 MiB lower than with the weight). Where the largest tensor is another (a tied embedding, reduced
    last), the moment is the end of backward, no activation alive. Nothing when no reduction copies anything."""
    reduce = zero3_reduce_terms(model, setup, knobs, n, on_cpu)
    if not reduce or set(reduce) == {"reduce_gradient"}:
        return {}  # the gradient alone: counted by the other phases (tiled_loss_head_grad; below the logits' gradient)
    sizes = trainable_gradient_sizes(model)
    head = model.vocab_size * model.hidden_size
    head_first = not model.tied_embeddings and not model.trained.frozen_head and sizes[0] == max(sizes) == head
    if not head_first:
        return {"backward_reduce": {**persistent, **held_logits, **bufs, **reduce}}
    held = dict(live)
    if not (setup.tiled_loss or model.liger_kernels) and "stage3_live_params" in held:
        held["stage3_live_params"] = max(0, held["stage3_live_params"] - e * head)
    return {"backward_reduce": {**persistent, **held, **start_acts, **held_logits, **bufs, **reduce}}


def zeropp_terms(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, knobs: ZeroKnobs) -> dict[str, dict[str, int]]:
    """ZeRO++'s quantized collectives, per phase group ("persistent", "live", "backward"): derived from DeepSpeed 0.19.8's
    source, not measured (they need CUDA and, for qgZ, several nodes; one GPU runs neither: DeepSpeed skips the gather
    at one rank and qgZ within one node). Only at ZeRO-3 on GPUs, over more than one ZeRO rank.
    - qwZ (zero_quantized_weights; zero_quantized_nontrainable_weights for the frozen weights alone): each gather call
      (partition_parameters.py _all_gather_coalesced with quantize=True) fills an int8 buffer of the bucket's full size
      plus its fp32 scales, and AllGatherCoalescedHandle.wait dequantizes it into an fp16 copy (CUDAQuantizer works in
      fp16) before the parameters get their own tensors: 1 byte per element of every gather in flight (the prefetch
      bucket and the module being fetched) and 2 bytes per element of the largest module's. The gathered parameters
      themselves are stage3_live_params as before.
    - zero_quantized_nontrainable_weights: a frozen weight's partition is stored int8 with its scales
      (_partition_param: quantize when not requires_grad): parameters_frozen_int8, in place of its E bytes per element.
    - qgZ (zero_quantized_gradients): stage3.py __avg_scatter_grads calls all_to_all_quant_reduce when the world spans
      more than one node (global world / local GPUs > 1); per gradient tensor, one at a time: its int4 swizzled copy and
      the intra-node all-to-all's output (half a byte per element each), then 1/L of it reduced (int4 in and out) and
      dequantized to fp16: (1 + 3 / L) bytes per element of the largest gradient, L the GPUs per node."""
    out: dict[str, dict[str, int]] = {"persistent": {}, "live": {}, "backward": {}}
    n = setup.zero_ranks(cluster.world_size)
    if setup.zero_stage != 3 or cluster.accelerator.is_cpu or n == 1:
        return out
    frozen = model.frozen_unquantized_params
    weights, gradients = (knobs.zero_quantized_weights or setup.quantized_weights,
                          knobs.zero_quantized_gradients or setup.quantized_gradients)
    quantized_gathers = weights or (knobs.zero_quantized_nontrainable_weights and frozen > 0)
    if quantized_gathers:
        largest = min(model.largest_layer_params, model.params)
        in_flight = min(model.params, knobs.stage3_prefetch_bucket_size + largest)
        out["live"]["qwz_gather_buffers"] = int(QWZ_BYTES_PER_ELEMENT * in_flight) + 2 * largest
    if knobs.zero_quantized_nontrainable_weights and frozen > 0 and setup.offload_param == "none":
        # replaces E bytes per element of that partition in "parameters" (phase_terms)
        out["persistent"]["parameters_frozen_int8"] = int(QWZ_BYTES_PER_ELEMENT * frozen) // n
    if gradients and cluster.nodes > 1:
        local = max(1, cluster.gpus_per_node)
        largest_grad = min(model.largest_layer_params, model.trainable)
        out["backward"]["qgz_reduce_buffers"] = int((1 + 3 / local) * largest_grad)
    return out


# The loss's backward writes the fp32 gradient of the logits while the nll_loss gradient (fp32) is alive:
# 8 bytes per logit at the start of backward, whatever the training dtype (measured: every run of
# bench/accuracy, bf16 and fp32). logits_grad keeps what FakeTensorMode traces see (6 bf16, 4 fp32);
# loss_backward_transient is the rest.
LOSS_BACKWARD_BYTES_PER_LOGIT = 8


def cpu_offload_terms(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, optimizer: Optimizer = ADAMW) -> dict[str, int]:
    """On a CPU target the "offloaded" optimizer lives in the rank's own memory: count it per rank.

    Measured on 2-rank ZeRO-1/2 runs with offload_optimizer cpu (bench/accuracy): fp32 master + Adam
    moments (12Ψ/N; 4 + the optimizer's state bytes), the fp32 gradient partition (4Ψ/N), a training-dtype copy of the parameter
    partition (EΨ/N) and DeepSpeed's two temp gradient buffers (training dtype, the largest tensor each).
    """
    if setup.offload_optimizer == "none":
        return {}
    n, trainable = setup.zero_ranks(cluster.world_size), model.trainable  # the optimizer's flat groups hold trainable params only
    e = dtype_bytes(setup.precision)
    out = {"optimizer_states_offloaded": (4 + optimizer.state_bytes) * trainable // n,
           "fp32_gradients_offloaded": 4 * trainable // n}
    if setup.zero_stage in (1, 2):
        out["offload_param_partition"] = e * trainable // n
        # temp_grad_buffer_for_cpu_offload and _for_gpu_offload: both the training dtype, largest tensor
        # (stage_1_and_2.py __init__); on a CPU target both are in the rank
        out["offload_grad_buffer"] = 2 * e * min(model.largest_layer_params, trainable)
    return out


def flash_backward_bytes(tokens: int, a: int, k: int, d: int, e: int, attention: str) -> int:
    """What a GPU flash kernel's backward allocates for `tokens` queries of `a` heads over `k` KV heads of width d (E bytes
    each), with the output's gradient it is handed (recompute_backward_terms' moment 2; bench/ulysses_attention_probe.py
    measures it). FlashAttention-2's mha_bwd (csrc/flash_attn/flash_api.cpp; torch's sdpa flash backend vendors it): dq,
    an fp32 dq_accum of every query head, dk and dv expanded to every query head when there are fewer KV heads (summed
    per group after), an fp32 softmax_d per head. FlashAttention-3's (flash3, hopper/flash_api.cpp): dq, dk and dv at
    their own heads, the fp32 dq_accum, fp32 dk_accum and dv_accum of the KV heads when they are fewer, fp32 softmax_d
    and softmax_lse_log2 per head."""
    if attention == "flash3":
        grouped = 8 * k * d if k < a else 0
        return tokens * (2 * e * a * d + 2 * e * k * d + 4 * a * d + grouped + 8 * a)
    kv = a if k < a else k
    return tokens * (2 * e * a * d + 2 * e * kv * d + 4 * a * d + 4 * a)


# What one unfused RMSNorm (transformers' LlamaRMSNorm, GemmaRMSNorm) holds at the peak of its backward, per element of
# its input: its saved tensors, its output, the incoming gradient and autograd's fp32 temporaries (the cast, the
# rsqrt product's and pow's gradients, their sum). Measured with zerokit's live-tensor meter on CPU, bf16, fp16 and
# fp32 alike (tests/test_long_context.py); the same aten backward formulas run on a GPU. On an H200 it closed the gap
# of gpu-1b's recompute phase at 32K-256K tokens (docs/long-context.md, "Measured on an H200").
RMSNORM_BACKWARD_PEAK_BYTES = 28


def recompute_backward_terms(model: ModelSpec, setup: ZeroSetup, workload: Workload, acts: dict[str, int],
                             on_cpu: bool) -> dict[str, int]:
    """What the recomputed layer's own backward holds beside its saved activations (issue 28: without it the longest
    sequence of ALST's setups came out 1.5x what ALST measured, bound by this phase). Derived from the source, in the
    order backward runs one decoder layer; not measured on a GPU (no CPU kernel runs the flash backward below):
    - hidden_state_grads: the gradient of the layer's output, arriving from the layer above, and the gradient of its
      input being produced (the residual stream's two tokens x h tensors in the training dtype), throughout.
    - recompute_layer_backward: the largest of the moments below, over the layer's saved activations at that moment.
      Non-reentrant checkpointing frees each recomputed tensor once its backward has unpacked it (torch.utils.checkpoint
      _checkpoint_hook), so after the MLP's backward the second norm's saved tensors are gone.
      1. The MLP's backward: TiledMLP's slices (tiled_mlp_backward, as activation_terms prices it) and, at ZeRO-2/3,
         the MLP's weight gradients its slices accumulate (tiled_mlp_weight_grads), every saved tensor still alive.
      2. Flash attention's backward (the kernel ALST runs: HF flash_attention_2; torch sdpa's flash backend vendors the
         same code), on a GPU. FlashAttention-2's mha_bwd (csrc/flash_attn/flash_api.cpp) allocates dq and an fp32
         dq_accum of every query head, dk and dv expanded to every query head when there are fewer KV heads (summed
         per group after), and an fp32 softmax_d per head, and the output's gradient (its input) is alive. Per local
         token (Ulysses: the full sequence over a / sp heads, the same bytes): E a d + E a d + 2 E a d (2 E k d without
         grouping) + 4 a d + 4 a, less the second norm's saved bytes.
         FlashAttention-3 (flash3) keeps dk and dv at the KV heads and accumulates them in fp32 instead:
         E a d + E a d + 2 E k d + 4 a d (+ 8 k d with grouping) + 8 a.
      3. Ulysses' backward all-to-all of the q/k/v gradients (sp_all_to_all_buffers), beside those gradients, less the
         second norm's saved bytes.
      4. With TiledMLP, the second norm's own backward (transformers' RMSNorm, unfused): after the MLP's backward and
         before attention's, every saved tensor but the MLP input alive, and the norm's autograd in fp32 beside them
         (RMSNORM_BACKWARD_PEAK_BYTES). An unfused MLP's freed intermediates outweigh it.
      On CPU torch's flash kernel differs and the measured CPU runs are the oracle there: moment 2 is not added.
    - reentrant_recompute_output (Workload.checkpoint_reentrant): reentrant checkpointing's backward
      (torch.utils.checkpoint.CheckpointFunction.backward, and ArcticTraining's CheckpointFunctionWithCPUOffload, a copy
      of it) keeps the recomputed layer's outputs in a local while torch.autograd.backward runs the layer's backward: one
      tokens x h tensor more, throughout. Non-reentrant checkpointing keeps only what backward unpacks. Measured on CPU
      with transformers' own Llama layers: exactly that much more at the peak (tests/test_long_context.py)."""
    e = dtype_bytes(setup.precision)
    sp = setup.sequence_parallel
    tokens = setup.micro_batch_size * workload.seq_len // sp
    view = sequence_parallel_view(model, sp) if sp > 1 else model
    a, k, d = view.num_attention_heads, view.num_kv_heads, view.head_dim
    # the second norm's saved bytes (a parallel attention + MLP block has one norm: nothing freed before attention)
    norm2 = tokens * _norm_bytes_per_token(model, setup.precision) if model.norms_per_layer > 1 else 0
    moments = [acts.get("tiled_mlp_backward", 0) + tiled_mlp_weight_grads(model, setup)]
    attention = workload.attention if model.supports_sdpa else "eager"
    masked = _masked_layers(model, workload.seq_len) > 0
    if not on_cpu and (attention == "flash3" or attention in ("sdpa", "flash") and not sdpa_runs_math_kernel(
            model, setup.precision, on_cpu, masked)):
        moments.append(flash_backward_bytes(tokens, a, k, d, e, attention) - norm2)
    if acts.get("sp_all_to_all_buffers"):
        moments.append(acts["sp_all_to_all_buffers"] + tokens * e * (a + 2 * k) * d - norm2)
    if setup.tiled_mlp and model.norm == "rmsnorm" and not model.liger_kernels and model.norms_per_layer > 1:
        moments.append(tokens * (RMSNORM_BACKWARD_PEAK_BYTES - e) * model.hidden_size - norm2)
    terms = {"hidden_state_grads": 2 * tokens * model.hidden_size * e}
    if workload.checkpoint_reentrant:
        terms["reentrant_recompute_output"] = tokens * model.hidden_size * e
    if max(moments) > 0:
        terms["recompute_layer_backward"] = max(moments)
    return terms


def estimate_memory(model: ModelSpec, cluster: Cluster, setup: ZeroSetup, workload: Workload,
                    knobs: ZeroKnobs | None = None) -> MemoryEstimate:
    """Everything a training step needs, by term: the terms live at the peak phase (phase_terms)."""
    knobs = knobs or ZeroKnobs.for_model(model)
    est = MemoryEstimate()
    phases = phase_terms(model, cluster, setup, workload, knobs)
    est.phase_terms = phases
    est.phases = {name: sum(t.values()) for name, t in phases.items()}
    est.peak_phase = max(est.phases, key=lambda k: (est.phases[k], k == "backward"))
    est.per_gpu.update(phases[est.peak_phase])
    est.per_node_cpu, est.nvme = host_terms(model, cluster, setup, optimizer_named(knobs.optimizer))
    if setup.checkpoint_offload and not cluster.accelerator.is_cpu:
        # every rank of the node keeps its offloaded layer inputs in host memory during forward and backward, beside the
        # offloaded optimizer states
        shard = model.tensor_parallel_shard(setup.tensor_parallel)
        est.per_node_cpu["activation_checkpoints_offloaded"] = (cluster.gpus_per_node
                                                                * checkpoint_offload_bytes(shard, setup, workload))
    # weights: the trainable ones are held in the training dtype (adapters, or what --freeze leaves), the rest as
    # weight_bytes holds them (4-bit for QLoRA); the weight-shaped terms split in that proportion
    held = weight_bytes(model, dtype_bytes(setup.precision)) + model.trained.quant_state_bytes
    share = min(1.0, dtype_bytes(setup.precision) * model.trainable / held) if held else 1.0
    est.trainable_fraction = dict.fromkeys(("parameters", "stage3_gathered_params", "stage3_live_params",
                                            "stage3_persistent_params", "stage3_prefetch", "parameters_offloaded",
                                            "model_loading"), share)
    est.reserved = reserved_estimate(est.per_gpu_total - est.per_gpu.get("cuda_context", 0), model, cluster, setup, knobs)
    if cluster.accelerator.is_cpu:
        # counted per rank above: the same RAM, once
        for k in ("optimizer_states_offloaded", "parameters_offloaded"):
            est.per_node_cpu.pop(k, None)
    liger = liger_limit_problem(model.tensor_parallel_shard(setup.tensor_parallel),
                                setup.micro_batch_size * workload.seq_len // setup.sequence_parallel)
    if liger:
        est.kernel_limits.append(liger)
    if setup.offload_optimizer == "nvme" and setup.zero_stage < 3:
        est.notes.append("offload_optimizer nvme with ZeRO stage < 3 silently behaves as CPU offload in DeepSpeed")
    if not model.exact:
        est.notes.append("model shapes were derived from a bare parameter count: activations are approximate")
    return est


@dataclass(frozen=True)
class Budget:
    """What a plan may use: device memory x safety fraction, host RAM and NVMe per node."""

    gpu_bytes: int
    cpu_bytes: int  # 0 = unknown, not checked
    nvme_bytes: int  # 0 = none

    @classmethod
    def of(cls, cluster: Cluster, memory_fraction: float = DEFAULT_MEMORY_FRACTION) -> "Budget":
        acc = cluster.accelerator
        if acc.is_cpu:
            # CPU ranks share the node's RAM: each rank gets its share, and host-side offload
            # comes out of the same RAM (checked in fits()).
            ram = cluster.cpu_memory_bytes or acc.memory_bytes
            return cls(int(ram * memory_fraction) // cluster.gpus_per_node, int(ram * memory_fraction), cluster.nvme_bytes)
        return cls(int(acc.memory_bytes * memory_fraction), cluster.cpu_memory_bytes, cluster.nvme_bytes)


def fit_problems(est: MemoryEstimate, cluster: Cluster, budget: Budget) -> list[str]:
    """Why an estimate does not fit, one reason per exhausted budget (after any kernel limit it hits); empty when it
    fits."""
    from zerokit.core.units import fmt_bytes

    problems = list(est.kernel_limits)
    if est.per_gpu_total > budget.gpu_bytes:
        where = "per rank" if cluster.accelerator.is_cpu else "per GPU"
        problems.append(f"needs {fmt_bytes(est.per_gpu_total)} {where}, budget {fmt_bytes(budget.gpu_bytes)}")
    host = est.per_node_cpu_total
    if cluster.accelerator.is_cpu:
        host += est.per_gpu_total * cluster.gpus_per_node
    if budget.cpu_bytes and host > budget.cpu_bytes:
        problems.append(f"needs {fmt_bytes(host)} host RAM per node, have {fmt_bytes(budget.cpu_bytes)}")
    if est.nvme_total and est.nvme_total > budget.nvme_bytes:
        have = (fmt_bytes(budget.nvme_bytes) if budget.nvme_bytes else
                f"none (give {flag('nvme-path')}/{flag('nvme-size')})")
        problems.append(f"needs {fmt_bytes(est.nvme_total)} NVMe per node, have {have}")
    return problems
