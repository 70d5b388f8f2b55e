"""The torch-free counts (zerokit/spec/arch_params.py) against the meta-device counts (the oracle: the real
transformers modules, spec/model.py _count_on_meta), on every ModelSpec field, for every bundled config of a
supported architecture and synthetic variants (tied/untied, biases, GQA/MQA, MoE, sliding windows, defaults)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zerokit.spec.arch_params import SUPPORTED_MODEL_TYPES, count_params_from_config

REPO = Path(__file__).resolve().parents[1]
BUNDLED = {p.parent.name: json.loads(p.read_text()) for p in sorted((REPO / "zerokit/data/models").glob("*/config.json"))}
SUPPORTED_BUNDLED = {k: v for k, v in BUNDLED.items() if v["model_type"] in SUPPORTED_MODEL_TYPES}


def _small(model_type: str, **kw) -> dict:
    base = {"model_type": model_type, "vocab_size": 512}
    if model_type == "gpt2":
        base.update(n_embd=64, n_layer=2, n_head=4, n_positions=128)
    elif model_type == "opt":
        base.update(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128)
    elif model_type == "gpt_neox":
        base.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    elif model_type == "bloom":
        base.update(hidden_size=64, n_layer=2, n_head=4)
    elif model_type == "falcon":
        base.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    else:
        base.update(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4)
    if model_type == "smollm3":
        base.update(pad_token_id=0)  # SmolLM3Config's pad_token_id 128004 is past the small vocabulary
    base.update(kw)
    return base


def _deepseek(model_type: str, drop: tuple = (), **kw) -> dict:
    """A small MLA + MoE config: q LoRA 48, kv LoRA 32, rope 8 + nope 16 query head dims, v 16, four routed experts
    of 32 and one shared, one dense layer of three; `drop` removes keys (the class default or an alias applies)."""
    base = _small(model_type, num_hidden_layers=3, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48,
                  qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, moe_intermediate_size=32, n_routed_experts=4,
                  n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1)
    base.update(kw)
    for key in drop:
        base.pop(key)
    return base


VARIANTS = {
    "llama-defaults-kv": _small("llama"),
    "llama-gqa-tied": _small("llama", num_key_value_heads=2, tie_word_embeddings=True),
    "llama-biases": _small("llama", attention_bias=True, mlp_bias=True, num_key_value_heads=1),
    "llama-head-dim": _small("llama", head_dim=32, num_key_value_heads=2),
    "llama-extra-sliding-key": _small("llama", sliding_window=16),
    "mistral-window": _small("mistral", num_key_value_heads=2, sliding_window=32),
    "mistral-no-window": _small("mistral", num_key_value_heads=2, sliding_window=None),
    "mistral-defaults": {"model_type": "mistral", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
                         "num_hidden_layers": 1, "num_attention_heads": 8},
    "mixtral-moe": _small("mixtral", num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
    "mixtral-moe-window": _small("mixtral", num_local_experts=3, sliding_window=64, tie_word_embeddings=True),
    "qwen2-bias-untied": _small("qwen2", num_key_value_heads=2),
    "qwen2-sliding": _small("qwen2", num_key_value_heads=2, use_sliding_window=True, sliding_window=32,
                            max_window_layers=1, tie_word_embeddings=True),
    "qwen3-head-norms": _small("qwen3", num_key_value_heads=2, head_dim=32),
    "qwen3-bias-sliding-tied": _small("qwen3", attention_bias=True, use_sliding_window=True, sliding_window=32,
                                      max_window_layers=0, tie_word_embeddings=True, head_dim=16),
    "qwen3-head-dim-is-hidden": _small("qwen3", head_dim=64, num_key_value_heads=1),
    "gemma-defaults-tied": _small("gemma", num_key_value_heads=1, head_dim=16),
    "gemma-untied-bias-gelu": _small("gemma", tie_word_embeddings=False, attention_bias=True, hidden_act="gelu",
                                     head_dim=32, num_key_value_heads=4),
    "opt-tied": _small("opt"),
    "opt-projected-untied": _small("opt", word_embed_proj_dim=32, tie_word_embeddings=False),
    "opt-no-bias-no-affine": _small("opt", enable_bias=False, layer_norm_elementwise_affine=False),
    "opt-post-norm": _small("opt", do_layer_norm_before=False, dropout=0.0),
    "bloom-tied": _small("bloom"),
    "bloom-untied-n-embed": {"model_type": "bloom", "vocab_size": 300, "n_embed": 96, "n_layer": 3, "n_head": 6,
                             "tie_word_embeddings": False, "hidden_dropout": 0.1},
    "neox-defaults-parallel": _small("gpt_neox"),
    "neox-sequential-full-rotary-tied": _small("gpt_neox", use_parallel_residual=False, rotary_pct=1.0,
                                               tie_word_embeddings=True, attention_bias=False),
    "neox-rope-dict": _small("gpt_neox", rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                          "partial_rotary_factor": 0.5}),
    "phi-defaults": _small("phi"),
    "phi-qk-norm-gqa-tied": _small("phi", qk_layernorm=True, num_key_value_heads=2, tie_word_embeddings=True,
                                   partial_rotary_factor=1.0),
    "phi-rope-dict-single-head": _small("phi", num_attention_heads=1, qk_layernorm=True,
                                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                         "partial_rotary_factor": 0.4}),
    "gemma2-defaults-alternating-window": _small("gemma2", head_dim=16, num_hidden_layers=3, sliding_window=32),
    "gemma2-untied-bias-no-window": _small("gemma2", head_dim=32, num_key_value_heads=1, attention_bias=True,
                                           tie_word_embeddings=False, sliding_window=None, hidden_act="gelu"),
    "gemma2-layer-types": _small("gemma2", head_dim=16, num_key_value_heads=2, sliding_window=8,
                                 layer_types=["full_attention", "sliding_attention"]),
    "gemma3-pattern-default": _small("gemma3_text", head_dim=16, num_hidden_layers=7, sliding_window=16),
    "gemma3-pattern-2-untied": _small("gemma3_text", head_dim=32, num_key_value_heads=2, sliding_window_pattern=2,
                                      sliding_window=16, tie_word_embeddings=False, attention_bias=True),
    "gemma3-head-dim-is-hidden": _small("gemma3_text", head_dim=64, num_key_value_heads=1, sliding_window=None),
    "gemma3-bidirectional": _small("gemma3_text", head_dim=16, use_bidirectional_attention=True, sliding_window=33),
    "gemma3-multimodal-head-untied": {"model_type": "gemma3", "tie_word_embeddings": False,
                                      "text_config": _small("gemma3_text", head_dim=16, sliding_window=16),
                                      "vision_config": {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                                                        "num_attention_heads": 2, "image_size": 28, "patch_size": 14}},
    "gemma3-multimodal-text-untie-ignored": {
        "model_type": "gemma3", "mm_tokens_per_image": 4,
        "text_config": _small("gemma3_text", head_dim=16, tie_word_embeddings=False, num_key_value_heads=1),
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 48, "intermediate_size": 40,
                          "num_hidden_layers": 1, "num_attention_heads": 4, "image_size": 56, "patch_size": 14,
                          "num_channels": 1, "vision_use_head": False}},
    "qwen3-moe-defaults-kv": _small("qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                                    head_dim=16),
    "qwen3-moe-bias-window-tied": _small("qwen3_moe", num_experts=3, moe_intermediate_size=40, attention_bias=True,
                                         use_sliding_window=True, sliding_window=32, tie_word_embeddings=True),
    "qwen3-moe-window-off": _small("qwen3_moe", num_experts=2, num_key_value_heads=2, sliding_window=32),
    "phi3-defaults": _small("phi3", pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "phi3-gqa-partial-rotary-window": _small("phi3", num_key_value_heads=2, partial_rotary_factor=0.75,
                                             sliding_window=16, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "phi3-rope-dict-tied-head-dim": _small("phi3", num_key_value_heads=1, head_dim=32, tie_word_embeddings=True,
                                           rope_scaling={"rope_type": "default", "partial_rotary_factor": 0.5},
                                           pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "falcon-defaults-mqa-parallel": _small("falcon"),
    "falcon-new-decoder-gqa": _small("falcon", new_decoder_architecture=True, num_kv_heads=2, bias=True),
    "falcon-new-decoder-one-norm": _small("falcon", new_decoder_architecture=True, num_kv_heads=1,
                                          num_ln_in_parallel_attn=1, tie_word_embeddings=False),
    "falcon-sequential-mha-bias": _small("falcon", parallel_attn=False, multi_query=False, bias=True,
                                         ffn_hidden_size=96, activation="relu", hidden_dropout=0.1),
    "falcon-alibi-n-embed": {"model_type": "falcon", "vocab_size": 300, "n_embed": 96, "num_hidden_layers": 2,
                             "num_attention_heads": 6, "alibi": True, "multi_query": False},
    "falcon-old-two-norms": _small("falcon", num_ln_in_parallel_attn=2),
    # without trust_remote_code transformers ignores auto_map and builds its own class (the meta oracle does too)
    "llama-auto-map-ignored": {**_small("llama"), "auto_map": {"AutoConfig": "x.Y", "AutoModelForCausalLM": "x.Z"}},
    "gpt2-tied": _small("gpt2"),
    "gpt2-untied-inner": _small("gpt2", tie_word_embeddings=False, n_inner=96, activation_function="relu",
                                attn_pdrop=0.0, resid_pdrop=0.2),
    # OLMo 2: q_norm / k_norm over heads x head_dim (both hidden-size with MHA), post-attention/feedforward norms
    "olmo2-defaults-mha": _small("olmo2"),
    "olmo2-gqa-bias-tied": _small("olmo2", num_key_value_heads=2, attention_bias=True, tie_word_embeddings=True),
    "olmo2-head-dim-mqa-partial-rotary": _small("olmo2", head_dim=32, num_key_value_heads=1, partial_rotary_factor=0.5),
    # Granite: Llama-shaped, multipliers without parameters
    "granite-multipliers": _small("granite", embedding_multiplier=12.0, residual_multiplier=0.22,
                                  attention_multiplier=0.015625, logits_scaling=8.0),
    "granite-biases-gqa-tied": _small("granite", attention_bias=True, mlp_bias=True, num_key_value_heads=2,
                                      tie_word_embeddings=True),
    "granite-head-dim-yarn-no-original": _small("granite", head_dim=32, original_max_position_embeddings=512,
                                                rope_scaling={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}),
    # SmolLM3: NoPE every 4th layer, sliding attention (when enabled) on the NoPE layers only
    "smollm3-defaults-tied": _small("smollm3", num_hidden_layers=4),
    "smollm3-sliding-nope-interval-2": _small("smollm3", num_hidden_layers=4, use_sliding_window=True,
                                              sliding_window=32, no_rope_layer_interval=2, tie_word_embeddings=False),
    "smollm3-no-rope-list-biases": _small("smollm3", no_rope_layers=[1, 0], use_sliding_window=True, sliding_window=16,
                                          attention_bias=True, mlp_bias=True, num_key_value_heads=1),
    "smollm3-window-not-used": _small("smollm3", num_hidden_layers=4, sliding_window=32),
    # Cohere 2: one CohereLayerNorm a layer (parallel attention + MLP), tied, sliding 3 layers of 4
    "cohere2-defaults-pattern-4": _small("cohere2", num_hidden_layers=5, sliding_window=32),
    "cohere2-untied-bias-gqa-pattern-2": _small("cohere2", num_hidden_layers=4, sliding_window=16,
                                                sliding_window_pattern=2, num_key_value_heads=2, attention_bias=True,
                                                tie_word_embeddings=False),
    "cohere2-no-window-head-dim-key": _small("cohere2", sliding_window=None, head_dim=32, num_key_value_heads=1),
    "cohere2-layer-types": _small("cohere2", sliding_window=8, layer_types=["full_attention", "sliding_attention"]),
    # GPT-OSS: attention biases and sinks, router with bias, fused experts with biases, sliding on even layers
    "gpt-oss-defaults-window": _small("gpt_oss", num_hidden_layers=3, num_key_value_heads=2, num_local_experts=4,
                                      num_experts_per_tok=2),
    "gpt-oss-no-bias-tied-num-experts": _small("gpt_oss", head_dim=32, num_key_value_heads=1, num_experts=3,
                                                 attention_bias=False, tie_word_embeddings=True, sliding_window=None),
    "gpt-oss-one-expert-rope-dict": _small("gpt_oss", num_local_experts=1, num_experts_per_tok=1, head_dim=8,
                                           num_key_value_heads=4, rope_parameters={"rope_type": "default",
                                                                                   "rope_theta": 1e4}),
    # DeepSeek-V3: MLA with a q LoRA (or a plain q_proj), dense layers then routed + shared experts
    "deepseek-v3-dense-then-moe": _deepseek("deepseek_v3"),
    "deepseek-v3-q-proj-tied-all-moe": _deepseek("deepseek_v3", q_lora_rank=None, first_k_dense_replace=0,
                                                 tie_word_embeddings=True, n_shared_experts=2),
    "deepseek-v3-bias-ranks-hidden-yarn": _deepseek("deepseek_v3", attention_bias=True, q_lora_rank=64,
                                                    kv_lora_rank=64, head_dim=16, num_key_value_heads=None,
                                                    max_position_embeddings=512,
                                                    rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                                  "original_max_position_embeddings": 256}),
    "deepseek-v3-all-dense-num-local-experts": _deepseek("deepseek_v3", drop=("n_routed_experts",),
                                                          first_k_dense_replace=5, num_local_experts=6),
    # DeepSeek-V2: mlp_bias, greedy top-k default (num_experts_per_tok None), first_k_dense_replace 0 by default
    "deepseek-v2-defaults-moe": _deepseek("deepseek_v2", drop=("first_k_dense_replace", "n_group", "topk_group"),
                                          num_experts_per_tok=None),
    "deepseek-v2-dense-first-mlp-bias-q-proj": _deepseek("deepseek_v2", drop=("n_routed_experts",), mlp_bias=True,
                                                         attention_bias=True, q_lora_rank=None, num_experts=5,
                                                         tie_word_embeddings=True),
    "deepseek-v2-head-dim-key-ignored": _deepseek("deepseek_v2", head_dim=40, partial_rotary_factor=0.5),
}


def _meta(config: dict) -> dict:
    from zerokit.spec.model import _count_on_meta

    counted = _count_on_meta(dict(config), "<test>", False, None)
    counted.pop("_seconds")
    return counted


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_synthetic_variants_equal_the_meta_device_count(name):
    pytest.importorskip("transformers")
    assert count_params_from_config(VARIANTS[name]) == _meta(VARIANTS[name])


@pytest.mark.parametrize("name", sorted(SUPPORTED_BUNDLED))
def test_bundled_configs_equal_the_meta_device_count(name):
    pytest.importorskip("transformers")
    assert count_params_from_config(SUPPORTED_BUNDLED[name]) == _meta(SUPPORTED_BUNDLED[name])


def test_published_counts():
    """Llama-3-8B: 8,030,261,248 parameters (Meta's model card: 8.03B); GPT-2: 124,439,808 (HF's gpt2); Gemma 3 4B
    (google/gemma-3-4b-it, HF safetensors metadata): 4,300,079,472 with its vision tower; more in test_model_spec."""
    assert count_params_from_config(BUNDLED["llama-3-8b"])["params"] == 8_030_261_248
    assert count_params_from_config(BUNDLED["gpt2"])["params"] == 124_439_808
    assert count_params_from_config(BUNDLED["gemma-3-4b"])["params"] == 4_300_079_472


@pytest.mark.parametrize("config", [{"model_type": "t5"}, {"model_type": "made-up"},
                                    _small("llama", hidden_size="64"), _small("gpt2", add_cross_attention=True),
                                    _small("mistral", layer_types=["full_attention"]), "not a dict",
                                    {"model_type": "gemma3", "vision_config": {"model_type": "clip_vision_model"}},
                                    {"model_type": "gemma3", "vision_config": {"image_size": [224, 224]}},
                                    _small("falcon", head_dim=16), _small("gemma3_text", sliding_window_pattern=0),
                                    _small("qwen3_moe", num_experts=4, mlp_only_layers=[0]),
                                    _small("qwen3_moe", num_experts=4, decoder_sparse_step=2),
                                    _small("olmo2", head_dim=None), _small("smollm3", no_rope_layers=[1]),
                                    _small("smollm3", no_rope_layer_interval=0),
                                    _small("cohere2", sliding_window_pattern=0),
                                    _small("cohere2", head_dim=None),
                                    _small("granite", rope_parameters={"full_attention": {"rope_type": "default"}}),
                                    _small("gpt_oss", layer_types=["attention", "full_attention"]),
                                    _small("gpt_oss", sliding_window=8, layer_types=["full_attention"]),
                                    _small("gpt_oss", head_dim=None),
                                    _deepseek("deepseek_v3", first_k_dense_replace=None),
                                    _deepseek("deepseek_v3", v_head_dim=None), _deepseek("deepseek_v3", head_dim=None),
                                    _deepseek("deepseek_v2", hidden_size=66)],
                         ids=["t5", "unknown", "string-size", "cross-attention", "bad-layer-types", "str",
                              "gemma3-other-vision", "gemma3-list-image-size", "falcon-head-dim-key", "gemma3-pattern-0",
                              "qwen3-moe-dense-layers", "qwen3-moe-sparse-step", "olmo2-null-head-dim",
                              "smollm3-short-no-rope-layers", "smollm3-interval-0", "cohere2-pattern-0",
                              "cohere2-null-head-dim", "granite-nested-rope", "gpt-oss-legacy-layer-type",
                              "gpt-oss-layer-types-length", "gpt-oss-null-head-dim", "deepseek-v3-null-first-dense",
                              "deepseek-v3-null-v-head-dim",
                              "deepseek-v3-null-head-dim",
                              "deepseek-v2-heads-do-not-divide"])
def test_what_it_does_not_model_falls_back(config):
    assert count_params_from_config(config) is None


def test_remote_code_is_counted_on_meta(tmp_path):
    """With trust_remote_code the hub's own modeling code decides the shapes: load_model_spec does not use the
    arithmetic then (a config with auto_map that names no loadable code fails there, not here)."""
    from zerokit.core.errors import ZerokitError
    from zerokit.spec.model import load_model_spec

    (tmp_path / "config.json").write_text(json.dumps({**_small("llama"), "auto_map": {"AutoConfig": "nope.Cfg"}}))
    assert load_model_spec(str(tmp_path)).params == count_params_from_config(_small("llama"))["params"]
    with pytest.raises(ZerokitError):
        load_model_spec(str(tmp_path), trust_remote_code=True)


def test_counting_imports_neither_torch_nor_transformers_and_is_fast():
    code = (
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "from zerokit.spec.arch_params import count_params_from_config\n"
        f"configs = [json.loads(p.read_text()) for p in Path({str(REPO / 'zerokit/data/models')!r}).glob('*/config.json')]\n"
        "t = time.perf_counter()\n"
        "n = sum(count_params_from_config(c) is not None for c in configs)\n"
        "dt = time.perf_counter() - t\n"
        "print(json.dumps({'n': n, 'seconds': dt, 'heavy': [m for m in ('torch', 'transformers') if m in sys.modules]}))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(REPO), timeout=60)
    out = json.loads(r.stdout)
    assert out["n"] == len(SUPPORTED_BUNDLED) and not out["heavy"] and out["seconds"] < 0.1, out


def test_moe_layers_count_the_dense_ones_out_of_the_active_parameters():
    # DeepSeek-V3 (config.json on the hub: 61 layers, first_k_dense_replace 3, 256 routed experts of 2048, 8 per token,
    # one shared expert): 671B parameters, 37B activated per token (the DeepSeek-V3 technical report, arXiv 2412.19437,
    # abstract). Without the 3 dense layers out of the idle-expert count it came to 4.8B.
    from zerokit.spec.model import ModelSpec

    v3 = dict(model_type="deepseek_v3", vocab_size=129280, hidden_size=7168, intermediate_size=18432,
              moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
              n_shared_experts=1, n_routed_experts=256, num_experts_per_tok=8, first_k_dense_replace=3,
              q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
    counted = count_params_from_config(v3)
    assert counted["moe_layers"] == 58
    spec = ModelSpec(name="deepseek-v3", **{k: v for k, v in counted.items() if k in ModelSpec.__dataclass_fields__})
    assert spec.params == pytest.approx(671e9, rel=0.01)
    assert spec.active_params == pytest.approx(37e9, rel=0.03)
