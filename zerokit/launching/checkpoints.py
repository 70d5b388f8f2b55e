"""Checkpoint bookkeeping of a run directory: pure file operations shared by the rank entrypoint (which writes
checkpoints), the runner (which restarts from them) and launch preparation (which resumes them).

    <output_dir>/checkpoints/step{N}/   engine.save_checkpoint's tag folder
    <output_dir>/checkpoints/latest     the tag of the newest COMPLETE checkpoint (written by rank 0 after a
                                        barrier, atomically)
    <output_dir>/checkpoints/step{N}/zerokit.json       world size, micro batch, accumulation that wrote it
    <output_dir>/checkpoints/step{N}_universal/         DeepSpeed's universal checkpoint of step{N}, converted
                                        for a resume on another number of ranks (convert_to_universal)
    <output_dir>/metrics/rank{R}.jsonl  one JSON record per line ("start", "step", "end"): MetricsLog writes them
                                        (zerokit's loop and ZerokitCallback), report/run_report.read_metrics reads
    <output_dir>/config_rejected.txt    DeepSpeed's config classes refused ds_config.json in the ranks (one line,
                                        rank 0): the run ends there, no restart (launching/prepare.py: deferred check)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from zerokit.core.errors import ZerokitError
from zerokit.core.fsutil import atomic_write_text
from zerokit.core.options import flag
from zerokit.report.run_dir import metrics_file

CKPT_SUBDIR = "checkpoints"
FINAL_SUBDIR = "final"
LATEST = "latest"
TAG_RE = re.compile(r"^step(\d+)$")
CONFIG_REJECTED = "config_rejected.txt"


class MetricsLog:
    """Appends a rank's metrics records to <output_dir>/metrics/rank{R}.jsonl, one flushed line each (a kill cuts at
    most the last line, which read_metrics skips)."""

    def __init__(self, output_dir: str | os.PathLike, rank: int):
        path = metrics_file(output_dir, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(path, "a", buffering=1)

    def write(self, rec: dict) -> None:
        self.fh.write(json.dumps(rec) + "\n")
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


def config_rejection(output_dir: str | os.PathLike) -> str | None:
    """The one-line reason the ranks gave for refusing the run's ds_config.json, or None."""
    try:
        return (Path(output_dir) / CONFIG_REJECTED).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def write_config_rejection(output_dir: str | os.PathLike, message: str) -> None:
    atomic_write_text(Path(output_dir) / CONFIG_REJECTED, message.strip() + "\n")


def tag_for_step(step: int) -> str:
    return f"step{step}"


def step_of_tag(tag: str) -> int | None:
    m = TAG_RE.match(tag.strip())
    return int(m.group(1)) if m else None


def read_latest(ckpt_dir: str | os.PathLike) -> str | None:
    """The tag of the newest complete checkpoint, or None."""
    p = Path(ckpt_dir) / LATEST
    try:
        tag = p.read_text().strip()
    except OSError:
        return None
    return tag if tag and (Path(ckpt_dir) / tag).is_dir() else None


def latest_step(ckpt_dir: str | os.PathLike) -> int:
    tag = read_latest(ckpt_dir)
    return (step_of_tag(tag) or 0) if tag else 0


def write_latest(ckpt_dir: str | os.PathLike, tag: str) -> None:
    """Mark `tag` complete: write the tag to a temporary file, fsync, and rename over `latest`."""
    ckpt_dir = Path(ckpt_dir)
    atomic_write_text(ckpt_dir / LATEST, tag, mode=0o644)
    try:  # and make the rename itself durable
        fd = os.open(ckpt_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def stale_checkpoints(ckpt_dir: str | os.PathLike) -> list[Path]:
    """Tag directories that `latest` does not cover: written by a run that died before marking them."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    done = latest_step(ckpt_dir) if read_latest(ckpt_dir) else -1
    out = []
    for d in ckpt_dir.iterdir():
        s = step_of_tag(d.name) if d.is_dir() else None
        if s is not None and s > done:
            out.append(d)
    return sorted(out)


# ----------------------------------------------------------------------------------------------
# resuming on another number of ranks (DeepSpeed's universal checkpoint)

SHAPE_FILE = "zerokit.json"  # in each tag folder: the world that wrote it (rank 0, before `latest` marks it)
UNIVERSAL_SUFFIX = "_universal"
_ZERO_OPTIM_RE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")


@dataclass(frozen=True)
class CheckpointShape:
    """The batch geometry of the run that wrote a checkpoint: what a resume on another world size must hold."""

    tag: str
    step: int
    world_size: int
    micro_batch: int | None = None  # per rank
    grad_accum: int | None = None
    zero_stage: int | None = None
    precision: str | None = None  # fp32 | bf16 | fp16
    zero_partitions: int = 0  # zero_pp_rank_*_optim_states.pt files: 0 = ZeRO-0, whose optimizer is not partitioned
    # the AutoTP and Ulysses degrees (ranks of one TP or SP group read the same samples: launching/parallel.py RankLayout)
    tensor_parallel: int = 1
    sequence_parallel: int = 1
    # pipeline stages (launching/pipeline.py): each stage's ZeRO-1 partitions and layer files belong to its stage
    pipeline_parallel: int = 1

    @property
    def data_parallel(self) -> int:
        return max(1, self.world_size // (self.tensor_parallel * self.sequence_parallel * self.pipeline_parallel))

    @property
    def global_batch(self) -> int | None:
        return self.micro_batch * self.grad_accum * self.data_parallel if self.micro_batch and self.grad_accum else None


@dataclass(frozen=True)
class Resize:
    """A resume whose world size differs from the checkpoint's: convert once, hold the global batch."""

    old: CheckpointShape
    new_world_size: int

    @property
    def needs_conversion(self) -> bool:
        # ZeRO-0's optimizer state is whole in mp_rank_00_model_states.pt: any world size loads it as it is
        # (engine._load_checkpoint); ZeRO-1/2/3 shard it per rank, which only ds_to_universal can re-cut
        return self.old.zero_partitions > 0

    @property
    def universal_tag(self) -> str:
        return self.old.tag + UNIVERSAL_SUFFIX


def write_shape(tag_dir: str | os.PathLike, world_size: int, micro_batch: int, grad_accum: int, zero_stage: int,
                precision: str, tensor_parallel: int = 1, sequence_parallel: int = 1, pipeline_parallel: int = 1) -> None:
    atomic_write_text(Path(tag_dir) / SHAPE_FILE, json.dumps(
        {"world_size": world_size, "micro_batch": micro_batch, "grad_accum": grad_accum, "zero_stage": zero_stage,
         "precision": precision, "tensor_parallel": tensor_parallel, "sequence_parallel": sequence_parallel,
         "pipeline_parallel": pipeline_parallel}) + "\n")


def read_shape(ckpt_dir: str | os.PathLike) -> CheckpointShape | None:
    """The latest complete checkpoint's shape, read without torch: zerokit's SHAPE_FILE, else (a checkpoint written
    before it existed) the world size from DeepSpeed's per-rank optimizer shard files. None: no checkpoint, or a
    ZeRO-0 checkpoint without SHAPE_FILE (one file for any world size: nothing to tell)."""
    tag = read_latest(ckpt_dir)
    if tag is None:
        return None
    tag_dir = Path(ckpt_dir) / tag
    shards = {int(m.group(1)) for f in tag_dir.iterdir() if (m := _ZERO_OPTIM_RE.match(f.name))}
    try:
        d = json.loads((tag_dir / SHAPE_FILE).read_text())
        return CheckpointShape(tag=tag, step=step_of_tag(tag) or 0, world_size=int(d["world_size"]),
                               micro_batch=int(d["micro_batch"]), grad_accum=int(d["grad_accum"]),
                               zero_stage=d.get("zero_stage"), precision=d.get("precision"),
                               zero_partitions=len(shards), tensor_parallel=int(d.get("tensor_parallel", 1)),
                               sequence_parallel=int(d.get("sequence_parallel", 1)),
                               pipeline_parallel=int(d.get("pipeline_parallel", 1)))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if not shards:
        return None
    return CheckpointShape(tag=tag, step=step_of_tag(tag) or 0, world_size=len(shards), zero_partitions=len(shards))


def detect_resize(ckpt_dir: str | os.PathLike, new_world_size: int) -> Resize | None:
    """A Resize when the latest checkpoint was written by another number of ranks; None: resume as it is."""
    shape = read_shape(ckpt_dir)
    if shape is None or shape.world_size == new_world_size:
        return None
    return Resize(old=shape, new_world_size=new_world_size)


def check_resize_parallelism(resize: Resize, tensor_parallel: int, sequence_parallel: int) -> None:
    """What a resume on another world size can change: the data-parallel degree only.
    - A Ulysses SP checkpoint: DeepSpeed 0.19.8 cannot re-cut one. Its SP mpu answers the tensor-parallel questions (the
      checkpoint records tp_degree = sp: engine._checkpoint_parallel_metadata, so ds_to_universal counts one model
      file short), and with that fixed, loading the universal checkpoint asks parallel_state_sp for
      get_tensor_model_parallel_world_size, which it lacks (stage_1_and_2._load_universal_checkpoint ->
      base_optimizer.load_hp_checkpoint_state_from_checkpoint_dir). Both seen on 2 -> 4 CPU ranks at SP 2.
    - AutoTP at another degree: the checkpoint's shards are TP slices that zerokit does not re-cut. At the same degree
      (TP 2 on 2 ranks -> TP 2 x DP 2 on 4) the universal path reproduces the uninterrupted run (tests/test_resize.py)."""
    old = resize.old
    if old.sequence_parallel > 1:
        raise ZerokitError(f"{flag('resume')}: checkpoint {old.tag} was written by a sequence-parallel run (SP "
                           f"{old.sequence_parallel} on {old.world_size} ranks), which DeepSpeed 0.19.8 cannot reload "
                           f"on another number of ranks (its universal checkpoint does not know SP): resume on "
                           f"{old.world_size} ranks")
    if sequence_parallel > 1:
        raise ZerokitError(f"{flag('resume')} on {resize.new_world_size} ranks with sequence parallelism: DeepSpeed "
                           f"0.19.8 loads a universal checkpoint only without it: resume on {old.world_size} ranks, or "
                           "without sequence_parallel_size")
    if tensor_parallel != old.tensor_parallel:
        raise ZerokitError(f"{flag('resume')}: checkpoint {old.tag} holds AutoTP slices of degree "
                           f"{old.tensor_parallel}; this run asks for {tensor_parallel}: keep "
                           f"tensor_parallel.autotp_size {old.tensor_parallel} (only the data-parallel degree may "
                           "change)")


def held_accumulation(global_batch: int, micro_batch: int, world_size: int, ranks_per_replica: int = 1) -> int:
    """Gradient accumulation that keeps `global_batch` on `world_size` data-parallel replicas of `micro_batch` (the
    ranks, without TP or SP): one line naming the global batch and the world sizes that would split it when it does
    not divide."""
    per_step = micro_batch * world_size
    if global_batch % per_step:
        fits = [w * ranks_per_replica for w in range(1, global_batch // micro_batch + 1)
                if global_batch % (micro_batch * w) == 0][:8]
        replicas = f"{world_size} ranks" if ranks_per_replica == 1 else f"{world_size} data-parallel replicas"
        raise ZerokitError(f"the checkpoint's global batch {global_batch} cannot be split into micro batch "
                           f"{micro_batch} x {replicas}: resume on {', '.join(map(str, fits))} ranks "
                           f"({flag('gpus-per-node')}/{flag('nodes')}), or use a {flag('config')} whose micro batch "
                           "divides it")
    return global_batch // per_step


def convert_to_universal(ckpt_dir: str | os.PathLike, resize: Resize) -> Path:
    """checkpoints/<tag>_universal from checkpoints/<tag>, once, with DeepSpeed's own converter
    (deepspeed/checkpoint/ds_to_universal.py). Run in a subprocess: the launching process imports no torch, and
    the converter's worker pools and prints stay out of it. `--inject_missing_state`: zerokit's ZeRO-1/2 engines
    do not save UNIVERSAL_CHECKPOINT_INFO (only Megatron-style clients do); ds_to_universal refuses a ZeRO-2
    checkpoint without it (measured: docs/measured-on-cpu.md "Checkpoints"). Written into a
    temporary folder and renamed: a failed conversion leaves the checkpoint and no half-converted copy."""
    ckpt_dir = Path(ckpt_dir)
    dest = ckpt_dir / resize.universal_tag
    if dest.is_dir():
        return dest
    tmp = ckpt_dir / f".{resize.universal_tag}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
           str(ckpt_dir / resize.old.tag), "--output_folder", str(tmp), "--inject_missing_state",
           "--num_extract_workers", "1", "--num_merge_workers", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        n = resize.new_world_size
        raise ZerokitError(f"cannot convert checkpoint {resize.old.tag} (written by {resize.old.world_size} ranks) to a "
                           f"universal checkpoint for {n} rank{'s' * (n > 1)}: {lines[-1] if lines else 'no output'}; "
                           f"resume on {resize.old.world_size} ranks instead")
    os.replace(tmp, dest)
    # the converter names its output folder (our temporary one) in <parent>/latest_universal, which
    # engine.load_checkpoint(tag=None) reads under load_universal; the ranks pass the tag, but keep the file true
    atomic_write_text(ckpt_dir / "latest_universal", resize.universal_tag, mode=0o644)
    return dest
