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


def _release(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def older_than(package: str, since: tuple[int, ...]) -> tuple[int, ...] | None:
    """The installed release of `package` when it is older than `since` (compared on since's length), else None (newer,
    or not installed here to judge)."""
    v = installed_version(package)
    return v if v is not None and v[:len(since)] < since else None


def deepcompile_problem(accelerator) -> str | None:
    """Why DeepCompile cannot run for this accelerator with the installed DeepSpeed and torch, in one line; None
    when it can (or when they are not installed here to judge)."""
    if accelerator.is_cpu:
        return (f"{flag('compile')} deepcompile: DeepCompile's op is CUDA code and DeepSpeed enables it on CUDA devices "
                f"only (is_deepcompile_supported), not on {accelerator.name}: use {flag('compile')} torch")
    if ds := older_than("deepspeed", DEEPCOMPILE_SINCE):
        return (f"{flag('compile')} deepcompile: the installed DeepSpeed {_release(ds)} has no DeepCompile "
                f"(added in {_release(DEEPCOMPILE_SINCE)}): upgrade DeepSpeed or use {flag('compile')} torch")
    if torch := older_than("torch", DEEPCOMPILE_TORCH):
        return (f"{flag('compile')} deepcompile: DeepSpeed runs DeepCompile on torch >= {_release(DEEPCOMPILE_TORCH)}, "
                f"the installed torch is {_release(torch)}: upgrade torch or use {flag('compile')} torch")
    return None


# ZenFlow as DeepSpeed's tutorial configures it (docs/_tutorials/zenflow.md), what render writes and the time model
# prices: the GPU updates the top 5% of gradient columns every step; the CPU updates the rest every 4 steps, its step
# overlapped with the GPU's forward and backward (overlap_step)
ZENFLOW = {"topk_ratio": 0.05, "update_interval": 4}
# ZenFlow landed for ZeRO-1/2 in DeepSpeed 0.17.5 (PR 7391) and for ZeRO-3 in 0.18.1 (PR 7516); configure_zenflow
# asks for torch >= 2.1. SuperOffload landed in 0.18.0 (PR 7559) and asserts a CUDA device (superoffload_stage3.py).
ZENFLOW_SINCE = {1: (0, 17, 5), 2: (0, 17, 5), 3: (0, 18, 1)}
ZENFLOW_TORCH = (2, 1)
SUPEROFFLOAD_SINCE = (0, 18, 0)


def offload_engine_problem(engine: str, accelerator, stage: int | None = None) -> str | None:
    """Why ZenFlow or SuperOffload cannot run here (the accelerator; the installed DeepSpeed and torch; the pinned
    ZeRO stage, None when the planner chooses), in one line; None when it can or is not judged."""
    if engine == "zero-offload":
        return None
    if engine == "superoffload":
        if accelerator.is_cpu:
            return (f"{flag('offload-engine')} superoffload: SuperOffload asserts a CUDA device "
                    f"(superoffload_stage3.py), not {accelerator.name}: use {flag('offload-engine')} zero-offload")
        if ds := older_than("deepspeed", SUPEROFFLOAD_SINCE):
            return (f"{flag('offload-engine')} superoffload: the installed DeepSpeed {_release(ds)} has no SuperOffload "
                    f"(added in {_release(SUPEROFFLOAD_SINCE)}): upgrade DeepSpeed")
        return None
    since = ZENFLOW_SINCE.get(stage) or min(ZENFLOW_SINCE.values())
    if ds := older_than("deepspeed", since):
        return (f"{flag('offload-engine')} zenflow: the installed DeepSpeed {_release(ds)} has no ZenFlow"
                f"{f' at ZeRO-{stage}' if stage else ''} (added in {_release(since)}): upgrade DeepSpeed")
    if torch := older_than("torch", ZENFLOW_TORCH):
        return (f"{flag('offload-engine')} zenflow: DeepSpeed runs ZenFlow on torch >= {_release(ZENFLOW_TORCH)}, the "
                f"installed torch is {_release(torch)}: upgrade torch")
    return None
