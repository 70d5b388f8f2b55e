"""The ZeroSetup and ZeroKnobs a ds_config implies, for the memory model: its stage, offload devices, precision,
batch, ZeRO knobs and the optimizer it trains with (setup_from_config, optimizer_of).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace

from zerokit.config.auto import AUTO, auto_keys, fill_auto
from zerokit.config.keys import ZERO_FIELD_TO_ALIAS
from zerokit.config.lint import batch_findings
from zerokit.config.read import (batch_world_size, checked_block, checked_config, checked_world_size, derive_batch,
                                 grad_accum_dtype_of, is_int, precision_of)
from zerokit.core.errors import ZerokitError
from zerokit.spec.optimizer import ADAMW, ADAMW_TORCH, deepspeed_optimizer
from zerokit.spec.optimizer import client_optimizer as client_optimizer_named
from zerokit.spec.setup import PRECISIONS, ZeroKnobs, ZeroSetup


def _offload_device(zero: Mapping, block: str, deprecated_flag: str) -> str:
    node = zero.get(block)
    if isinstance(node, Mapping):
        device = node.get("device", "none") or "none"
        if device not in ("none", "cpu", "nvme"):  # DeepSpeed's OffloadDeviceEnum
            raise ZerokitError(f"zero_optimization.{block}.device is {json.dumps(device)[:40]}: DeepSpeed offloads to "
                               "\"none\", \"cpu\" or \"nvme\"")
        return device
    return "cpu" if zero.get(deprecated_flag) is True else "none"


def setup_from_config(config: dict, world_size: int, auto_values=None, hidden_size: int | None = None,
                      client_optimizer: str = "adamw_torch") -> tuple[ZeroSetup, ZeroKnobs]:
    """The ZeroSetup and ZeroKnobs a ds_config implies, with DeepSpeed's defaults for missing keys; the optimizer
    of a config without one is client_optimizer (its HF Trainer --optim name, spec/optimizer.py CLIENT_OPTIMIZERS;
    zerokit's own loop: torch.optim.AdamW).

    "auto" values are first filled as the HF Trainer would (fill_auto with auto_values and hidden_size).
    Missing batch keys are derived as DeepSpeed derives them. overlap_comm defaults to True at stage 3 only
    (DeepSpeedZeroConfig.overlap_comm_valid); the other knobs to DeepSpeedZeroConfig's defaults.
    """
    checked_world_size(world_size)
    if auto_keys(config):
        config = fill_auto(config, auto_values, world_size, hidden_size)
    for f in batch_findings(config, world_size):
        raise ZerokitError(f"{f.key}: {f.message}")
    _, micro, accum = derive_batch(config.get("train_batch_size"), config.get("train_micro_batch_size_per_gpu"),
                                    config.get("gradient_accumulation_steps"), batch_world_size(config, world_size))

    zero = config.get("zero_optimization", {})
    if isinstance(zero, bool):  # DeepSpeed's deprecated boolean form: true = stage 1
        zero = {"stage": 1 if zero else 0}
    else:
        zero = checked_block(config, "zero_optimization")
    zero = {ZERO_FIELD_TO_ALIAS.get(k, k): v for k, v in zero.items()}
    stage = zero.get("stage", 0)
    if stage == AUTO:
        stage = 0  # DeepSpeed drops "auto" and uses its default
    if not is_int(stage) or stage not in (0, 1, 2, 3):  # DeepSpeed's ZeroStageEnum
        raise ZerokitError(f"zero_optimization.stage is {json.dumps(stage)[:40]}: DeepSpeed's stages are 0, 1, 2 and 3")
    setup = ZeroSetup(
        zero_stage=int(stage),
        offload_optimizer=_offload_device(zero, "offload_optimizer", "cpu_offload"),
        offload_param=_offload_device(zero, "offload_param", "cpu_offload_param"),
        precision=precision_of(config),
        micro_batch_size=int(micro),
        gradient_accumulation_steps=int(accum),
        activation_checkpointing="activation_checkpointing" in config,
        # DeepSpeed's activation_checkpointing.cpu_checkpointing: the checkpoints in host memory (render writes it for
        # --activation-checkpointing offload)
        checkpoint_offload=(isinstance(config.get("activation_checkpointing"), dict)
                            and config["activation_checkpointing"].get("cpu_checkpointing") is True),
    )
    offload = zero.get("offload_optimizer")
    if setup.offload_optimizer == "cpu" and isinstance(offload, dict) and offload.get("super_offload") is True \
            and setup.zero_stage == 3:  # SuperOffloadOptimizer_Stage3 (runtime/engine.py, stage 3 only)
        setup = replace(setup, offload_engine="superoffload")
    elif setup.offload_optimizer == "cpu" and isinstance(zero.get("zenflow"), dict):  # configure_zenflow
        setup = replace(setup, offload_engine="zenflow")
    block = config.get("compile")
    if isinstance(block, dict) and block.get("deepcompile") is True:  # engine.compile() builds DeepCompile's passes
        # at stage 0 DeepSpeed falls back to torch.compile (engine.get_deepcompile_backend)
        setup = replace(setup, compile="deepcompile" if setup.zero_stage > 0 else "torch")
    sp_comm = config.get("seq_parallel_communication_data_type")  # the engine's dtype under Ulysses (engine.py)
    if isinstance(sp_comm, str) and sp_comm.lower() in PRECISIONS:  # get_communication_data_type's
        setup = replace(setup, seq_parallel_communication_data_type=sp_comm.lower())
    knobs = ZeroKnobs.from_zero_config(zero)
    if zero.get("overlap_comm") in (None, AUTO):
        knobs = ZeroKnobs(**{**knobs.to_dict(), "overlap_comm": setup.zero_stage == 3})
    return setup, replace(knobs, optimizer=optimizer_of(config, client_optimizer),
                          grad_accum_dtype=grad_accum_dtype_of(config))


# What a config without an optimizer block trains with is the script's choice (DeepSpeed wraps it:
# engine._configure_optimizer with a client optimizer), named as the HF Trainer's --optim names it
# (spec/optimizer.py CLIENT_OPTIMIZERS); the declaration says how the memory model prices it (ZeroKnobs.optimizer).


def optimizer_of(config: dict, client_optimizer: str = "adamw_torch") -> str:
    """ZeroKnobs.optimizer (a spec/optimizer.py name) for a ds_config: without an optimizer block, the script's own
    (client_optimizer, its HF Trainer --optim name); with params.torch_adam true, torch.optim.AdamW unfused
    (engine._configure_basic_optimizer builds it); else the declaration of the block's "type" (DeepSpeed lowers it,
    runtime/config.py get_optimizer_name), a type zerokit has none of priced as DeepSpeed's AdamW."""
    opt = checked_config(config).get("optimizer")
    if not isinstance(opt, dict):
        return client_optimizer_named(client_optimizer).name
    params = opt.get("params") if isinstance(opt.get("params"), dict) else {}
    if params.get("torch_adam") is True:
        return ADAMW_TORCH.name
    return (deepspeed_optimizer(opt.get("type")) or ADAMW).name


def trainer_default_optimizer(torch_version: str) -> str:
    """The HF Trainer's default --optim for a torch version (transformers/training_args.py: adamw_torch_fused
    when is_torch_greater_or_equal_than_2_8, else adamw_torch); adamw_torch when the version is unknown."""
    import re

    m = re.match(r"(\d+)\.(\d+)", torch_version or "")
    return "adamw_torch_fused" if m and (int(m[1]), int(m[2])) >= (2, 8) else "adamw_torch"
