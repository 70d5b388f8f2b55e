"""DeepSpeed's speed features beyond ZeRO's partitioning: what each needs before a plan may use it.

Each rule reads the installed packages' versions from their metadata (importlib.metadata: no import of deepspeed or
torch, so `plan` stays instant) and says in one line why a feature cannot run, or None. Where DeepSpeed is not
installed (planning for another machine) the version is not judged: the launch there is.
"""

from __future__ import annotations

from zerokit.core.options import flag

# DeepCompile "is available in DeepSpeed versions >= 0.16.6" (DeepSpeed's blogs/deepcompile/README.md); it needs
# torch >= 2.6 and a CUDA device (deepspeed/compile/util.py is_deepcompile_supported), and its op is CUDA C++
# (deepspeed/ops/csrc/compile/deepcompile.cpp includes ATen/cuda: measured here, it does not build on a CPU-only torch)
DEEPCOMPILE_SINCE = (0, 16, 6)
DEEPCOMPILE_TORCH = (2, 6)


def installed_version(package: str) -> tuple[int, ...] | None:
    """The installed release of `package` as numbers ("0.19.8" -> (0, 19, 8); a local or dev suffix dropped), None when
    it is not installed."""
    import re
    from importlib import metadata

    try:
        text = metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def deepcompile_problem(accelerator) -> str | None:
    """Why DeepCompile cannot run for this accelerator with the installed DeepSpeed and torch, in one line; None
    when it can (or when they are not installed here to judge)."""
    if accelerator.is_cpu:
        return (f"{flag('compile')} deepcompile: DeepCompile's op is CUDA code and DeepSpeed enables it on CUDA devices "
                f"only (is_deepcompile_supported), not on {accelerator.name}: use {flag('compile')} torch")
    ds = installed_version("deepspeed")
    if ds is not None and ds < DEEPCOMPILE_SINCE:
        return (f"{flag('compile')} deepcompile: the installed DeepSpeed {'.'.join(map(str, ds))} has no DeepCompile "
                f"(added in {'.'.join(map(str, DEEPCOMPILE_SINCE))}): upgrade DeepSpeed or use {flag('compile')} torch")
    torch = installed_version("torch")
    if torch is not None and torch[:2] < DEEPCOMPILE_TORCH:
        return (f"{flag('compile')} deepcompile: DeepSpeed runs DeepCompile on torch >= "
                f"{'.'.join(map(str, DEEPCOMPILE_TORCH))}, the installed torch is {'.'.join(map(str, torch))}: upgrade "
                f"torch or use {flag('compile')} torch")
    return None
