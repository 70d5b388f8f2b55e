"""Checkpoint bookkeeping of a run directory: pure file operations shared by the rank entrypoint (which writes
checkpoints), the runner (which restarts from them) and launch preparation (which resumes them).

    <output_dir>/checkpoints/step{N}/   engine.save_checkpoint's tag folder
    <output_dir>/checkpoints/latest     the tag of the newest COMPLETE checkpoint (written by rank 0 after a
                                        barrier, atomically)
    <output_dir>/config_rejected.txt    DeepSpeed's config classes refused ds_config.json in the ranks (one line,
                                        rank 0): the run ends there, no restart (launch/prepare.py: deferred check)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from zerokit.core.fsutil import atomic_write_text

CKPT_SUBDIR = "checkpoints"
METRICS_SUBDIR = "metrics"
FINAL_SUBDIR = "final"
LATEST = "latest"
TAG_RE = re.compile(r"^step(\d+)$")
CONFIG_REJECTED = "config_rejected.txt"


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
