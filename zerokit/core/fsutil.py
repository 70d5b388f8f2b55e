"""Atomic file writes: a reader sees the old file or the complete new one, never half of it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_text(path: str | os.PathLike, text: str, mode: int | None = None) -> Path:
    """Write text (UTF-8) atomically: see atomic_write_bytes."""
    return atomic_write_bytes(path, text.encode("utf-8"), mode)


def missing_folders(path: str | os.PathLike) -> list[Path]:
    """The folders above path that do not exist yet, outermost first (what `mkdir -p` of its folder would create)."""
    missing = []
    folder = Path(path).expanduser().absolute().parent
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing[::-1]


def remove_folders(folders: list[Path]) -> None:
    """Undo missing_folders' creation: remove those that are still empty, innermost first."""
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:
            pass


def check_writable_file(path: str | os.PathLike, what: str) -> Path:
    """Refuse, before any work, an output file that could not be written; `what` names it in the message (the
    option, e.g. "--plot m.svg"). Folders that do not exist yet are fine: every writer creates them as `mkdir -p`
    does (atomic_write_bytes), so the nearest existing folder above path must be a writable folder."""
    from zerokit.core.errors import ZerokitError

    p = Path(path).expanduser()
    if p.is_dir():
        raise ZerokitError(f"{what} is a folder: give a file name in it")
    missing = missing_folders(p)
    existing = (missing[0] if missing else p.absolute()).parent
    if not existing.is_dir():
        raise ZerokitError(f"{what}: cannot create anything under {existing}, which is a file: choose another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ZerokitError(f"{what}: cannot write in {existing}: choose a writable folder")
    return p


def atomic_write_bytes(path: str | os.PathLike, data: bytes, mode: int | None = None) -> Path:
    """Write data to a temporary file in the same folder, fsync, then os.replace onto path.

    Missing folders above path are created first, as `mkdir -p` (the same for every file zerokit writes: render -o,
    plan --plot, calibrate -o, launch --sbatch / --k8s), and removed again if the write fails.
    mode: the file's permissions; default: the old file's, else what a plain open() would give
    (mkstemp alone would leave 0600). Raises OSError; nothing is left behind on failure.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    created = missing_folders(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        remove_folders(created)
        raise
    if mode is None:
        try:
            mode = path.stat().st_mode & 0o777
        except OSError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    except BaseException:
        remove_folders(created)
        raise
    try:
        os.chmod(tmp, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        remove_folders(created)
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
    except Exception:  # not installed, or broken metadata
        return "none"


# Nesting deeper than this is refused before Python's json recursion does it for us (RecursionError at ~1,000 levels
# in the C parser's Python fallback); real configs nest 4 levels at most (zero_optimization.offload_param.device).
MAX_JSON_DEPTH = 64


def parse_json_text(text: str, source: str, reject_duplicates: bool = False):
    """JSON as RFC 8259 defines it: NaN and Infinity (which Python's json accepts) are refused, and so is nesting
    deeper than MAX_JSON_DEPTH and, when asked, a key given twice. Raises ZerokitError (one line, naming `source`)."""
    import json

    from zerokit.core.errors import ZerokitError

    def constant(name):
        raise ZerokitError(f"{source} holds {name}, which is not a JSON number: write a finite number")

    def pairs(items):
        out = {}
        for k, v in items:
            if reject_duplicates and k in out:
                raise ZerokitError(f"{source} has the key {k!r} twice: keep one (DeepSpeed rejects duplicates)")
            out[k] = v
        return out

    depth = 0
    in_string = escaped = False
    for c in text:  # outside strings, brackets open and close levels
        if in_string:
            escaped, in_string = (False, True) if escaped else (c == "\\", c != '"')
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise ZerokitError(f"{source} nests deeper than {MAX_JSON_DEPTH} levels: a config is a few levels deep")
        elif c in "]}":
            depth -= 1
    try:
        return json.loads(text, parse_constant=constant, object_pairs_hook=pairs)
    except json.JSONDecodeError as e:
        raise ZerokitError(f"{source} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise ZerokitError(f"{source} nests too deeply to read: a config is a few levels deep") from None
