"""What the HF Trainer does with "auto" in a ds_config: the keys it fills (TRAINER_FILLED_KEYS), what it fills them
with under TrainingArguments' defaults (TRAINER_DEFAULTS), where a config has "auto" (auto_keys), and the config with
it filled (fill_auto), as transformers/integrations/deepspeed.py does.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from zerokit.config.read import batch_world_size, checked_config, checked_world_size, is_int, lookup
from zerokit.core.errors import ZerokitError
from zerokit.spec.setup import ZeroKnobs, ZeroSetup

AUTO = "auto"

# The keys transformers' HfTrainerDeepSpeedConfig fills when they are "auto" (trainer_config_process and
# trainer_config_finalize in transformers/integrations/deepspeed.py). "auto" anywhere else stays "auto":
# DeepSpeed's pydantic models then silently drop it (DeepSpeedConfigModel.__init__) and use their default.
TRAINER_FILLED_KEYS = (
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "train_batch_size",
    "gradient_clipping",
    "optimizer.params.lr",
    "optimizer.params.betas",
    "optimizer.params.eps",
    "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr",
    "scheduler.params.warmup_max_lr",
    "scheduler.params.warmup_num_steps",
    "scheduler.params.total_num_steps",
    "fp16.enabled",
    "bf16.enabled",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
)

# What the Trainer fills those keys with under TrainingArguments' defaults (transformers 5.x). The scheduler's
# total_num_steps depends on the data; DeepSpeedConfig does not read it, so a placeholder equal to the warm-up
# stands in for it (the smallest value WarmupDecayLR takes without a warning).
TRAINER_DEFAULTS = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "optimizer.params.lr": 5e-5,
    "optimizer.params.betas": [0.9, 0.999],
    "optimizer.params.eps": 1e-8,
    "optimizer.params.weight_decay": 0.0,
    "scheduler.params.warmup_min_lr": 0,
    "scheduler.params.warmup_num_steps": 1,
    "fp16.enabled": False,
    "bf16.enabled": False,
}


def auto_keys(config: Mapping, prefix: str = "") -> list[str]:
    """Dotted paths of every "auto" value in config."""
    if not prefix:
        checked_config(config)
    out = []
    for k, v in config.items():
        path = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.extend(auto_keys(v, path + "."))
        elif v == AUTO:
            out.append(path)
    return out


def _set(config: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    node = config
    for part in parents:
        node = node[part]
    node[last] = value


def fill_auto(config: dict, setup_or_values=None, world_size: int = 1, hidden_size: int | None = None) -> dict:
    """A copy of config with "auto" replaced on the keys the HF Trainer fills, with what it would fill them.

    setup_or_values: a ZeroSetup (micro batch, accumulation, precision), or a mapping of dotted config keys to
    values (e.g. {"optimizer.params.lr": 1e-4, "train_micro_batch_size_per_gpu": 4}), or None. Anything not given
    takes TrainingArguments' default (TRAINER_DEFAULTS); train_batch_size is micro x accumulation x the ranks DeepSpeed's
    batch check counts (batch_world_size: world / sequence_parallel_size under Ulysses);
    warmup_max_lr is the learning rate. Bucket sizes: h^2, int(0.9 h^2), 10 h from hidden_size as the Trainer does;
    without a hidden size, DeepSpeed's defaults (what DeepSpeed uses for a key whose value is "auto").
    "auto" on keys the Trainer does not fill is left alone, as the Trainer leaves it.
    """
    checked_world_size(world_size)
    out = copy.deepcopy(checked_config(config))
    values = dict(TRAINER_DEFAULTS)
    if isinstance(setup_or_values, ZeroSetup):
        s = setup_or_values
        values.update({
            "train_micro_batch_size_per_gpu": s.micro_batch_size,
            "gradient_accumulation_steps": s.gradient_accumulation_steps,
            "bf16.enabled": s.precision == "bf16",
            "fp16.enabled": s.precision == "fp16",
        })
    elif isinstance(setup_or_values, Mapping):
        unknown = [k for k in setup_or_values if k not in TRAINER_FILLED_KEYS]
        if unknown:
            raise ZerokitError(f"cannot fill {unknown[0]!r}: the HF Trainer fills only {', '.join(TRAINER_FILLED_KEYS)}")
        values.update(setup_or_values)
    elif setup_or_values is not None:
        raise TypeError(f"setup_or_values must be a ZeroSetup or a mapping, got {type(setup_or_values).__name__}")

    # The batch triple: concrete values in the config win over the fill values (a consistent Trainer agrees).
    micro = lookup(out, "train_micro_batch_size_per_gpu")
    accum = lookup(out, "gradient_accumulation_steps")
    micro = values["train_micro_batch_size_per_gpu"] if micro in (None, AUTO) else micro
    accum = values["gradient_accumulation_steps"] if accum in (None, AUTO) else accum
    # micro x accumulation x the data-parallel ranks: under Ulysses, accelerate sets it so "at the last moment"
    # (Accelerator._prepare_deepspeed, sp_backend "deepspeed": x parallelism_config.data_parallel_size), over the
    # Trainer's micro x accumulation x every process, as DeepSpeed's batch check counts world / sp (batch_world_size)
    values.setdefault("train_batch_size", micro * accum * batch_world_size(out, world_size)
                      if is_int(micro) and is_int(accum) else None)
    values.setdefault("scheduler.params.warmup_max_lr", values["optimizer.params.lr"])
    values.setdefault("scheduler.params.total_num_steps", values["scheduler.params.warmup_num_steps"])
    buckets = ZeroKnobs.for_hidden_size(hidden_size)
    values.setdefault("zero_optimization.reduce_bucket_size", buckets.reduce_bucket_size)
    values.setdefault("zero_optimization.stage3_prefetch_bucket_size", buckets.stage3_prefetch_bucket_size)
    values.setdefault("zero_optimization.stage3_param_persistence_threshold", buckets.stage3_param_persistence_threshold)

    for key in TRAINER_FILLED_KEYS:
        if lookup(out, key) == AUTO:
            if values.get(key) is None:
                raise ZerokitError(f"cannot fill {key} = \"auto\": give the micro batch and accumulation as integers")
            _set(out, key, copy.deepcopy(values[key]))
    return out
