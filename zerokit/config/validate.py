"""Put a ds_config to DeepSpeed's own DeepSpeedConfig: its pydantic models reject unknown keys inside
zero_optimization, bf16, fp16 and the offload blocks; its batch assertion runs for the given world size. Its error is
explained in one line (the dotted key, and the fix).

deepspeed is imported only inside validate_with_deepspeed.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping

from zerokit.config.auto import TRAINER_FILLED_KEYS, auto_keys
from zerokit.config.keys import DeepSpeedWorld, FP16_ONLY_KEYS, deepspeed_keys, did_you_mean, import_deepspeed_config
from zerokit.config.read import (batch_fix, batch_world_size, checked_config, checked_world_size, lookup,
                                 parallelism_from_config)
from zerokit.core.errors import ZerokitError


def _locate(config: Mapping, title: str, loc: tuple) -> str:
    """The dotted config path of a pydantic error location inside model `title`."""
    prefixes = [p for p, (model, _) in deepspeed_keys().blocks.items() if model == title]
    for prefix in prefixes:
        if lookup(config, prefix) is not None:
            return ".".join([prefix, *map(str, loc)])
    for key, value in config.items():  # a model zerokit does not map: find the block holding that location
        if isinstance(value, Mapping) and loc and str(loc[0]) in value:
            return ".".join([key, *map(str, loc)])
    return ".".join(map(str, loc)) or title


def _explain_validation_error(config: Mapping, e) -> str:
    err = e.errors()[0]
    loc = tuple(err.get("loc", ()))
    path = _locate(config, e.title, loc)
    if err.get("type") == "extra_forbidden":
        parent = path.rsplit(".", 1)[0] if "." in path else ""
        block = deepspeed_keys().blocks.get(parent)
        name = str(loc[-1]) if loc else path
        hint = did_you_mean(name, block[1]) if block else ""
        if name == "aio" and parent == "zero_optimization":
            hint = "move \"aio\" to the top level of the config"
        elif name in FP16_ONLY_KEYS and parent in ("bf16", "bfloat16"):
            hint = f"{name} is an fp16 setting: bf16 needs no loss scaling, remove it"
        return f"DeepSpeed does not know {path}: {hint or 'remove it'}"
    msg = " ".join(str(err.get("msg", "invalid value")).split())
    if not loc:  # a check across the block's fields (a model validator): the input is the whole block
        return f"DeepSpeed rejects {path}: {msg}"
    return f"DeepSpeed rejects {path} = {json.dumps(err.get('input'), default=str)}: {msg}"


def validate_with_deepspeed(config: dict, world_size: int) -> None:
    """Raise ZerokitError (one line) unless DeepSpeed's own DeepSpeedConfig accepts config for world_size ranks.

    "auto" on the keys the HF Trainer fills must be filled first (fill_auto): DeepSpeed would compare the
    string "auto" in its batch assertion.
    """
    checked_world_size(world_size)
    checked_config(config)
    unfilled = [k for k in auto_keys(config) if k in TRAINER_FILLED_KEYS]
    if unfilled:
        raise ZerokitError(
            f"{unfilled[0]} is \"auto\" (filled by the HF Trainer at start-up): fill it before validating "
            "(zerokit.config.auto.fill_auto) or give a concrete value"
        )
    ds_config = import_deepspeed_config()
    import pydantic  # deepspeed depends on it

    try:
        _parse_with_deepspeed(ds_config, config, world_size)
    except pydantic.ValidationError as e:
        raise ZerokitError(_explain_validation_error(config, e)) from None
    except AssertionError as e:
        text = " ".join(str(e).split())
        if "train_batch_size is not equal" in text or "has to be greater than 0" in text:
            raise ZerokitError(f"DeepSpeed's batch check fails for {world_size} ranks ({text}): {batch_fix(config, batch_world_size(config, world_size))}") from None
        raise ZerokitError(f"DeepSpeed rejects the config: {text}") from None
    except ds_config.DeepSpeedConfigError as e:
        text = " ".join(str(e).split())
        raise ZerokitError(f"DeepSpeed rejects the config: {text}") from None
    except Exception as e:  # DeepSpeed's own code tripped on a value (AttributeError, TypeError, ...
        key = _key_deepspeed_trips_on(ds_config, config, world_size)
        text = " ".join(str(e).split())[:160] or "a value of a type it does not expect"
        where = f"{key} (" if key else "the config ("
        raise ZerokitError(f"DeepSpeed cannot read {where}{text}): fix that value") from None


def _parse_with_deepspeed(ds_config, config: dict, world_size: int) -> None:
    """DeepSpeedConfig on a copy of `config` as `world_size` ranks would see it, its own output kept quiet."""
    from zerokit.core.quiet import library_output

    with DeepSpeedWorld(world_size), library_output():
        ds_config.DeepSpeedConfig(copy.deepcopy(config), mpu=_pipeline_mpu(config, world_size))


class _PipeGrid:
    """What deepspeed.initialize hands DeepSpeedConfig for a PipelineModule (mpu = model.mpu(), a PipelineParallelGrid):
    the batch check then counts the data-parallel ranks of one stage (runtime/config.py DeepSpeedConfig.__init__)."""

    def __init__(self, data_parallel: int):
        self.data_parallel = data_parallel

    def get_data_parallel_world_size(self) -> int:
        return self.data_parallel


def _pipeline_mpu(config: Mapping, world_size: int):
    """The pipeline's grid when the config's pipeline block names its stages (they must divide the world: lint_config
    says so otherwise), else None, as for any other model."""
    stages = parallelism_from_config(config).pipeline_parallel
    if stages > 1 and world_size % stages == 0:
        return _PipeGrid(world_size // stages)
    return None


def _trips(ds_config, config: dict, world_size: int) -> bool:
    """Whether DeepSpeedConfig fails on `config` other than by its own checks (pydantic, assertions)."""
    import pydantic

    try:
        _parse_with_deepspeed(ds_config, config, world_size)
    except (pydantic.ValidationError, AssertionError, ds_config.DeepSpeedConfigError):
        return False
    except Exception:
        return True
    return False


def _key_deepspeed_trips_on(ds_config, config: dict, world_size: int) -> str | None:
    """The dotted key whose removal lets DeepSpeedConfig read the config (top level, then one level into that
    block), or None. Only on the failure path: each try is one DeepSpeedConfig (milliseconds)."""
    for key in config:
        rest = {k: v for k, v in config.items() if k != key}
        if _trips(ds_config, rest, world_size):
            continue
        block = config[key]
        if isinstance(block, Mapping):
            for sub in block:
                if not _trips(ds_config, {**config, key: {k: v for k, v in block.items() if k != sub}}, world_size):
                    return f"{key}.{sub}"
        return key
    return None
