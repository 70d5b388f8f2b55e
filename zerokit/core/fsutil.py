"""Atomic file writes: a reader sees the old file or the complete new one, never half of it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_text(path: str | os.PathLike, text: str, mode: int | None = None) -> Path:
    """Write text (UTF-8) atomically: see atomic_write_bytes."""
    return atomic_write_bytes(path, text.encode("utf-8"), mode)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, mode: int | None = None) -> Path:
    """Write data to a temporary file in the same folder, fsync, then os.replace onto path.

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
