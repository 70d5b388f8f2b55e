"""Mixture-of-experts models in every fine-tuning mode (issue 29): full, --freeze, LoRA (peft's target_modules, and
target_parameters for transformers 5's fused 3-D experts, which peft wraps in its ParamWrapper), QLoRA.

Oracles: peft's own get_nb_trainable_parameters() on a second meta-device build of the same model (what peft itself
builds from the config zerokit hands it); transformers' replace_with_bnb_linear (integrations/bitsandbytes.py) for
which weights QLoRA quantizes (fused experts are not nn.Linear: they stay in the compute dtype); autograd's
saved-tensor hooks on a real CPU forward for the merged expert weights a ParamWrapper keeps."""

from __future__ import annotations

import contextlib
import io
import warnings

import pytest

from zerokit.core.errors import ZerokitError
from zerokit.spec.finetune import Finetune, lora_config, measure_split

_SMALL = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=128, head_dim=16)
# the expert-count keys each config class reads (configuration_<type>.py); DeepSeek-V2/V3's MLA sizes scaled down
_MLA = dict(n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
            qk_nope_head_dim=8, v_head_dim=16)
MOE = {
    "mixtral": dict(num_local_experts=4),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, shared_expert_intermediate_size=48),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2, eos_token_id=None, pad_token_id=None),
    "deepseek_v3": dict(n_routed_experts=4, num_experts_per_tok=2, **_MLA),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2),
    "granitemoe": dict(num_local_experts=4, num_experts_per_tok=2),
    "glm4_moe": dict(n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1),
}
FINETUNES = {
    "lora-all-linear": Finetune("lora"),
    "lora-attention": Finetune("lora", lora_targets="q_proj,v_proj"),  # experts (and router) frozen
    "lora-fused-experts": Finetune("lora", lora_targets="gate_up_proj,down_proj"),  # peft target_parameters
    "qlora": Finetune("qlora"),
    "freeze": Finetune("full", freeze=("embed_tokens",)),
}


def _config(model_type: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type](**{**_SMALL, **MOE[model_type]})


def _meta_model(cfg):
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg)


@pytest.mark.parametrize("mode", list(FINETUNES))
@pytest.mark.parametrize("model_type", list(MOE))
def test_moe_counts_equal_peft(model_type, mode):
    """Every mode answers on every MoE family with peft's own count; the module layout (what the memory and time models
    read) is read without the AttributeError ParamWrapper's missing `.weight` raised."""
    from peft import get_peft_model

    finetune = FINETUNES[mode]
    cfg = _config(model_type)
    if model_type.startswith("deepseek") and mode == "lora-attention":  # MLA has q_a/q_b/kv_a/kv_b, no q_proj/v_proj
        with pytest.raises(ZerokitError, match="--lora-targets .*Linear modules are named"):
            measure_split(_meta_model(cfg), finetune)
        return
    split = measure_split(_meta_model(cfg), finetune)
    if finetune.uses_lora:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = _meta_model(cfg)
            peft_model = get_peft_model(model, lora_config(model, finetune), low_cpu_mem_usage=True)
        assert (split.trainable_params, split.total_params) == peft_model.get_nb_trainable_parameters()
    else:
        model = _meta_model(cfg)
        assert split.total_params == sum(p.numel() for p in model.parameters())
        assert split.trainable_params == sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    layout = split.layout
    assert layout is not None and 0 < layout["trainable_matmul_params"] <= layout["backward_matmul_params"]
    if mode == "lora-fused-experts":  # the experts' 3-D parameters, adapted by target_parameters
        assert layout["merged_params_per_layer"] > 0 and layout["lora_slots"][2:] == (1, 1)
    if mode in ("lora-attention", "freeze"):
        assert layout["merged_params_per_layer"] == 0


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss"])
def test_qlora_quantizes_what_transformers_quantizes(model_type):
    """QLoRA's 4-bit weights are the nn.Linear weights transformers' replace_with_bnb_linear swaps for Linear4bit; the
    fused experts (3-D parameters) and the routers are not nn.Linear and stay in the compute dtype."""
    import bitsandbytes as bnb
    from transformers import BitsAndBytesConfig
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear
    from transformers.quantizers.base import get_keys_to_not_convert

    cfg = _config(model_type)
    split = measure_split(_meta_model(cfg), Finetune("qlora"))
    model = _meta_model(cfg)
    skip = list(set(get_keys_to_not_convert(model)) | set(getattr(model, "_keep_in_fp32_modules", None) or []))
    model = replace_with_bnb_linear(model, modules_to_not_convert=skip,
                                    quantization_config=BitsAndBytesConfig(load_in_4bit=True))
    expected = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, bnb.nn.Linear4bit))
    assert split.layout["quantized_params"] == expected > 0
    experts = sum(p.numel() for p in model.parameters() if p.dim() == 3)
    assert experts > 0  # held unquantized, in the training dtype


def test_lora_on_fused_experts_saves_the_merged_weights():
    """peft's ParamWrapper folds B A into a new copy of each adapted expert stack every forward (lora/layer.py
    _activate_lora: baddbmm), and the experts' matmuls save it for backward: a real bf16 forward keeps one copy per
    layer of each adapted stack, merged_params_per_layer elements in the training dtype."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, MixtralConfig

    torch.manual_seed(0)
    cfg = MixtralConfig(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=100, num_local_experts=8)
    finetune = Finetune("lora", lora_r=4)
    layout = measure_split(_meta_model(cfg), finetune).layout
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = get_peft_model(model, lora_config(model, finetune))
    params = {p.untyped_storage().data_ptr() for p in peft_model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.randint(0, 100, (1, 16))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        peft_model(input_ids=x, labels=x)
    stacks = [8 * 2 * 256 * 64 * 2, 8 * 64 * 256 * 2]  # gate_up_proj [E, 2i, h], down_proj [E, h, i] in bf16
    assert sorted(b for b in saved.values() if b in stacks) == sorted(stacks * cfg.num_hidden_layers)
    assert layout["merged_params_per_layer"] == 8 * 3 * 256 * 64 + 8 * 64  # the experts, and the router's weight


def _plan(argv: list[str]) -> tuple[int, str]:
    from zerokit.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = main(argv)
    return rc, out.getvalue()


@pytest.mark.parametrize("mode", ["full", "lora", "qlora"])
def test_plan_answers_a_small_moe_in_every_mode(tmp_path, mode):
    _config("qwen3_moe").save_pretrained(tmp_path)
    rc, out = _plan(["plan", str(tmp_path), "--gpu", "a100-80gb", "--finetune", mode])
    assert rc == 0 and "error:" not in out, out


def test_merged_experts_priced_in_memory(tmp_path):
    """The LoRA plan of an MoE whose experts peft adapts holds the merged stacks among the activations: more than
    the same plan with attention-only adapters, by about layers x merged elements x 2 bytes (bf16, no checkpointing)."""
    import json

    _config("mixtral").save_pretrained(tmp_path)
    base = ["plan", str(tmp_path), "--gpu", "a100-80gb", "--finetune", "lora", "--json", "--precision", "bf16",
            "--micro-batch", "1", "--activation-checkpointing", "off", "--stage", "2"]
    rc_all, all_linear = _plan(base)
    rc_attn, attention = _plan(base + ["--lora-targets", "q_proj,k_proj,v_proj,o_proj"])
    assert rc_all == rc_attn == 0, all_linear + attention

    def activations(text):
        plan = json.loads(text)
        return plan["memory"]["per_gpu"]["terms"]["activations"], plan["model"]["merged_params_per_layer"]

    (act_all, merged), (act_attn, none) = activations(all_linear), activations(attention)
    assert none == 0 and merged > 0
    assert act_all - act_attn >= 2 * 2 * merged  # 2 layers x merged x bf16


def test_bundled_moe_lora_plans_without_a_traceback():
    """The issue's commands: Mixtral-8x7B LoRA on 8 GPUs, and a Mixtral plan that does not fit, whose fine-tune
    suggestions count LoRA and QLoRA (planning/planner.py finetune_suggestions)."""
    rc, out = _plan(["plan", "mixtral-8x7b", "--finetune", "lora", "--gpus-per-node", "8"])
    assert rc in (0, 1) and "error:" not in out, out
    rc, out = _plan(["plan", "mixtral-8x7b", "--gpu", "h100-80gb", "--gpus-per-node", "8", "--stage", "3",
                     "--offload-optimizer", "none", "--offload-param", "none", "--seq-len", "4096"])
    assert rc in (0, 1) and "error:" not in out, out
