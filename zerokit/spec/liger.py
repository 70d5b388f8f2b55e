"""How long a sequence Liger-Kernel's Triton kernels can index, by release.

A Triton kernel computes its element offsets in the type of its operands: `tl.program_id(0)` is int32, and so is a
row stride that fits in 32 bits, so `row * stride` wraps past 2^31 - 1 and the kernel reads or writes outside its
tensor ("Triton Error [CUDA]: an illegal memory access was encountered"). Three of Liger's kernels did or do:
- before 0.6.1, RMSNorm's one-row-per-program kernel (`_rms_norm_forward_kernel`: `Y_ptr += row_idx * Y_row_stride`)
  and RoPE (`_triton_rope`: `q_ptr + pid * q_row_stride`, a row of query heads x head_dim per token). Liger-Kernel PR
  #804 ("Fix illegal memory access in Triton RMSNorm and RoPE", for "seq_len=1e6, hidden_size=4096") cast the program
  id to int64 in 0.6.1 (2025-07-28); ArcticTraining's model/liger_factory.py then required 0.6.1 ("int64 indexing").
  Its run-h100-sp1-llama-8b.yml shows it on Llama-3.1-8B, one sequence per GPU: 500,000 tokens ran, 555,000 failed
  with that Triton error.
- from 0.6.0 until 0.8.4, RMSNorm's block kernel (`_block_rms_norm_forward_kernel`: `row_idx = tl.program_id(0) *
  BLOCK_ROW + ...`, then `row_idx[:, None] * X_row_stride`), which rms_norm_forward runs for rows of at most 256
  elements once there are 32,768 rows or more: a per-head q_norm / k_norm (Qwen3, Gemma 3: LigerRMSNorm replaces their
  RMSNorm class), a token's heads rows of head_dim. 0.8.4 casts that program id to int64 too.
bench/liger_int32_probe.py runs each kernel in Triton's interpreter on the CPU with a row starting at element 2^31
(bench/results/liger_int32_probe.txt, seven releases): the row kernel and RoPE crash on 0.5.10 and 0.6.0, the block
kernel on 0.6.0 to 0.8.3, nothing on 0.8.4 and 0.8.5, and every control at 2^30 is right. The SwiGLU/GeGLU kernels
cast to int64 since PR #251 (2024), the cross-entropy ones by 0.5.9.

So a rank may hand Liger at most so many tokens in one micro batch (its sequence shard under Ulysses): each kernel's
rows x row stride must stay addressable in 32 bits. That is a crash, not a memory limit: zerokit refuses past it
whatever the memory (estimate/memory.py estimate_memory, MemoryEstimate.kernel_limits).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from zerokit.core.errors import ZerokitError
from zerokit.core.options import flag

INT32_MAX = 2**31 - 1
# the first release whose RMSNorm row kernel and RoPE index rows in int64 (Liger-Kernel PR #804)
INT64_ROWS_SINCE = (0, 6, 1)
# RMSNorm's block kernel, for rows of at most BLOCK_KERNEL_MAX_WIDTH elements: 32-bit from its first release until
# BLOCK_INT64_SINCE
BLOCK_KERNEL_SINCE = (0, 6, 0)
BLOCK_INT64_SINCE = (0, 8, 4)
BLOCK_KERNEL_MAX_WIDTH = 256  # rms_norm_forward: `if BLOCK_SIZE > 256 or n_rows < 4096 * 8 or row_mode:` row kernel


def _dotted(release: tuple[int, int, int]) -> str:
    return ".".join(map(str, release))


def liger_release(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a liger-kernel version ("0.5.10", "0.6.1.dev0", "0.6"); one line naming the fix for
    anything else."""
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-]?[A-Za-z][\w.+-]*)?", str(version).strip())
    if not m:
        raise ZerokitError(f"{flag('liger-kernels')} {version}: expected on, off or a liger-kernel version such as "
                           f"{_dotted(INT64_ROWS_SINCE)}")
    return int(m[1]), int(m[2]), int(m[3] or 0)


@dataclass(frozen=True)
class LigerLimit:
    """The most tokens one rank may hand Liger's kernels in a micro batch, the kernel that overflows past it, and the
    fix."""

    tokens: int
    kernel: str
    fix: str


def _rows_addressable(row_stride: int) -> int:
    """Rows whose first element's offset, row x row_stride, fits in int32 (rows 0 .. n - 1)."""
    return INT32_MAX // row_stride + 1


def liger_token_limit(model) -> LigerLimit | None:
    """The binding LigerLimit of a ModelSpec patched by Liger (liger_kernels) at its release (liger_version; None:
    `--liger-kernels on`, a current release, where none overflows), or None where no kernel overflows. `model` is what
    one rank holds (the AutoTP shard: its heads)."""
    if not model.liger_kernels or model.liger_version is None:
        return None
    release = liger_release(model.liger_version)
    h, a, d = model.hidden_size, model.num_attention_heads, model.head_dim
    # the RMSNorms Liger runs: over the hidden size, a row a token; a per-head q_norm, a rows of d a token (its k_norm
    # has fewer rows)
    norms = [(h, 1)]
    if model.head_norm_rows and model.head_norm_elements // model.head_norm_rows == d:
        norms.append((d, a))
    old = release < INT64_ROWS_SINCE
    block = BLOCK_KERNEL_SINCE <= release < BLOCK_INT64_SINCE
    upgrade = f"install liger-kernel>={_dotted(INT64_ROWS_SINCE)} (int64 there, Liger-Kernel PR #804)"
    block_upgrade = f"install liger-kernel>={_dotted(BLOCK_INT64_SINCE)} (its block kernel int64 there)"
    limits = []
    for width, per_token in norms:
        what = f"rows of {width}" + (f", {per_token} a token" if per_token > 1 else "")
        narrow = width <= BLOCK_KERNEL_MAX_WIDTH  # the block kernel's rows from 0.6.0 on
        if block and narrow:
            limits.append(LigerLimit(_rows_addressable(width) // per_token, f"RMSNorm block kernel ({what})",
                                     block_upgrade))
        elif old:  # the row kernel; 0.6.0 to 0.8.3 run narrow rows through the block kernel, as capped
            limits.append(LigerLimit(_rows_addressable(width) // per_token, f"RMSNorm ({what})",
                                     block_upgrade if narrow else upgrade))
    if old:
        limits.append(LigerLimit(_rows_addressable(a * d), f"RoPE (rows of {a * d})", upgrade))
    # on a tie, the one that needs the newer release to lift
    return min(limits, key=lambda limit: (limit.tokens, limit.fix != block_upgrade)) if limits else None


def liger_limit_problem(model, tokens: int) -> str | None:
    """One line when `tokens` per rank per micro batch overflow a Liger kernel's 32-bit offsets (liger_token_limit),
    naming the fix; None otherwise."""
    limit = liger_token_limit(model)
    if limit is None or tokens <= limit.tokens:
        return None
    return (f"liger-kernel {model.liger_version}'s {limit.kernel} indexes in 32 bits: {tokens} tokens per rank "
            f"overflow it past {limit.tokens} (a Triton illegal memory access): {limit.fix}; or keep micro batch x "
            f"sequence / sequence-parallel degree at {limit.tokens} or less")
