"""Exact parameter counts and shapes from a config.json, without torch or transformers, for the architectures
written out here; anything else returns None and zerokit counts on the meta device (spec/model.py).

Why: a cold plan that builds the model on the meta device imports torch and transformers (6-9 s on 2 cores), more
than DeepSpeed's own estimator takes. The arithmetic below copies the modules transformers 5.23 builds (each rule
names the class it copies), and tests/test_arch_params.py holds every supported architecture, bundled configs and
synthetic variants alike, equal to the meta-device count on every ModelSpec field.

The config is read the way transformers reads it: the config class's defaults (written out per model_type below,
from configuration_<type>.py), then every key of config.json (extra keys become attributes too), then what the
class derives in __post_init__ (head_dim, num_key_value_heads, Qwen2's sliding window, Qwen2/Gemma 2/Gemma 3/
SmolLM3/Cohere 2/GPT-OSS layer_types, Falcon's kv heads and FFN size, DeepSeek's head_dim, the rope parameters as
convert_rope_params_to_dict leaves them for the families added with transformers 5's config classes). The
multimodal Gemma 3 adds its SigLIP vision tower and projector. The field reading itself (config_fields) is shared
with the meta-device path, so the two cannot drift apart.

Families: Llama-shaped decoders (Llama, Mistral, Mixtral, Qwen2/3, Qwen3-MoE, Gemma 1/2/3, Granite, SmolLM3, OLMo 2),
Cohere 2, GPT-OSS, DeepSeek-V2/V3 (multi-head latent attention, routed and shared experts after dense layers), Phi,
Phi-3, Falcon, GPT-2, OPT, BLOOM, GPT-NeoX. Declined (None, the meta device counts): a config value of the wrong type
or a feature a counter does not model (each counter says which), such as Qwen3-MoE's dense layers among sparse ones,
per-layer-type (nested) rope parameters, or layer_types with other than full and sliding attention.
"""

from __future__ import annotations

from typing import Any

# Defaults of each supported config class (transformers 5.23 configuration_<type>.py), only the keys the counts
# or config_fields read; attribute_map aliases (GPT-2's n_embd is hidden_size) in ALIASES.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(max_position_embeddings=2048, vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=None, hidden_act="silu", tie_word_embeddings=False,
                  attention_bias=False, attention_dropout=0.0, mlp_bias=False, head_dim=None),
    "mistral": dict(max_position_embeddings=131072, vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, head_dim=None, hidden_act="silu",
                    tie_word_embeddings=False, sliding_window=4096, attention_dropout=0.0),
    "mixtral": dict(max_position_embeddings=131072, vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, head_dim=None, hidden_act="silu",
                    tie_word_embeddings=False, sliding_window=None, attention_dropout=0.0, num_experts_per_tok=2,
                    num_local_experts=8, router_jitter_noise=0.0),
    "qwen2": dict(max_position_embeddings=32768, vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, hidden_act="silu", tie_word_embeddings=False,
                  use_sliding_window=False, sliding_window=4096, max_window_layers=28, layer_types=None,
                  attention_dropout=0.0),
    "gemma": dict(max_position_embeddings=8192, vocab_size=256000, hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=16, head_dim=256, hidden_act="gelu_pytorch_tanh",
                  tie_word_embeddings=True, attention_bias=False, attention_dropout=0.0),
    "qwen3": dict(max_position_embeddings=32768, vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, head_dim=128, hidden_act="silu",
                  tie_word_embeddings=False, attention_bias=False, use_sliding_window=False, sliding_window=4096,
                  max_window_layers=28, layer_types=None, attention_dropout=0.0),
    "opt": dict(vocab_size=50272, hidden_size=768, num_hidden_layers=12, ffn_dim=3072, max_position_embeddings=2048,
                do_layer_norm_before=True, _remove_final_layer_norm=False, word_embed_proj_dim=None, dropout=0.1,
                attention_dropout=0.0, num_attention_heads=12, activation_function="relu", enable_bias=True,
                layer_norm_elementwise_affine=True, tie_word_embeddings=True),
    "bloom": dict(vocab_size=250880, hidden_size=64, n_layer=2, n_head=8, hidden_dropout=0.0, attention_dropout=0.0,
                  tie_word_embeddings=True),
    "gpt_neox": dict(vocab_size=50432, hidden_size=6144, num_hidden_layers=44, num_attention_heads=64,
                     intermediate_size=24576, hidden_act="gelu", attention_dropout=0.0, hidden_dropout=0.0,
                     max_position_embeddings=2048, tie_word_embeddings=False, use_parallel_residual=True,
                     rope_parameters=None, attention_bias=True),
    "phi": dict(max_position_embeddings=2048, vocab_size=51200, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                num_key_value_heads=None, resid_pdrop=0.0, attention_dropout=0.0, hidden_act="gelu_new",
                tie_word_embeddings=False, rope_parameters=None, qk_layernorm=False),
    "qwen3_moe": dict(max_position_embeddings=32768, vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
                      num_attention_heads=32, num_key_value_heads=4, hidden_act="silu", tie_word_embeddings=False,
                      attention_bias=False, use_sliding_window=False, sliding_window=4096, attention_dropout=0.0,
                      decoder_sparse_step=1, moe_intermediate_size=768, num_experts_per_tok=8, num_local_experts=128,
                      mlp_only_layers=None),
    "phi3": dict(max_position_embeddings=4096, vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=None, resid_pdrop=0.0, attention_dropout=0.0,
                 hidden_act="silu", tie_word_embeddings=False, rope_parameters=None, sliding_window=None),
    # Gemma2Config / Gemma3TextConfig: four norms a layer, layer_types from __post_init__ (below)
    "gemma2": dict(max_position_embeddings=8192, vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                   num_attention_heads=8, num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh",
                   tie_word_embeddings=True, attention_bias=False, attention_dropout=0.0, sliding_window=4096,
                   layer_types=None),
    "gemma3_text": dict(max_position_embeddings=131072, vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                        num_attention_heads=8, num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh",
                        tie_word_embeddings=True, attention_bias=False, attention_dropout=0.0, sliding_window=4096,
                        layer_types=None, use_bidirectional_attention=False),
    "falcon": dict(vocab_size=65024, hidden_size=4544, num_hidden_layers=32, num_attention_heads=71,
                   num_ln_in_parallel_attn=None, hidden_dropout=0.0, attention_dropout=0.0, num_kv_heads=None,
                   alibi=False, new_decoder_architecture=False, multi_query=True, parallel_attn=True, bias=False,
                   max_position_embeddings=2048, ffn_hidden_size=None, activation="gelu", tie_word_embeddings=True),
    "gpt2": dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, n_inner=None,
                 activation_function="gelu_new", resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                 add_cross_attention=False, tie_word_embeddings=True),
    # Olmo2Config, GraniteConfig, SmolLM3Config: Llama-shaped; Granite's four multipliers are plain floats (no
    # parameters), SmolLM3's no_rope_layers only decide its layer_types (below)
    "olmo2": dict(max_position_embeddings=2048, vocab_size=50304, hidden_size=4096, intermediate_size=11008,
                  num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=None, hidden_act="silu",
                  tie_word_embeddings=False, rope_parameters=None, attention_bias=False, attention_dropout=0.0),
    "granite": dict(max_position_embeddings=2048, vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=None, hidden_act="silu",
                    tie_word_embeddings=False, rope_parameters=None, attention_bias=False, attention_dropout=0.0,
                    mlp_bias=False),
    "smollm3": dict(max_position_embeddings=32768, vocab_size=128256, hidden_size=2048, intermediate_size=11008,
                    num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=4, hidden_act="silu",
                    rope_parameters=None, use_sliding_window=False, sliding_window=None, no_rope_layers=None,
                    no_rope_layer_interval=4, layer_types=None, attention_bias=False, attention_dropout=0.0,
                    mlp_bias=False, tie_word_embeddings=True),
    "cohere2": dict(max_position_embeddings=8192, vocab_size=256000, hidden_size=8192, intermediate_size=22528,
                    num_hidden_layers=40, num_attention_heads=64, num_key_value_heads=None, hidden_act="silu",
                    tie_word_embeddings=True, rope_parameters=None, attention_bias=False, attention_dropout=0.0,
                    sliding_window=4096, layer_types=None),
    "gpt_oss": dict(num_hidden_layers=36, num_local_experts=128, vocab_size=201088, hidden_size=2880,
                    intermediate_size=2880, head_dim=64, num_attention_heads=64, num_key_value_heads=8,
                    sliding_window=128, tie_word_embeddings=False, hidden_act="silu", max_position_embeddings=131072,
                    rope_parameters=None, attention_dropout=0.0, num_experts_per_tok=4, layer_types=None,
                    attention_bias=True),
    # DeepseekV3Config / DeepseekV2Config: multi-head latent attention (the ranks and head dims), routed and shared
    # experts after first_k_dense_replace dense layers
    "deepseek_v3": dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                        num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
                        n_routed_experts=256, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
                        v_head_dim=128, qk_nope_head_dim=128, num_experts_per_tok=8, first_k_dense_replace=3,
                        hidden_act="silu", max_position_embeddings=4096, tie_word_embeddings=False,
                        rope_parameters=None, attention_bias=False, attention_dropout=0.0),
    "deepseek_v2": dict(vocab_size=102400, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=None, hidden_act="silu",
                        max_position_embeddings=2048, tie_word_embeddings=False, rope_parameters=None,
                        attention_bias=False, attention_dropout=0.0, mlp_bias=False, first_k_dense_replace=0,
                        kv_lora_rank=512, q_lora_rank=1536, n_routed_experts=64, n_shared_experts=2,
                        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, num_experts_per_tok=None,
                        moe_intermediate_size=1407),
}
ALIASES: dict[str, dict[str, str]] = {
    "gpt2": {"hidden_size": "n_embd", "max_position_embeddings": "n_positions", "num_attention_heads": "n_head",
             "num_hidden_layers": "n_layer"},
    "mixtral": {"num_experts": "num_local_experts"},
    "qwen3_moe": {"num_experts": "num_local_experts"},
    "bloom": {"num_hidden_layers": "n_layer", "num_attention_heads": "n_head"},
    "gpt_oss": {"num_experts": "num_local_experts"},
    "deepseek_v3": {"num_local_experts": "n_routed_experts"},
    "deepseek_v2": {"num_experts": "n_routed_experts"},
}
# Modeling modules that build a sliding-window mask whenever config.sliding_window is set (MistralModel,
# MixtralModel: create_sliding_window_causal_mask); spec/model.py _activation_traits reads the same thing from
# the module. LlamaModel never does; Qwen2 decides per layer from layer_types.
_SLIDING_MASK_MODULES = ("mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "phi3", "gemma2", "gemma3_text")
# Config classes whose __post_init__ always fills layer_types (Qwen2/3 from max_window_layers, Gemma 2 every other
# layer, Gemma 3 from sliding_window_pattern)
_LAYER_TYPES_MODELS = ("qwen2", "qwen3", "gemma2", "gemma3_text")
_GEMMAS = ("gemma", "gemma2", "gemma3_text")
SUPPORTED_MODEL_TYPES = (*_DEFAULTS, "gemma3")  # gemma3: the multimodal Gemma 3 (its text model is gemma3_text)
# The config keys that size a model (any architecture's names, as config_fields reads them) and the bound of each
# (a name in zerokit/core/limits.py): spec/model.py check_config_bounds refuses a config past them before anything
# is counted or built; the arithmetic below declines (None) any of them that is not a positive integer.
SIZE_LIMITS = {
    "vocab_size": "MAX_VOCAB", "num_hidden_layers": "MAX_LAYERS", "n_layer": "MAX_LAYERS", "num_layers": "MAX_LAYERS",
    "n_layers": "MAX_LAYERS", "decoder_sparse_step": "MAX_LAYERS", "hidden_size": "MAX_DIMENSION",
    "n_embd": "MAX_DIMENSION", "n_embed": "MAX_DIMENSION", "d_model": "MAX_DIMENSION",
    "word_embed_proj_dim": "MAX_DIMENSION", "intermediate_size": "MAX_DIMENSION", "ffn_dim": "MAX_DIMENSION",
    "n_inner": "MAX_DIMENSION", "ffn_hidden_size": "MAX_DIMENSION", "moe_intermediate_size": "MAX_DIMENSION",
    "num_attention_heads": "MAX_DIMENSION", "n_head": "MAX_DIMENSION", "num_key_value_heads": "MAX_DIMENSION",
    "num_kv_heads": "MAX_DIMENSION", "n_head_kv": "MAX_DIMENSION", "multi_query_group_num": "MAX_DIMENSION",
    "head_dim": "MAX_DIMENSION", "kv_channels": "MAX_DIMENSION", "num_local_experts": "MAX_DIMENSION",
    "num_experts": "MAX_DIMENSION", "n_routed_experts": "MAX_DIMENSION", "num_experts_per_tok": "MAX_DIMENSION",
    "moe_top_k": "MAX_DIMENSION", "max_position_embeddings": "MAX_SEQ_LEN", "n_positions": "MAX_SEQ_LEN",
    # DeepSeek's multi-head latent attention and shared experts (q_lora_rank None: a plain q_proj, not checked)
    "q_lora_rank": "MAX_DIMENSION", "kv_lora_rank": "MAX_DIMENSION", "qk_nope_head_dim": "MAX_DIMENSION",
    "qk_rope_head_dim": "MAX_DIMENSION", "v_head_dim": "MAX_DIMENSION", "n_shared_experts": "MAX_DIMENSION",
}
# Not here, though the counts read them: first_k_dense_replace (DeepSeek) is a layer index, not a size (any value
# past the layers only makes every layer dense, and 0, DeepseekV2Config's default, is valid, which the positive-
# integer rule of check_config_bounds would refuse); SmolLM3's no_rope_layer_interval and Cohere 2's
# sliding_window_pattern are periods over the layers. The counters check each itself and decline what is not a
# plain integer.
_SHAPE_KEYS = frozenset(SIZE_LIMITS)


class ConfigView:
    """A config dict read like the transformers config object: defaults, aliases, then attribute access."""

    def __init__(self, model_type: str, values: dict):
        self.model_type = model_type
        self._aliases = ALIASES.get(model_type, {})
        self._values = values

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return self.get(name)

    def get(self, name: str):
        """A value by its name, also a private one (OPT's _remove_final_layer_norm)."""
        return self._values.get(self._aliases.get(name, name))


def first_attr(obj, names, default=None):
    """The first of the attributes `names` that the config has (not None), else default."""
    for n in names:
        try:
            v = getattr(obj, n)
        except Exception:  # a config property may raise
            continue
        if v is not None:
            return v
    return default


def _prob(v) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def _positive_or_none(v) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def moe_layer_count(tc, layers: int) -> int | None:
    """Decoder layers whose MLP is the routed experts, when some are dense (None: all of them). DeepSeek-V2/V3
    (DeepseekV3DecoderLayer: experts from layer first_k_dense_replace on; V2 also every moe_layer_freq-th), Qwen2/3-MoE
    (Qwen3MoeDecoderLayer: not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0)."""
    first = first_attr(tc, ["first_k_dense_replace"], 0)
    freq = first_attr(tc, ["moe_layer_freq"], 1)
    only = first_attr(tc, ["mlp_only_layers"], None) or ()
    step = first_attr(tc, ["decoder_sparse_step"], 1)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (first, freq, step)) or freq < 1 or step < 1:
        return None  # not a layout this reads: every layer counted as MoE, as before
    count = sum(1 for i in range(layers) if i >= first and i % freq == 0 and i not in only and (i + 1) % step == 0)
    return None if count == layers else count


def config_fields(tc) -> dict:
    """The ModelSpec fields read from the (text) config, with their fallbacks: shared by the meta-device count
    (spec/model.py _measure, on the transformers config) and the arithmetic below (on a ConfigView)."""
    hidden = int(first_attr(tc, ["hidden_size", "n_embd", "d_model", "n_embed", "dim", "model_dim"], 0))
    layers = int(first_attr(tc, ["num_hidden_layers", "n_layer", "num_layers", "n_layers"], 0))
    heads = int(first_attr(tc, ["num_attention_heads", "n_head", "num_heads", "n_heads"], 1))
    # KV heads: GQA attribute; Falcon/GPT-BigCode multi_query (the new Falcon decoder uses num_kv_heads).
    if getattr(tc, "new_decoder_architecture", False):
        kv = first_attr(tc, ["num_kv_heads", "num_key_value_heads"], heads)
    elif getattr(tc, "multi_query", False):
        kv = 1
    else:
        kv = first_attr(tc, ["num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"], heads)
    head_dim = first_attr(tc, ["head_dim", "kv_channels", "attention_head_size"], None)
    if not isinstance(head_dim, int) or head_dim <= 0:
        head_dim = hidden // heads if heads else 0
    experts = int(first_attr(tc, ["num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"], 1) or 1)
    if experts > 1:
        top_k = int(first_attr(tc, ["num_experts_per_tok", "moe_top_k", "top_k", "num_selected_experts"], 1) or 1)
        inter = first_attr(tc, ["moe_intermediate_size", "expert_intermediate_size", "intermediate_size", "ffn_dim"], None)
    else:
        experts, top_k = 1, 1
        inter = first_attr(tc, ["intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size", "d_ff", "inner_hidden_size"], None)
    if not isinstance(inter, int) or inter <= 0:
        inter = 4 * hidden  # GPT-2 n_inner=None, BLOOM, Falcon: 4h
    return dict(
        moe_layers=moe_layer_count(tc, layers) if experts > 1 else None,
        hidden_size=hidden, num_layers=layers, num_attention_heads=heads, num_kv_heads=int(kv), head_dim=int(head_dim),
        intermediate_size=int(inter), num_experts=experts, experts_per_token=top_k,
        # the longest sequence the positions support (learned tables, rope's design length, raised by the config's
        # rope scaling); None: no such limit (ALiBi)
        max_positions=_scaled_positions(tc, _positive_or_none(first_attr(tc, ["max_position_embeddings", "n_positions",
                                                                              "max_sequence_length", "seq_length"], None))),
        learned_positions=learned_position_table(tc),
        # Falcon names it `activation` (FalconMLP: get_activation(config.activation))
        mlp_activation=str(first_attr(tc, ["hidden_act", "activation_function", "hidden_activation", "activation"],
                                      "silu")),
        attention_dropout=_prob(first_attr(tc, ["attn_pdrop", "attention_dropout", "attention_probs_dropout_prob"], 0.0)),
        hidden_dropout=_prob(first_attr(tc, ["resid_pdrop", "hidden_dropout", "dropout", "hidden_dropout_prob"], 0.0)),
    )


# Architectures whose positions are a learned nn.Embedding table indexed by the position ids: a sequence longer than
# its rows is an IndexError, not a quality question. transformers' modeling code: GPT2Model.wpe
# (nn.Embedding(config.n_positions, ...)), GPTBigCodeModel.wpe, GPTNeoModel.wpe (max_position_embeddings rows),
# OPTLearnedPositionalEmbedding (max_position_embeddings + 2 rows), BioGptLearnedPositionalEmbedding. Not here: rotary
# models (Llama, Mistral, Qwen, Gemma, Phi, GPT-NeoX, Falcon: cos/sin computed from the position ids), ALiBi (BLOOM,
# Falcon with alibi: a bias computed from the length, no max_positions read) and XGLM's sinusoidal table (rebuilt
# longer when a sequence needs it: XGLMSinusoidalPositionalEmbedding.forward).
LEARNED_POSITION_TYPES = frozenset({"gpt2", "gpt_bigcode", "gpt_neo", "opt", "biogpt", "imagegpt"})


def learned_position_table(tc) -> bool:
    """Whether the model looks its positions up in a learned table (LEARNED_POSITION_TYPES)."""
    return getattr(tc, "model_type", None) in LEARNED_POSITION_TYPES


def _scaled_positions(tc, positions: int | None) -> int | None:
    """The positions a rope-scaled config is meant for: factor x original_max_position_embeddings (transformers'
    modeling_rope_utils: linear, dynamic, yarn and llama3 scale the rotary frequencies by `factor` relative to the
    original length), when the config states the original length and the product is more than
    max_position_embeddings (Qwen2.5's YaRN recipe: factor 4 x 32768).
    Llama-3.1's own config (llama3, factor 8 x 8192 = 65536 under its 131072) keeps its maximum."""
    if positions is None:
        return None
    rope = first_attr(tc, ["rope_scaling", "rope_parameters"], None)
    if not isinstance(rope, dict):
        return positions
    kind = rope.get("rope_type") or rope.get("type")
    factor = rope.get("factor")
    if kind in (None, "default") or isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 1:
        return positions
    original = _positive_or_none(rope.get("original_max_position_embeddings")
                                 or first_attr(tc, ["original_max_position_embeddings"], None))
    if original is None:
        # no stated original length: max_position_embeddings may already be the scaled one (Gemma 3's 131072 with a
        # linear factor 8 over its 32768 pre-training length), so it stays the limit
        return positions
    return max(positions, int(factor * original))


def _positive_ints(*values) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)


def _standardise_rope(values: dict, factor_key: str, default: float) -> bool:
    """values["rope_parameters"] as transformers' convert_rope_params_to_dict leaves it (rope_scaling wins, the
    factor from `factor_key` unless the dict has one); False for per-layer-type (nested) rope parameters, which
    are left to transformers."""
    rope = values.pop("rope_scaling", None) or values.get("rope_parameters") or {}
    if not isinstance(rope, dict) or any(isinstance(v, dict) for v in rope.values()):
        return False
    rope = dict(rope)
    rope.setdefault("partial_rotary_factor", values.pop(factor_key, default))
    values["rope_parameters"] = rope
    return True


def _effective(config: dict) -> ConfigView | None:
    """The config as the class would hold it after __post_init__, or None when it is not one we model."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in _DEFAULTS:
        return None  # other architectures are counted on the meta device
    # auto_map (remote code) is ignored here as transformers ignores it without trust_remote_code: the native class
    # of a model_type it knows is built (spec/model.py _count_on_meta); with trust_remote_code the caller (load_model_spec)
    # does not ask this module at all
    values = {**_DEFAULTS[model_type], **config}
    for key, value in values.items():
        if key in _SHAPE_KEYS and value is not None and not _positive_ints(value):
            return None  # a size that is not a positive integer: the meta device (and its error) decides
    if model_type in ("llama", "mistral"):  # LlamaConfig / MistralConfig __post_init__
        if values.get("head_dim") is None and _positive_ints(values.get("hidden_size"), values.get("num_attention_heads")):
            values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
    if model_type in ("llama", "mistral", "mixtral", "qwen2", "qwen3") and values.get("num_key_value_heads") is None:
        values["num_key_value_heads"] = values.get("num_attention_heads")
    if model_type == "opt" and values.get("word_embed_proj_dim") is None:  # OPTConfig.__post_init__
        values["word_embed_proj_dim"] = values.get("hidden_size")
    if model_type in ("bloom", "falcon") and values.get("n_embed") is not None:  # the old n_embed kwarg
        values["hidden_size"] = values.pop("n_embed")
    if model_type == "falcon":  # FalconConfig.__post_init__; head_dim is a read-only property (hidden // heads)
        if "head_dim" in values:
            return None
        if values.get("num_kv_heads") is None:
            values["num_kv_heads"] = values.get("num_attention_heads")
        if values.get("ffn_hidden_size") is None and _positive_ints(values.get("hidden_size")):
            values["ffn_hidden_size"] = 4 * values["hidden_size"]
        if values.get("new_decoder_architecture") and values.get("num_ln_in_parallel_attn") is None:
            values["num_ln_in_parallel_attn"] = 2  # what FalconDecoderLayer.__init__ writes into the config
    if model_type == "gemma2" and values.get("layer_types") is None and _positive_ints(values.get("num_hidden_layers")):
        # Gemma2Config.__post_init__: sliding on even layers (i + 1 odd), full on odd ones
        values["layer_types"] = ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                 for i in range(values["num_hidden_layers"])]
    if model_type == "gemma3_text":  # Gemma3TextConfig.__post_init__
        if values.get("use_bidirectional_attention") and _positive_ints(values.get("sliding_window")):
            values["sliding_window"] = values["sliding_window"] // 2 + 1
        pattern = values.get("sliding_window_pattern", 6)  # the hub configs' old int pattern, default 6
        if values.get("layer_types") is None and _positive_ints(values.get("num_hidden_layers")):
            if not _positive_ints(pattern):
                return None
            values["layer_types"] = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                     for i in range(values["num_hidden_layers"])]
    # the rope's partial_rotary_factor as convert_rope_params_to_dict standardises it: GPTNeoXConfig takes it from
    # rotary_pct (default 0.25), PhiConfig from partial_rotary_factor (default 0.5)
    if model_type == "gpt_neox" and not _standardise_rope(values, "rotary_pct", 0.25):
        return None
    if model_type == "phi":  # PhiConfig.__post_init__: kv heads, and partial_rotary_factor 0.5 unless given
        if values.get("num_key_value_heads") is None:
            values["num_key_value_heads"] = values.get("num_attention_heads")
        if not _standardise_rope(values, "partial_rotary_factor", 0.5):
            return None
    if model_type == "qwen3_moe":  # Qwen3MoeConfig: num_experts is stored as num_local_experts (attribute_map)
        if "num_experts" in config:
            values["num_local_experts"] = values.pop("num_experts")
        if values.get("mlp_only_layers") or values.get("decoder_sparse_step") != 1:
            return None  # dense layers among the sparse ones: ModelSpec has one MLP shape for every layer
        values["sliding_window"] = values.get("sliding_window") if values.get("use_sliding_window") else None
    if model_type == "phi3":  # Phi3Config.__post_init__ and its convert_rope_params_to_dict
        if values.get("num_key_value_heads") is None:
            values["num_key_value_heads"] = values.get("num_attention_heads")
        if "head_dim" in values and not _positive_ints(values["head_dim"]):
            return None
        if not _standardise_rope(values, "partial_rotary_factor", 1.0):
            return None
    if model_type == "gemma" and values.get("hidden_act") == "gelu":  # GemmaConfig: the legacy value means tanh
        values["hidden_act"] = "gelu_pytorch_tanh"
    if model_type in ("qwen2", "qwen3"):  # Qwen2Config / Qwen3Config.__post_init__
        if not isinstance(values.get("max_window_layers"), int) or isinstance(values.get("max_window_layers"), bool):
            return None
        values["sliding_window"] = values.get("sliding_window") if values.get("use_sliding_window") else None
        if values.get("layer_types") is None and _positive_ints(values.get("num_hidden_layers")):
            window_from = values.get("max_window_layers")
            values["layer_types"] = [
                "sliding_attention" if values["sliding_window"] is not None and isinstance(window_from, int)
                and i >= window_from else "full_attention" for i in range(values["num_hidden_layers"])]
    if model_type in _ROPE_DICT_MODELS and not _later_post_init(model_type, config, values):
        return None
    return ConfigView(model_type, values)


# The families whose config classes are read by _later_post_init: each __post_init__ as transformers 5.23 writes
# it, then PreTrainedConfig's convert_rope_params_to_dict (_rope_parameters).
_ROPE_DICT_MODELS = ("olmo2", "granite", "smollm3", "cohere2", "gpt_oss", "deepseek_v3", "deepseek_v2")
# GptOssConfig.__post_init__'s rope_parameters when the config gives none
_GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                 "original_max_position_embeddings": 4096}
_ATTENTION_TYPES = ("full_attention", "sliding_attention")


def _later_post_init(model_type: str, config: dict, values: dict) -> bool:
    """values as the __post_init__ of Olmo2Config, GraniteConfig, SmolLM3Config, Cohere2Config, GptOssConfig,
    DeepseekV3Config and DeepseekV2Config leave them (in place); False for what they would refuse or what
    this module leaves to transformers."""
    layers, hidden = values.get("num_hidden_layers"), values.get("hidden_size")
    heads = values.get("num_attention_heads")
    if values.get("num_key_value_heads") is None:  # every one of them: kv heads default to the query heads
        values["num_key_value_heads"] = heads
    if model_type in ("olmo2", "granite", "smollm3") and "head_dim" in values and values["head_dim"] is None:
        return False  # their attention takes getattr(config, "head_dim", hidden // heads): a null would be used
    if model_type == "smollm3":  # SmolLM3Config.__post_init__: NoPE on every no_rope_layer_interval-th layer
        if not _positive_ints(layers):
            return False
        no_rope = values.get("no_rope_layers")
        if no_rope is None:
            interval = values.get("no_rope_layer_interval")
            if not _positive_ints(interval):
                return False  # 0 divides by zero there
            no_rope = values["no_rope_layers"] = [int((i + 1) % interval != 0) for i in range(layers)]
        elif (not isinstance(no_rope, list) or len(no_rope) < layers
              or any(not isinstance(x, int) or isinstance(x, bool) for x in no_rope)):
            return False  # SmolLM3Attention indexes it by layer
        if values.get("layer_types") is None:  # sliding attention only on the NoPE layers
            sliding = bool(values.get("use_sliding_window")) and values.get("sliding_window") is not None
            values["layer_types"] = ["sliding_attention" if sliding and not no_rope[i] else "full_attention"
                                     for i in range(layers)]
    if model_type == "cohere2":  # Cohere2Config.__post_init__: head_dim hidden // heads, unless config.json has one
        # (its extra keys are set after __post_init__, over what it derived)
        if "head_dim" not in config:
            values["head_dim"] = hidden // heads if _positive_ints(hidden, heads) else None
        elif config["head_dim"] is None:
            return False  # Cohere2Attention would take the null
        if values.get("layer_types") is None:
            pattern = values.pop("sliding_window_pattern", 4)  # the hub configs' old int pattern
            if not _positive_ints(pattern, layers):
                return False
            values["layer_types"] = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                     for i in range(layers)]
    if model_type == "gpt_oss":  # GptOssConfig.__post_init__: sliding on even layers, a YaRN rope by default
        if config.get("head_dim", 0) is None or config.get("num_key_value_heads", 0) is None:
            return False  # both typed int (not None) in GptOssConfig: its strict validation refuses a null
        if values.get("layer_types") is None and _positive_ints(layers):
            values["layer_types"] = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
        if values.get("rope_parameters") is None:
            values["rope_parameters"] = dict(_GPT_OSS_ROPE)
        if "num_experts" in config:  # attribute_map: num_experts is stored as num_local_experts
            values["num_local_experts"] = values.pop("num_experts")
    if model_type in ("deepseek_v3", "deepseek_v2"):
        alias = "num_local_experts" if model_type == "deepseek_v3" else "num_experts"  # their attribute_map
        if alias in config:
            values["n_routed_experts"] = values.pop(alias)
        # DeepseekV3Config / DeepseekV2Config.__post_init__: head_dim is the rotary part of a query head (V2: hidden //
        # heads were that None, which its qk_head_dim sum already refuses). V2 declares head_dim, so the derivation
        # wins; for V3 a head_dim key of config.json is an extra attribute, set after __post_init__ (a field only:
        # the rotary embedding's buffers are all it sizes)
        if model_type == "deepseek_v2" or "head_dim" not in config:
            values["head_dim"] = values.get("qk_rope_head_dim")
        elif config["head_dim"] is None:
            return False  # a null head_dim then reaches the rotary embedding's init (a TypeError with yarn)
    return _rope_parameters(values)


def _rope_parameters(values: dict) -> bool:
    """values["rope_parameters"] as convert_rope_params_to_dict and standardize_rope_params leave it for a config
    class that declares no partial_rotary_factor: rope_scaling wins over rope_parameters, a top-level
    partial_rotary_factor moves into the dict (unless it has one) and leaves the config, rope_type defaults to
    `type` or "default", and a llama3/yarn/longrope rope takes the config's original_max_position_embeddings if it
    has one, else keeps its own, else max_position_embeddings (max_positions reads it). False for per-layer-type
    (nested) rope parameters or a rope that is no dict: left to transformers."""
    rope = values.pop("rope_scaling", None) or values.get("rope_parameters") or {}
    if not isinstance(rope, dict) or any(isinstance(v, dict) for v in rope.values()):
        return False
    rope = dict(rope)
    partial = values.pop("partial_rotary_factor", None)
    if partial is not None:
        rope.setdefault("partial_rotary_factor", partial)
    rope.setdefault("rope_type", rope.get("type", "default"))
    if rope["rope_type"] in ("llama3", "yarn", "longrope"):
        # the config's own key wins: the model's rope init (modeling_rope_utils _compute_yarn_parameters and its
        # kin) runs standardize_rope_params again once config.json's extra keys are attributes, and assigns it
        if "original_max_position_embeddings" in values:
            rope["original_max_position_embeddings"] = values["original_max_position_embeddings"]
        else:
            rope.setdefault("original_max_position_embeddings", values.get("max_position_embeddings"))
    values["rope_parameters"] = rope
    return True


# The activation traits (spec/model.py _activation_traits) of a plain dense decoder block: two hidden-size norms
# reading two tensors, weights applied in the compute dtype, no sliding window, sdpa without an explicit mask or
# broadcast K/V, full rotary. Each counter returns only what its architecture changes.
_PLAIN_BLOCK_TRAITS = dict(supports_sdpa=True, norms_per_layer=2, norm_inputs_per_layer=2, norm_fp32_weight=False,
                           sliding_window=None, sliding_window_layers=0, sdpa_mask=False, sdpa_broadcast_kv=False,
                           attention_output_copy=False, head_norm_elements=0, head_norm_rows=0,
                           norm_outputs_unkept=0, fused_qkv_kept=False)


def _partial_rotary(cfg: ConfigView) -> bool:
    """Rotary on part of the head: `torch.cat((q_rot, q_pass))` leaves q contiguous in (b, a, s, d), so o_proj reads a
    copy of the attention output (attention_output_copy). Read as spec/model.py _activation_traits reads it from the
    config transformers built: the rope dict's partial_rotary_factor (_standardise_rope and _rope_parameters moved a
    top-level one there), else a partial_rotary_factor or rotary_pct key."""
    rope = cfg.rope_parameters
    partial = rope.get("partial_rotary_factor") if isinstance(rope, dict) else None
    if partial is None:
        partial = first_attr(cfg, ["partial_rotary_factor", "rotary_pct"], 1.0)
    return isinstance(partial, (int, float)) and not isinstance(partial, bool) and 0 < partial < 1


def _linear(n_in: int, n_out: int, bias: bool) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _llama_family(cfg: ConfigView, f: dict) -> dict | None:
    """LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
    GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM: embed_tokens, per layer input_layernorm, q/k/v/o_proj
    (Qwen3, Gemma 3: q_norm and k_norm over the head dim), post_attention_layernorm (Gemma 2/3: and
    pre_/post_feedforward_layernorm) and the MLP (gate/up/down_proj; Mixtral: a router weight [E, h] and
    MixtralExperts' fused gate_up_proj [E, 2i, h] and down_proj [E, h, i]), the final norm, lm_head unless tied."""
    mt = cfg.model_type
    h, layers, a, k, d, i, v = (f["hidden_size"], f["num_layers"], f["num_attention_heads"], f["num_kv_heads"],
                                f["head_dim"], f["intermediate_size"], cfg.vocab_size)
    if not _positive_ints(h, layers, a, k, d, i, v):
        return None
    # LlamaAttention, GemmaAttention, Qwen3Attention: bias=config.attention_bias on q, k, v and o; LlamaMLP:
    # bias=config.mlp_bias (Gemma's and Qwen3's MLPs have none). Qwen2Attention: bias=True on q, k, v, not on o.
    # Mistral/Mixtral: no biases.
    configured_bias = mt in ("llama", "qwen3", "qwen3_moe", *_GEMMAS)
    qkv_bias = bool(cfg.attention_bias) if configured_bias else mt == "qwen2"
    o_bias = bool(cfg.attention_bias) if configured_bias else False
    mlp_bias = bool(cfg.mlp_bias) if mt == "llama" else False
    if mt in ("mixtral", "qwen3_moe"):
        # MixtralAttention takes head_dim from the config or hidden // heads (the config keeps None); Qwen3-MoE's
        # i is moe_intermediate_size (config_fields), its router the TopKRouter's weight [E, h]
        e = f["num_experts"]
        if e < 2:
            return None
        mlp = [h * e, e * 2 * i * h + e * h * i]  # router weight; the experts' two fused parameters (one module)
        largest_mlp = e * 3 * i * h
    else:
        mlp = [_linear(h, i, mlp_bias), _linear(h, i, mlp_bias), _linear(i, h, mlp_bias)]
        largest_mlp = max(mlp)
    attn = [_linear(h, a * d, qkv_bias), _linear(h, k * d, qkv_bias), _linear(h, k * d, qkv_bias),
            _linear(a * d, h, o_bias)]
    if mt in ("gemma2", "gemma3_text") and h % a:
        return None  # Gemma2Config / Gemma3TextConfig.validate_architecture refuses it
    # Qwen3(Moe)Attention's and Gemma3Attention's q_norm and k_norm over the head dim
    head_norms = 2 * d if mt in ("qwen3", "qwen3_moe", "gemma3_text") else 0
    # input_layernorm and post_attention_layernorm; Gemma2/3DecoderLayer add pre_ and post_feedforward_layernorm
    hidden_norms = 4 if mt in ("gemma2", "gemma3_text") else 2
    per_layer = sum(attn) + sum(mlp) + hidden_norms * h + head_norms
    tied = bool(cfg.tie_word_embeddings)
    embedding = v * h + (0 if tied else v * h)
    params = v * h + layers * per_layer + h + (0 if tied else v * h)
    window = cfg.sliding_window
    n_sliding = 0
    if isinstance(window, int) and not isinstance(window, bool) and window > 0:
        types = cfg.layer_types
        if isinstance(types, (list, tuple)):
            if len(types) != layers:
                return None  # _activation_traits then falls back to the module rule: leave it to the meta device
            n_sliding = sum(1 for t in types if t == "sliding_attention")
        elif mt in _SLIDING_MASK_MODULES:
            n_sliding = layers
    elif cfg.layer_types is not None and mt not in _LAYER_TYPES_MODELS:
        return None
    return dict(
        params=params, largest_layer_params=max(v * h, max(attn), largest_mlp, h),
        vocab_size=v, tied_embeddings=tied, gated_mlp=True, embedding_params=embedding, norm="rmsnorm",
        # the hidden-size norms of a layer (spec/model.py _activation_traits): Qwen3's head-dim q/k norms count
        # only when the head dim happens to equal the hidden size
        norms_per_layer=hidden_norms + (2 if head_norms and d == h else 0),
        norm_inputs_per_layer=hidden_norms + (2 if head_norms and d == h else 0),
        # the others: q_norm over the a heads' queries, k_norm over the k heads' keys, one head per row
        head_norm_elements=(a + k) * d if head_norms and d != h else 0,
        head_norm_rows=a + k if head_norms and d != h else 0,
        # Gemma2/3DecoderLayer: post_attention_layernorm and post_feedforward_layernorm normalise a sublayer's output
        # into the residual add; hidden-size q/k norms feed the rotary embedding: no Linear keeps their output
        norm_outputs_unkept=(2 if hidden_norms == 4 else 0) + (2 if head_norms and d == h else 0),
        # Gemma(2/3)RMSNorm: `output * (1.0 + self.weight.float())` keeps the fp32 normalised input
        norm_fp32_weight=mt in _GEMMAS,
        # Gemma2PreTrainedModel._supports_sdpa = False (sdpa has no logit soft-capping)
        supports_sdpa=mt != "gemma2",
        sliding_window=int(window) if n_sliding else None, sliding_window_layers=n_sliding,
    )


def _phi3(cfg: ConfigView, f: dict) -> dict | None:
    """Phi3ForCausalLM (Phi-3, Phi-3.5, Phi-4): embed_tokens, per layer input_layernorm, qkv_proj (h -> (a + 2k) d)
    and o_proj, post_attention_layernorm, gate_up_proj (h -> 2i) and down_proj, all without bias; the final norm;
    lm_head, untied by default. Partial rotary as convert_rope_params_to_dict standardises it (Phi-4-mini 0.75)."""
    h, layers, a, k, d, i, v = (f["hidden_size"], f["num_layers"], f["num_attention_heads"], f["num_kv_heads"],
                                f["head_dim"], f["intermediate_size"], cfg.vocab_size)
    if not _positive_ints(h, layers, a, k, d, i, v):
        return None
    layer = [h * (a + 2 * k) * d, a * d * h, h * 2 * i, i * h]
    tied = bool(cfg.tie_word_embeddings)
    window = cfg.sliding_window  # Phi3Model builds a sliding-window mask for every layer when it is set
    sliding = isinstance(window, int) and not isinstance(window, bool) and window > 0
    return dict(
        params=v * h + layers * (sum(layer) + 2 * h) + h + (0 if tied else v * h),
        largest_layer_params=max(v * h, *layer, h), vocab_size=v, tied_embeddings=tied, gated_mlp=True,
        # Phi3's apply_rotary_pos_emb concatenates the rotated and passed parts whatever the factor (q_pass may be
        # empty): q is contiguous in (b, a, s, d), the attention output is copied for o_proj; v stays a view of qkv
        embedding_params=v * h + (0 if tied else v * h), norm="rmsnorm", attention_output_copy=True, fused_qkv_kept=True,
        sliding_window=int(window) if sliding else None, sliding_window_layers=layers if sliding else 0,
    )


def _gpt2(cfg: ConfigView, f: dict) -> dict | None:
    """GPT2LMHeadModel: wte, wpe, per block ln_1, c_attn (Conv1D h -> 3h), c_proj (h -> h), ln_2, c_fc (h -> i),
    c_proj (i -> h), all with biases, LayerNorms with weight and bias; ln_f; lm_head (no bias) tied to wte by
    default."""
    h, layers, i, v, positions = f["hidden_size"], f["num_layers"], f["intermediate_size"], cfg.vocab_size, cfg.n_positions
    if not _positive_ints(h, layers, i, v, positions) or cfg.add_cross_attention:
        return None  # cross-attention blocks add modules this does not count
    if f["num_attention_heads"] < 1 or h % f["num_attention_heads"]:
        return None
    layer = [2 * h, _linear(h, 3 * h, True), _linear(h, h, True), 2 * h, _linear(h, i, True), _linear(i, h, True)]
    tied = bool(cfg.tie_word_embeddings)
    params = v * h + positions * h + layers * sum(layer) + 2 * h + (0 if tied else v * h)
    return dict(
        params=params, largest_layer_params=max(v * h, positions * h, max(layer)),
        vocab_size=v, tied_embeddings=tied, gated_mlp=False, embedding_params=v * h + (0 if tied else v * h),
        norm="layernorm",
    )


def _opt(cfg: ConfigView, f: dict) -> dict | None:
    """OPTForCausalLM: embed_tokens [V, p] (p = word_embed_proj_dim), OPTLearnedPositionalEmbedding with 2 extra
    rows, project_in/project_out (no bias) only when p != hidden, per layer q/k/v/out_proj and fc1/fc2 (bias =
    enable_bias) and two LayerNorms (weight and bias when layer_norm_elementwise_affine), the final LayerNorm only
    when do_layer_norm_before and not _remove_final_layer_norm, lm_head [V, p] tied by default."""
    h, layers, ffn, v, p, positions = (f["hidden_size"], f["num_layers"], cfg.ffn_dim, cfg.vocab_size,
                                       cfg.word_embed_proj_dim, cfg.max_position_embeddings)
    if not _positive_ints(h, layers, ffn, v, p, positions) or f["num_attention_heads"] < 1 or h % f["num_attention_heads"]:
        return None
    bias, norm = bool(cfg.enable_bias), (2 * h if cfg.layer_norm_elementwise_affine else 0)
    attn = [_linear(h, h, bias)] * 4
    mlp = [_linear(h, ffn, bias), _linear(ffn, h, bias)]
    per_layer = sum(attn) + sum(mlp) + 2 * norm
    projections = 2 * h * p if p != h else 0
    final_norm = norm if cfg.do_layer_norm_before and not cfg.get("_remove_final_layer_norm") else 0
    tied = bool(cfg.tie_word_embeddings)
    params = v * p + (positions + 2) * h + projections + layers * per_layer + final_norm + (0 if tied else v * p)
    return dict(
        params=params, largest_layer_params=max(v * p, (positions + 2) * h, h * p if p != h else 0, *attn, *mlp, norm),
        vocab_size=v, tied_embeddings=tied, gated_mlp=False, embedding_params=v * p + (0 if tied else v * p),
        norm="layernorm",
    )


def _bloom(cfg: ConfigView, f: dict) -> dict | None:
    """BloomForCausalLM: word_embeddings, word_embeddings_layernorm, per block input_layernorm, query_key_value
    (h -> 3h), dense (h -> h), post_attention_layernorm, dense_h_to_4h, dense_4h_to_h (all with biases), ln_f,
    lm_head tied by default. BLOOM's ALiBi attention has no sdpa path in transformers (_supports_sdpa False)."""
    h, layers, v = f["hidden_size"], f["num_layers"], cfg.vocab_size
    if not _positive_ints(h, layers, v) or f["num_attention_heads"] < 1 or h % f["num_attention_heads"]:
        return None
    layer = [2 * h, _linear(h, 3 * h, True), _linear(h, h, True), 2 * h, _linear(h, 4 * h, True), _linear(4 * h, h, True)]
    tied = bool(cfg.tie_word_embeddings)
    params = v * h + 2 * h + layers * sum(layer) + 2 * h + (0 if tied else v * h)
    return dict(
        params=params, largest_layer_params=max(v * h, max(layer)),
        vocab_size=v, tied_embeddings=tied, gated_mlp=False, embedding_params=v * h + (0 if tied else v * h),
        norm="layernorm", supports_sdpa=False,
    )


def _gpt_neox(cfg: ConfigView, f: dict) -> dict | None:
    """GPTNeoXForCausalLM: embed_in, per layer input_layernorm and post_attention_layernorm (weight and bias),
    query_key_value (h -> 3h) and dense (bias = attention_bias), dense_h_to_4h / dense_4h_to_h with biases,
    final_layer_norm, lm_head (no bias, untied by default). With use_parallel_residual both norms read the
    layer's input, which a LayerNorm saves once (spec/model.py _activation_traits)."""
    h, layers, i, v = f["hidden_size"], f["num_layers"], f["intermediate_size"], cfg.vocab_size
    if not _positive_ints(h, layers, i, v) or f["num_attention_heads"] < 1 or h % f["num_attention_heads"]:
        return None
    bias = bool(cfg.attention_bias)
    layer = [2 * h, 2 * h, _linear(h, 3 * h, bias), _linear(h, h, bias), _linear(h, i, True), _linear(i, h, True)]
    tied = bool(cfg.tie_word_embeddings)
    return dict(
        params=v * h + layers * sum(layer) + 2 * h + (0 if tied else v * h),
        largest_layer_params=max(v * h, max(layer)), vocab_size=v, tied_embeddings=tied, gated_mlp=False,
        embedding_params=v * h + (0 if tied else v * h), norm="layernorm",
        norm_inputs_per_layer=1 if cfg.use_parallel_residual else 2, attention_output_copy=_partial_rotary(cfg),
    )


def _phi(cfg: ConfigView, f: dict) -> dict | None:
    """PhiForCausalLM: embed_tokens, per layer one input_layernorm (attention and MLP run in parallel on it),
    q/k/v/dense with biases (q/k_layernorm over hidden // heads with qk_layernorm), fc1/fc2 with biases,
    final_layernorm, lm_head WITH a bias, untied by default."""
    h, layers, a, k, d, i, v = (f["hidden_size"], f["num_layers"], f["num_attention_heads"], f["num_kv_heads"],
                                f["head_dim"], f["intermediate_size"], cfg.vocab_size)
    if not _positive_ints(h, layers, a, k, d, i, v) or h % a:
        return None
    qk_norm = h // a if cfg.qk_layernorm else 0
    attn = [_linear(h, a * d, True), _linear(h, k * d, True), _linear(h, k * d, True), _linear(a * d, h, True)]
    layer = [2 * h, *attn, 4 * qk_norm, _linear(h, i, True), _linear(i, h, True)]
    tied = bool(cfg.tie_word_embeddings)
    head = v + (0 if tied else v * h)  # the lm_head bias is its own parameter even when the weight is tied
    norms = 1 + (2 if qk_norm and qk_norm == h else 0)  # hidden-size norms of a layer (_activation_traits)
    return dict(
        params=v * h + layers * sum(layer) + 2 * h + head,
        # lm_head's direct parameters are its weight (shared with embed_tokens when tied) and its bias
        largest_layer_params=max(h * v + v, *attn, _linear(h, i, True), _linear(i, h, True)),
        vocab_size=v, tied_embeddings=tied, gated_mlp=False, embedding_params=v * h + (0 if tied else v * h),
        norm="layernorm", norms_per_layer=norms, norm_inputs_per_layer=norms, attention_output_copy=_partial_rotary(cfg),
    )


def _falcon(cfg: ConfigView, f: dict) -> dict | None:
    """FalconForCausalLM: word_embeddings, per layer query_key_value (h -> (a + 2k) d for the new decoder
    architecture, h + 2d for multi-query, 3h otherwise) and dense (bias = config.bias), dense_h_to_4h /
    dense_4h_to_h (ffn_hidden_size, bias = config.bias), LayerNorms (weight and bias): input_layernorm and
    post_attention_layernorm without parallel_attn, ln_attn and ln_mlp with parallel_attn and
    num_ln_in_parallel_attn 2, else one input_layernorm; ln_f; lm_head tied by default. ALiBi and rotary
    positions have no parameters."""
    h, layers, a, k, d, i, v = (f["hidden_size"], f["num_layers"], f["num_attention_heads"], f["num_kv_heads"],
                                f["head_dim"], f["intermediate_size"], cfg.vocab_size)
    if not _positive_ints(h, layers, a, k, i, v) or h % a:
        return None  # FalconAttention raises unless hidden_size is a multiple of the heads
    new_arch, bias = bool(cfg.new_decoder_architecture), bool(cfg.bias)
    qkv_out = (2 * k + a) * d if new_arch else (h + 2 * d if cfg.multi_query else 3 * h)
    n_norms = 2 if not cfg.parallel_attn or cfg.num_ln_in_parallel_attn == 2 else 1
    layer = [_linear(h, qkv_out, bias), _linear(h, h, bias), _linear(h, i, bias), _linear(i, h, bias)]
    tied = bool(cfg.tie_word_embeddings)
    rotary = not cfg.alibi  # FalconModel calls sdpa itself: spec/model.py _activation_traits
    # the norms of a parallel block with the new decoder architecture read the same tensor (same rule as there)
    shared = new_arch and cfg.num_ln_in_parallel_attn in (None, 2)
    return dict(
        params=v * h + layers * (sum(layer) + n_norms * 2 * h) + 2 * h + (0 if tied else v * h),
        largest_layer_params=max(v * h, *layer, 2 * h), vocab_size=v, tied_embeddings=tied, gated_mlp=False,
        embedding_params=v * h + (0 if tied else v * h), norm="layernorm", norms_per_layer=n_norms,
        norm_inputs_per_layer=1 if shared else n_norms, sdpa_mask=rotary,
        sdpa_broadcast_kv=rotary and not new_arch and bool(cfg.multi_query),
    )


def _sliding(cfg: ConfigView, layers: int, mask_module: bool) -> tuple[int | None, int] | None:
    """(sliding_window, sliding_window_layers) as spec/model.py _activation_traits reads them: the layers
    layer_types names "sliding_attention" when the config has a positive sliding_window, else (no layer_types) every
    layer of a model whose module builds a sliding-window mask (mask_module), else none. None when layer_types is
    not a list of the model's layers of full and sliding attention (transformers refuses it, or remaps legacy names):
    the meta device decides."""
    types = cfg.layer_types
    if types is not None and (not isinstance(types, (list, tuple)) or len(types) != layers
                              or any(t not in _ATTENTION_TYPES for t in types)):
        return None
    window = cfg.sliding_window
    if not _positive_ints(window):
        return None, 0
    n = sum(1 for t in types if t == "sliding_attention") if types is not None else (layers if mask_module else 0)
    return (int(window) if n else None), n


def _olmo2_granite_smollm3(cfg: ConfigView, f: dict) -> dict | None:
    """Olmo2ForCausalLM, GraniteForCausalLM, SmolLM3ForCausalLM: embed_tokens; per layer q/k/v/o_proj (head_dim
    from the config, else hidden // heads; bias = attention_bias) and the MLP's gate/up/down_proj (Granite, SmolLM3:
    bias = mlp_bias; Olmo 2: none). Granite and SmolLM3 keep Llama's input_layernorm and post_attention_layernorm
    (Granite's embedding/attention/residual multipliers and logits_scaling are floats, SmolLM3's NoPE layers only
    skip the rotary: no parameters); Olmo 2 has no input norm but Olmo2Attention's q_norm and k_norm over the whole
    q and k projections (heads x head_dim, not one head as Qwen3's) and post_attention_ and
    post_feedforward_layernorm on each branch's output. The final norm; lm_head unless tied (SmolLM3: tied by
    default)."""
    mt = cfg.model_type
    h, layers, a, k, i, v = (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
                             cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size)
    if not _positive_ints(h, layers, a, k, i, v):
        return None
    # the module's head size: config_fields would also read a kv_channels or attention_head_size key, the attention
    # only head_dim
    d = cfg.head_dim if cfg.head_dim is not None else h // a
    if not _positive_ints(d):
        return None
    bias = bool(cfg.attention_bias)
    mlp_bias = bool(cfg.mlp_bias) if mt != "olmo2" else False  # Olmo2MLP: bias=False
    attn = [_linear(h, a * d, bias), _linear(h, k * d, bias), _linear(h, k * d, bias), _linear(a * d, h, bias)]
    mlp = [_linear(h, i, mlp_bias), _linear(h, i, mlp_bias), _linear(i, h, mlp_bias)]
    head_norms = [a * d, k * d] if mt == "olmo2" else []
    sliding = _sliding(cfg, layers, mask_module=mt == "smollm3")  # SmolLM3Model: create_sliding_window_causal_mask
    if sliding is None:
        return None
    tied = bool(cfg.tie_word_embeddings)
    # hidden-size norms of a layer (_activation_traits counts a norm whose weight has hidden_size entries): Olmo 2's
    # q_norm / k_norm when heads x head_dim happens to be the hidden size (q_norm usually is, k_norm with GQA not)
    norms = 2 + sum(1 for n in head_norms if n == h)
    return dict(
        params=v * h + layers * (sum(attn) + sum(mlp) + sum(head_norms) + 2 * h) + h + (0 if tied else v * h),
        largest_layer_params=max(v * h, *attn, *mlp, *head_norms, h), vocab_size=v, tied_embeddings=tied,
        gated_mlp=True, embedding_params=v * h + (0 if tied else v * h), norm="rmsnorm", norms_per_layer=norms,
        norm_inputs_per_layer=norms, attention_output_copy=_partial_rotary(cfg),
        # the others (Olmo 2's k_norm with GQA): each over the whole projection, one row per token
        head_norm_elements=sum(n for n in head_norms if n != h), head_norm_rows=sum(1 for n in head_norms if n != h),
        # Olmo2RMSNorm: `(self.weight * hidden_states).to(input_dtype)`, the weight times the fp32 normalised input; the
        # hidden-size q/k norms' output goes to the rotary embedding, which keeps nothing
        norm_fp32_weight=mt == "olmo2", norm_outputs_unkept=sum(1 for n in head_norms if n == h),
        sliding_window=sliding[0], sliding_window_layers=sliding[1],
    )


def _cohere2(cfg: ConfigView, f: dict) -> dict | None:
    """Cohere2ForCausalLM (Command R7B, Command A): embed_tokens; per layer ONE input_layernorm (Cohere2LayerNorm: a
    weight, no bias, mean-centred, multiplied in fp32: `self.weight.to(torch.float32) * hidden_states`) whose output
    attention and MLP read in parallel, q/k/v/o_proj (bias = attention_bias; head_dim: config.json's, else hidden //
    heads from Cohere2Config.__post_init__) and gate/up/down_proj without bias; the final norm; lm_head,
    tied by default (logit_scale is a float). Sliding-window attention on the layers layer_types names (from
    sliding_window_pattern, default 4: three sliding layers of four)."""
    h, layers, a, k, d, i, v = (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
                                cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size)
    if not _positive_ints(h, layers, a, k, d, i, v):
        return None
    bias = bool(cfg.attention_bias)
    attn = [_linear(h, a * d, bias), _linear(h, k * d, bias), _linear(h, k * d, bias), _linear(a * d, h, bias)]
    mlp = [h * i, h * i, i * h]
    sliding = _sliding(cfg, layers, mask_module=True)
    if sliding is None:
        return None
    tied = bool(cfg.tie_word_embeddings)
    return dict(
        params=v * h + layers * (sum(attn) + sum(mlp) + h) + h + (0 if tied else v * h),
        largest_layer_params=max(v * h, *attn, *mlp, h), vocab_size=v, tied_embeddings=tied, gated_mlp=True,
        embedding_params=v * h + (0 if tied else v * h), norm="layernorm", norms_per_layer=1,
        norm_inputs_per_layer=1, norm_fp32_weight=True, attention_output_copy=_partial_rotary(cfg),
        sliding_window=sliding[0], sliding_window_layers=sliding[1],
    )


def _gpt_oss(cfg: ConfigView, f: dict) -> dict | None:
    """GptOssForCausalLM: embed_tokens; per layer input_layernorm, q/k/v/o_proj (bias = attention_bias, True by
    default) and GptOssAttention's own sinks [heads], post_attention_layernorm, GptOssMLP: GptOssTopKRouter's weight
    [E, h] and bias [E], GptOssExperts' fused gate_up_proj [E, h, 2i] with gate_up_proj_bias [E, 2i] and down_proj
    [E, i, h] with down_proj_bias [E, h] (i = intermediate_size: there is no moe_intermediate_size); the final norm;
    lm_head, untied by default. GptOssPreTrainedModel._supports_sdpa is False (sdpa has no attention sinks);
    sliding-window attention on the even layers (layer_types)."""
    h, layers, a, k, d, v = (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
                             cfg.head_dim, cfg.vocab_size)
    i, e = cfg.intermediate_size, cfg.num_local_experts
    if not _positive_ints(h, layers, a, k, d, v, i, e):
        return None
    bias = bool(cfg.attention_bias)
    # q, k, v, o, then the attention module's own direct parameter: one sink logit per head
    attn = [_linear(h, a * d, bias), _linear(h, k * d, bias), _linear(h, k * d, bias), _linear(a * d, h, bias), a]
    router = e * h + e
    experts = e * h * 2 * i + e * 2 * i + e * i * h + e * h  # one module: all experts' weights and biases
    sliding = _sliding(cfg, layers, mask_module=True)
    if sliding is None:
        return None
    tied = bool(cfg.tie_word_embeddings)
    return dict(
        params=v * h + layers * (sum(attn) + router + experts + 2 * h) + h + (0 if tied else v * h),
        largest_layer_params=max(v * h, *attn, router, experts, h), vocab_size=v, tied_embeddings=tied,
        gated_mlp=True, embedding_params=v * h + (0 if tied else v * h), norm="rmsnorm", supports_sdpa=False,
        attention_output_copy=_partial_rotary(cfg), sliding_window=sliding[0], sliding_window_layers=sliding[1],
        # GptOssRMSNorm: `(self.weight * hidden_states).to(input_dtype)`, the weight times the fp32 normalised input
        norm_fp32_weight=True,
    )


def _deepseek(cfg: ConfigView, f: dict) -> dict | None:
    """DeepseekV3ForCausalLM, DeepseekV2ForCausalLM: embed_tokens; per layer input_layernorm, multi-head latent
    attention (DeepseekV3Attention / DeepseekV2Attention: with a q_lora_rank r, q_a_proj h -> r (bias =
    attention_bias), q_a_layernorm [r] and q_b_proj r -> a (nope + rope) without bias, else one q_proj h -> a (nope +
    rope) without bias; kv_a_proj_with_mqa h -> kv_lora_rank + rope (bias = attention_bias), kv_a_layernorm
    [kv_lora_rank], kv_b_proj kv_lora_rank -> a (nope + v_head_dim) without bias; o_proj a v_head_dim -> h (bias =
    attention_bias)), post_attention_layernorm and the MLP: layers below first_k_dense_replace a dense
    gate/up/down_proj of intermediate_size, the others the MoE (DeepseekV3MoE / DeepseekV2Moe: the router's weight
    [E, h]; the experts' fused gate_up_proj [E, 2m, h] and down_proj [E, h, m], m = moe_intermediate_size;
    shared_experts, a dense MLP of m x n_shared_experts). V2's MLPs take bias = mlp_bias, V3's none. The final norm;
    lm_head unless tied. DeepseekV3TopkRouter's e_score_correction_bias is an nn.Buffer, not a parameter, so it is
    not counted (nor does DeepSpeed partition it); no multi-token-prediction layers are built."""
    v2 = cfg.model_type == "deepseek_v2"
    h, layers, a, k, v = (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
                          cfg.vocab_size)
    q_rank, kv_rank, nope, rope, v_dim = (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_nope_head_dim,
                                          cfg.qk_rope_head_dim, cfg.v_head_dim)
    i, m, e, n_shared, first_moe = (cfg.intermediate_size, cfg.moe_intermediate_size, cfg.n_routed_experts,
                                    cfg.n_shared_experts, cfg.first_k_dense_replace)
    if not _positive_ints(h, layers, a, k, v, kv_rank, nope, rope, v_dim, i, m, e, n_shared):
        return None  # (k: the attention divides the heads by it)
    if q_rank is not None and not _positive_ints(q_rank):
        return None
    if not isinstance(first_moe, int) or isinstance(first_moe, bool):
        return None  # DeepseekV3DecoderLayer compares the layer index with it
    if v2 and h % a:
        return None  # DeepseekV2Config.validate_architecture refuses it
    bias = bool(cfg.attention_bias)
    qk = nope + rope
    # a norm's weight is its module's direct parameters (q_a_layernorm, kv_a_layernorm)
    q = [_linear(h, q_rank, bias), q_rank, q_rank * a * qk] if q_rank is not None else [h * a * qk]
    attn = [*q, _linear(h, kv_rank + rope, bias), kv_rank, kv_rank * a * (nope + v_dim), _linear(a * v_dim, h, bias)]
    mlp_bias = bool(cfg.mlp_bias) if v2 else False
    dense_mlp = [_linear(h, i, mlp_bias), _linear(h, i, mlp_bias), _linear(i, h, mlp_bias)]
    s = m * n_shared
    moe_mlp = [e * h, e * 2 * m * h + e * h * m, _linear(h, s, mlp_bias), _linear(h, s, mlp_bias),
               _linear(s, h, mlp_bias)]
    dense = min(max(first_moe, 0), layers)  # layer_idx >= first_k_dense_replace: MoE
    sliding = _sliding(cfg, layers, mask_module=False)  # DeepseekV3Model builds a causal mask only
    if sliding is None:
        return None
    tied = bool(cfg.tie_word_embeddings)
    params = (v * h + layers * (sum(attn) + 2 * h) + dense * sum(dense_mlp) + (layers - dense) * sum(moe_mlp) + h
              + (0 if tied else v * h))
    # ModelSpec keeps one MLP shape: config_fields' (the routed experts' moe_intermediate_size, num_experts E), on
    # the meta device as here; the first_k_dense_replace dense layers are in params and largest_layer_params only
    largest = max(v * h, *attn, h, *(dense_mlp if dense else ()), *(moe_mlp if dense < layers else ()))
    # hidden-size norms of a layer: the two, and q_a_layernorm / kv_a_layernorm when a rank equals the hidden size
    norms = 2 + (q_rank == h) + (kv_rank == h)
    return dict(
        params=params, largest_layer_params=largest, vocab_size=v, tied_embeddings=tied, gated_mlp=True,
        embedding_params=v * h + (0 if tied else v * h), norm="rmsnorm", norms_per_layer=norms,
        norm_inputs_per_layer=norms, attention_output_copy=_partial_rotary(cfg),
        sliding_window=sliding[0], sliding_window_layers=sliding[1],
    )


_COUNTERS = {"llama": _llama_family, "mistral": _llama_family, "mixtral": _llama_family, "qwen2": _llama_family,
             "qwen3": _llama_family, "gemma": _llama_family, "gemma2": _llama_family,
             "gemma3_text": _llama_family, "qwen3_moe": _llama_family, "falcon": _falcon, "phi3": _phi3, "gpt2": _gpt2, "opt": _opt, "bloom": _bloom,
             "gpt_neox": _gpt_neox, "phi": _phi, "olmo2": _olmo2_granite_smollm3, "granite": _olmo2_granite_smollm3,
             "smollm3": _olmo2_granite_smollm3, "cohere2": _cohere2, "gpt_oss": _gpt_oss, "deepseek_v3": _deepseek,
             "deepseek_v2": _deepseek}


# SiglipVisionConfig's defaults (transformers 5.23 configuration_siglip.py), the keys the vision tower's count reads
_SIGLIP_VISION_DEFAULTS = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                               num_channels=3, image_size=224, patch_size=16, vision_use_head=True)


def _siglip_vision(vision: dict) -> tuple[int, int] | None:
    """(parameters, largest direct parameters of one module) of SiglipVisionModel: patch_embedding (Conv2d with
    bias), position_embedding [(image // patch)^2, h], per layer layer_norm1/2 (weight and bias), q/k/v/out_proj and
    fc1/fc2 with biases, post_layernorm, and with vision_use_head the pooling head (probe [1, 1, h],
    nn.MultiheadAttention: in_proj [3h, h] + bias on the module itself, out_proj; layernorm; an MLP)."""
    values = {**_SIGLIP_VISION_DEFAULTS, **vision}
    h, i, layers, heads, channels, image, patch = (values[k] for k in (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_channels", "image_size",
        "patch_size"))
    if not _positive_ints(h, i, layers, heads, channels, image, patch) or h % heads:
        return None  # list-valued image sizes and the like: the meta device decides
    patch_embedding = _linear(channels * patch * patch, h, True)
    positions = (image // patch) ** 2 * h
    mlp = [_linear(h, i, True), _linear(i, h, True)]
    layer = [2 * h, 2 * h, *[_linear(h, h, True)] * 4, *mlp]
    params = patch_embedding + positions + layers * sum(layer) + 2 * h
    largest = max(patch_embedding, positions, *layer)
    if values["vision_use_head"]:
        in_proj = 3 * h * h + 3 * h  # nn.MultiheadAttention's own in_proj_weight and in_proj_bias
        params += h + in_proj + _linear(h, h, True) + 2 * h + sum(mlp)
        largest = max(largest, in_proj)
    return params, largest


def _gemma3_multimodal(config: dict) -> dict | None:
    """Gemma3ForConditionalGeneration (Gemma 3 4B and up): the Gemma3TextModel of text_config, a SigLIP vision tower
    (vision_config), Gemma3MultiModalProjector (mm_input_projection_weight [vision h, text h] and mm_soft_emb_norm
    over the vision h) and lm_head, tied to the text embeddings by the top-level tie_word_embeddings. The ModelSpec
    shape fields are the text model's (spec/model.py reads get_text_config(decoder=True))."""
    text, vision = config.get("text_config") or {}, config.get("vision_config") or {}
    if not isinstance(text, dict) or not isinstance(vision, dict):
        return None
    if text.get("model_type", "gemma3_text") != "gemma3_text" or (
            vision.get("model_type", "siglip_vision_model") != "siglip_vision_model"):
        return None
    counted = count_params_from_config(
        {**text, "model_type": "gemma3_text", "tie_word_embeddings": config.get("tie_word_embeddings", True)})
    tower = _siglip_vision(vision)
    if counted is None or tower is None:
        return None
    vision_h, text_h = vision.get("hidden_size", _SIGLIP_VISION_DEFAULTS["hidden_size"]), counted["hidden_size"]
    projection = vision_h * text_h
    return {**counted, "model_type": "gemma3", "params": counted["params"] + tower[0] + projection + vision_h,
            "largest_layer_params": max(counted["largest_layer_params"], tower[1], projection)}


def count_params_from_config(config: dict) -> dict | None:
    """The ModelSpec fields (all but name) of a config.json, as the meta-device count gives them, or None for an
    architecture or a feature this module does not model."""
    if not isinstance(config, dict):
        return None
    if config.get("model_type") == "gemma3":
        return _gemma3_multimodal(config)
    cfg = _effective(config)
    if cfg is None:
        return None
    try:
        f = config_fields(cfg)
        counted = _COUNTERS[cfg.model_type](cfg, f)
    except (TypeError, ValueError, OverflowError):
        return None  # a value of the wrong type: the meta device (and its error message) decides
    if counted is None:
        return None
    return {**f, **_PLAIN_BLOCK_TRAITS, **counted, "model_type": cfg.model_type, "exact": True}
