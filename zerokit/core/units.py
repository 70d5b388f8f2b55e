"""Sizes with units: parse `80GB`, `2TiB`, `512MiB`, `1.5e9`; format bytes for humans."""

from __future__ import annotations

import math
import re

from zerokit.core.errors import ZerokitError
from zerokit.core.limits import at_most, finite_number
from zerokit.core.options import flag

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

# The only size constants in zerokit: binary units as nvidia-smi and DeepSpeed print them, decimal GB as vendors sell.
KiB = 2**10
MiB = 2**20
GiB = 2**30
GB = 10**9


UNITLESS_FLOOR = 2**20  # a size given without a unit below a MiB is taken for a missing unit (parse_size)


def parse_size(text: str | int | float, what: str = "size") -> int:
    """Bytes from a number with an optional unit. Decimal units (GB) are 10^9, binary (GiB) 2^30.

    A GPU sold as "80 GB" has 80 GiB-ish of usable memory; the catalog stores exact bytes, and users
    who type `--gpu-memory 80GB` get exactly 80e9 bytes.
    """
    if isinstance(text, bool):
        raise ZerokitError(f"{what} must be a number of bytes, got {text!r}")
    if isinstance(text, (int, float)):
        value, unit = finite_number(text, what), ""
    else:
        m = _SIZE_RE.match(str(text))
        if not m:
            raise ZerokitError(f"cannot read {what} {text!r}: use a number with an optional unit, e.g. 80GB or 2TiB")
        value, unit = finite_number(m.group(1), what), m.group(2).lower()
        if unit not in _UNITS:
            raise ZerokitError(f"unknown unit {m.group(2)!r} in {what} {text!r}: use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB")
    if value < 0:
        raise ZerokitError(f"{what} must not be negative, got {text!r}")
    if not unit and 0 < value < UNITLESS_FLOOR:
        # every memory it sizes (a GPU's, a node's RAM, an NVMe drive) is gigabytes: "--cpu-memory 512" means a unit
        # left out, not 512 bytes
        raise ZerokitError(f"{what} {text!r} has no unit, so it reads as {value:g} bytes: give one, e.g. {value:g}GB "
                           f"or {value:g}GiB")
    size = value * _UNITS[unit]
    at_most(size, "MAX_BYTES", what)
    return int(round(size))


def parse_param_count(text: str | int | float, what: str = flag("params")) -> int:
    """A parameter count, a positive integer that may be written as 7e9 or 7B (billions) / 125M (millions), at most
    MAX_PARAMS."""
    s = str(text).strip()
    mult = 1
    suffix = s[-1:].upper()
    if suffix in ("K", "M", "B", "T"):
        mult = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}[suffix]
        s = s[:-1]
    try:
        value = float(s) * mult
    except (ValueError, OverflowError):
        raise ZerokitError(f"cannot read {what} {text!r}: use a number such as 7e9, 7B or 125M") from None
    if value != value or value in (math.inf, -math.inf):
        raise ZerokitError(f"{what} must be a finite number, got {text!r}")
    if not value >= 1:
        raise ZerokitError(f"{what} must be a positive number of parameters (at least 1), got {text!r}")
    at_most(value, "MAX_PARAMS", what)
    return int(round(value))


def fmt_bytes(n: float) -> str:
    """Binary units, the way nvidia-smi and DeepSpeed's estimator print them."""
    n = float(n)
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def fmt_seconds(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.2f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.2f} h"
    return f"{s / 86400:.2f} days"
