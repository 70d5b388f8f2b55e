"""Reading a ds_config: the one function that parses a ds_config file (load_config_file), and the values DeepSpeed
reads out of a config as it reads them: dotted keys, integers, the batch triple it derives, the world its batch check
counts and the TP, SP and hpZ degrees. The rest of zerokit.config (auto, lint, validate, setup) reads a config with
these; this module imports none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from zerokit.core.errors import ZerokitError
from zerokit.core.fsutil import parse_json_text
from zerokit.spec.setup import Parallelism


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


# The library's boundary: the public functions of zerokit.config take a ds_config and a world size from any caller,
# not only from the CLI (which has checked both); a value they cannot work with is refused here as the CLI refuses
# it (ZerokitError, one line), not by a ZeroDivisionError or AttributeError from deep inside.
def checked_config(config, what: str = "the ds_config") -> Mapping:
    """config, when it is a JSON object (a Mapping); ZerokitError otherwise."""
    if not isinstance(config, Mapping):
        raise ZerokitError(f"{what} is {_json_kind(config)}, not an object: a ds_config is {{...}}, as json.load "
                           "reads the file")
    return config


def checked_world_size(world_size) -> int:
    """world_size, when it is a whole number of at least 1 (DeepSpeed's world: dist.get_world_size()); ZerokitError
    otherwise (0 would divide by zero in the batch DeepSpeed derives, derive_batch)."""
    if not is_int(world_size) or world_size < 1:
        raise ZerokitError(f"world size must be a whole number of at least 1 (the ranks: GPUs per node x nodes), got "
                           f"{world_size!r}")
    return world_size


def checked_block(config: Mapping, key: str) -> Mapping:
    """The block config[key] as an object ({} where it is absent or null); ZerokitError when it is another type,
    which DeepSpeed's config classes reject (its pydantic models take keyword arguments: DeepSpeedZeroConfig(**block))."""
    block = config.get(key)
    if block is None:
        return {}
    if not isinstance(block, Mapping):
        raise ZerokitError(f"{key} is {_json_kind(block)}, DeepSpeed reads an object here: write {key}: {{...}}")
    return block


def _json_kind(value) -> str:
    kinds = ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"), (list, "an array"))
    return next((kind for t, kind in kinds if isinstance(value, t)), "null" if value is None else type(value).__name__)


def lookup(config: Mapping, dotted: str, default=None):
    """The value at a dotted key ("zero_optimization.offload_param.device"); default where a step is missing."""
    node = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


# DeepSpeed's old name of the bf16 block, which it still reads (deepspeed/runtime/precision_config.py BFLOAT16_OLD,
# get_bfloat16_config): transformers' own tests/deepspeed/ds_config_zero3_bf16.json is written with it.
BF16_OLD_NAME = "bfloat16"


def bf16_block(config: Mapping):
    """The bf16 block as DeepSpeed picks it (get_bfloat16_config): "bf16", else, where that is absent or null, the
    old "bfloat16"; None when neither is there."""
    checked_config(config)
    block = config.get("bf16")
    return config.get(BF16_OLD_NAME) if block is None else block


def precision_of(config: Mapping, auto: str | None = None) -> str:
    """The model's dtype as DeepSpeed's engine takes it (engine.get_data_types: fp16 if enabled, else bf16 under
    either name, else fp32). Where none is enabled, an enabled that is "auto" (the HF Trainer fills it) raises, unless
    `auto` says what to read the model's dtype as."""
    enabled = {}
    for name, block in (("fp16", config.get("fp16")), ("bf16", bf16_block(config))):
        enabled[name] = block.get("enabled", False) if isinstance(block, Mapping) else False
    on = [name for name, v in enabled.items() if v is True]
    if on:
        return on[0]
    waiting = [name for name, v in enabled.items() if v == "auto"]
    if waiting and auto is None:
        raise ZerokitError(f"{waiting[0]}.enabled is \"auto\": fill it first (fill_auto) with the precision the "
                           "Trainer uses")
    return auto if waiting else "fp32"


def with_bf16_name(config: dict) -> dict:
    """config with an old "bfloat16" block that DeepSpeed reads under its current name "bf16" (a copy; config itself
    when there is none), so that every reader of the precision and the "auto" the Trainer fills sees one name (the
    Trainer fills only "bf16.enabled": HfTrainerDeepSpeedConfig.trainer_config_process; accelerate adds a "bf16" block
    beside an old one for --bf16, DeepSpeedPlugin.set_mixed_precision, which DeepSpeed then reads first).
    A "bfloat16" beside a "bf16" that DeepSpeed reads is dropped: DeepSpeed ignores it (lint_config warns)."""
    if BF16_OLD_NAME not in checked_config(config):
        return config
    block = bf16_block(config)
    return {("bf16" if k == BF16_OLD_NAME else k): (block if k == BF16_OLD_NAME else v)
            for k, v in config.items() if k != "bf16"}


def is_int(v) -> bool:
    """An integer as DeepSpeed counts one: JSON true and false are not."""
    return isinstance(v, int) and not isinstance(v, bool)


def derive_batch(tb, micro, accum, world_size: int):
    """The batch triple DeepSpeed ends up with: DeepSpeedConfig._set_batch_related_parameters, floor division
    included. None when neither train_batch_size nor the micro batch is given (DeepSpeed asserts)."""
    checked_world_size(world_size)
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
    world. A degree that does not divide the world is lint_config's error (config/lint.py): the full world here."""
    checked_config(config)
    checked_world_size(world_size)
    sp = config.get("sequence_parallel_size")
    if is_int(sp) and sp > 1 and world_size % sp == 0:
        world_size //= sp
    stages = parallelism_from_config(config).pipeline_parallel  # a PipelineModule's mpu: one stage's data-parallel ranks
    if world_size % stages == 0:
        world_size //= stages
    return world_size


def batch_fix(config: Mapping, world_size: int) -> str:
    checked_config(config)
    checked_world_size(world_size)
    micro = config.get("train_micro_batch_size_per_gpu")
    accum = config.get("gradient_accumulation_steps", 1)
    if is_int(micro) and is_int(accum) and micro > 0 and accum > 0:
        return (f"set train_batch_size to {micro * accum * world_size} (= micro {micro} x accumulation {accum} "
                f"x {world_size} ranks), or drop it and let DeepSpeed derive it")
    return "make train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size"


def parallelism_from_config(config: Mapping) -> Parallelism:
    """The TP, SP and hpZ degrees a config asks for (1 where unset or off: DeepSpeed acts on autotp_size and
    zero_hpz_partition_size only above 1). Values of a type DeepSpeed cannot read count as 1 here; lint_config
    reports them."""
    checked_config(config)
    zero = config.get("zero_optimization")
    zero = zero if isinstance(zero, Mapping) else {}

    def degree(v) -> int:
        return v if is_int(v) and v > 1 else 1
    return Parallelism(tensor_parallel=degree(lookup(config, "tensor_parallel.autotp_size")),
                       sequence_parallel=degree(config.get("sequence_parallel_size")),
                       hpz_partition_size=degree(zero.get("zero_hpz_partition_size")),
                       # the pipeline block's stages ("auto" by default: the PipelineModule's own count, unknown here)
                       pipeline_parallel=degree(lookup(config, "pipeline.stages")))


# DeepSpeed's names for a data type (runtime/config.py DtypeEnum), by what zerokit calls it
_DTYPE_NAMES = {"fp16": ("torch.float16", "fp16", "float16", "half"),
                "fp32": ("torch.float32", "fp32", "float32", "float"),
                "bf16": ("torch.bfloat16", "bf16", "bfloat16")}


def grad_accum_dtype_of(config: dict) -> str | None:
    """data_types.grad_accum_dtype as fp32, bf16 or fp16 (ZeroKnobs.grad_accum_dtype); None where absent or "auto"
    (the model's own dtype, engine.get_data_types); a name DeepSpeed's DtypeEnum does not read stays as given, for
    the config checker to report."""
    block = config.get("data_types")
    value = block.get("grad_accum_dtype") if isinstance(block, dict) else None
    if value in (None, "auto"):
        return None
    return next((name for name, spellings in _DTYPE_NAMES.items() if str(value) in spellings), str(value))
