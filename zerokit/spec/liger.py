"""How long a sequence Liger-Kernel's Triton kernels can index, by release.

A Triton kernel computes its element offsets in the type of its operands: `tl.program_id(0)` is int32, and so is a
row stride that fits in 32 bits, so `row * stride` wraps past 2^31 - 1 and the kernel reads or writes outside its
tensor ("Triton Error [CUDA]: an illegal memory access was encountered"). Before liger-kernel 0.6.1 its RMSNorm
(`_rms_norm_forward_kernel`: `Y_ptr += row_idx * Y_row_stride`, and the backward's `row_start * stride`) and RoPE
(`_triton_rope`: `q_ptr + pid * q_row_stride`) did that: Liger-Kernel PR #804 ("Fix illegal memory access in Triton
RMSNorm and RoPE", for "seq_len=1e6, hidden_size=4096") cast the program id to int64, released in 0.6.1 (2025-07-28;
ArcticTraining's model/liger_factory.py then raised its minimum to 0.6.1, "int64 indexing"). ArcticTraining's
run-h100-sp1-llama-8b.yml shows it on Llama-3.1-8B, one sequence per GPU: 500,000 tokens ran, 555,000 failed with that
Triton error. The SwiGLU/GeGLU kernels cast their program id to int64 since PR #251 (2024), the cross-entropy ones by
0.5.9.

So a release before 0.6.1 caps the tokens one rank hands those kernels in one micro batch (its sequence shard under
Ulysses): each kernel's rows x row stride must stay addressable in 32 bits. That is a crash, not a memory limit:
zerokit refuses past it whatever the memory (estimate/memory.py estimate_memory, MemoryEstimate.kernel_limits).
"""

from __future__ import annotations

import re

from zerokit.core.errors import ZerokitError
from zerokit.core.options import flag

INT32_MAX = 2**31 - 1
# the first release whose RMSNorm and RoPE kernels index rows in int64 (Liger-Kernel PR #804)
INT64_ROWS_SINCE = (0, 6, 1)


def liger_release(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a liger-kernel version ("0.5.10", "0.6.1.dev0", "0.6"); one line naming the fix for
    anything else."""
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-]?[A-Za-z][\w.+-]*)?", str(version).strip())
    if not m:
        raise ZerokitError(f"{flag('liger-kernels')} {version}: expected on, off or a liger-kernel version such as "
                           f"{'.'.join(map(str, INT64_ROWS_SINCE))}")
    return int(m[1]), int(m[2]), int(m[3] or 0)


def _rows_addressable(row_stride: int) -> int:
    """Rows whose first element's offset, row x row_stride, fits in int32 (rows 0 .. n - 1)."""
    return INT32_MAX // row_stride + 1


def liger_token_limit(model) -> tuple[int, str] | None:
    """(the most tokens one rank may hand Liger's kernels in a micro batch, the kernel that overflows past it) for a
    ModelSpec patched by Liger (liger_kernels) at its release (liger_version; None: 0.6.1 or later), or None where no
    kernel overflows. `model` is what one rank holds (the AutoTP shard: its heads)."""
    if not model.liger_kernels or model.liger_version is None or liger_release(model.liger_version) >= INT64_ROWS_SINCE:
        return None
    h, q = model.hidden_size, model.num_attention_heads * model.head_dim
    # RMSNorm over the hidden size, a row per token; RoPE over the queries, a row of heads x head_dim per token (its keys'
    # rows are no wider). A per-head q_norm (Qwen3, Gemma 3: LigerRMSNorm replaces Qwen3RMSNorm) spans the same heads x
    # head_dim elements a token, in rows of head_dim: the same cap as RoPE's
    limits = [(_rows_addressable(h), f"RMSNorm (rows of {h})"), (_rows_addressable(q), f"RoPE (rows of {q})")]
    return min(limits)


def liger_limit_problem(model, tokens: int) -> str | None:
    """One line when `tokens` per rank per micro batch overflow a Liger kernel's 32-bit offsets (liger_token_limit),
    naming the fix; None otherwise."""
    limit = liger_token_limit(model)
    if limit is None or tokens <= limit[0]:
        return None
    most, kernel = limit
    fixed = ".".join(map(str, INT64_ROWS_SINCE))
    return (f"liger-kernel {model.liger_version}'s {kernel} indexes in 32 bits: {tokens} tokens per rank overflow it "
            f"past {most} (a Triton illegal memory access; int64 from {fixed}, Liger-Kernel PR #804): install "
            f"liger-kernel>={fixed}, or keep micro batch x sequence / sequence-parallel degree at {most} or less")
