"""`zerokit launch --report-to tensorboard|wandb|csv`: where a run's curves go, as DeepSpeed's own monitor writes them.

DeepSpeed's engine has one monitor (deepspeed/monitor/monitor.py MonitorMaster, built in DeepSpeedEngine.__init__
from the ds_config's `tensorboard`, `wandb` and `csv_monitor` blocks: deepspeed/monitor/config.py). It logs the
learning rate itself at every optimizer step ("Train/Samples/lr" at engine.global_samples, engine.step), and a
training loop writes its own scalars through `engine.monitor.write_events([(tag, value, step), ...])`, on rank 0 only.
So zerokit renders those blocks into the run's ds_config (with_monitor) and zerokit's loop writes its step figures
through the engine's monitor (launching/train.py); nothing here imports DeepSpeed or a tracker.

Where each writes (DeepSpeed joins output_path and job_name: TensorBoardMonitor.get_summary_writer,
csvMonitor.setup_log_dir; wandb.init takes its directory from $WANDB_DIR, which the ranks get):

    REPORT_DIR/tensorboard/RUN/events.out.tfevents.*    tensorboard --logdir REPORT_DIR/tensorboard
    REPORT_DIR/csv/RUN/Train_Samples_loss.csv, ...       one file per scalar: step,value
    REPORT_DIR/wandb/[offline-]run-*/                    W&B project $WANDB_PROJECT (default zerokit), group RUN

RUN is the run directory's name, so one --report-dir shared by several runs shows them side by side.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from zerokit.core.errors import ZerokitError
from zerokit.core.options import flag

TRACKERS = ("tensorboard", "wandb", "csv")
NONE = "none"
# the ds_config block DeepSpeed reads for each (deepspeed/monitor/config.py get_monitor_config)
CONFIG_KEYS = {"tensorboard": "tensorboard", "wandb": "wandb", "csv": "csv_monitor"}
# the package each needs beside DeepSpeed: TensorBoardMonitor writes with torch.utils.tensorboard.SummaryWriter,
# which needs the `tensorboard` package (deepspeed/monitor/utils.py check_tb_availability); WandbMonitor imports
# wandb. DeepSpeed's csvMonitor writes with the standard library's csv module.
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}
# the HF Trainer's own integrations for a user's script (transformers integration_utils INTEGRATION_TO_CALLBACK); it
# has no CSV reporter
TRAINER_REPORTERS = ("tensorboard", "wandb")
DEFAULT_WANDB_PROJECT = "zerokit"  # DeepSpeed's WandbConfig default is "deepspeed"; $WANDB_PROJECT overrides it


def trackers_from(names) -> tuple[str, ...]:
    """--report-to's values (repeatable), duplicates dropped, in the order given; `none` alone means none (the
    default). `none` beside a tracker is a contradiction: one line."""
    names = list(dict.fromkeys(names or ()))
    if NONE in names and len(names) > 1:
        others = ", ".join(n for n in names if n != NONE)
        raise ZerokitError(f"{flag('report-to')} none and {others} contradict each other: drop {flag('report-to')} "
                           "none (it is the default) or the trackers")
    unknown = [n for n in names if n not in TRACKERS + (NONE,)]
    if unknown:
        raise ZerokitError(f"{flag('report-to')} {unknown[0]}: expected one of {', '.join(TRACKERS + (NONE,))}")
    return tuple(n for n in names if n != NONE)


def check_installed(trackers) -> None:
    """One line naming the package a tracker needs when it is not installed here (the ranks run this machine's
    software; on other hosts the same is assumed). Finds, imports nothing: importlib.util.find_spec."""
    for t in trackers:
        pkg = PACKAGES.get(t)
        if pkg and importlib.util.find_spec(pkg) is None:
            raise ZerokitError(f"{flag('report-to')} {t} needs the {pkg} package, which is not installed: pip install "
                               f"{pkg} (or pip install 'zerokit[track]')")


def report_dir_for(report_dir: str | None, run_dir: Path, trackers) -> Path | None:
    """The directory the trackers write under (absolute): --report-dir, else the run directory. --report-dir without
    a tracker, or naming a file: one line."""
    if report_dir is not None and not trackers:
        raise ZerokitError(f"{flag('report-dir')} says where {flag('report-to')}'s trackers write: give "
                           f"{flag('report-to')} tensorboard, wandb or csv too, or drop {flag('report-dir')}")
    if not trackers:
        return None
    d = Path(report_dir).expanduser() if report_dir is not None else run_dir
    if d.exists() and not d.is_dir():
        raise ZerokitError(f"{flag('report-dir')} {d} is a file: give a directory")
    return d.resolve()


def job_name(run_dir: Path) -> str:
    """What names the run in every tracker: the run directory's name."""
    return Path(run_dir).resolve().name


def monitor_blocks(trackers, report_dir: Path, name: str, env: dict | None = None) -> dict:
    """The ds_config blocks DeepSpeed's monitor reads (deepspeed/monitor/config.py TensorBoardConfig, WandbConfig,
    CSVConfig), for the trackers asked for. W&B's project is $WANDB_PROJECT (else zerokit), its entity $WANDB_ENTITY
    (WandbConfig.team None: wandb.init reads the variable itself)."""
    env = os.environ if env is None else env
    blocks = {}
    if "tensorboard" in trackers:
        blocks["tensorboard"] = {"enabled": True, "output_path": str(report_dir / "tensorboard"), "job_name": name}
    if "wandb" in trackers:
        blocks["wandb"] = {"enabled": True, "project": env.get("WANDB_PROJECT") or DEFAULT_WANDB_PROJECT,
                           "group": name}
    if "csv" in trackers:
        blocks["csv_monitor"] = {"enabled": True, "output_path": str(report_dir / "csv"), "job_name": name}
    return blocks


def with_monitor(ds_config: dict, trackers, report_dir: Path, name: str, env: dict | None = None) -> dict:
    """The ds_config with the monitor blocks of `trackers` set (a config's own blocks for other trackers stay)."""
    if not trackers:
        return ds_config
    return {**ds_config, **monitor_blocks(trackers, report_dir, name, env)}


def rank_env(trackers, report_dir: Path, name: str, trainer: bool = False, env: dict | None = None) -> dict:
    """Variables the ranks need for the trackers: wandb.init's directory ($WANDB_DIR: DeepSpeed's WandbMonitor passes
    none); for a user's Trainer script also where its TensorBoardCallback writes ($TENSORBOARD_LOGGING_DIR,
    transformers integration_utils) and its WandbCallback's project and group ($WANDB_PROJECT, $WANDB_RUN_GROUP),
    unless the user set them."""
    env = os.environ if env is None else env
    out = {}
    if "wandb" in trackers:
        out["WANDB_DIR"] = str(report_dir)
        if trainer:
            out["WANDB_PROJECT"] = env.get("WANDB_PROJECT") or DEFAULT_WANDB_PROJECT
            out["WANDB_RUN_GROUP"] = env.get("WANDB_RUN_GROUP") or name
    if "tensorboard" in trackers and trainer:
        out["TENSORBOARD_LOGGING_DIR"] = str(report_dir / "tensorboard" / name)
    return out


def trainer_report_to(trackers, script_args) -> list[str]:
    """The `--report_to NAME` a user's HF Trainer script gets. The Trainer's HfArgumentParser reads one value for
    report_to from a command line (transformers TrainingArguments.report_to; a second --report_to replaces the
    first), and the Trainer has no CSV reporter: both are one line here, as is a script that names its own."""
    if not trackers:
        return []
    if any(a == "--report_to" or a.startswith("--report_to=") for a in script_args):
        raise ZerokitError(f"the script's arguments already give --report_to and zerokit launch {flag('report-to')} "
                           "would add another: drop one of them")
    if "csv" in trackers:
        raise ZerokitError(f"{flag('report-to')} csv: the HF Trainer has no CSV reporter (its report_to takes "
                           "tensorboard, wandb, ...): use tensorboard or wandb for a Trainer script")
    if len(trackers) > 1:
        raise ZerokitError(f"{flag('report-to')} {' and '.join(trackers)}: a Trainer script takes one --report_to on "
                           "its command line (HfArgumentParser reads one value): give one, or set report_to=[...] in "
                           "the script's TrainingArguments")
    return ["--report_to", trackers[0]]


def locations(trackers, report_dir: Path | None, name: str, env: dict | None = None) -> dict[str, str]:
    """tracker -> where its curves are, as the run report names them."""
    env = os.environ if env is None else env
    out = {}
    if not trackers or report_dir is None:
        return out
    if "tensorboard" in trackers:
        out["tensorboard"] = f"{report_dir / 'tensorboard' / name} (tensorboard --logdir {report_dir / 'tensorboard'})"
    if "wandb" in trackers:
        project = env.get("WANDB_PROJECT") or DEFAULT_WANDB_PROJECT
        where = f"W&B project {project}, group {name}; files in {report_dir / 'wandb'}"
        if (env.get("WANDB_MODE") or "").lower() in ("offline", "dryrun"):
            where += f" (offline: upload with wandb sync {report_dir / 'wandb'}/offline-run-*)"
        out["wandb"] = where
    if "csv" in trackers:
        out["csv"] = f"{report_dir / 'csv' / name}/*.csv (step,value per scalar)"
    return out
