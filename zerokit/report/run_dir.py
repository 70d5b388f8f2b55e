"""A `zerokit launch` output folder's records, named and read in one place: the launch record (launch.json, what
launching/execute.py writes before the ranks start: the command, the setup, the plan's prediction, what trains) and
the ranks' metrics (metrics/rank{R}.jsonl, one JSON record a line, appended by launching/checkpoints.py MetricsLog).
Resume, learn, the run report and the training loop's closing figures read them through here."""

from __future__ import annotations

import json
import os
from pathlib import Path

LAUNCH_RECORD = "launch.json"
METRICS_SUBDIR = "metrics"


def launch_record_path(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / LAUNCH_RECORD


def launch_record(output_dir: str | os.PathLike) -> dict | None:
    """The run's launch record, or None where there is none to read: a folder written by ranks started without
    `zerokit launch`, or by an --sbatch script not yet run, or a record that is not a JSON object."""
    try:
        record = json.loads(launch_record_path(output_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def metrics_file(output_dir: str | os.PathLike, rank: int) -> Path:
    return Path(output_dir) / METRICS_SUBDIR / f"rank{rank}.jsonl"


def metrics_files(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(rank, file) of every rank's metrics file, by rank."""
    found = []
    for f in (Path(output_dir) / METRICS_SUBDIR).glob("rank*.jsonl"):
        try:
            found.append((int(f.stem[4:]), f))
        except ValueError:
            continue
    return sorted(found)
