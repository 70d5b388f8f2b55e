"""What DeepSpeed knows, as names: the top-level keys DeepSpeedConfig reads, the removed ones, each pydantic config
block's fields and aliases (read from the installed DeepSpeed, or shipped as deepspeed_keys.json for the pinned one),
and the tables of DeepSpeed's key names zerokit's rules use (stage-3 aliases, deprecated ZeRO keys, fp16-only keys).

deepspeed is imported only inside the functions that need it (read_deepspeed_keys; import_deepspeed_config, which
config/validate.py uses too).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace

from zerokit.core.errors import ZerokitError
from zerokit.core.fsutil import atomic_write_text, cache_dir, package_version

# DeepSpeedZeroConfig's stage-3 fields are written with their "stage3_" alias in configs; populate_by_name
# lets DeepSpeed take the plain field name too. ZeroKnobs uses the alias.
ZERO_FIELD_TO_ALIAS = {
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


def did_you_mean(word: str, choices) -> str:
    """"did you mean 'X'?" for the closest of choices to a mistyped key, or "" when none is close."""
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.75)
    return f"did you mean {close[0]!r}?" if close else ""


def import_deepspeed_config():
    """deepspeed.runtime.config, imported with its output kept quiet; a one-line install hint without DeepSpeed."""
    from zerokit.core.quiet import library_output

    try:
        # DeepSpeed logs its accelerator choice on import: kept out of zerokit's output unless -v
        with library_output():
            import deepspeed.runtime.config as ds_config  # heavy: only when checking
    except ImportError as e:
        raise ZerokitError(f"checking against DeepSpeed needs deepspeed installed ({e}): pip install 'zerokit[train]'") from None
    return ds_config


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
    ds_config = import_deepspeed_config()
    from deepspeed.runtime import precision_config
    from deepspeed.runtime.zero import config as zero_config, offload_config

    recorder = _KeyRecorder({"train_micro_batch_size_per_gpu": 1})
    with DeepSpeedWorld(1):
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
        import_deepspeed_config()  # raises the one-line install hint
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


class DeepSpeedWorld:
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
        import deepspeed.runtime.config as ds_config

        self.module, self.saved = ds_config, ds_config.dist
        ds_config.dist = self.shim
        return self

    def __exit__(self, *exc):
        self.module.dist = self.saved
        return False
