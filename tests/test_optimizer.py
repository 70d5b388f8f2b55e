"""The optimizer declarations (spec/optimizer.py) and every layer that looks them up: the memory model prices each
declaration's state bytes per trainable parameter and its step temporaries, render writes a DeepSpeed type DeepSpeed's
own config parsing accepts, and `zerokit check` reads the optimizer block's type or --client-optimizer."""

from __future__ import annotations

import inspect
import json

import pytest

from zerokit.estimate.memory import estimate_memory
from zerokit.spec.hardware import build_cluster
from zerokit.spec.optimizer import ADAMW, CLIENT_OPTIMIZERS, LION, OPTIMIZERS, deepspeed_optimizer, optimizer_named
from zerokit.spec.setup import Workload, ZeroKnobs, ZeroSetup
from specs import LLAMA3_8B

H100_8 = build_cluster(gpu="h100", gpus_per_node=8)


def test_every_declaration_is_complete_and_selectable():
    """One name each, a source, a DeepSpeed type or a client name; the client names are `check --client-optimizer`'s
    choices (core/options.py cannot import spec/, so the two lists are held equal here)."""
    from zerokit.core.options import option

    for name, opt in OPTIMIZERS.items():
        assert opt.name == name and opt.source and opt.label
        assert (opt.ds_type is None) != (opt.client is None)  # DeepSpeed builds it, or the script brings it
        assert opt.ds_type is None or "lr" in opt.ds_params
        assert opt.on_cpu is None or opt.on_cpu in OPTIMIZERS
    assert set(option("client-optimizer").choices) == set(CLIENT_OPTIMIZERS)
    assert deepspeed_optimizer("adam") is ADAMW and deepspeed_optimizer("LION") is LION
    assert deepspeed_optimizer("OneBitAdam") is None
    with pytest.raises(Exception, match="unknown optimizer"):
        optimizer_named("sgd")


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_state_bytes_in_the_breakdown_are_the_declared_bytes_per_trainable_parameter(name, precision):
    """ZeRO-1 over 8 ranks: optimizer_states = state_bytes x trainable / 8, the full model and a LoRA-sized trainable
    count alike (the optimizer keeps state for trainable parameters only); offloaded, the host holds master weights,
    states and (mixed precision) fp32 gradients per node; only an unfused step makes temporaries."""
    opt = OPTIMIZERS[name]
    knobs = ZeroKnobs(optimizer=name)
    work = Workload(seq_len=1024)
    for model in (LLAMA3_8B, LLAMA3_8B.with_trained(trainable_params=20_000_000, finetune_mode="lora")):
        est = estimate_memory(model, H100_8, ZeroSetup(zero_stage=1, precision=precision), work, knobs)
        step = est.phase_terms["step"]
        assert step["optimizer_states"] == opt.state_bytes * model.trainable // 8
        temporaries = step.get("optimizer_step_temporaries", 0)
        assert temporaries == opt.step_temporaries * (model.trainable // 8)
        if opt.cpu_offload:
            off = estimate_memory(model, H100_8, ZeroSetup(zero_stage=2, precision=precision, offload_optimizer="cpu"),
                                  work, knobs)
            fp32_grads = 4 if precision != "fp32" else 0
            assert off.per_node_cpu.get("optimizer_states_offloaded", 0) in (
                0, (4 + opt.state_bytes + fp32_grads) * model.trainable)  # 0: the loading phase is the larger
            assert "optimizer_states" not in off.phase_terms["step"] or off.phase_terms["step"]["optimizer_states"] == 0
    # Adam's 8 bytes are what the memory model priced before declarations existed (DeepSpeed's estimator's 12 - 4)
    assert OPTIMIZERS["adamw"].state_bytes == 8 and LION.state_bytes == 4 and OPTIMIZERS["adamw_bnb_8bit"].state_bytes == 2


@pytest.mark.parametrize("profile", ["deepspeed", "hf"])
def test_render_writes_lion_and_deepspeed_parses_it(profile):
    """A Lion plan renders "type": "Lion" with the keywords FusedLion and DeepSpeedCPULion take (no eps), and
    DeepSpeed's DeepSpeedConfig accepts the config (after the HF Trainer's auto fill for the hf profile)."""
    pytest.importorskip("deepspeed")
    from zerokit.config.auto import fill_auto
    from zerokit.config.render import render_ds_config
    from zerokit.config.validate import validate_with_deepspeed
    from zerokit.spec.model import load_model_spec

    cluster = build_cluster(gpu="a100-80gb", gpus_per_node=2)
    for offload in ("none", "cpu"):
        setup = ZeroSetup(zero_stage=2, precision="bf16", micro_batch_size=2, offload_optimizer=offload)
        cfg = render_ds_config(setup, cluster, load_model_spec("tiny-llama"), profile=profile,
                               knobs=ZeroKnobs(optimizer="lion"))
        assert cfg["optimizer"]["type"] == "Lion" and "eps" not in cfg["optimizer"]["params"]
        assert "torch_adam" not in cfg["optimizer"]["params"]
        validate_with_deepspeed(fill_auto(cfg, setup, 2, 128) if profile == "hf" else cfg, 2)
    from deepspeed.ops.lion.cpu_lion import DeepSpeedCPULion
    from deepspeed.ops.lion.fused_lion import FusedLion

    for cls in (FusedLion, DeepSpeedCPULion):
        assert set(LION.ds_params) <= set(inspect.signature(cls.__init__).parameters)
    with pytest.raises(Exception, match="script's own optimizer"):
        render_ds_config(setup, cluster, None, knobs=ZeroKnobs(optimizer="adamw_bnb_8bit"))


def _check(capsys, cfg: dict, tmp_path, *extra) -> tuple[int, dict]:
    from zerokit.cli import main as cli_main

    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    code = cli_main(["check", str(path), "--model", "llama-3-8b", "--gpu", "h100", "--gpus-per-node", "8",
                     "--seq-len", "1024", "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


BASE = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2}}


def test_check_reads_a_lion_block_and_deepspeed_accepts_it(capsys, tmp_path):
    """`check` prices the config's optimizer.type: Lion's one fp32 momentum is half of AdamW's two."""
    pytest.importorskip("deepspeed")
    psi = LLAMA3_8B.params
    states = {}
    for ds_type in ("AdamW", "Lion", "lion"):
        cfg = {**BASE, "optimizer": {"type": ds_type, "params": {"lr": 1e-4, "betas": [0.9, 0.99], "weight_decay": 0.1}}}
        code, out = _check(capsys, cfg, tmp_path)
        assert code == 0 and not [f for f in out["findings"] if f["level"] == "error"], out["findings"]
        states[ds_type] = out["evaluation"]["memory"]["phase_terms"]["step"]["optimizer_states"]
    assert states["Lion"] == states["lion"] == 4 * psi // 8 and states["AdamW"] == 8 * psi // 8


def test_check_prices_an_8bit_adam_client_optimizer(capsys, tmp_path):
    """A config without an optimizer block under the HF Trainer's --optim adamw_bnb_8bit: two uint8 states, 2 bytes
    per trainable parameter, updated in place (no temporaries); said in the assumptions."""
    code, out = _check(capsys, BASE, tmp_path, "--client-optimizer", "adamw_bnb_8bit")
    assert code == 0
    step = out["evaluation"]["memory"]["phase_terms"]["step"]
    assert step["optimizer_states"] == 2 * LLAMA3_8B.params // 8 and "optimizer_step_temporaries" not in step
    assumed = {a["key"]: a for a in out["assumed"]}
    assert assumed["optimizer"]["value"] == "adamw_bnb_8bit"
