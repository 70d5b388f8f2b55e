"""`zerokit check ACCELERATE.yaml`: an accelerate config that launches DeepSpeed, as the HF Trainer and TRL run ALST
(issue 28): its DeepSpeed config (the `deepspeed_config_file` beside it, or the plugin's own keys) with the Ulysses
degree of its `parallelism_config`.

What accelerate 1.15 does with each key (the oracle for this reader):
- `deepspeed_config.deepspeed_config_file`: the ds_config, read as is (utils/dataclasses.py DeepSpeedPlugin).
- without one, DeepSpeedPlugin.__post_init__ builds the config from `zero_stage` (default 2),
  `offload_optimizer_device` / `offload_param_device` (default none), `gradient_accumulation_steps` and
  `gradient_clipping` (default "auto"), with "auto" micro and global batch; `mixed_precision` bf16/fp16 adds the
  precision block (DeepSpeedPlugin.set_mixed_precision).
- `parallelism_config.parallelism_config_sp_size` > 1 needs `parallelism_config_sp_backend: deepspeed`
  (accelerator.py: "In order to use the configured sp_size with DeepSpeed, you need to configure
  sp_backend='deepspeed'"); dp_replicate x dp_shard x sp must be the processes (parallelism_config.py). accelerate
  hands the degree to DeepSpeed through Ulysses' mpu, not a config key; zerokit prices it as the ds_config's
  `sequence_parallel_size` (config/read.py parallelism_from_config), the same groups.
- `num_processes` (all machines) and `num_machines`: the ranks.
- any other `deepspeed_config` key: `accelerate launch` copies each key onto its parsed arguments
  (commands/launch.py `_validate_launch_command`) and reads only its own options, so the rest are dropped without a
  word (`ignored_plugin_keys`). DeepSpeed's nested `offload_optimizer: {device: cpu}` written there is the costly one:
  the launch keeps the optimizer on the GPU (the HF Ulysses blog's "Best Practices" YAML is written so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from zerokit.core.errors import ZerokitError

ACCELERATE_SUFFIXES = (".yaml", ".yml")


@dataclass
class AccelerateConfig:
    ds_config: dict
    source: str  # where the ds_config came from: the file, or "the accelerate config's deepspeed_config keys"
    processes: int | None  # num_processes (every machine's), None when not given
    machines: int
    sequence_parallel: int
    ignored: list = field(default_factory=list)  # lint Findings: deepspeed_config keys accelerate does not read


def is_accelerate_config(path) -> bool:
    return Path(str(path)).suffix.lower() in ACCELERATE_SUFFIXES


def _int(value, key: str, path) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ZerokitError(f"{path}: {key} is {value!r}: accelerate reads a positive whole number there")
    return value


def read_accelerate_config(path) -> AccelerateConfig:
    """The ds_config an accelerate config launches with, its ranks and its Ulysses degree; one-line ZerokitError for
    what accelerate would refuse or zerokit cannot read."""
    import yaml

    from zerokit.config.read import load_config_file

    p = Path(str(path))
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ZerokitError(f"config file {p} does not exist: check the path") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ZerokitError(f"cannot read config file {p}: {e}") from None
    except yaml.YAMLError as e:
        raise ZerokitError(f"{p} is not valid YAML ({str(e).splitlines()[0]}): fix the file") from None
    if not isinstance(data, dict):
        raise ZerokitError(f"{p} holds a YAML {type(data).__name__}, not an accelerate config (a mapping of keys)")
    kind = data.get("distributed_type")
    if kind != "DEEPSPEED":
        raise ZerokitError(f"{p}: distributed_type is {kind!r}: zerokit checks DeepSpeed launches, "
                           "distributed_type: DEEPSPEED")
    plugin = data.get("deepspeed_config") or {}
    if not isinstance(plugin, dict):
        raise ZerokitError(f"{p}: deepspeed_config is not a mapping: give its keys (zero_stage, ... or "
                           "deepspeed_config_file)")
    file = plugin.get("deepspeed_config_file")
    if file:
        ds_path = Path(str(file))
        if not ds_path.is_absolute() and not ds_path.exists() and (p.parent / ds_path).exists():
            ds_path = p.parent / ds_path  # accelerate opens it from the working directory; beside the YAML too
        ds_config, source = load_config_file(ds_path), str(ds_path)
    else:
        ds_config, source = _plugin_config(plugin, p), f"{p}'s deepspeed_config keys"
        precision = data.get("mixed_precision")
        if precision in ("bf16", "fp16"):
            ds_config[precision] = {"enabled": True}
    machines = _int(data.get("num_machines", 1), "num_machines", p)
    processes = data.get("num_processes")
    processes = None if processes is None else _int(processes, "num_processes", p)
    par = data.get("parallelism_config") or {}
    if not isinstance(par, dict):
        raise ZerokitError(f"{p}: parallelism_config is not a mapping of parallelism_config_* keys")

    def pc(name: str, default):
        return par.get(f"parallelism_config_{name}", par.get(name, default))

    sp = _int(pc("sp_size", 1), "parallelism_config_sp_size", p)
    if sp > 1:
        backend = pc("sp_backend", "deepspeed")
        if backend != "deepspeed":
            raise ZerokitError(f"{p}: parallelism_config_sp_size {sp} with sp_backend {backend!r}: accelerate runs "
                               "sequence parallelism with DeepSpeed only through sp_backend: deepspeed")
        given = ds_config.get("sequence_parallel_size")
        if given not in (None, 1, sp):
            raise ZerokitError(f"{p}: parallelism_config_sp_size {sp} disagrees with {source}'s sequence_parallel_size "
                               f"{given}: make them equal, or drop the config's key")
        ds_config = {**ds_config, "sequence_parallel_size": sp}
        if processes is not None:
            product = _int(pc("dp_replicate_size", 1), "parallelism_config_dp_replicate_size", p) * _int(
                pc("dp_shard_size", 1), "parallelism_config_dp_shard_size", p) * sp
            if product != processes and product != sp:
                raise ZerokitError(f"{p}: dp_replicate_size x dp_shard_size x sp_size = {product}, but num_processes is "
                                   f"{processes}: accelerate requires them equal")
    return AccelerateConfig(ds_config, source, processes, machines, sp, ignored_plugin_keys(plugin))


def ignored_plugin_keys(plugin: dict) -> list:
    """A warning (lint Finding) for each `deepspeed_config` key that is not an option of `accelerate launch`, the
    installed accelerate's own parser being the oracle; none when accelerate is not installed."""
    from zerokit.config.lint import Finding

    try:
        from accelerate.commands.launch import launch_command_parser
    except ImportError:
        return []
    options = vars(launch_command_parser().parse_args(["train.py"]))
    out = []
    for key, value in plugin.items():
        if key in options:
            continue
        if key in ("offload_optimizer", "offload_param"):
            device = value.get("device") if isinstance(value, dict) else value
            held = "optimizer states" if key == "offload_optimizer" else "parameters"
            message = (f"accelerate reads {key}_device, not {key}: this launch keeps the {held} on the GPU (priced so); "
                       f"write {key}_device: {device or 'cpu'}")
        else:
            message = ("not an option accelerate reads: it is dropped (a DeepSpeed key belongs in a "
                       "deepspeed_config_file)")
        out.append(Finding("warning", f"deepspeed_config.{key}", message))
    return out


def _plugin_config(plugin: dict, path) -> dict:
    """DeepSpeedPlugin.__post_init__'s config when there is no deepspeed_config_file (accelerate 1.15)."""
    zero: dict = {"stage": plugin.get("zero_stage", 2)}
    for name in ("offload_optimizer", "offload_param"):
        device = plugin.get(f"{name}_device", "none")
        zero[name] = {"device": device}
        nvme = plugin.get(f"{name}_nvme_path")
        if device == "nvme" and nvme:
            zero[name]["nvme_path"] = nvme
    config = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
              "gradient_accumulation_steps": plugin.get("gradient_accumulation_steps", "auto"),
              "zero_optimization": zero}
    clipping = plugin.get("gradient_clipping", "auto")
    if clipping:
        config["gradient_clipping"] = clipping
    return config
