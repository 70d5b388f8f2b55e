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


def lookup(config: Mapping, dotted: str, default=None):
    """The value at a dotted key ("zero_optimization.offload_param.device"); default where a step is missing."""
    node = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def is_int(v) -> bool:
    """An integer as DeepSpeed counts one: JSON true and false are not."""
    return isinstance(v, int) and not isinstance(v, bool)


def derive_batch(tb, micro, accum, world_size: int):
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
    world. A degree that does not divide the world is lint_config's error (config/lint.py): the full world here."""
    sp = config.get("sequence_parallel_size")
    if is_int(sp) and sp > 1 and world_size % sp == 0:
        return world_size // sp
    return world_size


def batch_fix(config: Mapping, world_size: int) -> str:
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
    zero = config.get("zero_optimization")
    zero = zero if isinstance(zero, Mapping) else {}

    def degree(v) -> int:
        return v if is_int(v) and v > 1 else 1
    return Parallelism(tensor_parallel=degree(lookup(config, "tensor_parallel.autotp_size")),
                       sequence_parallel=degree(config.get("sequence_parallel_size")),
                       hpz_partition_size=degree(zero.get("zero_hpz_partition_size")))
