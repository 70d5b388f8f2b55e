"""Check a ds_config the way DeepSpeed will read it, and read back the ZeRO setup it implies.

- validate_with_deepspeed: DeepSpeed's own DeepSpeedConfig (its pydantic models reject unknown keys inside
  zero_optimization, bf16, fp16, offload blocks; its batch assertion runs for the given world size).
- lint_config: what DeepSpeed accepts silently but gets wrong (unknown top-level keys are ignored, NVMe
  optimizer offload below stage 3 quietly becomes CPU offload, ...) and what fails only at run time.
- fill_auto: replace "auto" as the HF Trainer does (transformers/integrations/deepspeed.py).
- setup_from_config: the ZeroSetup and ZeroKnobs a config implies, for the memory model.

deepspeed is imported only inside the functions that need it (validate_with_deepspeed, lint_config).
"""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

from zerokit.core.errors import ZerokitError
from zerokit.core.fsutil import atomic_write_text, cache_dir, package_version, parse_json_text
from zerokit.spec.setup import Parallelism, ZeroKnobs, ZeroSetup

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

# DeepSpeedZeroConfig's stage-3 fields are written with their "stage3_" alias in configs; populate_by_name
# lets DeepSpeed take the plain field name too. ZeroKnobs uses the alias.
_ZERO_FIELD_TO_ALIAS = {
    "prefetch_bucket_size": "stage3_prefetch_bucket_size",
    "param_persistence_threshold": "stage3_param_persistence_threshold",
    "max_live_parameters": "stage3_max_live_parameters",
    "max_reuse_distance": "stage3_max_reuse_distance",
    "gather_16bit_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
}

# DeepSpeedZeroConfig's deprecated fields (json_schema_extra "deprecated"): DeepSpeedConfigModel's
# _process_deprecated_field logs a warning and moves the value to new_param, or drops it where set_new_param is False
# (None here).
ZERO_DEPRECATED = {
    "cpu_offload": "offload_optimizer",
    "cpu_offload_param": "offload_param",
    "cpu_offload_use_pin_memory": None,
    "stage3_gather_fp16_weights_on_model_save": "gather_16bit_weights_on_model_save",
}

FP16_ONLY_KEYS = ("loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis",
                  "min_loss_scale", "auto_cast", "fp16_master_weights_and_grads")
# Optimizers DeepSpeed has a CPU implementation of, used when the optimizer is offloaded
# (engine._configure_basic_optimizer: DeepSpeedCPUAdam, DeepSpeedCPUAdagrad, DeepSpeedCPULion).
CPU_OFFLOAD_OPTIMIZERS = ("adam", "adamw", "adagrad", "lion")


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
            continue  # "auto": the HF Trainer fills it; 2.0: the batch rule (_batch_findings) says what a count is
        if kind not in allowed:
            shown = f" {json.dumps(value)[:40]}" if kind not in ("null", "object") else ""
            want = "an object {...}" if allowed[0] == "object" else ("an " if allowed[0][0] in "aeiou" else "a ") + allowed[0]
            out.append(Finding("error", key, f"is {kind}{shown}, DeepSpeed reads {' or '.join(allowed)} here: "
                                             f"write {want}"))
    return out


@dataclass(frozen=True)
class Finding:
    level: str  # "error" | "warning"
    key: str  # dotted path in the config, e.g. "zero_optimization.offload_param"
    message: str

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.level}: {self.key}: {self.message}"


# ----------------------------------------------------------------------------------------------------------
# small helpers


def _get(config: Mapping, dotted: str, default=None):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def _set(config: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    node = config
    for part in parents:
        node = node[part]
    node[last] = value


def auto_keys(config: Mapping, prefix: str = "") -> list[str]:
    """Dotted paths of every "auto" value in config."""
    out = []
    for k, v in config.items():
        path = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.extend(auto_keys(v, path + "."))
        elif v == AUTO:
            out.append(path)
    return out


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.75)
    return f"did you mean {close[0]!r}?" if close else ""


def _import_deepspeed_config():
    from zerokit.core.quiet import library_output

    try:
        # DeepSpeed logs its accelerator choice on import: kept out of zerokit's output unless -v
        with library_output():
            import deepspeed.runtime.config as ds_config  # noqa: PLC0415 (heavy: only when checking)
    except ImportError as e:
        raise ZerokitError(f"checking against DeepSpeed needs deepspeed installed ({e}): pip install 'zerokit[train]'") from None
    return ds_config


# ----------------------------------------------------------------------------------------------------------
# what DeepSpeed knows


class _KeyRecorder(dict):
    """A dict that records which keys are looked up: DeepSpeedConfig's reads name every top-level key it knows."""

    def __init__(self, *args, seen: set | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = seen if seen is not None else set()

    def get(self, key, default=None):
        self.seen.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.seen.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.seen.add(key)
        return super().__contains__(key)

    def keys(self):  # `key in param_dict.keys()` is DeepSpeed's usual idiom
        outer = self

        class _Keys:
            def __contains__(self, key):
                outer.seen.add(key)
                return dict.__contains__(outer, key)

            def __iter__(self):
                return iter(dict.keys(outer))

        return _Keys()

    def __copy__(self):  # DeepSpeedConfig reads from copy.copy(param_dict): share the record
        return _KeyRecorder(self, seen=self.seen)


def _model_keys(cls) -> set[str]:
    """Field names and aliases of a pydantic model class."""
    out = set()
    for name, field in cls.model_fields.items():
        out.add(name)
        if field.alias:
            out.add(field.alias)
    return out


# The config blocks whose keys DeepSpeed's pydantic models check (extra keys forbidden), with their model class.
_MODEL_BLOCKS = {
    "zero_optimization": "DeepSpeedZeroConfig",
    "zero_optimization.offload_optimizer": "DeepSpeedZeroOffloadOptimizerConfig",
    "zero_optimization.offload_param": "DeepSpeedZeroOffloadParamConfig",
    "bf16": "DeepSpeedBF16Config",
    "bfloat16": "DeepSpeedBF16Config",
    "fp16": "DeepSpeedFP16Config",
}
# DeepSpeed's key sets for the DeepSpeed pinned in constraints-cpu.txt: lint then imports no DeepSpeed (2 s of a cold
# launch on 2 cores). tests/test_ds_check.py regenerates them from the installed DeepSpeed and compares.
SHIPPED_KEYS = "deepspeed_keys.json"


@dataclass(frozen=True)
class DeepSpeedKeys:
    """What DeepSpeed knows, as names: the top-level keys DeepSpeedConfig reads, the removed ones with DeepSpeed's
    message (top-level keys, and ZeRO keys as zero_optimization.KEY), and each model block's field names and aliases."""

    deepspeed: str  # the version they were read from
    top: frozenset
    removed: dict
    blocks: dict  # dotted block -> (model class name, frozenset of its keys)

    @property
    def zero(self) -> frozenset:
        return self.blocks["zero_optimization"][1]

    def to_json(self) -> dict:
        return {"deepspeed": self.deepspeed, "top": sorted(self.top), "removed": dict(sorted(self.removed.items())),
                "blocks": {b: {"model": m, "keys": sorted(k)} for b, (m, k) in sorted(self.blocks.items())}}

    @classmethod
    def from_json(cls, data: dict) -> "DeepSpeedKeys":
        return cls(deepspeed=data["deepspeed"], top=frozenset(data["top"]), removed=dict(data["removed"]),
                   blocks={b: (v["model"], frozenset(v["keys"])) for b, v in data["blocks"].items()})


def read_deepspeed_keys() -> DeepSpeedKeys:
    """The key sets, read from the installed DeepSpeed's own code (imports it): its top-level reads, recorded while
    DeepSpeedConfig parses a minimal config, and its config models' fields."""
    ds_config = _import_deepspeed_config()
    from deepspeed.runtime import precision_config  # noqa: PLC0415
    from deepspeed.runtime.zero import config as zero_config, offload_config  # noqa: PLC0415

    recorder = _KeyRecorder({"train_micro_batch_size_per_gpu": 1})
    with _world(1):
        ds_config.DeepSpeedConfig(recorder)
    removed = dict(getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {}))
    # removed ZeRO keys (MiCS in 0.19.8: _reject_removed_config_keys), dotted, so no top-level key matches them
    removed.update({f"zero_optimization.{k}": v for k, v in getattr(ds_config, "_REMOVED_ZERO_CONFIG_KEYS", {}).items()})
    # read outside DeepSpeedConfig.__init__'s default path: sequence parallelism (under an initialised dist)
    top = (recorder.seen | {"sequence_parallel_size"}) - set(removed)
    models = {m: getattr(mod, m) for mod in (zero_config, offload_config, precision_config) for m in dir(mod)
              if m in _MODEL_BLOCKS.values()}
    return DeepSpeedKeys(deepspeed=package_version("deepspeed"), top=frozenset(top), removed=removed,
                         blocks={b: (m, frozenset(_model_keys(models[m]))) for b, m in _MODEL_BLOCKS.items()})


@lru_cache(maxsize=1)
def deepspeed_keys() -> DeepSpeedKeys:
    """The installed DeepSpeed's key sets: shipped for the pinned version, else read once and cached per version."""
    from zerokit.core.resources import bundled_data

    version = package_version("deepspeed")
    if version == "none":
        _import_deepspeed_config()  # raises the one-line install hint
    cached = cache_dir("deepspeed_keys") / f"{version}.json"
    for path in (bundled_data(SHIPPED_KEYS), cached):
        try:
            keys = DeepSpeedKeys.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if keys.deepspeed == version:
            return keys
    keys = read_deepspeed_keys()
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(cached, json.dumps(keys.to_json(), indent=1), mode=0o644)
    except OSError:
        pass  # an unwritable cache only costs the reading next time
    return keys


class _world:
    """Make DeepSpeedConfig see `world_size` ranks without a process group.

    DeepSpeedConfig.__init__ takes the world size from deepspeed.comm (dist.get_rank / dist.get_world_size) and
    falls back to rank 0 of 1 when no process group is initialised, so its batch assertion
    (train_batch_size == micro x accumulation x world size) would always check a single-rank run. For the
    duration of the call, the module's `dist` name is replaced by a shim that answers rank 0 and the world size
    asked for. Only that module's reference changes; deepspeed.comm itself is untouched.
    """

    def __init__(self, world_size: int):
        self.shim = SimpleNamespace(get_rank=lambda group=None: 0, get_world_size=lambda group=None: world_size)

    def __enter__(self):
        import deepspeed.runtime.config as ds_config  # noqa: PLC0415

        self.module, self.saved = ds_config, ds_config.dist
        ds_config.dist = self.shim
        return self

    def __exit__(self, *exc):
        self.module.dist = self.saved
        return False


# ----------------------------------------------------------------------------------------------------------
# fill "auto"


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
    out = copy.deepcopy(config)
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
    micro = _get(out, "train_micro_batch_size_per_gpu")
    accum = _get(out, "gradient_accumulation_steps")
    micro = values["train_micro_batch_size_per_gpu"] if micro in (None, AUTO) else micro
    accum = values["gradient_accumulation_steps"] if accum in (None, AUTO) else accum
    # micro x accumulation x the data-parallel ranks: under Ulysses, accelerate sets it so "at the last moment"
    # (Accelerator._prepare_deepspeed, sp_backend "deepspeed": x parallelism_config.data_parallel_size), over the
    # Trainer's micro x accumulation x every process, as DeepSpeed's batch check counts world / sp (batch_world_size)
    values.setdefault("train_batch_size", micro * accum * batch_world_size(out, world_size)
                      if _is_int(micro) and _is_int(accum) else None)
    values.setdefault("scheduler.params.warmup_max_lr", values["optimizer.params.lr"])
    values.setdefault("scheduler.params.total_num_steps", values["scheduler.params.warmup_num_steps"])
    buckets = ZeroKnobs.for_hidden_size(hidden_size)
    values.setdefault("zero_optimization.reduce_bucket_size", buckets.reduce_bucket_size)
    values.setdefault("zero_optimization.stage3_prefetch_bucket_size", buckets.stage3_prefetch_bucket_size)
    values.setdefault("zero_optimization.stage3_param_persistence_threshold", buckets.stage3_param_persistence_threshold)

    for key in TRAINER_FILLED_KEYS:
        if _get(out, key) == AUTO:
            if values.get(key) is None:
                raise ZerokitError(f"cannot fill {key} = \"auto\": give the micro batch and accumulation as integers")
            _set(out, key, copy.deepcopy(values[key]))
    return out


# ----------------------------------------------------------------------------------------------------------
# validate with DeepSpeed


def _locate(config: Mapping, title: str, loc: tuple) -> str:
    """The dotted config path of a pydantic error location inside model `title`."""
    prefixes = [p for p, (model, _) in deepspeed_keys().blocks.items() if model == title]
    for prefix in prefixes:
        if _get(config, prefix) is not None:
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
        hint = _did_you_mean(name, block[1]) if block else ""
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
    if not _is_int(world_size) or world_size < 1:
        raise ZerokitError(f"world size must be a positive integer, got {world_size}")
    unfilled = [k for k in auto_keys(config) if k in TRAINER_FILLED_KEYS]
    if unfilled:
        raise ZerokitError(
            f"{unfilled[0]} is \"auto\" (filled by the HF Trainer at start-up): fill it before validating "
            "(zerokit.config.rules.fill_auto) or give a concrete value"
        )
    ds_config = _import_deepspeed_config()
    import pydantic  # noqa: PLC0415 (deepspeed depends on it)

    try:
        _parse_with_deepspeed(ds_config, config, world_size)
    except pydantic.ValidationError as e:
        raise ZerokitError(_explain_validation_error(config, e)) from None
    except AssertionError as e:
        text = " ".join(str(e).split())
        if "train_batch_size is not equal" in text or "has to be greater than 0" in text:
            raise ZerokitError(f"DeepSpeed's batch check fails for {world_size} ranks ({text}): {_batch_fix(config, batch_world_size(config, world_size))}") from None
        raise ZerokitError(f"DeepSpeed rejects the config: {text}") from None
    except ds_config.DeepSpeedConfigError as e:
        text = " ".join(str(e).split())
        raise ZerokitError(f"DeepSpeed rejects the config: {text}") from None
    except Exception as e:  # noqa: BLE001 - DeepSpeed's own code tripped on a value (AttributeError, TypeError, ...)
        key = _key_deepspeed_trips_on(ds_config, config, world_size)
        text = " ".join(str(e).split())[:160] or "a value of a type it does not expect"
        where = f"{key} (" if key else "the config ("
        raise ZerokitError(f"DeepSpeed cannot read {where}{text}): fix that value") from None


def _parse_with_deepspeed(ds_config, config: dict, world_size: int) -> None:
    """DeepSpeedConfig on a copy of `config` as `world_size` ranks would see it, its own output kept quiet."""
    from zerokit.core.quiet import library_output

    with _world(world_size), library_output():
        ds_config.DeepSpeedConfig(copy.deepcopy(config))


def _trips(ds_config, config: dict, world_size: int) -> bool:
    """Whether DeepSpeedConfig fails on `config` other than by its own checks (pydantic, assertions)."""
    import pydantic  # noqa: PLC0415

    try:
        _parse_with_deepspeed(ds_config, config, world_size)
    except (pydantic.ValidationError, AssertionError, ds_config.DeepSpeedConfigError):
        return False
    except Exception:  # noqa: BLE001
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


def _batch_fix(config: Mapping, world_size: int) -> str:
    micro = config.get("train_micro_batch_size_per_gpu")
    accum = config.get("gradient_accumulation_steps", 1)
    if _is_int(micro) and _is_int(accum) and micro > 0 and accum > 0:
        return (f"set train_batch_size to {micro * accum * world_size} (= micro {micro} x accumulation {accum} "
                f"x {world_size} ranks), or drop it and let DeepSpeed derive it")
    return "make train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size"


# ----------------------------------------------------------------------------------------------------------
# lint


def _derive_batch(tb, micro, accum, world_size: int):
    """The batch triple DeepSpeed ends up with: DeepSpeedConfig._set_batch_related_parameters, floor division
    included. None when neither train_batch_size nor the micro batch is given (DeepSpeed asserts)."""
    if tb is not None and micro is not None and accum is not None:
        return tb, micro, accum
    if tb is not None and micro is not None:
        return tb, micro, tb // micro // world_size
    if tb is not None and accum is not None:
        return tb, tb // world_size // accum, accum
    if micro is not None and accum is not None:
        return micro * accum * world_size, micro, accum
    if tb is not None:
        return tb, tb // world_size, 1
    if micro is not None:
        return micro * world_size, micro, 1
    return None


def batch_world_size(config: Mapping, world_size: int) -> int:
    """The world DeepSpeed's batch check counts: world / sequence_parallel_size under Ulysses (runtime/config.py
    DeepSpeedConfig.__init__: `dist.get_world_size() / config["sequence_parallel_size"]` without an mpu, and the
    SP mpu's data-parallel world with one); AutoTP's groups do not exist yet when the config is built, so its full
    world. A degree that does not divide the world is _parallelism_findings' error: the full world here."""
    sp = config.get("sequence_parallel_size")
    if _is_int(sp) and sp > 1 and world_size % sp == 0:
        return world_size // sp
    return world_size


def _batch_findings(config: Mapping, world_size: int) -> list[Finding]:
    world_size = batch_world_size(config, world_size)
    keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    raw = {k: config.get(k) for k in keys}
    out = [Finding("error", k, f"must be a positive integer, got {json.dumps(v)}")
           for k, v in raw.items() if v not in (None, AUTO) and (not _is_int(v) or v < 1)]
    if out or AUTO in raw.values():
        return out
    derived = _derive_batch(*raw.values(), world_size)
    if derived is None:
        return [Finding("error", "train_batch_size",
                        "neither train_batch_size nor train_micro_batch_size_per_gpu is set: DeepSpeed needs one")]
    tb, micro, accum = derived
    if micro >= 1 and accum >= 1 and tb == micro * accum * world_size:
        return []
    if raw["train_micro_batch_size_per_gpu"] is not None:
        fix = _batch_fix(config, world_size)
    else:
        fix = f"use a train_batch_size that is a multiple of {world_size * (raw['gradient_accumulation_steps'] or 1)}"
    return [Finding("error", "train_batch_size",
                    f"{tb} != micro batch {micro} x accumulation {accum} x {world_size} ranks: {fix}")]


def lint_config(config: dict, world_size: int, accelerator=None) -> list[Finding]:
    """Problems DeepSpeed lets through silently or reports only at run time; errors first.

    accelerator: a zerokit.spec.hardware.Accelerator, to check the precision against; None skips that rule.
    A block of a type DeepSpeed cannot read is reported alone: the other rules read the blocks as DeepSpeed would.
    """
    type_errors = _type_findings(config)
    if type_errors:
        return type_errors
    schema = deepspeed_keys()
    out: list[Finding] = []
    zero = config.get("zero_optimization")
    zero = zero if isinstance(zero, Mapping) else {}
    zero_keys = set(schema.zero)

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
            fix = _did_you_mean(key, schema.top) if typo else "remove it if it is not for your own script or tool"
            out.append(Finding("error" if typo else "warning", key, f"DeepSpeed ignores unknown top-level keys: {fix}"))

    # misplaced or unknown keys inside blocks DeepSpeed's pydantic models reject
    for block, (_, block_keys) in schema.blocks.items():
        node = _get(config, block)
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
                hint = _did_you_mean(key, block_keys)
                out.append(Finding("error", where, f"DeepSpeed rejects unknown key {key!r}: {hint or 'remove it'}"))

    out.extend(_batch_findings(config, world_size))

    fp16_on = _get(config, "fp16.enabled") is True
    bf16_on = (_get(config, "bf16.enabled") if "bf16" in config else _get(config, "bfloat16.enabled")) is True
    if fp16_on and bf16_on:
        out.append(Finding("error", "fp16.enabled", "fp16 and bf16 are both enabled: DeepSpeed allows one; disable one"))
    if accelerator is not None:
        for name, on in (("fp16", fp16_on), ("bf16", bf16_on)):
            if on and not accelerator.supports(name):
                usable = ", ".join(p for p in accelerator.precisions if p != name)
                out.append(Finding("error", f"{name}.enabled", f"{accelerator.name} does not support {name}: use {usable}"))

    stage = zero.get("stage", 0)
    stage = stage if _is_int(stage) else 0
    opt_dev = _get(zero, "offload_optimizer.device", "none") or "none"
    param_dev = _get(zero, "offload_param.device", "none") or "none"
    opt_type = _get(config, "optimizer.type")
    opt_params = _get(config, "optimizer.params", {})
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
        if dev == "nvme" and not _get(zero, f"{block}.nvme_path"):
            out.append(Finding("error", f"zero_optimization.{block}.nvme_path",
                               "NVMe offload needs nvme_path, a folder on the NVMe drive: add it"))

    out.extend(_parallelism_findings(config, zero, stage, world_size, accelerator))
    for key in auto_keys(config):
        if key not in TRAINER_FILLED_KEYS:
            out.append(Finding("warning", key,
                               "\"auto\" here is not filled by the HF Trainer: DeepSpeed drops it and uses its default; "
                               "give a value"))
    return sorted(out, key=lambda f: f.level != "error")


# DeepSpeed's ZeRO++ quantized collectives: both build its CUDA quantizer (zero/partition_parameters.py CUDAQuantizer,
# runtime/comm/coalesced_collectives.py all_to_all_quant_reduce: QuantizerBuilder().load()), which a machine without
# CUDA does not have ("This op had not been implemented on CPU backend", op_builder/cpu/no_impl.py)
QUANTIZED_COLLECTIVE_KEYS = {"zero_quantized_weights": "qwZ", "zero_quantized_nontrainable_weights": "qwZ",
                             "zero_quantized_gradients": "qgZ"}


def parallelism_from_config(config: Mapping) -> Parallelism:
    """The TP, SP and hpZ degrees a config asks for (1 where unset or off: DeepSpeed acts on autotp_size and
    zero_hpz_partition_size only above 1). Values of a type DeepSpeed cannot read count as 1 here; lint_config
    reports them."""
    zero = config.get("zero_optimization")
    zero = zero if isinstance(zero, Mapping) else {}

    def degree(v) -> int:
        return v if _is_int(v) and v > 1 else 1
    return Parallelism(tensor_parallel=degree(_get(config, "tensor_parallel.autotp_size")),
                       sequence_parallel=degree(config.get("sequence_parallel_size")),
                       hpz_partition_size=degree(zero.get("zero_hpz_partition_size")))


def _parallelism_findings(config: Mapping, zero: Mapping, stage: int, world_size: int, accelerator) -> list[Finding]:
    """TP, SP and ZeRO++: what DeepSpeed refuses only once the ranks run, and what it silently ignores."""
    out: list[Finding] = []
    tp_key, sp_key, hpz_key = "tensor_parallel.autotp_size", "sequence_parallel_size", "zero_optimization.zero_hpz_partition_size"
    tp, sp, hpz = _get(config, tp_key), config.get(sp_key), zero.get("zero_hpz_partition_size")
    if _is_int(sp) and sp < 1:  # DeepSpeedConfig divides the world by it
        out.append(Finding("error", sp_key, f"{sp} ranks: DeepSpeed divides the world size by it; use 1 (off) or "
                                            "the number of ranks that share a sequence"))
    if _is_int(tp) and tp < 0:  # accepted (no bound in TPTrainingConfig), and off
        out.append(Finding("warning", tp_key, f"{tp}: DeepSpeed treats it as off (it acts above 1); use 0 or 1"))
    tp_size = _get(config, "tensor_parallel.tp.tp_size", _get(config, "tensor_parallel.tensor_parallel.tp_size"))
    if _is_int(tp) and tp > 1 and _is_int(tp_size) and tp_size not in (1, tp):  # engine._apply_autotp_partitioning
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
    return out


# ----------------------------------------------------------------------------------------------------------
# read a setup back


def _precision(config: Mapping) -> str:
    bf16 = config.get("bf16", config.get("bfloat16")) or {}
    fp16 = config.get("fp16") or {}
    for name, block in (("bf16", bf16), ("fp16", fp16)):
        enabled = block.get("enabled", False) if isinstance(block, Mapping) else False
        if enabled == AUTO:
            raise ZerokitError(f"{name}.enabled is \"auto\": fill it first (fill_auto) with the precision the Trainer uses")
        if enabled is True:
            return name
    return "fp32"


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
    of a config without one is client_optimizer (CLIENT_OPTIMIZERS; zerokit's own loop: torch.optim.AdamW).

    "auto" values are first filled as the HF Trainer would (fill_auto with auto_values and hidden_size).
    Missing batch keys are derived as DeepSpeed derives them. overlap_comm defaults to True at stage 3 only
    (DeepSpeedZeroConfig.overlap_comm_valid); the other knobs to DeepSpeedZeroConfig's defaults.
    """
    if auto_keys(config):
        config = fill_auto(config, auto_values, world_size, hidden_size)
    for f in _batch_findings(config, world_size):
        raise ZerokitError(f"{f.key}: {f.message}")
    _, micro, accum = _derive_batch(config.get("train_batch_size"), config.get("train_micro_batch_size_per_gpu"),
                                    config.get("gradient_accumulation_steps"), batch_world_size(config, world_size))

    zero = config.get("zero_optimization", {})
    if isinstance(zero, bool):  # DeepSpeed's deprecated boolean form: true = stage 1
        zero = {"stage": 1 if zero else 0}
    zero = {_ZERO_FIELD_TO_ALIAS.get(k, k): v for k, v in (zero or {}).items()}
    stage = zero.get("stage", 0)
    if stage == AUTO:
        stage = 0  # DeepSpeed drops "auto" and uses its default
    if not _is_int(stage) or stage not in (0, 1, 2, 3):  # DeepSpeed's ZeroStageEnum
        raise ZerokitError(f"zero_optimization.stage is {json.dumps(stage)[:40]}: DeepSpeed's stages are 0, 1, 2 and 3")
    setup = ZeroSetup(
        zero_stage=int(stage),
        offload_optimizer=_offload_device(zero, "offload_optimizer", "cpu_offload"),
        offload_param=_offload_device(zero, "offload_param", "cpu_offload_param"),
        precision=_precision(config),
        micro_batch_size=int(micro),
        gradient_accumulation_steps=int(accum),
        activation_checkpointing="activation_checkpointing" in config,
    )
    knobs = ZeroKnobs.from_zero_config(zero)
    if zero.get("overlap_comm") in (None, AUTO):
        knobs = ZeroKnobs(**{**knobs.to_dict(), "overlap_comm": setup.zero_stage == 3})
    return setup, replace(knobs, optimizer=optimizer_of(config, client_optimizer))


# What a config without an optimizer block trains with is the script's choice (DeepSpeed wraps it:
# engine._configure_optimizer with a client optimizer), named as the HF Trainer's --optim names it, and how the
# memory model prices it (spec.setup.ZeroKnobs.optimizer): the unfused torch AdamW makes fp32 temporaries, the
# fused kernel updates in place as DeepSpeed's FusedAdam does.
CLIENT_OPTIMIZERS = {"adamw_torch": "torch_adamw", "adamw_torch_fused": "deepspeed"}


def optimizer_of(config: dict, client_optimizer: str = "adamw_torch") -> str:
    """ZeroKnobs.optimizer for a ds_config: the client optimizer's pricing without an optimizer block;
    "torch_adamw" with params.torch_adam true (engine._configure_basic_optimizer builds torch.optim.AdamW); else
    "deepspeed"."""
    opt = config.get("optimizer")
    if not isinstance(opt, dict):
        return CLIENT_OPTIMIZERS[client_optimizer]
    params = opt.get("params") if isinstance(opt.get("params"), dict) else {}
    return "torch_adamw" if params.get("torch_adam") is True else "deepspeed"


def trainer_default_optimizer(torch_version: str) -> str:
    """The HF Trainer's default --optim for a torch version (transformers/training_args.py: adamw_torch_fused
    when is_torch_greater_or_equal_than_2_8, else adamw_torch); adamw_torch when the version is unknown."""
    import re

    m = re.match(r"(\d+)\.(\d+)", torch_version or "")
    return "adamw_torch_fused" if m and (int(m[1]), int(m[2])) >= (2, 8) else "adamw_torch"


# ----------------------------------------------------------------------------------------------------------
# files


def load_config_file(path) -> dict:
    """A ds_config from a JSON file; one-line ZerokitError when missing, unreadable, malformed or not an object."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ZerokitError(f"config file {p} does not exist: check the path") from None
    except IsADirectoryError:
        raise ZerokitError(f"{p} is a folder, not a config file: give the path of the JSON file") from None
    except UnicodeDecodeError:
        raise ZerokitError(f"config file {p} is not UTF-8 text: give a JSON ds_config") from None
    except OSError as e:
        raise ZerokitError(f"cannot read config file {p}: {e.strerror}") from None

    obj = parse_json_text(text, f"config file {p}", reject_duplicates=True)
    if not isinstance(obj, dict):
        raise ZerokitError(f"config file {p} holds a JSON {type(obj).__name__}, not an object: a ds_config is {{...}}")
    return obj
