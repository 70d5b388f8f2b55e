"""Lint a ds_config: what DeepSpeed accepts silently but gets wrong (unknown top-level keys are ignored, NVMe
optimizer offload below stage 3 quietly becomes CPU offload, ...) and what fails only at run time, as Findings.

Reads DeepSpeed's key sets as data (config/keys.py deepspeed_keys): importing no DeepSpeed for the pinned version.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from zerokit.config.auto import AUTO, TRAINER_FILLED_KEYS, auto_keys
from zerokit.config.keys import FP16_ONLY_KEYS, ZERO_DEPRECATED, DeepSpeedKeys, deepspeed_keys, did_you_mean
from zerokit.config.read import (
    BF16_OLD_NAME,
    batch_fix,
    batch_world_size,
    bf16_block,
    checked_config,
    checked_world_size,
    derive_batch,
    grad_accum_dtype_of,
    is_int,
    lookup,
    parallelism_from_config,
    precision_of,
    with_bf16_name,
)
from zerokit.spec.optimizer import OPTIMIZERS

# Optimizers DeepSpeed has a CPU implementation of, used when the optimizer is offloaded
# (engine._configure_basic_optimizer: DeepSpeedCPUAdam, DeepSpeedCPUAdagrad, DeepSpeedCPULion): the declared ones
# (spec/optimizer.py cpu_offload), DeepSpeed's Adam (the same DeepSpeedCPUAdam) and Adagrad (not declared)
CPU_OFFLOAD_OPTIMIZERS = frozenset({"adam", "adagrad"} | {o.ds_type.lower() for o in OPTIMIZERS.values() if o.cpu_offload})

# DeepSpeed's ZeRO++ quantized collectives: both build its CUDA quantizer (zero/partition_parameters.py CUDAQuantizer,
# runtime/comm/coalesced_collectives.py all_to_all_quant_reduce: QuantizerBuilder().load()), which a machine without
# CUDA does not have ("This op had not been implemented on CPU backend", op_builder/cpu/no_impl.py)
QUANTIZED_COLLECTIVE_KEYS = {"zero_quantized_weights": "qwZ", "zero_quantized_nontrainable_weights": "qwZ",
                             "zero_quantized_gradients": "qgZ"}


# The JSON types DeepSpeed can read at each top-level key: any other raises AttributeError/TypeError/ValueError inside
# DeepSpeedConfig (probed on DeepSpeed 0.19.8: every key it reads, given a list, a string, null, a float, a bool, an
# object and an integer; e.g. `param_dict["optimizer"].get(...)` in runtime/config.py get_optimizer_name). "null"
# is listed where DeepSpeed takes it as absent. Keys whose every type DeepSpeed survives are not listed.
_OBJECT, _OBJECT_OR_NULL = ("object",), ("object", "null")
_COUNT = ("integer", "null")  # "auto" on these is the HF Trainer's (fill_auto) and checked there
BLOCK_TYPES = {
    **{k: _OBJECT for k in ("activation_checkpointing", "autotuning", "checkpoint", "comet", "comms_logger", "compile",
                            "csv_monitor", "data_efficiency", "data_types", "flops_profiler", "fp16", "bfloat16",
                            "hybrid_engine", "optimizer", "pipeline", "scheduler", "tensor_parallel", "tensorboard",
                            "timers", "torch_autocast", "wandb", "weight_quantization")},
    **{k: _OBJECT_OR_NULL for k in ("aio", "bf16", "expert_parallel")},
    "zero_optimization": ("object", "boolean"),  # a bool is DeepSpeed's legacy stage 0/1 switch
    "communication_data_type": ("string", "null"),
    "seq_parallel_communication_data_type": ("string", "null"),
    "train_batch_size": _COUNT, "train_micro_batch_size_per_gpu": _COUNT, "gradient_accumulation_steps": _COUNT,
    "sequence_parallel_size": ("integer",), "vocabulary_size": ("integer", "null"),
    "wall_clock_breakdown": ("boolean", "integer"),
}


@dataclass(frozen=True)
class Finding:
    level: str  # "error" | "warning"
    key: str  # dotted path in the config, e.g. "zero_optimization.offload_param"
    message: str

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.level}: {self.key}: {self.message}"


def json_type(value) -> str:
    """The JSON type name of a parsed value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    return "object" if isinstance(value, Mapping) else type(value).__name__


def _type_findings(config: Mapping) -> list:
    """A Finding for each top-level block whose JSON type DeepSpeed cannot read (BLOCK_TYPES)."""
    out = []
    for key, allowed in BLOCK_TYPES.items():
        if key not in config:
            continue
        value = config[key]
        kind = json_type(value)
        if "integer" in allowed and (value == AUTO or kind == "number"):
            continue  # "auto": the HF Trainer fills it; 2.0: the batch rule (batch_findings) says what a count is
        if kind not in allowed:
            shown = f" {json.dumps(value)[:40]}" if kind not in ("null", "object") else ""
            want = "an object {...}" if allowed[0] == "object" else ("an " if allowed[0][0] in "aeiou" else "a ") + allowed[0]
            out.append(Finding("error", key, f"is {kind}{shown}, DeepSpeed reads {' or '.join(allowed)} here: "
                                             f"write {want}"))
    return out


def batch_findings(config: Mapping, world_size: int) -> list[Finding]:
    world_size = batch_world_size(config, world_size)
    keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    raw = {k: config.get(k) for k in keys}
    out = [Finding("error", k, f"must be a positive integer, got {json.dumps(v)}")
           for k, v in raw.items() if v not in (None, AUTO) and (not is_int(v) or v < 1)]
    if out or AUTO in raw.values():
        return out
    derived = derive_batch(*raw.values(), world_size)
    if derived is None:
        return [Finding("error", "train_batch_size",
                        "neither train_batch_size nor train_micro_batch_size_per_gpu is set: DeepSpeed needs one")]
    tb, micro, accum = derived
    if micro >= 1 and accum >= 1 and tb == micro * accum * world_size:
        return []
    if raw["train_micro_batch_size_per_gpu"] is not None:
        fix = batch_fix(config, world_size)
    else:
        fix = f"use a train_batch_size that is a multiple of {world_size * (raw['gradient_accumulation_steps'] or 1)}"
    return [Finding("error", "train_batch_size",
                    f"{tb} != micro batch {micro} x accumulation {accum} x {world_size} ranks: {fix}")]


def _top_level_findings(config: Mapping, schema: DeepSpeedKeys) -> list[Finding]:
    """lint_config's top-level keys DeepSpeed does not read: removed, misplaced or unknown."""
    zero_keys = set(schema.zero)
    out: list[Finding] = []
    # top level: DeepSpeed ignores keys it does not read
    for key in config:
        if key in schema.top:
            continue
        if key in schema.removed:
            out.append(Finding("error", key, " ".join(schema.removed[key].split())))
        elif key in ("offload_optimizer", "offload_param"):
            out.append(Finding("error", key, "offload settings belong inside zero_optimization: move the block there"))
        elif key in zero_keys:
            out.append(Finding("error", key, "a ZeRO setting at the top level is ignored: move it into zero_optimization"))
        else:
            # A near miss is a typo (error) only where DeepSpeed could read its value under the key it resembles:
            # "_comment" (JSON's comment convention; LLaMA-Factory's ds_z2_autotp_config.json) and LLaMA-Factory's
            # own "sequence_parallel" block (an object; DeepSpeed's sequence_parallel_size is an integer) are other
            # tools' keys, which DeepSpeed ignores: a warning.
            close = next(iter(difflib.get_close_matches(key, sorted(schema.top), n=1, cutoff=0.75)), None)
            kind = json_type(config[key])
            typo = bool(close) and not key.startswith("_") and (
                close not in BLOCK_TYPES or kind in BLOCK_TYPES[close]
                or ("integer" in BLOCK_TYPES[close] and config[key] == AUTO))
            fix = did_you_mean(key, schema.top) if typo else "remove it if it is not for your own script or tool"
            out.append(Finding("error" if typo else "warning", key, f"DeepSpeed ignores unknown top-level keys: {fix}"))
    return out


def _block_key_findings(config: Mapping, schema: DeepSpeedKeys) -> list[Finding]:
    """lint_config's removed, misplaced or unknown keys inside the blocks DeepSpeed reads."""
    out: list[Finding] = []
    # misplaced or unknown keys inside blocks DeepSpeed's pydantic models reject
    for block, (_, block_keys) in schema.blocks.items():
        node = lookup(config, block)
        if not isinstance(node, Mapping):
            continue
        for key in node:
            if key in block_keys:
                continue
            where = f"{block}.{key}"
            if where in schema.removed:
                out.append(Finding("error", where, " ".join(schema.removed[where].split()) + (
                    " For parameters sharded within a node, ZeRO++ hpZ does it: zero_hpz_partition_size = GPUs per "
                    "node; remove this key" if "MiCS" in schema.removed[where] else " Remove this key")))
            elif key == "aio" and block == "zero_optimization":
                out.append(Finding("error", where, "aio belongs at the top level of the config: move it there"))
            elif key in FP16_ONLY_KEYS and block in ("bf16", "bfloat16"):
                out.append(Finding("error", where, f"{key} is an fp16 setting; bf16 has no loss scaling: remove it"))
            else:
                hint = did_you_mean(key, block_keys)
                out.append(Finding("error", where, f"DeepSpeed rejects unknown key {key!r}: {hint or 'remove it'}"))
    return out


def _precision_findings(config: Mapping, accelerator) -> list[Finding]:
    """lint_config's fp16 / bf16 blocks: both enabled, the old bf16 name, a precision the accelerator lacks."""
    out: list[Finding] = []
    fp16_on = lookup(config, "fp16.enabled") is True
    bf16 = bf16_block(config)
    bf16_on = isinstance(bf16, Mapping) and bf16.get("enabled") is True
    if BF16_OLD_NAME in config:  # DeepSpeed reads it only where "bf16" is absent or null (get_bfloat16_config)
        ignored = config.get("bf16") is not None
        out.append(Finding("warning", BF16_OLD_NAME, "DeepSpeed ignores it beside the bf16 block: remove it" if ignored
                           else "the old name of the bf16 block, which DeepSpeed still reads: rename it bf16"))
    if fp16_on and bf16_on:
        out.append(Finding("error", "fp16.enabled", "fp16 and bf16 are both enabled: DeepSpeed allows one; disable one"))
    if accelerator is not None:
        for name, on in (("fp16", fp16_on), ("bf16", bf16_on)):
            if on and not accelerator.supports(name):
                usable = ", ".join(p for p in accelerator.precisions if p != name)
                out.append(Finding("error", f"{name}.enabled", f"{accelerator.name} does not support {name}: use {usable}"))
    return out


def _data_types_findings(config: Mapping, stage: int) -> list[Finding]:
    """data_types.grad_accum_dtype beside the model's dtype: without ZeRO the engine takes only the model's own
    (engine._do_optimizer_sanity_check raises NotImplementedError "unsupported mix of model_dtype and
    grad_accum_dtype"); with ZeRO any mix runs (ZeRO-1 bf16 with fp32 builds BF16_Optimizer, priced by
    estimate/memory.py grad_accum_terms). A pipeline changes nothing here: the check runs before the engine asks
    whether it pipelines, which only picks BF16_Optimizer for a bf16 model accumulating in bf16 (checked on a real
    PipelineEngine, tests/test_ds_check.py)."""
    accum = grad_accum_dtype_of(config)
    if accum is None or stage != 0:
        return []
    model = precision_of(config, auto="fp32")
    if accum == model:
        return []
    return [Finding("error", "data_types.grad_accum_dtype",
                    f"{accum} gradient accumulation on a {model} model without ZeRO: DeepSpeed raises "
                    "NotImplementedError (unsupported mix of model_dtype and grad_accum_dtype); use ZeRO stage 1 or "
                    "more, or remove data_types.grad_accum_dtype")]


def _optimizer_findings(config: Mapping, stage: int, opt_dev: str, accelerator) -> list[Finding]:
    """lint_config's optimizer block against the ZeRO optimizer offload (opt_dev) and the accelerator."""
    out: list[Finding] = []
    opt_type = lookup(config, "optimizer.type")
    opt_params = lookup(config, "optimizer.params", {})
    opt_params = opt_params if isinstance(opt_params, Mapping) else {}
    force_ds_cpu = config.get("zero_force_ds_cpu_optimizer", True)

    if opt_dev in ("cpu", "nvme") and stage >= 1:
        if opt_type is None:
            if force_ds_cpu is not False:
                # accelerate (under the HF Trainer too) swaps a torch optimizer for DeepSpeedCPUAdam itself
                # (map_pytorch_optim_to_deepspeed); a plain script's torch optimizer makes the engine raise.
                out.append(Finding(
                    "warning", "optimizer",
                    "optimizer offload with no optimizer block: fine under the HF Trainer/accelerate, but a plain "
                    "DeepSpeed script must pass DeepSpeedCPUAdam or DeepSpeed raises (zero_force_ds_cpu_optimizer); "
                    "add an optimizer block of type AdamW",
                ))
            else:
                # false switches off the engine's check (engine._configure_basic_optimizer) and accelerate's swap
                # (accelerator.py: only when the switch is true): the script's torch optimizer steps the CPU copy
                out.append(Finding(
                    "warning", "zero_force_ds_cpu_optimizer",
                    "false with optimizer offload and no optimizer block: DeepSpeed runs your script's torch "
                    "optimizer on the offloaded CPU states instead of DeepSpeedCPUAdam (same memory, a slower step); "
                    "add an optimizer block of type AdamW for DeepSpeedCPUAdam",
                ))
        elif str(opt_type).lower() not in CPU_OFFLOAD_OPTIMIZERS:
            out.append(Finding(
                "error", "optimizer.type",
                f"offload_optimizer runs the optimizer step on the CPU and DeepSpeed has CPU kernels only for "
                f"Adam, AdamW, Adagrad and Lion, not {opt_type}: use AdamW or drop the offload",
            ))
        elif str(opt_type).lower() in ("adam", "adamw") and opt_params.get("torch_adam") is True:
            out.append(Finding(
                "warning", "optimizer.params.torch_adam",
                "torch_adam replaces DeepSpeedCPUAdam with torch.optim.AdamW for the offloaded step (several times "
                "slower; ZeRO-3's offload fast path needs DeepSpeedCPUAdam): remove torch_adam",
            ))
    elif (accelerator is not None and accelerator.is_cpu and str(opt_type).lower() in ("adam", "adamw")
          and opt_params.get("torch_adam") is not True):
        out.append(Finding(
            "warning", "optimizer.params.torch_adam",
            "without offload DeepSpeed's Adam is FusedAdam, a JIT build of minutes on a CPU-only machine: "
            "set optimizer.params.torch_adam true",
        ))
    if "max_grad_norm" in opt_params:
        out.append(Finding("error", "optimizer.params.max_grad_norm",
                           "DeepSpeed raises on max_grad_norm as an optimizer parameter: use top-level gradient_clipping"))
    return out


def lint_config(config: dict, world_size: int, accelerator=None) -> list[Finding]:
    """Problems DeepSpeed lets through silently or reports only at run time; errors first.

    accelerator: a zerokit.spec.hardware.Accelerator, to check the precision against; None skips that rule.
    A block of a type DeepSpeed cannot read is reported alone: the other rules read the blocks as DeepSpeed would.
    """
    checked_world_size(world_size)
    type_errors = _type_findings(checked_config(config))
    if type_errors:
        return type_errors
    schema = deepspeed_keys()
    out: list[Finding] = []
    zero = config.get("zero_optimization")
    zero = zero if isinstance(zero, Mapping) else {}

    out.extend(_top_level_findings(config, schema))
    out.extend(_block_key_findings(config, schema))
    out.extend(batch_findings(config, world_size))
    out.extend(_precision_findings(config, accelerator))

    stage = zero.get("stage", 0)
    stage = stage if is_int(stage) else 0
    opt_dev = lookup(zero, "offload_optimizer.device", "none") or "none"
    param_dev = lookup(zero, "offload_param.device", "none") or "none"
    out.extend(_optimizer_findings(config, stage, opt_dev, accelerator))
    out.extend(_data_types_findings(config, stage))

    for old, new in ZERO_DEPRECATED.items():
        if old in zero:
            out.append(Finding("warning", f"zero_optimization.{old}",
                               f"deprecated: DeepSpeed reads it as {new} (and logs a warning): use {new}" if new else
                               "deprecated and ignored by DeepSpeed: set pin_memory in offload_optimizer/offload_param"))
    if stage == 3 and zero.get("stage3_gather_16bit_weights_on_model_save", zero.get(
            "gather_16bit_weights_on_model_save", zero.get("stage3_gather_fp16_weights_on_model_save"))) is not True:
        out.append(Finding(
            "warning", "zero_optimization.stage3_gather_16bit_weights_on_model_save",
            "ZeRO-3 keeps each weight partitioned: without this, save_pretrained/save_16bit_model write empty "
            "weights; set it true",
        ))
    if opt_dev == "nvme" and stage < 3:
        out.append(Finding(
            "warning", "zero_optimization.offload_optimizer.device",
            f"NVMe optimizer offload needs ZeRO-3: at stage {stage} DeepSpeed silently offloads to CPU memory "
            "instead; use stage 3 or device cpu",
        ))
    if param_dev != "none" and stage != 3:
        out.append(Finding("error", "zero_optimization.offload_param",
                           f"parameter offload needs ZeRO stage 3 (stage is {stage}): set stage 3 or remove offload_param"))
    for block, dev in (("offload_optimizer", opt_dev), ("offload_param", param_dev)):
        if dev == "nvme" and not lookup(zero, f"{block}.nvme_path"):
            out.append(Finding("error", f"zero_optimization.{block}.nvme_path",
                               "NVMe offload needs nvme_path, a folder on the NVMe drive: add it"))

    out.extend(_parallelism_findings(config, zero, stage, world_size, accelerator))
    # an "auto" in the old bfloat16 block acts as the Trainer's bf16.enabled: accelerate adds {"bf16": {"enabled":
    # true}} for --bf16 (DeepSpeedPlugin.set_mixed_precision), which DeepSpeed reads first; else DeepSpeed drops "auto"
    for key in auto_keys(with_bf16_name(config)):
        if key not in TRAINER_FILLED_KEYS:
            out.append(Finding("warning", key,
                               "\"auto\" here is not filled by the HF Trainer: DeepSpeed drops it and uses its default; "
                               "give a value"))
    return sorted(out, key=lambda f: f.level != "error")


def _parallelism_findings(config: Mapping, zero: Mapping, stage: int, world_size: int, accelerator) -> list[Finding]:
    """TP, SP and ZeRO++: what DeepSpeed refuses only once the ranks run, and what it silently ignores."""
    out: list[Finding] = []
    tp_key, sp_key, hpz_key = "tensor_parallel.autotp_size", "sequence_parallel_size", "zero_optimization.zero_hpz_partition_size"
    tp, sp = lookup(config, tp_key), config.get(sp_key)
    if is_int(sp) and sp < 1:  # DeepSpeedConfig divides the world by it
        out.append(Finding("error", sp_key, f"{sp} ranks: DeepSpeed divides the world size by it; use 1 (off) or "
                                            "the number of ranks that share a sequence"))
    if is_int(tp) and tp < 0:  # accepted (no bound in TPTrainingConfig), and off
        out.append(Finding("warning", tp_key, f"{tp}: DeepSpeed treats it as off (it acts above 1); use 0 or 1"))
    tp_size = lookup(config, "tensor_parallel.tp.tp_size", lookup(config, "tensor_parallel.tensor_parallel.tp_size"))
    if is_int(tp) and tp > 1 and is_int(tp_size) and tp_size not in (1, tp):  # engine._apply_autotp_partitioning
        out.append(Finding("error", "tensor_parallel.tp.tp_size", f"{tp_size} disagrees with autotp_size {tp}: "
                                                                  "DeepSpeed raises when the engine starts; remove it"))
    par = parallelism_from_config(config)
    for key, size, what in ((tp_key, par.tensor_parallel, "tensor-parallel (AutoTP: utils/groups.py "
                                                          "_init_tp_mesh_device)"),
                            (sp_key, par.sequence_parallel, "sequence-parallel (Ulysses: parallel_state_sp.py "
                                                            "initialize_sequence_parallel)")):
        if size > 1 and world_size % size:
            out.append(Finding("error", key, f"{size} does not divide the {world_size} ranks into {what} groups: use "
                                             f"a divisor of {world_size}"))
    if par.tensor_parallel > 1 and par.sequence_parallel > 1 and not world_size % par.tensor_parallel \
            and not world_size % par.sequence_parallel and world_size % par.model_parallel:
        out.append(Finding("error", sp_key, f"tensor x sequence parallel = {par.model_parallel} ranks per replica does "
                                            f"not divide the {world_size} ranks: lower one of them"))
    if par.sequence_parallel > 1:
        out.append(Finding("warning", sp_key, (
            f"this key alone only changes DeepSpeed's batch arithmetic (world / {par.sequence_parallel}): the sequence "
            "is split when the script registers UlyssesSPAttentionHF (deepspeed.runtime.sequence_parallel.ulysses_sp) "
            "and passes its mpu to deepspeed.initialize; zerokit prices the split sequence (each rank seq / "
            f"{par.sequence_parallel} tokens), without ALST's tiled loss or MLP, which are the script's")))
    if par.tensor_parallel > 1 and par.sequence_parallel > 1:
        # engine.py builds one model-parallel mesh (mp_mode = "tp" if tp_size > 1 else "sp")
        out.append(Finding("warning", tp_key, "with sequence_parallel_size too: DeepSpeed 0.19.8 builds one "
                                              "model-parallel mesh, TP or SP; zerokit's figures assume neither"))
    if par.pipeline_parallel > 1:
        if stage > 1:  # runtime/pipe/engine.py asserts it when the engine starts
            out.append(Finding("error", "pipeline.stages", f"stage {stage}: ZeRO-2 and ZeRO-3 are incompatible with "
                                                           "pipeline parallelism (DeepSpeed asserts it): use stage 0 or 1"))
        if world_size % par.pipeline_parallel:
            out.append(Finding("error", "pipeline.stages", f"{par.pipeline_parallel} does not divide the {world_size} "
                                                           f"ranks into stages: use a divisor of {world_size}"))
        out.append(Finding("warning", "pipeline.stages", (
            "acts only on a deepspeed.pipe.PipelineModule (the script builds it with num_stages; an HF model as it is "
            "trains without stages); zerokit prices the stages as its own adapter cuts them (partition parameters)")))
        if par.tensor_parallel > 1:  # the pipeline engine's grid is pipe x data (pipe/topology.py): AutoTP is not in it
            out.append(Finding("warning", tp_key, "with pipeline stages: AutoTP inside a PipelineModule is untried "
                                                  "(the pipeline engine's grid is stages x data ranks); zerokit prices "
                                                  "the pair as Megatron-style tensor x pipeline parallelism"))
    if par.hpz_partition_size > 1:
        if stage != 3:
            out.append(Finding("warning", hpz_key, f"read by ZeRO-3 only (zero/stage3.py): at stage {stage} DeepSpeed "
                                                   "ignores it; remove it or use stage 3"))
        elif world_size % min(par.hpz_partition_size, world_size):
            # utils/groups.py _create_zero_param_parallel_group: _ensure_divisibility(world, min(size, world))
            out.append(Finding("error", hpz_key, f"{par.hpz_partition_size} does not divide the {world_size} ranks "
                                                 "(DeepSpeed asserts it when ZeRO-3 starts): use the GPUs per node"))
        else:
            pass  # priced: the secondary partition (memory.phase_terms) and the gathers it serves (timing)
    for key, name in QUANTIZED_COLLECTIVE_KEYS.items():
        if zero.get(key) is not True:
            continue
        where = f"zero_optimization.{key}"
        if accelerator is not None and accelerator.is_cpu:
            out.append(Finding("error", where, f"ZeRO++ {name} runs on DeepSpeed's CUDA quantizer kernels, which a "
                                               "machine without GPUs does not have: remove it (set it false)"))
        elif stage != 3:
            out.append(Finding("warning", where, f"read by ZeRO-3 only (zero/stage3.py): at stage {stage} DeepSpeed "
                                                 "ignores it; remove it or use stage 3"))
        # else priced: its buffers (estimate/memory.py zeropp_terms) and its bytes (estimate/timing.py collective_bytes)
    out += _deepcompile_findings(config, stage, accelerator)
    out += _offload_engine_findings(zero, stage, accelerator)
    return out


def _offload_engine_findings(zero: Mapping, stage: int, accelerator) -> list[Finding]:
    """zenflow and offload_optimizer.super_offload: refused where they cannot run (spec/features.py
    offload_engine_problem), said where DeepSpeed would ignore them."""
    from zerokit.spec.features import offload_engine_problem

    offload = zero.get("offload_optimizer") if isinstance(zero.get("offload_optimizer"), Mapping) else {}
    device = offload.get("device", "none")
    out = []
    for engine, where, on in (("superoffload", "zero_optimization.offload_optimizer.super_offload",
                               offload.get("super_offload") is True),
                              ("zenflow", "zero_optimization.zenflow", isinstance(zero.get("zenflow"), Mapping))):
        if not on:
            continue
        problem = offload_engine_problem(engine, accelerator, stage or None) if accelerator is not None else None
        if problem:
            out.append(Finding("error", where, problem.split(": ", 1)[1]))
        elif device != "cpu":
            out.append(Finding("warning", where, f"it runs an optimizer offloaded to the CPU (offload_optimizer.device "
                                                 f"cpu), not {device}: zerokit prices plain ZeRO here"))
        elif engine == "superoffload" and stage != 3:
            out.append(Finding("warning", where, f"read at ZeRO-3 only (runtime/engine.py builds "
                                                 f"SuperOffloadOptimizer_Stage3): at stage {stage} DeepSpeed uses "
                                                 "ZeRO-Offload; zerokit prices that"))
    return out


def _deepcompile_findings(config: Mapping, stage: int, accelerator) -> list[Finding]:
    """compile.deepcompile: refused where it cannot run (spec/features.py deepcompile_problem), and at ZeRO-0, where
    DeepSpeed falls back to torch.compile (engine.get_deepcompile_backend)."""
    block = config.get("compile")
    if not isinstance(block, Mapping) or block.get("deepcompile") is not True:
        return []
    from zerokit.spec.features import deepcompile_problem

    where = "compile.deepcompile"
    problem = deepcompile_problem(accelerator) if accelerator is not None else None
    if problem:
        return [Finding("error", where, problem.split(": ", 1)[1] + " (set it false)")]
    if stage == 0:
        return [Finding("warning", where, "DeepCompile runs ZeRO stage 1, 2 or 3: at stage 0 DeepSpeed falls back to "
                                          "torch.compile (priced as such); use stage 1 or higher")]
    return []  # priced: spec.setup.ZeroSetup.compile (estimate/gpu_time.py fuses_elementwise, GpuStepParts)
