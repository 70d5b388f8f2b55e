"""Exact model specs: parameter counts and shapes for any HF causal LM, or a bare parameter count.

The dataclass below is the contract the memory/time models and the planner rely on. Loading an HF
config counts it by arithmetic where spec/arch_params.py models the architecture (no torch), else
instantiates the model on the meta device (no weights) and caches the result per config so a repeated
plan does not import torch.

Public functions:

* ``load_model_spec(model, trust_remote_code=False) -> ModelSpec``: exact counts for a bundled
  name (``zerokit/data/models/<name>/config.json``), a local directory holding ``config.json``, a
  path to a ``config.json`` file, or a HuggingFace hub id.
* ``spec_from_params(params, hidden_size=None, num_layers=None, vocab_size=None, seq_len=None)``:
  plausible Llama-like shapes for a bare parameter count (pure Python, ``exact=False``).
* ``spec_cache_dir() -> Path``: where cached specs live.

Counting rules (the same numbers DeepSpeed's ``model_to_params`` gives on a real model):

* ``params``: unique parameters, deduplicated by object identity (tied weights counted once). Meta
  tensors all have ``data_ptr() == 0``, so DeepSpeed's data_ptr dedupe cannot be used on meta.
* ``largest_layer_params``: max over modules of the numel of the module's *direct* parameters
  (``parameters(recurse=False)``), DeepSpeed's definition in ``zero/stage3.py``. With the fused
  expert modules of recent transformers (e.g. ``MixtralExperts``) that is all experts of a layer.

Cache: after a meta count the spec is written (atomically) to
``$ZEROKIT_CACHE_DIR/model_specs/<sha256>.json`` (default ``~/.cache/zerokit/model_specs/``), keyed by
the sha256 of the canonical config JSON (sorted keys, compact separators), the installed
transformers version (read from package metadata, which does not import it), the
``trust_remote_code`` flag and this module's schema version. A cache hit imports neither torch nor
transformers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from zerokit.core.errors import ZerokitError
from zerokit.core.fsutil import atomic_write_text, cache_dir, package_version
from zerokit.core.limits import MAX_LAYERS, META_BUILD_SECONDS, WHY, at_most
from zerokit.core.memo import by_identity
from zerokit.core.options import flag
from zerokit.spec.arch_params import SIZE_LIMITS, ConfigView, config_fields, count_params_from_config, first_attr as _first
from zerokit.spec.liger import liger_release
from zerokit.spec.resolve import HINT as _HINT
from zerokit.spec.resolve import ResolvedModel, resolve_model
from zerokit.spec.trained import FULL, Trained


@dataclass(frozen=True)
class ModelSpec:
    name: str
    params: int  # exact parameter count, tied weights counted once (LoRA adapters included: with_finetune)
    largest_layer_params: int  # DeepSpeed's definition: the module with most DIRECT parameters
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # per expert for MoE
    vocab_size: int
    tied_embeddings: bool = False
    gated_mlp: bool = True  # Llama-style gate/up/down (3 matrices) vs GPT-2 style (2)
    num_experts: int = 1  # routed experts per MoE layer (1 = dense)
    experts_per_token: int = 1
    # decoder layers with routed experts when some have a dense MLP instead (DeepSeek's first_k_dense_replace, Qwen-MoE's
    # mlp_only_layers); None: every layer. The shape fields describe the experts; the dense layers count in params only
    moe_layers: int | None = None
    embedding_params: int = 0  # input embedding (+ untied LM head) parameters: no matmul FLOPs for the input side
    model_type: str = "unknown"  # HF model_type, e.g. "llama"; "params" for a bare count
    norm: str = "rmsnorm"  # rmsnorm | layernorm
    mlp_activation: str = "silu"  # HF hidden_act / activation_function
    attention_dropout: float = 0.0  # training-time dropout on attention probabilities
    hidden_dropout: float = 0.0  # training-time dropout on the residual branches
    supports_sdpa: bool = True  # False: transformers runs this architecture's attention eagerly (BLOOM)
    # What the activation model needs beyond shapes (memory.activation_bytes_per_layer; read from the
    # config and the modeling code as transformers uses them, docs/memory-model.md "activations"):
    norms_per_layer: int = 2  # hidden-size norms in one decoder layer (1: parallel attn+MLP blocks, Phi/Falcon)
    norm_inputs_per_layer: int = 2  # distinct tensors they read (a LayerNorm saves its input; Falcon-40B's two norms share one)
    norm_fp32_weight: bool = False  # the norm multiplies by its weight in fp32 before casting back (Gemma)
    sliding_window: int | None = None  # sliding-window attention size where the model applies one
    sliding_window_layers: int = 0  # decoder layers that use it (all for Mistral; layer_types for Qwen2/Gemma2)
    sdpa_mask: bool = False  # the model always passes an explicit (b, 1, s, s) mask to sdpa (Falcon)
    sdpa_broadcast_kv: bool = False  # sdpa gets fewer K/V heads than query heads without enable_gqa (Falcon MQA)
    attention_output_copy: bool = False  # o_proj reads a copy of the attention output (q reaches the kernel in (b, a, s, d) layout)
    # q_norm / k_norm on the projected queries and keys, where not hidden-size (Qwen3, Gemma 3: per head; Olmo 2's k_norm
    # over the whole keys): the elements they normalise and the vectors (rows) they normalise them in, per token per layer
    head_norm_elements: int = 0
    head_norm_rows: int = 0
    # hidden-size norms whose output no Linear keeps: Gemma 2/3's post_attention_layernorm and post_feedforward_layernorm
    # (beside pre-norms: into the residual add), a q_norm / k_norm that is hidden-size (Olmo 2: the rotary embedding next)
    norm_outputs_unkept: int = 0
    # the fused q/k/v projection's whole output stays alive through v, a view of it, while the rotary embedding replaces
    # q and k with new tensors (Phi3Attention: `value_states = qkv[..., query_pos + ...:]`)
    fused_qkv_kept: bool = False
    exact: bool = True  # False when shapes were guessed from a bare parameter count
    # Megatron's tensor parallelism (Megatron-LM / Megatron-DeepSpeed GPT models, bench/published_3d.py): the embedding
    # and the head are VocabParallelEmbedding / a vocab-parallel head with a vocab-parallel cross-entropy, so a TP rank
    # holds, computes and keeps logits for vocab / tp rows (tensor_parallel_shard). AutoTP (False) keeps them whole.
    vocab_parallel: bool = False
    max_positions: int | None = None  # max_position_embeddings / n_positions; None: unknown or unbounded (ALiBi)
    # a learned absolute position table (GPT-2's wpe of n_positions rows, OPT's embed_positions): a longer sequence
    # indexes past it (an IndexError in the embedding), so max_positions is a hard limit; otherwise (rotary, computed
    # from the position ids) it is what the model was trained on, and a longer sequence runs (spec/arch_params.py)
    learned_positions: bool = False
    # the user's script loads the model with Liger-Kernel (with_liger_kernels): its RMSNorm, SwiGLU/GEGLU and fused linear
    # cross-entropy replace transformers' modules and loss, save less for backward (estimate/memory.py) and move each
    # tensor once (estimate/gpu_time.py, with its rotary). Set by the
    # --liger-kernels option, not read from a config (not cached)
    liger_kernels: bool = False
    # its liger-kernel release where the user names one (--liger-kernels 0.5.10); None: a current release. Releases before
    # 0.6.1 index RMSNorm and RoPE rows in 32 bits, before 0.8.4 a per-head q_norm's: that caps a rank's tokens
    # (spec/liger.py)
    liger_version: str | None = None
    # what a fine-tune trains (spec/trained.py); the default: every weight, nothing quantized (a full fine-tune).
    # Set by with_finetune (spec/finetune.py)
    trained: Trained = FULL

    @property
    def trainable(self) -> int:
        """Parameters with gradients, an fp32 master copy and Adam moments (DeepSpeed keeps them for these only)."""
        return self.params if self.trained.trainable_params is None else self.trained.trainable_params

    @property
    def frozen_unquantized_params(self) -> int:
        """Frozen weights held in the training dtype (not QLoRA's 4-bit ones): what ZeRO++'s
        zero_quantized_nontrainable_weights stores and gathers as int8."""
        return self.params - self.trainable - self.trained.quantized_params

    def weight_bytes(self, bytes_per_element: int) -> int:
        """Bytes of every parameter tensor as held: the training dtype's bytes_per_element, except QLoRA's 4-bit base
        weights at their packed size (spec/finetune.py packed_4bit_elements: half a byte per weight in uint8, or the
        same bytes in a wider bnb_4bit_quant_storage). Oracle: a real bitsandbytes-quantized model
        (tests/test_finetune_model.py)."""
        return bytes_per_element * (self.params - self.trained.quantized_params) + self.trained.quantized_bytes

    def check_seq_len(self, seq_len: int) -> str | None:
        """The same rule for plan, render, check and launch: past a learned position table, refused (an index error
        in the embedding); past rotary positions, a warning (the rotary embedding is computed from the position ids,
        so the step runs; quality past the trained length needs rope scaling). None when within the positions."""
        if self.max_positions is None or seq_len <= self.max_positions:
            return None
        if self.learned_positions:
            raise ZerokitError(f"{flag('seq-len')} {seq_len} exceeds the model's maximum of {self.max_positions} "
                               "positions: its learned position table has that many rows (max_position_embeddings / "
                               f"n_positions), a longer sequence indexes past it: use {flag('seq-len')} "
                               f"{self.max_positions} or less")
        factor = -(-seq_len // self.max_positions)
        return (f"{flag('seq-len')} {seq_len} is past the {self.max_positions} positions the model was trained on: "
                f"set rope scaling in its config for quality (e.g. rope_scaling YaRN or llama3 with factor {factor} "
                f"and original_max_position_embeddings {self.max_positions})")

    @property
    def active_params(self) -> int:
        """Parameters touched per token (MoE runs experts_per_token of num_experts experts, in its MoE layers)."""
        if self.num_experts <= 1:
            return self.params
        mlp_mats = 3 if self.gated_mlp else 2
        per_expert = mlp_mats * self.hidden_size * self.intermediate_size
        moe_layers = self.num_layers if self.moe_layers is None else self.moe_layers
        idle = (self.num_experts - self.experts_per_token) * per_expert * moe_layers
        return self.params - idle

    @property
    def _holds_untied_head(self) -> bool:
        """An untied LM head beside the input embedding (a pipeline's first stage holds the embedding alone:
        estimate/pipeline.py stage_view gives it embedding_params V h, untied)."""
        return not self.tied_embeddings and self.embedding_params >= 2 * self.vocab_size * self.hidden_size

    def tensor_parallel_params(self) -> int:
        """Parameters AutoTP splits over the tensor-parallel ranks: every decoder Linear's weight and, in training, the
        untied LM head (module_inject/auto_tp.py _replace: q/k/v/gate/up become LinearLayer, o_proj/down_proj
        LinearAllreduce, lm_head a LinearLayer with gather_output=True). Embeddings and norms stay whole on every rank.
        Measured: a random-init Llama of hidden 256 (8 heads / 4 KV heads, vocabulary 2048) at TP=2 holds 2,238,720 of
        its 3,950,848 parameters per rank (docs/measured-on-cpu.md; tests/test_parallel_memory.py checks it)."""
        h, d = self.hidden_size, self.head_dim
        a, k = self.num_attention_heads, self.num_kv_heads
        attention = h * (a + 2 * k) * d + a * d * h
        mlp = (3 if self.gated_mlp else 2) * h * self.intermediate_size * max(1, self.num_experts)
        # an untied head only where the model holds one; a vocab-parallel head is split by its rows (tensor_parallel_shard)
        head = self.vocab_size * h if self._holds_untied_head and not self.vocab_parallel else 0
        return self.num_layers * (attention + mlp) + head

    @by_identity()
    def tensor_parallel_shard(self, tp: int) -> "ModelSpec":
        """What one AutoTP rank holds and computes: the split weights at 1/tp, the heads, KV heads and MLP width at
        1/tp (column-parallel q/k/v/gate/up keep a slice of the outputs, row-parallel o_proj/down_proj read it and
        all-reduce their outputs in place: layers.py RowParallel), the hidden states, embeddings and logits whole
        (the LM head gathers its output). A fine-tune's counts come from the unsplit module tree, and peft's wrappers
        are not Linears AutoTP replaces: refused."""
        if tp == 1:
            return self
        if self.trained.trainable_params is not None:
            raise ZerokitError("AutoTP tensor parallelism is planned for full fine-tunes only (peft's LoRA layers are "
                               f"not the nn.Linear modules AutoTP splits): drop {flag('tensor-parallel')}, or use "
                               f"{flag('finetune')} full")
        split = self.tensor_parallel_params()
        vh = self.vocab_size * self.hidden_size
        largest = self.largest_layer_params
        common = dict(head_norm_elements=self.head_norm_elements // tp,
                      head_norm_rows=max(1, self.head_norm_rows // tp) if self.head_norm_rows else 0,
                      num_attention_heads=self.num_attention_heads // tp, num_kv_heads=max(1, self.num_kv_heads // tp),
                      intermediate_size=self.intermediate_size // tp)
        if self.vocab_parallel:  # Megatron: the embedding and head rows split too, and the logits with them
            kept = self.embedding_params // tp
            return replace(self, params=self.params - split + split // tp - (self.embedding_params - kept),
                           largest_layer_params=max(vh // tp, largest // tp), vocab_size=self.vocab_size // tp,
                           embedding_params=kept, **common)
        if largest > vh:  # the largest module is a split Linear (else the replicated embedding)
            largest = max(vh, largest // tp)
        head_split = vh - vh // tp if self._holds_untied_head else 0  # AutoTP's LinearLayer lm_head
        return replace(self, params=self.params - split + split // tp, largest_layer_params=largest,
                       embedding_params=self.embedding_params - head_split, **common)

    def with_liger_kernels(self, version: str | None = None) -> "ModelSpec":
        """This model as Liger-Kernel patches it (AutoLigerKernelForCausalLM / apply_liger_kernel_to_<model type>), for
        the model types Liger patches (LIGER_MODEL_TYPES); the rest are refused, as Liger would leave them unpatched.
        `version`: the liger-kernel release (None: a current one; its memory is priced the same since 0.5.9: the same
        tensors saved for backward and the same loss chunk)."""
        if version is not None:
            liger_release(version)  # one line for a version it cannot read
        # a bare count is priced as a Llama (spec_from_params: SwiGLU, RMSNorm, rotary), whose modules Liger patches
        if self.model_type not in LIGER_MODEL_TYPES and self.model_type != "params":
            raise ZerokitError(f"{flag('liger-kernels')} on: Liger-Kernel has no kernels for model type "
                               f"{self.model_type!r} (it patches "
                               f"{', '.join(sorted(LIGER_TEXT_TYPES))}): drop {flag('liger-kernels')}")
        return replace(self, liger_kernels=True, liger_version=version)

    def with_trained(self, **changes) -> "ModelSpec":
        """This spec with some of what trains changed (spec/trained.py Trained's fields)."""
        return replace(self, trained=replace(self.trained, **changes))

    def to_dict(self) -> dict:
        """JSON: the model's fields, then what trains (Trained's fields, flat as one spec), active and trainable counts."""
        d = asdict(self)
        d.update(d.pop("trained"))
        d["active_params"] = self.active_params
        d["trainable_params"] = self.trainable
        return d


# The model types Liger-Kernel patches: liger_kernel/transformers/monkey_patch.py MODEL_TYPE_TO_APPLY_LIGER_FN of v0.6.1,
# the oldest release ArcticTraining accepts (model/liger_factory.py: liger_version_min "0.6.1", "int64 indexing"). Each
# applies RMSNorm, SwiGLU (GEGLU for Gemma) and the fused linear cross-entropy by default; all are RMSNorm models.
LIGER_TEXT_TYPES = frozenset({"gemma", "gemma2", "gemma3_text", "glm4", "granite", "llama", "llama4_text", "mistral",
                              "mixtral", "olmo2", "phi3", "qwen2", "qwen3", "qwen3_moe", "smollm3"})
LIGER_MODEL_TYPES = LIGER_TEXT_TYPES | {"gemma3", "llama4", "llava", "mllama", "mllama_text_model", "qwen2_vl",
                                        "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text", "paligemma"}


# Bump when the counting or field-reading rules change: old cache entries then stop matching.
# 4: norms_per_layer, norm_inputs_per_layer, norm_fp32_weight, sliding_window(_layers), sdpa_mask, sdpa_broadcast_kv, attention_output_copy.
# 5: mlp_activation also reads `activation` (Falcon's gelu was read as the silu default). 6: max_positions.
# 7: the fine-tuning fields (quantized_bytes ... backward_matmul_params; defaults in the cache). 8: trainable_tensors,
# extra_modules_per_layer. 9: the fine-tuning fields moved to ModelSpec.trained (spec/trained.py), not cached.
# 10: learned_positions; max_positions raised by a config's rope scaling.
# 11: moe_layers (the layers with routed experts, when some are dense). 12: head_norm_elements, head_norm_rows. 13: norm_outputs_unkept, fused_qkv_kept.
_SCHEMA_VERSION = 13


# --------------------------------------------------------------------------------------------
# Bundled configs and the cache (pure Python)
# --------------------------------------------------------------------------------------------


def spec_cache_dir() -> Path:
    """Where cached specs live: ``$ZEROKIT_CACHE_DIR/model_specs`` or ``~/.cache/zerokit/model_specs``."""
    return cache_dir("model_specs")


def _cache_key(config: dict, trust_remote_code: bool) -> str:
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    material = f"zerokit-model-spec/{_SCHEMA_VERSION}\n{package_version('transformers')}\n{int(bool(trust_remote_code))}\n{canonical}"
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


# a counted model: what trains and the kernels it runs are set later
_SPEC_FIELDS = {f.name for f in fields(ModelSpec)} - {"trained", "liger_kernels", "liger_version"}


def _cache_read(key: str, name: str) -> ModelSpec | None:
    path = spec_cache_dir() / f"{key}.json"
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        if entry.get("key") != key or entry.get("schema") != _SCHEMA_VERSION:
            return None
        data = entry["spec"]
        if set(data) != _SPEC_FIELDS - {"name"}:
            return None
        return ModelSpec(name=name, **data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # missing or corrupt: recount


def _cache_write(key: str, spec: ModelSpec, source: str, seconds: float) -> None:
    directory = spec_cache_dir()
    data = asdict(spec)
    data.pop("name")
    data.pop("trained")
    data.pop("liger_kernels")
    data.pop("liger_version")
    entry = {
        "schema": _SCHEMA_VERSION,
        "key": key,
        "source": source,
        "transformers": package_version("transformers"),
        "count_seconds": round(seconds, 3),
        "spec": data,
    }
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # cache entries hold nothing private: 0644
        atomic_write_text(directory / f"{key}.json", json.dumps(entry, indent=1, sort_keys=True), mode=0o644)
    except OSError:
        pass  # an unwritable cache only costs a recount next time


# --------------------------------------------------------------------------------------------
# Counting on the meta device (imports torch + transformers)
# --------------------------------------------------------------------------------------------


def _text_config(cfg):
    get = getattr(cfg, "get_text_config", None)
    if get is not None:
        try:
            return get(decoder=True)
        except TypeError:
            return get()
        except Exception:
            pass
    return _first(cfg, ["text_config", "llm_config", "language_config"], cfg)


_GATE_NAME = re.compile(r"(^|\.)(gate_proj|gate_up_proj|w1|w3|wi_0|gate_up)(\.|$)")


def _measure(model, cfg) -> dict:
    """Exact counts from an instantiated module; shapes from the (text) config with fallbacks."""
    import torch

    unique: dict[int, int] = {}
    for p in model.parameters():
        unique[id(p)] = p.numel()
    params = sum(unique.values())
    largest = 0
    for m in model.modules():
        largest = max(largest, sum(p.numel() for p in m.parameters(recurse=False)))

    tc = _text_config(cfg)
    model_type = str(getattr(cfg, "model_type", None) or getattr(tc, "model_type", None) or "unknown")
    fields = config_fields(tc)
    hidden, layers = fields["hidden_size"], fields["num_layers"]

    in_emb = model.get_input_embeddings()
    in_w = getattr(in_emb, "weight", None)
    vocab = int(in_w.shape[0]) if in_w is not None else int(_first(tc, ["vocab_size"], 0))
    out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    out_w = getattr(out_emb, "weight", None) if out_emb is not None else None
    tied = out_w is not None and in_w is not None and out_w is in_w
    embedding = (in_w.numel() if in_w is not None else 0) + (out_w.numel() if out_w is not None and not tied else 0)

    names = [n for n, _ in model.named_parameters()]
    gated = any(_GATE_NAME.search(n) for n in names)

    cls = {type(m).__name__.lower() for m in model.modules()}
    if any("rmsnorm" in c for c in cls):
        norm = "rmsnorm"
    elif any("layernorm" in c or "layer_norm" in c for c in cls) or any(
        isinstance(m, torch.nn.LayerNorm) for m in model.modules()
    ):
        norm = "layernorm"
    else:
        norm = "rmsnorm"

    traits = _activation_traits(model, tc, model_type, hidden, layers)

    return dict(
        **traits,
        **fields,
        supports_sdpa=bool(getattr(model, "_supports_sdpa", True)),
        params=int(params),
        largest_layer_params=int(largest),
        vocab_size=vocab,
        tied_embeddings=bool(tied),
        gated_mlp=bool(gated),
        embedding_params=int(embedding),
        model_type=model_type,
        norm=norm,
        exact=True,
    )


# Gemma: `(1.0 + self.weight.float())`; Olmo 2: `(self.weight * hidden_states).to(input_dtype)`, the fp32 normalised input
# times the weight before the cast
_FP32_WEIGHT = re.compile(r"self\.weight\.float\(\)|self\.weight\.to\(torch\.float32\)|\(self\.weight \* hidden_states\)\.to\(")


def _decoder_layer(model, layers: int):
    """The first decoder layer: the first ModuleList of `layers` blocks in the text decoder."""
    import torch

    base = model
    get = getattr(model, "get_decoder", None)
    if callable(get):
        try:
            base = get() or model
        except Exception:
            base = model
    for root in (base, model):
        for m in root.modules():
            if isinstance(m, torch.nn.ModuleList) and layers > 0 and len(m) == layers and any(True for _ in m[0].parameters()):
                return m[0]
    return None


def _activation_traits(model, tc, model_type: str, hidden: int, layers: int) -> dict:
    """How the architecture's modules behave where it changes what autograd keeps (the activation model's
    inputs beyond shapes). Each rule names the transformers code it reads (transformers 5.23, torch 2.13)."""
    import inspect
    import sys

    out: dict = {}
    # Norms per decoder layer: the hidden-size norm modules of the first layer (a parallel attention + MLP
    # block reads one: PhiDecoderLayer, FalconDecoderLayer with parallel_attn; Gemma2 has four; per-head
    # q/k norms (Qwen3) are not hidden-size and are not counted).
    layer = _decoder_layer(model, layers)
    norms = []
    if layer is not None:
        for sub in layer.modules():
            if "norm" not in type(sub).__name__.lower():
                continue
            if any("norm" in type(c).__name__.lower() for c in sub.children()):
                continue
            w = getattr(sub, "weight", None)
            if w is None or not hasattr(w, "numel") or w.numel() == hidden:
                norms.append(sub)
    out["norms_per_layer"] = len(norms) if norms else 2
    # A norm that multiplies by its weight in fp32 (GemmaRMSNorm: `output * (1.0 + self.weight.float())`,
    # then `.type_as(x)`) keeps the fp32 normalised input for the weight's gradient instead of a 16-bit cast.
    fp32_weight = False
    if norms:
        try:
            fp32_weight = bool(_FP32_WEIGHT.search(inspect.getsource(type(norms[0]).forward)))
        except (OSError, TypeError):
            fp32_weight = False
    out["norm_fp32_weight"] = fp32_weight
    # Sliding-window attention as transformers builds its mask (masking_utils.create_sliding_window_causal_mask):
    # per layer from config.layer_types ("sliding_attention"; Qwen2 sets sliding_window None unless
    # use_sliding_window), else every layer of a model whose modeling code builds that mask whenever
    # config.sliding_window is set (MistralModel).
    window = getattr(tc, "sliding_window", None)
    n_sliding = 0
    if isinstance(window, int) and not isinstance(window, bool) and window > 0:
        types = getattr(tc, "layer_types", None)
        if isinstance(types, (list, tuple)) and len(types) == layers:
            n_sliding = sum(1 for t in types if t == "sliding_attention")
        else:
            module = sys.modules.get(type(model).__module__)
            if module is not None and hasattr(module, "create_sliding_window_causal_mask"):
                n_sliding = layers
    out["sliding_window"] = int(window) if n_sliding else None
    out["sliding_window_layers"] = n_sliding
    # Falcon (rotary, no ALiBi) calls torch sdpa itself (modeling_falcon.FalconAttention.forward): the mask is
    # always materialised (FalconModel.forward: create_causal_mask(..., allow_is_causal_skip=False)), and
    # multi-query K/V (1 head) go in un-repeated without enable_gqa (the new decoder architecture broadcasts
    # them to every head in _split_heads first).
    falcon = model_type == "falcon" and not getattr(tc, "alibi", False)
    out["sdpa_mask"] = falcon
    out["sdpa_broadcast_kv"] = falcon and not getattr(tc, "new_decoder_architecture", False) and bool(
        getattr(tc, "multi_query", False))
    # Partial rotary (Phi, GPT-NeoX, StableLM: `torch.cat((query_rot, query_pass), dim=-1)`) makes q contiguous
    # in (b, a, s, d); flash kernels write the output in q's layout (CPU: traced; CUDA flash: empty_like(q)), so
    # `attn_output.transpose(1, 2).contiguous()` copies it for o_proj.
    rope = getattr(tc, "rope_parameters", None)
    partial = rope.get("partial_rotary_factor") if isinstance(rope, dict) else None
    if partial is None:
        partial = _first(tc, ["partial_rotary_factor", "rotary_pct"], 1.0)
    partial_rotary = isinstance(partial, (int, float)) and not isinstance(partial, bool) and 0 < partial < 1
    out["attention_output_copy"] = partial_rotary
    # Phi3 (modeling_phi3): its apply_rotary_pos_emb always concatenates `q_rot` and `q_pass` (so the copy above whatever
    # the factor), and the attention's v is a view of the fused qkv_proj output, which q's and k's rotary replace
    if model_type == "phi3":
        out["attention_output_copy"] = True
    out["fused_qkv_kept"] = model_type == "phi3"
    # Parallel blocks whose two norms read the same tensor (FalconDecoderLayer with the new decoder architecture
    # and num_ln_in_parallel_attn 2: ln_attn and ln_mlp; GPTNeoXLayer with use_parallel_residual): a LayerNorm
    # saves its input, so that input is kept once.
    shared = (model_type == "falcon" and getattr(tc, "new_decoder_architecture", False)
              and getattr(tc, "num_ln_in_parallel_attn", None) in (None, 2)) or (
        model_type == "gpt_neox" and bool(getattr(tc, "use_parallel_residual", False)))
    out["norm_inputs_per_layer"] = 1 if shared else out["norms_per_layer"]
    # Norms on the projected queries and keys (Qwen3Attention, Gemma3Attention: `self.q_norm(self.q_proj(x).view(
    # hidden_shape))` over the head dim; Olmo2Attention over the whole projection), before the rotary embedding, which
    # keeps none of their output. One whose weight is hidden-size is already a hidden-size norm above.
    a = getattr(tc, "num_attention_heads", None) or 0
    k = getattr(tc, "num_key_value_heads", None) or a
    d = getattr(tc, "head_dim", None) or (hidden // a if a else 0)
    elements = rows = 0
    if layer is not None and a:
        for name, sub in layer.named_modules():
            leaf = name.rsplit(".", 1)[-1]
            w = getattr(sub, "weight", None)
            if leaf not in ("q_norm", "k_norm") or w is None or not hasattr(w, "numel") or w.numel() in (0, hidden):
                continue
            n = (a if leaf == "q_norm" else k) * d
            elements += n
            rows += max(1, n // w.numel())
    out["head_norm_elements"], out["head_norm_rows"] = elements, rows
    # Post-norms beside pre-norms (Gemma2DecoderLayer, Gemma3DecoderLayer: `hidden_states = self.post_attention_layernorm(
    # hidden_states); hidden_states = residual + hidden_states`, and pre_/post_feedforward_layernorm around the MLP): the
    # add keeps nothing, so their output is not saved. Olmo 2 has post-norms only (no input norm): its attention and MLP
    # read the residual itself, saved by their Linears in place of a norm's output: nothing to take off there.
    names = {n.rsplit(".", 1)[-1] for n, _ in layer.named_modules()} if layer is not None else set()
    pre_and_post = "pre_feedforward_layernorm" in names and "input_layernorm" in names
    unkept = sum(1 for n in ("post_attention_layernorm", "post_feedforward_layernorm") if n in names) if pre_and_post else 0
    # and a hidden-size q_norm / k_norm (counted among the hidden-size norms above): the rotary embedding keeps nothing
    unkept += sum(1 for n, sub in (layer.named_modules() if layer is not None else ())
                  if n.rsplit(".", 1)[-1] in ("q_norm", "k_norm")
                  and getattr(getattr(sub, "weight", None), "numel", lambda: 0)() == hidden)
    out["norm_outputs_unkept"] = unkept
    return out


class _MetaBuildTimeout(BaseException):
    """Raised by the alarm inside transformers' build: a BaseException, so the build's own `except Exception`
    handlers let it through."""


@contextlib.contextmanager
def _meta_build_deadline(seconds: float):
    """SIGALRM after `seconds` while the block runs (main thread on Unix; elsewhere the block runs unbounded)."""
    import signal
    import threading

    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise _MetaBuildTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{exc.__class__.__name__}: {text[0]}" if text else exc.__class__.__name__


def _count_on_meta(config: dict, source: str, trust_remote_code: bool, hub_id: str | None) -> dict:
    try:
        import torch
        import transformers
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
    except ImportError as exc:
        raise ZerokitError(
            f"exact counts for {source} need torch and transformers ({exc.name} is missing): pip install "
            f"'zerokit[train]', or plan with {flag('params')} N"
        ) from None

    model_type = config.get("model_type")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING and not (trust_remote_code and "auto_map" in config):
        hint = " (it has auto_map: pass trust_remote_code / --trust-remote-code)" if "auto_map" in config else ""
        raise ZerokitError(
            f"{source}: model_type {model_type!r} is unknown to transformers {transformers.__version__}{hint}: "
            f"upgrade transformers, or plan with {flag('params')} N"
        )

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        try:
            if hub_id is not None and trust_remote_code:
                cfg = AutoConfig.from_pretrained(hub_id, trust_remote_code=True)
            elif trust_remote_code and "auto_map" in config:
                cfg = AutoConfig.from_pretrained(str(Path(source).parent), trust_remote_code=True)
            else:
                cfg = CONFIG_MAPPING[model_type].from_dict(dict(config))
        except ZerokitError:
            raise
        except Exception as exc:
            raise ZerokitError(f"transformers cannot parse the config of {source} ({_first_line(exc)}): {_HINT}") from None
        model = None
        errors = []
        start = time.perf_counter()
        # Causal LM first; vision/audio-language models have a generation head under
        # ImageTextToText; the bare AutoModel (no LM head) is the last resort.
        autos = [AutoModelForCausalLM, getattr(transformers, "AutoModelForImageTextToText", None), AutoModel]
        try:
            with _meta_build_deadline(META_BUILD_SECONDS):
                for auto in [a for a in autos if a is not None]:
                    try:
                        with torch.device("meta"):
                            model = auto.from_config(cfg, trust_remote_code=trust_remote_code)
                        break
                    except Exception as exc:  # no causal-LM class for this config, or a model bug
                        errors.append(_first_line(exc))
        except _MetaBuildTimeout:
            raise ZerokitError(f"{source} did not build on the meta device within {META_BUILD_SECONDS} s "
                               f"(core/limits.py): check its sizes, or plan with {flag('params')} N") from None
        if model is None:
            raise ZerokitError(
                f"transformers cannot build {source} (model_type {model_type!r}): {errors[-1]}; plan with "
                f"{flag('params')} N"
            )
        try:
            measured = _measure(model, cfg)
            measured["_seconds"] = time.perf_counter() - start
            return measured
        except Exception as exc:
            raise ZerokitError(f"cannot measure {source} ({_first_line(exc)}): plan with {flag('params')} N") from None
    finally:
        transformers.logging.set_verbosity(verbosity)


_TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config")


# The keys by which a config names its attention head size itself (Llama-family head_dim, GLM's kv_channels, T5's
# d_kv, DeepSeek's MLA qk_nope_head_dim / v_head_dim, ...): then the heads need not divide the hidden size.
_HEAD_DIM_KEYS = ("head_dim", "kv_channels", "attention_head_size", "d_kv", "qk_nope_head_dim", "qk_head_dim",
                  "v_head_dim", "attention_head_dim", "head_size")


def _gives_head_dim(cfg: dict) -> bool:
    from zerokit.spec.arch_params import _DEFAULTS  # the architectures counted here, with their config classes' defaults

    defaults = _DEFAULTS.get(str(cfg.get("model_type")), {})
    return any(cfg.get(k) is not None or defaults.get(k) is not None for k in _HEAD_DIM_KEYS)


def check_config_bounds(config: dict, source: str) -> None:
    """Refuse a config.json whose sizes are not positive integers within core/limits.py, or whose model would
    exceed MAX_PARAMS, before it is counted or built (10**12 layers hung the meta-device build). Nested text
    configs (multimodal models) are held to the same bounds."""
    nested = [(config[k], f"{source} ({k})") for k in _TEXT_CONFIG_KEYS if isinstance(config.get(k), dict)]
    for cfg, where in [(config, source), *nested]:
        for key, limit in SIZE_LIMITS.items():
            value = cfg.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ZerokitError(f"{where}: {key} must be a positive integer, got {value!r}: fix the config")
            at_most(value, limit, f"{where}: {key}")
        try:
            f = config_fields(ConfigView(str(cfg.get("model_type")), cfg))
        except (TypeError, ValueError, OverflowError) as e:
            raise ZerokitError(f"{where}: cannot read the model's sizes ({e}): fix the config") from None
        h, layers = f["hidden_size"], f["num_layers"]
        heads = f["num_attention_heads"]
        if heads > 0 and h % heads and not _gives_head_dim(cfg):
            # transformers splits the hidden size into the heads, hidden_size // num_attention_heads each, unless the
            # config names the head size (LlamaAttention: getattr(config, "head_dim", hidden_size // heads); GPT-2,
            # OPT, BLOOM and Falcon raise "must be divisible by num_heads"): without one, heads that do not divide
            # the hidden size are a typo, not a model (Gemma's head_dim 256 beside hidden 3072 is one, and valid)
            raise ZerokitError(f"{where}: hidden_size {h} is not divisible by num_attention_heads {heads}, and the "
                               "config gives no head_dim: fix either, or give head_dim as the model defines it")
        rough = layers * (4 * h * h + 3 * h * f["intermediate_size"] * f["num_experts"]) + 2 * (cfg.get("vocab_size") or 0) * h
        at_most(rough, "MAX_PARAMS", f"{where}: the model's size in parameters (roughly)")


def load_model_spec(model: "str | ResolvedModel", trust_remote_code: bool = False) -> ModelSpec:
    """Exact spec for a bundled name, a local dir/config.json, or a hub id (zerokit.spec.resolve decides which).

    Counted without torch (spec/arch_params.py) for the architectures it knows, else on the meta device
    (imports torch and transformers) and cached. Raises ZerokitError (one line) for a missing path, a
    directory without config.json, malformed JSON, an unknown model_type, or an unreachable / unknown hub id.
    """
    resolved = model if isinstance(model, ResolvedModel) else resolve_model(model)
    config_path, config = resolved.load_config()
    check_config_bounds(config, str(config_path))
    if not trust_remote_code:
        counted = count_params_from_config(config)
        if counted is not None:
            return ModelSpec(name=resolved.name, **counted)

    key = _cache_key(config, trust_remote_code)
    cached = _cache_read(key, resolved.name)
    if cached is not None:
        return cached

    source = str(config_path)
    measured = _count_on_meta(config, source, trust_remote_code, resolved.hub_id)
    seconds = measured.pop("_seconds")  # instantiate + count on meta, imports excluded
    spec = ModelSpec(name=resolved.name, **measured)
    _cache_write(key, spec, resolved.hub_id or source, seconds)
    return spec


# --------------------------------------------------------------------------------------------
# Shapes from a bare parameter count (pure Python)
# --------------------------------------------------------------------------------------------

# Published Llama-family shapes (hidden, layers, intermediate, heads, kv_heads), from the HF
# config.json of each: GPT-3-Small-sized Llama analog, TinyLlama-1.1B, Llama-3.2-3B, Llama-2-7B,
# Llama-2-13B, Llama-1-33B, Llama-2-70B, Llama-3.1-405B. A bare count picks the anchor whose
# size is nearest in log space, then solves the layer count; between anchors depth grows and
# width steps, the way these families scale.
_ANCHORS = (
    (768, 12, 2048, 12, 12),
    (1024, 24, 2816, 16, 16),
    (2048, 22, 5632, 32, 4),
    (3072, 28, 8192, 24, 8),
    (4096, 32, 11008, 32, 32),
    (5120, 40, 13824, 40, 40),
    (6656, 60, 17920, 52, 52),
    (8192, 80, 28672, 64, 8),
    (16384, 126, 53248, 128, 8),
)
_DEFAULT_VOCAB = 32000  # Llama / Llama-2 / Mistral tokenizer


def _llama_intermediate(h: int) -> int:
    """Llama's SwiGLU width rule: 2/3 of 4h, rounded up to a multiple of 256."""
    return 256 * math.ceil((8 * h / 3) / 256)


def _heads_for(h: int) -> int:
    head_dim = 128 if h >= 1536 else 64
    return max(1, h // head_dim)


def _layer_params(h: int, inter: int, heads: int, kv: int) -> int:
    head_dim = h // heads
    attn = 2 * h * h + 2 * h * kv * head_dim  # q, o + k, v
    mlp = 3 * h * inter  # gate, up, down
    return attn + mlp + 2 * h  # two RMSNorm weights


def _shape_for_hidden(h: int) -> tuple[int, int, int]:
    for ah, _, ai, aheads, akv in _ANCHORS:
        if ah == h:
            return ai, aheads, akv
    heads = _heads_for(h)
    return _llama_intermediate(h), heads, heads


def _given_heads(h: int, heads: int, kv: int, num_attention_heads: int | None,
                 num_kv_heads: int | None) -> tuple[int, int]:
    """The heads and key/value heads of a bare count's shape: as given, the key/value heads defaulting to the heads
    (LlamaConfig's num_key_value_heads default), else the guessed ones. Heads must split the width evenly and the
    key/value heads the heads (grouped-query attention), as transformers' Llama asserts."""
    if num_attention_heads is None and num_kv_heads is None:
        return heads, kv
    heads = num_attention_heads or heads
    kv = num_kv_heads or (heads if num_attention_heads else kv)
    if h % heads:
        raise ZerokitError(f"{flag('num-attention-heads')} {heads} does not divide {flag('hidden-size')} {h}: give a "
                           "divisor of it")
    if kv > heads or heads % kv:
        raise ZerokitError(f"{flag('num-kv-heads')} {kv} does not divide the {heads} attention heads: give a divisor "
                           "of them")
    return heads, kv


def spec_from_params(
    params: float,
    hidden_size: int | None = None,
    num_layers: int | None = None,
    vocab_size: int | None = None,
    seq_len: int | None = None,
    num_attention_heads: int | None = None,
    num_kv_heads: int | None = None,
) -> ModelSpec:
    """A plausible Llama-like (SwiGLU, RMSNorm; untied unless the shape's count says tied) ModelSpec for a bare
    parameter count.

    ``params`` is kept exactly; shapes are guessed (``exact=False``). Rule: total ≈ L·(4h² + 3·h·I)
    + 2·V·h (I ≈ 8h/3; GQA where the family uses it). With no shape given, h/I/heads come from the
    published Llama anchor nearest in log-size and L is solved for the count; ``hidden_size`` fixes
    h and solves L; ``num_layers`` alone solves h (multiple of 128); both given are taken as is.
    ``vocab_size`` defaults to 32000. ``num_attention_heads`` sets the heads (head_dim = h / heads)
    and ``num_kv_heads`` the key/value heads, which default to the attention heads when only those
    are given (LlamaConfig's num_key_value_heads default). ``seq_len`` is accepted for interface
    symmetry: RoPE models have no position parameters, so it does not change the shapes. Pure
    Python: no torch.
    """
    try:
        total = int(params)
    except (TypeError, ValueError, OverflowError):
        raise ZerokitError(f"{flag('params')} must be a number, got {params!r}") from None
    if total <= 0:
        raise ZerokitError(f"{flag('params')} must be positive, got {params!r}")
    at_most(total, "MAX_PARAMS", flag("params"))
    for label, value, limit in (("hidden_size", hidden_size, "MAX_DIMENSION"), ("num_layers", num_layers, "MAX_LAYERS"),
                                ("vocab_size", vocab_size, "MAX_VOCAB"), ("seq_len", seq_len, "MAX_SEQ_LEN"),
                                ("num_attention_heads", num_attention_heads, "MAX_DIMENSION"),
                                ("num_kv_heads", num_kv_heads, "MAX_DIMENSION")):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ZerokitError(f"{label} must be a positive integer, got {value!r}")
        if value is not None:
            at_most(value, limit, f"--{label.replace('_', '-')}")
    if hidden_size is None and (num_attention_heads or num_kv_heads):
        raise ZerokitError(f"{flag('num-attention-heads')} and {flag('num-kv-heads')} split a given width: give "
                           f"{flag('hidden-size')} too")
    V = vocab_size or _DEFAULT_VOCAB

    if hidden_size is None and num_layers is None:
        def anchor_total(a):
            h, L, inter, heads, kv = a
            return L * _layer_params(h, inter, heads, kv) + 2 * V * h + h

        anchor = min(_ANCHORS, key=lambda a: abs(math.log(anchor_total(a)) - math.log(total)))
        h, _, inter, heads, kv = anchor
        # Below the smallest anchor, shrink the width so at least one layer fits the count.
        while h > 64 and total - 2 * V * h < _layer_params(h, inter, heads, kv):
            h = max(64, (h // 2) // 64 * 64)
            inter, heads, kv = _llama_intermediate(h), max(1, h // 64), max(1, h // 64)
    elif hidden_size is not None:
        h = hidden_size
        inter, heads, kv = _shape_for_hidden(h)
        heads, kv = _given_heads(h, heads, kv, num_attention_heads, num_kv_heads)
    else:
        # num_layers only: the width (multiple of 128) whose Llama-rule total is nearest.
        best = None
        for h_try in range(128, 65536 + 1, 128):
            i_try, he, kvh = _shape_for_hidden(h_try)
            err = abs(num_layers * _layer_params(h_try, i_try, he, kvh) + 2 * V * h_try - total)
            if best is None or err < best[0]:
                best = (err, h_try)
        h = best[1]
        inter, heads, kv = _shape_for_hidden(h)

    # The smallest model of these shapes holds its vocabulary's embeddings (input and untied output) and one layer:
    # 4,161,728 parameters for the default 32,000-token vocabulary at the narrowest width, 64. A count below that
    # (--params 1) is no Llama-like model of that vocabulary; planned, its states would be priced for fewer
    # parameters than its own embeddings, beside activations and logits of the full shapes: refused instead.
    smallest = 2 * V * h + h + _layer_params(h, inter, heads, kv)
    if total < smallest:
        fix = (f"a smaller {flag('hidden-size')} or {flag('vocab-size')}" if hidden_size is not None
               else f"a smaller {flag('vocab-size')}")
        raise ZerokitError(f"{flag('params')} {total:,} is below the smallest Llama-like model of a {V:,}-token "
                           f"vocabulary at hidden size {h:,} ({smallest:,} parameters: its embeddings and one layer): "
                           f"give at least {smallest:,}, {fix}, or the model's config.json")
    if num_layers is not None:
        L = num_layers
    else:
        L = max(1, round((total - 2 * V * h - h) / _layer_params(h, inter, heads, kv)))
    if L > MAX_LAYERS:
        raise ZerokitError(f"{_human(total)} parameters at hidden size {h:,} make {L:,} layers, above the "
                           f"{MAX_LAYERS:,} zerokit accepts ({WHY['MAX_LAYERS']}): give a larger {flag('hidden-size')}")

    # A count given with its shape that leaves room for one vocabulary matrix, not two, is a tied model (GPT-2,
    # Megatron's GPT, BLOOM, OPT, Llama-3.2-1B/3B: the LM head is the input embedding). Priced untied, its LM head
    # would run no matmul (timing.matmul_params takes the input embedding out) and an AutoTP shard would split a head
    # the count never held. Left beside the layers: under 1.5 V h is one matrix (and position tables), not two; none
    # left (the guessed layers outweigh the count) says nothing of the head, which stays untied.
    left = total - L * _layer_params(h, inter, heads, kv) - h
    tied = hidden_size is not None and num_layers is not None and 0 < left < 1.5 * V * h
    head_dim = max(1, h // heads)
    largest = max(V * h, h * inter, h * h)
    return ModelSpec(
        name=f"params-{_human(total)}",
        params=total,
        largest_layer_params=largest,
        hidden_size=h,
        num_layers=L,
        num_attention_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=V,
        tied_embeddings=tied,
        gated_mlp=True,
        num_experts=1,
        experts_per_token=1,
        embedding_params=(1 if tied else 2) * V * h,
        model_type="params",
        norm="rmsnorm",
        exact=False,
    )


def _human(n: int) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def gradient_sizes_in_backward_order(model: ModelSpec) -> list[int]:
    """Parameter sizes in the order their gradients become ready (the reverse of forward), from the spec's
    shapes: the untied LM head, the final norm, each layer's tensors last to first, the input embedding
    (a tied embedding's gradient completes last, after both uses). Whatever the shapes leave over
    (biases, position embeddings) is one small tensor at the end."""
    h, i, d = model.hidden_size, model.intermediate_size, model.head_dim
    a, k = model.num_attention_heads, model.num_kv_heads
    experts = max(1, model.num_experts)
    if model.gated_mlp:  # Llama: norm, q, k, v, o, norm, gate, up, down
        layer = [h, a * d * h, k * d * h, k * d * h, a * d * h, h] + [i * h] * 3 * experts
        if experts > 1:
            layer.append(h * experts)  # router
    else:  # GPT-2: ln (w, b), fused qkv (w, b), out proj (w, b), ln (w, b), fc (w, b), proj (w, b)
        layer = [h, h, 3 * h * h, 3 * h, h * h, h, h, h, i * h, i, i * h, h]
    final_norm = h if model.norm == "rmsnorm" else 2 * h
    vh = model.vocab_size * h
    head = [] if model.tied_embeddings else [vh]
    sizes = head + [final_norm] + list(reversed(layer)) * model.num_layers + [vh]
    rest = model.params - sum(sizes)
    return sizes + ([rest] if rest > 0 else [])


@by_identity()
def trainable_gradient_sizes(model: ModelSpec) -> tuple[int, ...]:
    """The trainable parameter tensors' elements in the order their gradients become ready: what a fine-tune's module
    tree recorded (Trained.trainable_tensors), else every tensor of the spec's shapes (gradient_sizes_in_backward_order).
    Memoized: the planner prices every ZeRO setup's reductions from it."""
    return tuple(model.trained.trainable_tensors or gradient_sizes_in_backward_order(model))


__all__ = ["ModelSpec", "load_model_spec", "spec_from_params", "spec_cache_dir", "gradient_sizes_in_backward_order",
           "trainable_gradient_sizes"]
