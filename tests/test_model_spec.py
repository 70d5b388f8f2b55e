"""zerokit.spec.model: exact meta-device counts vs DeepSpeed on real models, published oracles,
the per-config cache, bad inputs, and shapes from a bare parameter count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zerokit.core.errors import ZerokitError
from zerokit.spec.resolve import bundled_models
from zerokit.spec.model import (
    ModelSpec,
    load_model_spec,
    spec_cache_dir,
    spec_from_params,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own empty spec cache."""
    monkeypatch.setenv("ZEROKIT_CACHE_DIR", str(tmp_path_factory.mktemp("zk-cache")))


def _run_py(code: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update(env_extra or {})
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, cwd=REPO, timeout=300
    )


# ---------------------------------------------------------------------------------------------
# Exact counts vs DeepSpeed's model_to_params on a real (CPU, random init) instantiation
# ---------------------------------------------------------------------------------------------

_ATTN = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=256, max_position_embeddings=128)

# (id, model_type, config kwargs, expected shape fields)
ARCHS = [
    ("llama", "llama", dict(_ATTN, intermediate_size=96, num_key_value_heads=2), dict(kv=2, inter=96, gated=True, tied=False)),
    ("llama-tied", "llama", dict(_ATTN, intermediate_size=96, num_key_value_heads=2, tie_word_embeddings=True), dict(tied=True)),
    ("mistral", "mistral", dict(_ATTN, intermediate_size=96, num_key_value_heads=2), dict(kv=2, gated=True)),
    ("qwen2", "qwen2", dict(_ATTN, intermediate_size=96, num_key_value_heads=2, tie_word_embeddings=False), dict(kv=2, tied=False)),
    ("qwen2-tied", "qwen2", dict(_ATTN, intermediate_size=96, num_key_value_heads=2, tie_word_embeddings=True), dict(tied=True)),
    ("gemma", "gemma", dict(_ATTN, intermediate_size=96, num_key_value_heads=1, head_dim=32), dict(kv=1, head_dim=32, tied=True, gated=True)),
    ("gemma2", "gemma2", dict(_ATTN, intermediate_size=96, num_key_value_heads=2, head_dim=16), dict(kv=2, head_dim=16, gated=True)),
    ("phi", "phi", dict(_ATTN, intermediate_size=96), dict(gated=False, norm="layernorm", tied=False)),
    ("phi3", "phi3", dict(_ATTN, intermediate_size=96, pad_token_id=0, bos_token_id=1, eos_token_id=2), dict(gated=True)),
    ("gpt2", "gpt2", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=128), dict(inter=256, gated=False, tied=True, norm="layernorm")),
    ("gpt2-ninner", "gpt2", dict(n_embd=64, n_layer=2, n_head=4, n_inner=100, vocab_size=256, n_positions=128), dict(inter=100)),
    ("gpt2-untied", "gpt2", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=128, tie_word_embeddings=False), dict(tied=False)),
    ("opt", "opt", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=96, vocab_size=256, max_position_embeddings=128, word_embed_proj_dim=64), dict(inter=96, gated=False, tied=True)),
    ("bloom", "bloom", dict(hidden_size=64, n_layer=2, n_head=4, vocab_size=256), dict(inter=256, gated=False, tied=True)),
    ("falcon-mqa", "falcon", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=256, multi_query=True), dict(kv=1, gated=False)),
    ("falcon-mha", "falcon", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=256, multi_query=False), dict(kv=4)),
    ("falcon-new", "falcon", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=2, vocab_size=256, new_decoder_architecture=True), dict(kv=2)),
    ("mixtral", "mixtral", dict(_ATTN, intermediate_size=96, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2), dict(experts=4, top_k=2, inter=96, gated=True)),
    ("qwen2_moe", "qwen2_moe", dict(_ATTN, intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2), dict(experts=4, top_k=2, inter=32)),
    ("gpt_neox", "gpt_neox", dict(_ATTN, intermediate_size=96), dict(inter=96, gated=False, norm="layernorm")),
    ("starcoder2", "starcoder2", dict(_ATTN, intermediate_size=96, num_key_value_heads=2), dict(kv=2, gated=False)),
    ("olmo", "olmo", dict(_ATTN, intermediate_size=96, num_key_value_heads=2), dict(kv=2, gated=True, norm="layernorm")),
]


@pytest.fixture(scope="module")
def deepspeed_model_to_params():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    return stage3.model_to_params


@pytest.mark.parametrize("arch_id,model_type,kwargs,expect", ARCHS, ids=[a[0] for a in ARCHS])
def test_meta_count_matches_deepspeed_on_real_model(arch_id, model_type, kwargs, expect, tmp_path, deepspeed_model_to_params):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(model_type, **kwargs)
    cfg.save_pretrained(tmp_path)
    spec = load_model_spec(str(tmp_path))

    torch.manual_seed(0)
    real = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path))
    total, largest = deepspeed_model_to_params(real)

    assert spec.params == total, f"{arch_id}: meta {spec.params} != DeepSpeed {total}"
    assert spec.largest_layer_params == largest, f"{arch_id}: largest {spec.largest_layer_params} != {largest}"
    assert spec.exact and spec.model_type == model_type
    assert spec.hidden_size == 64 and spec.num_layers == 2 and spec.num_attention_heads == 4
    assert spec.vocab_size == 256
    emb = real.get_input_embeddings().weight
    out = real.get_output_embeddings()
    real_tied = out is not None and out.weight is emb
    assert spec.tied_embeddings == real_tied
    assert spec.embedding_params == emb.numel() + (0 if real_tied or out is None else out.weight.numel())
    if "kv" in expect:
        assert spec.num_kv_heads == expect["kv"]
    if "head_dim" in expect:
        assert spec.head_dim == expect["head_dim"]
    else:
        assert spec.head_dim == 16
    if "inter" in expect:
        assert spec.intermediate_size == expect["inter"]
    if "gated" in expect:
        assert spec.gated_mlp is expect["gated"]
    if "tied" in expect:
        assert spec.tied_embeddings is expect["tied"]
    if "norm" in expect:
        assert spec.norm == expect["norm"]
    else:
        assert spec.norm == "rmsnorm" or model_type in ("gpt2", "opt", "bloom", "falcon", "phi", "gpt_neox", "starcoder2")
    assert spec.num_experts == expect.get("experts", 1)
    assert spec.experts_per_token == expect.get("top_k", 1)


def test_multimodal_counts_whole_model_and_reads_text_config(tmp_path, deepspeed_model_to_params):
    from transformers import AutoConfig, AutoModelForImageTextToText

    cfg = AutoConfig.for_model(
        "llava",
        text_config=dict(model_type="llama", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=300),
        vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, image_size=32, patch_size=8, projection_dim=32),
    )
    cfg.save_pretrained(tmp_path)
    spec = load_model_spec(str(tmp_path))
    total, largest = deepspeed_model_to_params(AutoModelForImageTextToText.from_config(cfg))
    assert (spec.params, spec.largest_layer_params) == (total, largest)
    assert (spec.hidden_size, spec.num_layers, spec.num_kv_heads, spec.vocab_size) == (64, 2, 2, 300)
    assert spec.model_type == "llava" and not spec.tied_embeddings and spec.embedding_params == 2 * 300 * 64


def test_tied_weights_counted_once(tmp_path):
    from transformers import LlamaConfig

    base = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, vocab_size=256)
    LlamaConfig(**base, tie_word_embeddings=True).save_pretrained(tmp_path / "tied")
    LlamaConfig(**base, tie_word_embeddings=False).save_pretrained(tmp_path / "untied")
    tied = load_model_spec(str(tmp_path / "tied"))
    untied = load_model_spec(str(tmp_path / "untied"))
    assert untied.params - tied.params == 256 * 64
    assert tied.tied_embeddings and not untied.tied_embeddings
    assert tied.embedding_params == 256 * 64 and untied.embedding_params == 2 * 256 * 64


# ---------------------------------------------------------------------------------------------
# Oracles: bundled real configs vs published parameter counts
# ---------------------------------------------------------------------------------------------

# Sources: safetensors metadata ("total" in model.safetensors.index.json / the HF model page's
# parameter count) of each public checkpoint, and model cards:
#   meta-llama/Meta-Llama-3-8B           8,030,261,248  (HF safetensors metadata; PEFT print_trainable_parameters "all params")
#   meta-llama/Meta-Llama-3-70B         70,553,706,496  (HF safetensors metadata)
#   meta-llama/Llama-2-7b-hf             6,738,415,616  (HF safetensors metadata)
#   mistralai/Mistral-7B-v0.1            7,241,732,096  (HF safetensors metadata; v0.3 with vocab 32768 is 7,248,023,552)
#   mistralai/Mixtral-8x7B-v0.1         46,702,792,704  (HF safetensors metadata; card "46.7B total, 12.9B active")
#   Qwen/Qwen2.5-7B                      7,615,616,512  (HF safetensors metadata; card "7.61B")
#   openai-community/gpt2                  124,439,808  (HF safetensors metadata; "124M")
#   openai-community/gpt2-xl             1,557,611,200  (HF safetensors metadata; "1.5B")
#   openai-community/gpt2-medium           354,823,168  (card "355M"; GPT-2's count, as gpt2 and gpt2-xl above: 50,257 x
#                                                        1,024 tokens + 1,024 x 1,024 positions + 24 layers of
#                                                        12,596,224 + the final LayerNorm)
#   openai-community/gpt2-large            774,030,080  (card "774M", DeepSpeedExamples' autotuning README "774M"; 50,257
#                                                        x 1,280 + 1,024 x 1,280 + 36 layers of 19,677,440 + 2,560)
#   google/gemma-2b                      2,506,172,416  (HF safetensors metadata)
#   microsoft/phi-2                      2,779,683,840  (HF safetensors metadata; card "2.7B")
#   tiiuae/falcon-7b                     6,921,720,704  (HF safetensors metadata)
#   google/gemma-2-9b                    9,241,705,984  (HF safetensors metadata; card "9B")
#   google/gemma-3-1b-pt                   999,885,952  (HF safetensors metadata; card "1B")
#   google/gemma-3-4b-it                 4,300,079,472  (HF safetensors metadata: text, SigLIP vision tower, projector)
#   microsoft/Phi-3-mini-4k-instruct     3,821,079,552  (HF safetensors metadata; card "3.8B")
#   Qwen/Qwen3-30B-A3B                  30,532,122,624  (HF safetensors metadata; card "30.5B in total")
#   Qwen/Qwen3-32B                      32,762,123,264  (card: "32.8B", "Non-Embedding: 31.2B"; 2 x 151,936 x 5,120
#                                                        embedding + head and 64 layers of 487,598,336 + the final norm)
#   Qwen/Qwen3-4B                        4,022,468,096  (card: "4.0B", "Non-Embedding: 3.6B"; one tied 151,936 x 2,560
#                                                        embedding and 36 layers of 100,930,816 + the final norm)
#   facebook/opt-1.3b                    1,315,758,080  (HF model page)
#   bigscience/bloom-560m                  559,214,592  (HF safetensors metadata; card "559,214,592 parameters")
PUBLISHED = {
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "llama-2-7b": 6_738_415_616,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2.5-7b": 7_615_616_512,
    "gpt2": 124_439_808,
    "gpt2-xl": 1_557_611_200,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gemma-2b": 2_506_172_416,
    "phi-2": 2_779_683_840,
    "falcon-7b": 6_921_720_704,
    "gemma-2-9b": 9_241_705_984,
    "gemma-3-1b": 999_885_952,
    "gemma-3-4b": 4_300_079_472,
    "phi-3-mini": 3_821_079_552,
    "qwen3-30b-a3b": 30_532_122_624,
    "qwen3-32b": 32_762_123_264,
    "qwen3-4b": 4_022_468_096,
    "opt-1.3b": 1_315_758_080,
    "bloom-560m": 559_214_592,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_bundled_real_configs_match_published_counts(name):
    pytest.importorskip("transformers")
    spec = load_model_spec(name)
    assert spec.params == PUBLISHED[name]
    assert spec.name == name and spec.exact


def test_bundled_shapes_spot_checks():
    pytest.importorskip("transformers")
    l3 = load_model_spec("llama-3-8b")
    assert (l3.hidden_size, l3.num_layers, l3.num_attention_heads, l3.num_kv_heads, l3.head_dim) == (4096, 32, 32, 8, 128)
    assert (l3.intermediate_size, l3.vocab_size, l3.tied_embeddings, l3.gated_mlp) == (14336, 128256, False, True)
    assert l3.largest_layer_params == 128256 * 4096  # the embedding / lm_head
    assert l3.embedding_params == 2 * 128256 * 4096

    mx = load_model_spec("mixtral-8x7b")
    assert (mx.num_experts, mx.experts_per_token, mx.intermediate_size) == (8, 2, 14336)
    assert mx.active_params == 12_879_925_248  # Mixtral paper / card: "12.9B active"

    fa = load_model_spec("falcon-7b")
    assert fa.num_kv_heads == 1 and fa.tied_embeddings and fa.norm == "layernorm" and not fa.gated_mlp

    g2 = load_model_spec("gpt2")
    assert (g2.hidden_size, g2.num_layers, g2.intermediate_size, g2.norm) == (768, 12, 3072, "layernorm")

    gm = load_model_spec("gemma-2b")
    assert (gm.head_dim, gm.num_kv_heads, gm.tied_embeddings) == (256, 1, True)

    opt = load_model_spec("opt-1.3b")
    assert opt.intermediate_size == 8192 and not opt.gated_mlp


def test_bundled_activation_traits():
    # the architecture traits the activation model reads (memory.activation_bytes_per_layer; traced in
    # bench/results/activation_trace.txt): defaults for Llama-like models
    pytest.importorskip("transformers")
    traits = ("norms_per_layer", "norm_inputs_per_layer", "norm_fp32_weight", "sliding_window", "sliding_window_layers",
              "sdpa_mask", "sdpa_broadcast_kv", "attention_output_copy")
    got = {n: tuple(getattr(load_model_spec(n), t) for t in traits)
           for n in ("llama-3-8b", "qwen2.5-7b", "gpt2", "mistral-7b", "falcon-7b", "phi-2", "gemma-2b")}
    plain = (2, 2, False, None, 0, False, False, False)
    assert got["llama-3-8b"] == got["gpt2"] == plain
    assert got["qwen2.5-7b"] == plain  # use_sliding_window false: transformers sets sliding_window None
    assert got["mistral-7b"] == (2, 2, False, 4096, 32, False, False, False)
    assert got["falcon-7b"] == (1, 1, False, None, 0, True, True, False)  # parallel_attn, MQA, mask always
    assert got["phi-2"] == (1, 1, False, None, 0, False, False, True)  # parallel block, partial rotary 0.4
    assert got["gemma-2b"] == (2, 2, True, None, 0, False, False, False)  # (1 + w) in fp32


@pytest.mark.parametrize("model_type,kwargs,expect", [
    # Falcon-40B style: ln_attn and ln_mlp on one input, K/V broadcast to all heads (no math kernel), mask always
    ("falcon", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=2, vocab_size=256,
                    new_decoder_architecture=True), dict(norms_per_layer=2, norm_inputs_per_layer=1, sdpa_mask=True,
                                                         sdpa_broadcast_kv=False)),
    # GPT-NeoX: parallel residual (both norms read the layer input), partial rotary 0.25
    ("gpt_neox", dict(_ATTN, intermediate_size=96), dict(norms_per_layer=2, norm_inputs_per_layer=1, attention_output_copy=True)),
    # Gemma2: four norms per layer, (1 + w) in fp32, sliding window on layer_types' "sliding_attention" layers
    ("gemma2", dict(_ATTN, intermediate_size=96, num_key_value_heads=2, head_dim=16, sliding_window=32),
     dict(norms_per_layer=4, norm_fp32_weight=True, sliding_window=32, sliding_window_layers=1)),
    # Qwen3: per-head q/k norms are not hidden-size norms
    ("qwen3", dict(_ATTN, intermediate_size=96, num_key_value_heads=2), dict(norms_per_layer=2, norm_fp32_weight=False)),
], ids=["falcon-new", "gpt_neox", "gemma2", "qwen3"])
def test_activation_traits_from_config(model_type, kwargs, expect, tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    AutoConfig.for_model(model_type, **kwargs).save_pretrained(tmp_path)
    spec = load_model_spec(str(tmp_path))
    assert {k: getattr(spec, k) for k in expect} == expect


def test_tiny_bundled_models():
    pytest.importorskip("transformers")
    tl = load_model_spec("tiny-llama")
    assert (tl.hidden_size, tl.intermediate_size, tl.num_layers, tl.num_attention_heads, tl.num_kv_heads) == (128, 352, 4, 4, 2)
    assert (tl.vocab_size, tl.tied_embeddings, tl.model_type) == (2048, False, "llama")
    tg = load_model_spec("tiny-gpt2")
    assert (tg.hidden_size, tg.num_layers, tg.num_attention_heads, tg.vocab_size) == (128, 4, 4, 2048)
    raw = json.loads((REPO / "zerokit/data/models/tiny-gpt2/config.json").read_text())
    assert raw["n_positions"] == 512
    assert set(bundled_models()) >= {"tiny-llama", "tiny-gpt2", *PUBLISHED}


def test_load_accepts_config_file_path(tmp_path):
    pytest.importorskip("transformers")
    src = REPO / "zerokit/data/models/tiny-llama/config.json"
    spec_file = load_model_spec(str(src))
    spec_dir = load_model_spec(str(src.parent))
    assert spec_file.params == spec_dir.params == load_model_spec("tiny-llama").params


def test_70b_cold_count_needs_no_torch():
    """A cold 70B Llama is counted by arithmetic (spec/arch_params.py) in a fresh process: no torch, no cache."""
    r = _run_py(
        """
        import time, json, sys
        t0 = time.perf_counter()
        from zerokit.spec.model import load_model_spec
        s = load_model_spec("llama-3-70b")
        print(json.dumps({"cold_total_s": time.perf_counter() - t0, "params": s.params,
                          "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules}))
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["params"] == 70_553_706_496 and not result["torch"] and not result["transformers"]
    print(f"\n70B: cold load {result['cold_total_s'] * 1000:.0f} ms without torch")


# ---------------------------------------------------------------------------------------------
# Cache (of meta-device counts: architectures spec/arch_params.py does not model, here a tiny StarCoder2 and GPT-BigCode)
# ---------------------------------------------------------------------------------------------

TINY_META_A = json.dumps({"model_type": "starcoder2", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
                          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2})
TINY_META_B = json.dumps({"model_type": "gpt_bigcode", "vocab_size": 512, "n_embd": 64, "n_layer": 2, "n_head": 4,
                          "n_positions": 128})


def test_cache_tests_use_architectures_counted_on_meta():
    """The cache holds meta-device counts only: the configs above must not be counted without torch."""
    from zerokit.spec.arch_params import count_params_from_config

    assert count_params_from_config(json.loads(TINY_META_A)) is None
    assert count_params_from_config(json.loads(TINY_META_B)) is None


def test_second_load_reads_cache_without_torch(tmp_path):
    pytest.importorskip("transformers")
    cache = tmp_path / "cache"
    model_dir, other_dir = tmp_path / "m", tmp_path / "other"
    for d, text in ((model_dir, TINY_META_A), (other_dir, TINY_META_B)):
        d.mkdir()
        (d / "config.json").write_text(text)
    env = {"ZEROKIT_CACHE_DIR": str(cache)}
    code = """
        import sys, json, time
        from zerokit.spec.model import load_model_spec
        t = time.perf_counter()
        s = load_model_spec(sys.argv[1] if len(sys.argv) > 1 else {target!r})
        dt = time.perf_counter() - t
        print(json.dumps({{"params": s.params, "name": s.name, "torch": "torch" in sys.modules,
                          "transformers": "transformers" in sys.modules, "seconds": dt}}))
    """
    for target in (str(model_dir), str(other_dir)):
        first = _run_py(code.format(target=target), env)
        assert first.returncode == 0, first.stderr[-2000:]
        a = json.loads(first.stdout.strip().splitlines()[-1])
        assert a["torch"]  # the cold load had to count on meta
        second = _run_py(code.format(target=target), env)
        assert second.returncode == 0, second.stderr[-2000:]
        b = json.loads(second.stdout.strip().splitlines()[-1])
        assert b["params"] == a["params"] and b["name"] == a["name"]
        assert not b["torch"] and not b["transformers"], "a cached load must not import torch or transformers"
        print(f"\n{target}: cold {a['seconds']:.2f}s, cached {b['seconds'] * 1000:.1f} ms")
    entries = list((cache / "model_specs").glob("*.json"))
    assert len(entries) == 2
    assert not list((cache / "model_specs").glob(".tmp-*"))  # atomic write left no temp file


def test_changed_config_invalidates_cache(tmp_path):
    pytest.importorskip("transformers")
    cfg = json.loads(TINY_META_A)
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    first = load_model_spec(str(d))
    # Same content, different formatting/key order: same canonical text, same entry.
    (d / "config.json").write_text(json.dumps(dict(reversed(list(cfg.items()))), indent=4))
    assert load_model_spec(str(d)) == first
    assert len(list(spec_cache_dir().glob("*.json"))) == 1
    cfg["num_hidden_layers"] = 6
    (d / "config.json").write_text(json.dumps(cfg))
    changed = load_model_spec(str(d))
    assert changed.num_layers == 6 and changed.params > first.params
    assert len(list(spec_cache_dir().glob("*.json"))) == 2


def test_corrupt_cache_entry_is_recounted(tmp_path):
    pytest.importorskip("transformers")
    d = tmp_path / "opt"
    d.mkdir()
    (d / "config.json").write_text(TINY_META_A)
    first = load_model_spec(str(d))
    (entry,) = spec_cache_dir().glob("*.json")
    entry.write_text("{not json")
    assert load_model_spec(str(d)) == first
    json.loads(entry.read_text())  # rewritten


def test_cache_name_follows_the_caller(tmp_path):
    pytest.importorskip("transformers")
    d = tmp_path / "my-model"
    d.mkdir()
    (d / "config.json").write_text(TINY_META_A)
    other = tmp_path / "first"
    other.mkdir()
    (other / "config.json").write_text(TINY_META_A)
    a = load_model_spec(str(other))
    b = load_model_spec(str(d))  # same config: cache hit, but named after this directory
    assert a.name == "first" and b.name == "my-model" and a.params == b.params


# ---------------------------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------------------------


def _one_line(exc: ZerokitError) -> str:
    msg = str(exc)
    assert "\n" not in msg and msg
    return msg


def test_missing_directory(tmp_path):
    with pytest.raises(ZerokitError) as e:
        load_model_spec(str(tmp_path / "nope"))
    msg = _one_line(e.value)
    assert "does not exist" in msg and "--params" in msg


def test_directory_without_config(tmp_path):
    with pytest.raises(ZerokitError) as e:
        load_model_spec(str(tmp_path))
    msg = _one_line(e.value)
    assert "has no config.json" in msg and str(tmp_path) in msg and "--params" in msg


def test_malformed_json(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", ')
    with pytest.raises(ZerokitError) as e:
        load_model_spec(str(tmp_path))
    assert "not valid JSON" in _one_line(e.value)


def test_config_without_model_type(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 64}')
    with pytest.raises(ZerokitError) as e:
        load_model_spec(str(tmp_path))
    assert "no model_type" in _one_line(e.value)


def test_unknown_model_type(tmp_path):
    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text('{"model_type": "zerokit-imaginary", "hidden_size": 64}')
    with pytest.raises(ZerokitError) as e:
        load_model_spec(str(tmp_path))
    msg = _one_line(e.value)
    assert "zerokit-imaginary" in msg and "unknown" in msg


def test_remote_code_config_needs_flag(tmp_path):
    pytest.importorskip("transformers")
    cfg = {"model_type": "my_custom", "auto_map": {"AutoConfig": "configuration_x.XConfig"}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ZerokitError) as e:
        load_model_spec(str(tmp_path))
    assert "trust_remote_code" in _one_line(e.value)


def test_hub_errors_are_wrapped(monkeypatch):
    pytest.importorskip("huggingface_hub")
    import huggingface_hub
    from huggingface_hub import errors as hf_errors

    def offline(**kw):
        raise hf_errors.LocalEntryNotFoundError("no connection and not in cache")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(ZerokitError) as e:
        load_model_spec("some-org/some-model")
    assert "cannot reach the HuggingFace hub" in _one_line(e.value)

    def boom(**kw):
        raise ConnectionError("name resolution failed")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", boom)
    with pytest.raises(ZerokitError) as e:
        load_model_spec("some-org/some-model")
    assert "name resolution failed" in _one_line(e.value)  # the reason, without the exception's class name


def test_hub_id_uses_fetched_config_and_caches(monkeypatch, tmp_path):
    pytest.importorskip("transformers")
    import huggingface_hub

    snap = tmp_path / "snapshot"
    snap.mkdir()
    (snap / "config.json").write_text((REPO / "zerokit/data/models/tiny-gpt2/config.json").read_text())
    calls = []

    def fake_download(repo_id, filename, **kw):
        calls.append((repo_id, filename))
        return str(snap / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    spec = load_model_spec("someone/tiny-gpt2-copy")
    assert spec.name == "someone/tiny-gpt2-copy" and spec.params == load_model_spec("tiny-gpt2").params
    assert calls == [("someone/tiny-gpt2-copy", "config.json")]


def _hf_cache_with(tmp_path, repo: str, config_text: str) -> Path:
    """An HF_HOME whose hub cache holds repo's config.json, in huggingface_hub's layout (refs/main -> snapshot)."""
    home = tmp_path / "hf"
    folder = home / "hub" / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0123456789abcdef0123456789abcdef01234567")
    snap = folder / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(config_text)
    return home


@pytest.mark.parametrize("offline", [True, False], ids=["HF_HUB_OFFLINE", "no-network"])
def test_hub_config_cached_locally_plans_offline(tmp_path, offline):
    """A hub id fetched once (HF's cache holds its config.json) plans without the network, flag or not."""
    pytest.importorskip("huggingface_hub")
    home = _hf_cache_with(tmp_path, "someone/cached-gpt2", (REPO / "zerokit/data/models/tiny-gpt2/config.json").read_text())
    env = {"HF_HOME": str(home), "ZEROKIT_CACHE_DIR": str(tmp_path / "zk")}
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    r = _run_py("""
        import json
        from zerokit.spec.model import load_model_spec
        print(json.dumps(load_model_spec("someone/cached-gpt2").params))
    """, env)
    assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]
    assert json.loads(r.stdout) == load_model_spec("tiny-gpt2").params


def test_hub_id_without_network_fails_at_once(tmp_path):
    """Not cached, no network (this machine reaches no hub): one short request, one line, none of the client's
    retry lines (its own download retries 5 times: 23 s measured before). The bound is loose: the point is no
    retries."""
    pytest.importorskip("huggingface_hub")
    import time

    env = {"HF_HOME": str(tmp_path / "hf"), "ZEROKIT_CACHE_DIR": str(tmp_path / "zk"), "PYTHONPATH": str(REPO)}
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "zerokit", "plan", "someone/not-cached-model", "--gpu", "a100-80gb"],
                       capture_output=True, text=True, env={**os.environ, **env}, timeout=120)
    seconds = time.perf_counter() - t
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "hub" in lines[0] and "Retry" not in r.stderr, r.stderr
    assert seconds < 10, seconds


def test_empty_model_name():
    with pytest.raises(ZerokitError):
        load_model_spec("  ")


# ---------------------------------------------------------------------------------------------
# spec_from_params
# ---------------------------------------------------------------------------------------------


def test_spec_from_params_is_pure_python():
    r = _run_py(
        """
        import sys, json
        from zerokit.spec.model import spec_from_params
        s = spec_from_params(7e9)
        print(json.dumps({"torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules, "h": s.hidden_size}))
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert not out["torch"] and not out["transformers"] and out["h"] == 4096


def _approx_total(s: ModelSpec) -> int:
    attn = 2 * s.hidden_size * s.num_attention_heads * s.head_dim + 2 * s.hidden_size * s.num_kv_heads * s.head_dim
    return s.num_layers * (attn + 3 * s.hidden_size * s.intermediate_size) + s.embedding_params


@pytest.mark.parametrize(
    "params,h,layers",
    [(7e9, 4096, range(30, 36)), (13e9, 5120, range(38, 43)), (70e9, 8192, range(78, 84))],
)
def test_spec_from_params_plausible_llama_shapes(params, h, layers):
    s = spec_from_params(params)
    assert s.params == int(params) and not s.exact and s.model_type == "params"
    assert s.hidden_size == h and s.num_layers in layers
    assert s.head_dim == 128 and s.num_attention_heads * s.head_dim == s.hidden_size
    assert s.gated_mlp and s.norm == "rmsnorm" and not s.tied_embeddings and s.vocab_size == 32000
    assert abs(_approx_total(s) - params) / params < 0.03
    assert s.largest_layer_params == max(s.vocab_size * s.hidden_size, s.hidden_size * s.intermediate_size)
    assert s.embedding_params == 2 * s.vocab_size * s.hidden_size
    if params >= 70e9:
        assert s.num_kv_heads == 8  # GQA, as Llama-2-70B


def test_spec_from_params_overrides():
    s = spec_from_params(7e9, hidden_size=4096, num_layers=32, vocab_size=128256, seq_len=8192)
    assert (s.hidden_size, s.num_layers, s.vocab_size) == (4096, 32, 128256)
    assert s.largest_layer_params == 128256 * 4096
    only_h = spec_from_params(7e9, hidden_size=3584)
    assert only_h.hidden_size == 3584 and abs(_approx_total(only_h) - 7e9) / 7e9 < 0.05
    only_l = spec_from_params(7e9, num_layers=32)
    assert only_l.num_layers == 32 and only_l.hidden_size % 128 == 0 and 3584 <= only_l.hidden_size <= 4608


def test_spec_from_params_takes_the_heads_it_is_given():
    """--num-attention-heads / --num-kv-heads on a bare count: head_dim is h / heads; the key/value heads default to the
    heads (LlamaConfig's num_key_value_heads default), so BigScience's tr3m 1.3B (NHEADS=16, multi-head) is 16 x 128,
    not the anchor's grouped 32 x 64 at h 2048. Eager attention's scores per token are per
    head: half the guessed shape's."""
    from zerokit.estimate.gpu_time import elementwise_bytes_per_token

    guessed = spec_from_params(1.316e9, hidden_size=2048, num_layers=24, vocab_size=50304)
    stated = spec_from_params(1.316e9, hidden_size=2048, num_layers=24, vocab_size=50304, num_attention_heads=16)
    assert (guessed.num_attention_heads, guessed.head_dim) == (32, 64) and guessed.num_kv_heads < 32
    assert (stated.num_attention_heads, stated.num_kv_heads, stated.head_dim) == (16, 16, 128)
    gqa = spec_from_params(7e9, hidden_size=3584, num_attention_heads=28, num_kv_heads=4)  # Qwen2-7B's heads
    assert (gqa.num_attention_heads, gqa.num_kv_heads, gqa.head_dim) == (28, 4, 128)
    eager = [elementwise_bytes_per_token(s, 2048, "bf16", "eager") - elementwise_bytes_per_token(s, 0, "bf16", "eager")
             for s in (guessed, stated)]
    assert eager[1] == eager[0] / 2


@pytest.mark.parametrize("params, h, layers, vocab, tied", [
    (3_212_749_824, 3072, 28, 128256, True),    # Llama-3.2-3B (tie_word_embeddings true; its model card's count)
    (6_738_415_616, 4096, 32, 32000, False),    # Llama-2-7B (lm_head apart)
    (1_557_611_200, 1600, 48, 50257, True),     # GPT-2 XL (lm_head is wte)
    (2_352e7, 14400, 8, 250880, True),          # BigScience's 20B probe: 8 x (12 h^2 + 13 h) + V h
])
def test_spec_from_params_reads_a_tied_head_from_the_count(params, h, layers, vocab, tied):
    """A count with its shape that leaves one vocabulary matrix beside the layers is a tied model: its LM head runs
    the matmul (timing.matmul_params keeps it) and an AutoTP shard still holds matmuls (at TP 8 the 20B probe's shard
    once held none: the untied guess put 2 V h in a count that holds V h)."""
    from zerokit.estimate.timing import matmul_params

    s = spec_from_params(params, hidden_size=h, num_layers=layers, vocab_size=vocab)
    assert s.tied_embeddings is tied and s.embedding_params == (1 if tied else 2) * vocab * h
    assert matmul_params(s) == s.params - (0 if tied else vocab * h)
    shard = s.tensor_parallel_shard(8)
    assert 0 < matmul_params(shard) < matmul_params(s)


@pytest.mark.parametrize("params", [5e6, 1.2e8, 1.1e9, 3e9, 400e9, 1e12])  # 1e6: below the smallest (bad input)
def test_spec_from_params_scales_monotonically_and_sanely(params):
    s = spec_from_params(params)
    assert s.num_layers >= 1 and s.hidden_size >= 64 and s.intermediate_size > s.hidden_size
    assert s.hidden_size % s.num_attention_heads == 0 and s.num_attention_heads % s.num_kv_heads == 0


def test_spec_from_params_bad_values():
    for bad in (0, -5, "seven"):
        with pytest.raises(ZerokitError):
            spec_from_params(bad)
    with pytest.raises(ZerokitError):
        spec_from_params(7e9, hidden_size=0)
