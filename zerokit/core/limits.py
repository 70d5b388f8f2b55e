"""The bounds on what a user may ask for, in one place, each with where it comes from: physics (what hardware or
models exist), DeepSpeed or torch (what they can represent), or zerokit's own arithmetic. A value past a bound is
refused with a one-line ZerokitError that names the bound, never carried into the estimates (where it would
overflow, hang or answer nonsense).

Every reader of user input (cli/common.py, core/units.py, spec/hardware.py, spec/hostfile.py, spec/model.py,
config/read.py, lint.py, setup.py) checks against these names; tests/test_bad_input.py holds the table of refusals.
"""

from __future__ import annotations

import math

from zerokit.core.errors import ZerokitError

# Parameters. Physics: at the 16 bytes per parameter of mixed-precision Adam (ZeRO paper, Rajbhandari et al. 2020,
# section 3.1) 10^15 parameters are 16 PB of model states, all the HBM of ~200,000 80 GB GPUs: the largest clusters
# built. The largest models trained are ~2 x 10^12.
MAX_PARAMS = 10**15

# Decoder layers. zerokit's own bound: a config it cannot count by arithmetic is built on the meta device, one
# Python module per layer (~1-3 ms each on 2 cores), so 10,000 layers already take seconds to minutes; the deepest
# published LLM has 126 (Llama-3.1-405B). (10**12 layers hung the meta build before this bound.)
MAX_LAYERS = 10_000

# Vocabulary. zerokit packs token ids as int32 (launching/data.py) and the largest published vocabulary has 262,208
# entries (Gemma 3): an id must fit int32.
MAX_VOCAB = 2**31 - 1

# Any one model dimension (hidden, intermediate, heads, head dim, experts). Physics via MAX_PARAMS: one square
# hidden x hidden projection past 2^25 already holds more than 10^15 parameters.
MAX_DIMENSION = 2**25

# Ranks on one node. Physics: the largest single hosts hold 16 GPUs (HGX-2), and CPU ranks run one per core (512 in
# the largest 2-socket servers); DeepSpeed's launcher starts one process per slot.
MAX_GPUS_PER_NODE = 1024

# Ranks in one job (GPUs per node x nodes). Physics: ~10x the largest training clusters built (~100,000 GPUs).
MAX_WORLD_SIZE = 2**20

# Bytes (any size: GPU, host or NVMe memory). Physics: 1 EiB is ~1,000x what one node holds; it also keeps byte
# arithmetic exact in Python ints and below int64 (2^63) where torch or DeepSpeed receive it.
MAX_BYTES = 2**60

# Counts of samples, steps and batches. zerokit's arithmetic: step counts and times are computed in float64, exact
# for integers up to 2^53.
MAX_COUNT = 2**53

# Tokens per sample when the model states no maximum (--params). Physics: 10x the longest context trained (10M
# tokens, Llama 4 Scout). A model's own max_position_embeddings is the bound when it has one.
MAX_SEQ_LEN = 2**27


def finite_number(value, what: str) -> float:
    """`value` as a finite float, else a one-line error (inf, nan, and numbers too large for a float)."""
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ZerokitError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(v):
        raise ZerokitError(f"{what} must be a finite number, got {value!r}")
    return v


# Seconds a model may take to build on the meta device. zerokit's own bound: a 70B Llama builds in ~6 s on 2 cores
# with the imports (the slowest bundled config); a config that takes 20x that is refused rather than waited for.
META_BUILD_SECONDS = 120

# What a refusal says of each bound (the comments above give the sources).
WHY = {
    "MAX_PARAMS": "16 PB of model states: more than any cluster holds",
    "MAX_LAYERS": "the deepest LLM has 126; far deeper only hangs the meta-device build",
    "MAX_VOCAB": "token ids are packed as int32",
    "MAX_DIMENSION": "one square projection that wide exceeds 10^15 parameters",
    "MAX_GPUS_PER_NODE": "the ranks one host can run",
    "MAX_WORLD_SIZE": "10x the largest clusters built",
    "MAX_BYTES": "1 EiB: more than any node holds",
    "MAX_COUNT": "exact in float64",
    "MAX_SEQ_LEN": "10x the longest context trained",
}


def at_most(value, limit: str, what: str) -> None:
    """Refuse `value` above the bound named `limit` (a name in this module, e.g. "MAX_LAYERS")."""
    bound = globals()[limit]
    if value > bound:
        shown = f"{int(value):,}" if float(value).is_integer() else f"{value:,}"
        raise ZerokitError(f"{what} is {shown}, above the {bound:,} zerokit accepts ({WHY[limit]})")
