"""Atomic file writes: a reader sees the old file or the complete new one, never half of it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_text(path: str | os.PathLike, text: str, mode: int | None = None) -> Path:
    """Write text to a temporary file in the same folder, fsync, then os.replace onto path.

    mode: the file's permissions; default: the old file's, else what a plain open() would give
    (mkstemp alone would leave 0600). Raises OSError; nothing is left behind on failure.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if mode is None:
        try:
            mode = path.stat().st_mode & 0o777
        except OSError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def cache_dir(kind: str) -> Path:
    """Where zerokit caches `kind` (model_specs, checks, tokens): $ZEROKIT_CACHE_DIR/<kind>, else
    ~/.cache/zerokit/<kind>. Entries are keyed by a hash of everything that decides them; a missing, corrupt
    or unwritable cache only costs the recomputation."""
    root = os.environ.get("ZEROKIT_CACHE_DIR")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "zerokit"
    return base / kind


def package_version(name: str) -> str:
    """An installed distribution's version from its metadata (imports nothing), or "none"."""
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001 - not installed, or broken metadata
        return "none"
