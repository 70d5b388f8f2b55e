"""A user's own training script on every rank: `zerokit launch [options] -- python train.py ARGS`.

The deepspeed launcher starts, on every rank,

    python -u -m zerokit.launching.user_script --local_rank=N train.py ARGS        (or: -m MODULE ARGS)

and this module runs the script as `python train.py --local_rank=N ARGS` would run (runpy, as __main__, with
the same sys.argv the script gets under a plain `deepspeed train.py ARGS`: DeepSpeed's launcher,
deepspeed/launcher/launch.py, puts `--local_rank=N` before the script's own arguments).

Why a wrapper rather than the script itself: on CPU the memory meter (zerokit.measure.meter.MemoryMeter, exact
live tensor bytes) must be running before the script builds its model, as zerokit's own loop starts it before
building its model; a callback only runs once the Trainer exists. On CUDA nothing is started: the allocator's
counters see everything anyway. zerokit.integrations.hf.ZerokitCallback finds the meter through
active_meter() and writes the per-rank metrics the predicted-vs-measured report reads.

Environment (set by `zerokit launch`, see launching/prepare.py): ZEROKIT_OUTPUT_DIR (the run directory: the
callback writes OUT/metrics/rank{R}.jsonl there), ZEROKIT_NO_MEMORY_METER=1 to run without the CPU meter.

The parent side is here too: parse_command() reads what follows `--` on zerokit's command line and refuses what
the deepspeed launcher cannot run; script_argv() fills the placeholders ({ds_config}, {micro_batch}, ...).
Only the standard library is imported at module level (the parent stays torch-free).
"""

from __future__ import annotations

import os
import re
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path

from zerokit.core.errors import ZerokitError
from zerokit.core.options import flag
from zerokit.core.process import finish_script_rank

MODULE = "zerokit.launching.user_script"  # what the deepspeed launcher starts on every rank (--module)

# {name} in the script's arguments -> the value from the run: the config path, and what the plan chose, so the
# script trains what was planned (e.g. --per_device_train_batch_size {micro_batch}). Other braces are left alone.
PLACEHOLDERS = ("ds_config", "output_dir", "micro_batch", "grad_accum", "seq_len", "steps", "world_size")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
# How a script shows it takes the HF Trainer's --deepspeed option: through TrainingArguments (HfArgumentParser,
# TRL's SFTConfig and friends subclass it) or an option of that name of its own.
_TAKES_DEEPSPEED = re.compile(r"TrainingArguments|HfArgumentParser|SFTConfig|DPOConfig|GRPOConfig|[\'\"]--deepspeed[\'\"]")
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


@dataclass(frozen=True)
class UserCommand:
    """What follows `--` on `zerokit launch`: a Python script (or -m module) and its arguments."""

    target: str  # the script's path as given, or the module name
    is_module: bool
    args: tuple[str, ...]
    source: str  # the script's text ("" when a module's source cannot be found without importing it)

    @property
    def uses_hf_trainer(self) -> bool:
        """Whether the script takes the HF Trainer's --deepspeed (and so wants the "auto" config profile)."""
        return bool(_TAKES_DEEPSPEED.search(self.source))

    @property
    def has_config_placeholder(self) -> bool:
        return any("{ds_config}" in a for a in self.args)

    def runner_args(self, values: dict) -> list[str]:
        """The arguments of this module on every rank: the script (or -m module), then its arguments with the
        placeholders filled; `--deepspeed CONFIG` appended for a Trainer script that names no {ds_config}, and
        --bf16/--fp16 for a Trainer script in that precision that gives neither."""
        def fill(a: str) -> str:
            return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]) if values.get(m.group(1)) is not None
                                    else m.group(0), a)

        args = [fill(a) for a in self.args]
        if not self.has_config_placeholder:
            args += ["--deepspeed", str(values["ds_config"])]
        flag = {"bf16": "--bf16", "fp16": "--fp16"}.get(values.get("precision", ""))
        if flag and self.uses_hf_trainer and not any(a.split("=")[0] in ("--bf16", "--fp16") for a in self.args):
            # the Trainer matches the config's precision against its own --bf16/--fp16, False by default
            # (HfTrainerDeepSpeedConfig.trainer_config_process, fill_match): without the flag it fills an "auto"
            # precision with fp32 and refuses a concrete bf16.enabled=true as a mismatch
            args.append(flag)
        return (["-m", self.target] if self.is_module else [str(Path(self.target).resolve())]) + args


def parse_command(command: list[str] | tuple[str, ...]) -> UserCommand:
    """`python train.py ARGS`, `python -m pkg.train ARGS` or `train.py ARGS`. Raises ZerokitError (one line)."""
    cmd = list(command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ZerokitError("nothing follows `--`: give the script to run, e.g. `-- python train.py --deepspeed {ds_config}`")
    if _PYTHON.match(Path(cmd[0]).name):
        cmd = cmd[1:]
        while cmd and cmd[0] in ("-u", "-B", "-O"):  # unbuffered etc.: the launcher runs `python -u` anyway
            cmd = cmd[1:]
    elif not cmd[0].endswith(".py"):
        raise ZerokitError(f"zerokit launch runs your script under the deepspeed launcher, which starts `python SCRIPT` on "
                           f"every rank: give `-- python SCRIPT ARGS`, not `{cmd[0]} ...`")
    if not cmd:
        raise ZerokitError("no script after `python`: give `-- python train.py ARGS`")
    if cmd[0] == "-m":
        if len(cmd) < 2:
            raise ZerokitError("`python -m` needs a module name: give `-- python -m package.train ARGS`")
        import importlib.util

        try:
            spec = importlib.util.find_spec(cmd[1])
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            raise ZerokitError(f"module {cmd[1]} is not importable here: check its name, or give `-- python path/to/train.py`")
        source = Path(spec.origin).read_text(errors="replace") if spec.origin and spec.origin.endswith(".py") else ""
        return UserCommand(cmd[1], True, tuple(cmd[2:]), source)
    script = Path(cmd[0])
    if cmd[0].startswith("-"):
        raise ZerokitError(f"python option {cmd[0]} is not supported here: give `-- python train.py ARGS`")
    if not script.is_file():
        raise ZerokitError(f"script {cmd[0]} does not exist: give the path of your training script")
    return UserCommand(cmd[0], False, tuple(cmd[1:]), script.read_text(errors="replace"))


def check_config_argument(cmd: UserCommand) -> None:
    """The script must get zerokit's config: through {ds_config}, or through the HF Trainer's --deepspeed."""
    given = [a for a in cmd.args if a == "--deepspeed" or a.startswith("--deepspeed=") or a == "--deepspeed_config"]
    if given and not cmd.has_config_placeholder:
        raise ZerokitError(f"the script's arguments already name a DeepSpeed config ({given[0]} ...): pass that file "
                           f"with `zerokit launch {flag('config')} FILE` and write {{ds_config}} in its place")
    if not cmd.has_config_placeholder and not cmd.uses_hf_trainer:
        raise ZerokitError(f"{cmd.target} takes no --deepspeed option (no TrainingArguments in it) and its arguments have "
                           "no {ds_config}: write {ds_config} where the script reads its DeepSpeed config path")

_METER = None  # the MemoryMeter this process started, if any


def active_meter():
    """The started CPU MemoryMeter of this rank, or None (CUDA, metering off, or not run through this module)."""
    return _METER


def _start_meter() -> None:
    global _METER
    if os.environ.get("ZEROKIT_NO_MEMORY_METER") == "1":
        return
    import torch

    if torch.cuda.is_available():
        return
    from zerokit.measure.meter import MemoryMeter

    _METER = MemoryMeter("cpu").start()


def split_argv(argv: list[str]) -> tuple[list[str], str, bool, list[str]]:
    """(launcher arguments to hand on, script path or module, whether it is a module, the script's arguments).

    argv as the deepspeed launcher gives it: [--local_rank=N] (SCRIPT | -m MODULE) ARGS..."""
    lead = []
    while argv and argv[0].startswith("--local_rank"):
        lead.append(argv[0])
        argv = argv[1:]
        if lead[-1] == "--local_rank" and argv:  # the two-word form
            lead.append(argv[0])
            argv = argv[1:]
    if not argv:
        raise SystemExit("usage: python -m zerokit.launching.user_script [--local_rank=N] (SCRIPT | -m MODULE) [ARGS...]")
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("-m needs a module name")
        return lead, argv[1], True, argv[2:]
    return lead, argv[0], False, argv[1:]


def main(argv: list[str] | None = None) -> None:
    lead, target, is_module, args = split_argv(list(sys.argv[1:] if argv is None else argv))
    # Run as `python -m`, this module is __main__; the callback's `import zerokit.launching.user_script` must find
    # this same module object (and its meter), not a fresh copy with none.
    sys.modules.setdefault(__spec__.name if __spec__ else "zerokit.launching.user_script", sys.modules[__name__])
    _start_meter()
    sys.argv = [target] + lead + args
    try:
        if is_module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            # as `python train.py` does: the script's own directory first on sys.path
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        if exc.code in (None, 0):  # the script's own sys.exit() after success: the same clean end
            finish_script_rank()
        raise
    # Most scripts (the HF Trainer's and TRL's examples among them) leave their process group to the interpreter's
    # teardown, where gloo's can abort a finished rank: destroyed here, the script's atexit hooks run (a tracker's
    # final upload), open files flushed, and out without the teardown. zerokit.core.process says why.
    finish_script_rank()


if __name__ == "__main__":
    main()
