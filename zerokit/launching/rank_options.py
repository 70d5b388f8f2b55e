"""What one training rank is told to do: `RankOptions`, written into the run directory by `zerokit launch`
(launching/execute.py) and read back, typed, by every rank (`python -m zerokit.launching.train RUN/rank_options.json`).

A file instead of a command line: the ranks parse nothing, so an option that reaches them is declared once
(zerokit.core.options, `rank=True`) and carried as a typed field here; the file stays in the run directory as the
record of what the ranks ran. The deepspeed launcher adds `--local_rank=N` to every rank's arguments
(deepspeed/launcher/launch.py); the ranks read LOCAL_RANK from the environment it also sets.
"""

from __future__ import annotations

import json
import os
import types
import typing
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from zerokit.core.errors import ZerokitError
from zerokit.core.fsutil import atomic_write_text
from zerokit.spec.finetune import Finetune

RANK_OPTIONS_FILE = "rank_options.json"


@dataclass(frozen=True)
class RankOptions:
    """One rank's job. Fields named as the options they come from (zerokit.core.options, rank=True)."""

    model: str  # HF id, model directory, or config-only directory
    ds_config: str  # the ds_config.json path
    output_dir: str
    tokens: str | None = None  # packed tokens.npy written by `zerokit launch` (int32 [n, seq_len])
    data: str | None = None  # instead of tokens: .txt/.jsonl file or directory ("": the bundled corpus)
    tokenizer: str | None = None  # default: the model's, else the bundled one
    seq_len: int | None = None  # with data: sequence length (default 64)
    steps: int | None = None  # optimizer steps in total
    epochs: float | None = None  # passes over the data (default 1)
    save_every: int = 0  # checkpoint every K optimizer steps (0: only at the end)
    resume: bool = False  # continue from checkpoints/latest if there is one (also on every restart: attempt > 0)
    seed: int = 1234
    gradient_checkpointing: bool = False  # model.gradient_checkpointing_enable()
    # with it: the checkpointed layer inputs offloaded to host memory in forward and back for the recompute
    # (launching/ckpt_offload.py, around each step's forward and backward)
    checkpoint_offload: bool = False
    lr: float = 1e-3  # only when the config has no optimizer block
    no_save: bool = False  # no checkpoint and no final/ weights (a run that only measures)
    no_memory_meter: bool = False  # CPU: skip the live-tensor-byte meter
    memory_steps: int | None = None  # CPU: stop the meter after this many steps; None: ZEROKIT_MEMORY_STEPS or its default
    log_every: int = 1
    check_config: bool = False  # validate ds_config with DeepSpeed's config classes before anything else
    dist_backend: str | None = None  # deepspeed.init_distributed(dist_backend=...); None: DeepSpeed's default
    finetune: Finetune = Finetune()  # what trains: full, --freeze patterns, LoRA or QLoRA
    merge: bool = False  # LoRA/QLoRA: also write final/merged (the adapter merged into the base)
    tiled_loss: bool = False  # the LM head and loss through TiledFusedLogitsLoss (launching/parallel.py)
    tiled_mlp: bool = False  # every decoder MLP through TiledMLP
    compile: str = "off"  # torch / deepcompile: engine.compile() after deepspeed.initialize (spec.setup.ZeroSetup.compile)

    def __post_init__(self):
        if self.tokens is None and self.data is None:
            object.__setattr__(self, "data", "")  # the bundled corpus
        if self.steps is not None and self.epochs is not None:
            raise ZerokitError("rank options: steps and epochs exclude each other")
        if self.checkpoint_offload and not self.gradient_checkpointing:
            raise ZerokitError("rank options: checkpoint_offload needs gradient_checkpointing")
        if self.merge and not self.finetune.uses_lora:
            raise ZerokitError("rank options: merge needs a LoRA or QLoRA finetune")
        if self.no_save and (self.save_every or self.merge or self.resume):
            raise ZerokitError("rank options: no_save excludes save_every, merge and resume")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["finetune"] = self.finetune.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RankOptions":
        """Typed: an unknown key or a value of the wrong type is a ZerokitError naming it."""
        if not isinstance(d, dict):
            raise ZerokitError(f"rank options must be a JSON object, got {type(d).__name__}")
        hints = typing.get_type_hints(cls)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ZerokitError(f"rank options: unknown key {unknown[0]!r} (written by another zerokit version?)")
        values = {}
        for key, value in d.items():
            if key == "finetune":
                try:
                    values[key] = Finetune.from_dict(value or {})
                except (TypeError, ValueError, AttributeError) as e:
                    raise ZerokitError(f"rank options: finetune: {e}") from None
                continue
            if not _is_a(value, hints[key]):
                raise ZerokitError(f"rank options: {key} must be {hints[key]}, got {value!r}")
            values[key] = float(value) if hints[key] in (float, float | None) and isinstance(value, int) else value
        return cls(**values)

    def save(self, path: str | os.PathLike) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike, attempt: int = 0) -> "RankOptions":
        """The options a rank runs: the file's, resuming on every restart (as launching/runner.py relaunches), the
        CPU meter's step count from the environment when the file leaves it open."""
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ZerokitError(f"cannot read rank options {path}: {e}") from None
        opts = cls.from_dict(d)
        if attempt > 0 and not opts.resume:
            opts = replace(opts, resume=True)
        if opts.memory_steps is None:
            from zerokit.measure.step_phases import memory_steps_from_env

            opts = replace(opts, memory_steps=memory_steps_from_env())
        return opts


def _is_a(value, hint) -> bool:
    """isinstance for the annotations RankOptions uses (X, X | None); a bool is no int here, an int is a float."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for t in options:
        if t is type(None) and value is None:
            return True
        if t is bool and isinstance(value, bool):
            return True
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if t is str and isinstance(value, str):
            return True
    return False


def options_file_from_argv(argv: list[str]) -> str:
    """The rank's one argument, the options file, among what the deepspeed launcher passes (`--local_rank=N`)."""
    paths = [a for a in argv if not a.startswith("--local_rank") and not a.startswith("--local-rank")]
    if len(paths) != 1:
        raise ZerokitError("usage: python -m zerokit.launching.train RUN_DIR/rank_options.json (written by "
                           f"`zerokit launch`); got {argv}")
    return paths[0]
