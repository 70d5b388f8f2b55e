"""Does a liger-kernel release's RMSNorm address a row past 2^31 elements? Run in Triton's interpreter on the CPU.

zerokit/spec/liger.py caps a rank's tokens under liger-kernel releases before 0.6.1: their RMSNorm and RoPE kernels
compute a row's offset as `program_id * row_stride` in int32 (Liger-Kernel PR #804 cast it to int64 in 0.6.1). That
rule comes from the source and from ArcticTraining's recipe that crashed at 555K tokens on one GPU. This probe runs the
kernels themselves: Triton's interpreter (TRITON_INTERPRET=1) executes a @triton.jit kernel on the CPU with the same
integer types the compiler gives it (an int argument that fits is int32: triton/runtime/interpreter.py _implicit_cvt;
tl.program_id is int32), so an offset that wraps in 32 bits wraps here too.

Each case hands a kernel a few rows of a strided view whose row stride puts the last row's first element at element
2^31 (or, for the control, 2^30), so no multi-GB tensor is touched: the storage is reserved, and only the rows read are
written. The kernel's output row against PyTorch's own RMSNorm of the same row: "correct", "wrong" or "crashed" (a
read outside the storage: the interpreter dies on it as the GPU raises an illegal memory access). Cases:
- `_rms_norm_forward_kernel`, the one-row-per-program kernel every release runs for rows wider than 256 elements (a
  hidden-size norm);
- `_block_rms_norm_forward_kernel` (0.6.0 on), which runs for rows of at most 256 elements once there are 32,768 rows
  or more (a per-head q_norm / k_norm: Qwen3, Gemma 3);
- `_triton_rope`, the rotary embedding over a token's query heads (a row of heads x head_dim), rotated in place.

Liger's rsqrt comes from libdevice, which the interpreter lacks: it is replaced by 1 / sqrt for the probe.

Usage (a throwaway directory, nothing installed into the project):
  pip install --no-deps --target /tmp/liger-X triton==3.3.1 liger-kernel==X
  PYTHONPATH=/tmp/liger-X python bench/liger_int32_probe.py [--out FILE]
bench/results/liger_int32_probe.txt holds the runs for seven releases, 0.5.10 to 0.8.5. On a GPU, `--device cuda` runs the
same cases compiled (bench/gpu_lend.sh does, for 0.8.3).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CASES = {  # name: (kernel, columns, rows, the last row's first element)
    "row kernel, hidden-size rows, last row at 2^30 (control)": ("_rms_norm_forward_kernel", 4096, 5, 2**30),
    "row kernel, hidden-size rows, last row at 2^31": ("_rms_norm_forward_kernel", 4096, 5, 2**31),
    "block kernel, head-dim rows, last row at 2^30 (control)": ("_block_rms_norm_forward_kernel", 128, 17, 2**30),
    "block kernel, head-dim rows, last row at 2^31": ("_block_rms_norm_forward_kernel", 128, 17, 2**31),
    "RoPE, 32 heads x 128 a row, last row at 2^30 (control)": ("_triton_rope", 32 * 128, 5, 2**30),
    "RoPE, 32 heads x 128 a row, last row at 2^31": ("_triton_rope", 32 * 128, 5, 2**31),
}


def _interpret() -> None:
    """Make Triton interpret the kernels on the CPU, and let Liger's import and kernels run there."""
    global tl  # the interpreter looks for triton.language among a jitted function's globals
    os.environ["TRITON_INTERPRET"] = "1"
    import numpy as np
    import triton
    import triton.language as tl
    import triton.runtime.interpreter as interpreter
    from triton.runtime.driver import driver

    class NoDevice:  # newer releases autotune some kernels, whose decorator asks the device for a benchmarker at import
        def get_benchmarker(self):
            return lambda *args, **kwargs: None

    driver.set_active(NoDevice())
    to_tensor = interpreter._implicit_cvt

    def float_args_as_fp32(arg):  # as the compiler types a float argument (newer kernels call eps.to(tl.float32))
        if isinstance(arg, float):
            return tl.tensor(interpreter.TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
        return to_tensor(arg)

    interpreter._implicit_cvt = float_args_as_fp32
    import liger_kernel.ops.rms_norm as lrn

    @triton.jit
    def _rsqrt(x):
        return 1.0 / tl.sqrt(x)

    lrn.rsqrt = _rsqrt  # libdevice's rsqrt has no interpreter form


def run_case(kernel_name: str, cols: int, rows: int, last: int, device: str = "cpu") -> str:
    """In this process: run one kernel over `rows` rows strided so the last starts at element `last`; what came out.
    On "cpu" in Triton's interpreter; on "cuda" compiled, as a training job runs it."""
    if device == "cpu":
        _interpret()
    import torch
    import triton

    import liger_kernel.ops.rms_norm as lrn

    stride = last // (rows - 1)
    torch.set_default_device(device)
    storage = torch.empty(last + cols, dtype=torch.float16)  # reserved, not touched but for the rows written next
    x = storage.as_strided((rows, cols), (stride, 1))
    torch.manual_seed(0)
    for r in range(rows):
        x[r].copy_(torch.randn(cols))
    if kernel_name == "_triton_rope":
        return _rope_case(x, stride)
    kernel = getattr(lrn, kernel_name, None)
    if kernel is None:
        return "absent in this release"
    w = torch.ones(cols, dtype=torch.float16)
    y = torch.zeros(rows, cols, dtype=torch.float16)
    rstd = torch.empty(rows, dtype=torch.float32)
    args = [y, y.stride(0), x, x.stride(0), w, w.stride(0), rstd, rstd.stride(0)]
    kwargs = {"BLOCK_SIZE": triton.next_power_of_2(cols)}
    if "elementwise_affine" in kernel.arg_names:  # 0.6.2 on: the weight is optional
        kwargs["elementwise_affine"] = True
    if kernel_name == "_block_rms_norm_forward_kernel":
        kernel[(triton.cdiv(rows, 16),)](*args, rows, cols, 1e-6, 0.0, 0, BLOCK_ROW=16, **kwargs)
    else:
        kernel[(rows,)](*args, cols, 1e-6, 0.0, 0, **kwargs)
    xf = x[-1].float()
    want = xf * torch.rsqrt(xf.pow(2).mean() + 1e-6)
    return "correct" if torch.allclose(y[-1].float(), want, atol=2e-2, rtol=2e-2) else "wrong"  # syncs: a fault raises


def _rope_case(x, stride: int) -> str:
    """RoPE over rows of 32 query heads x 128 (Llama-3.1-8B's queries, one token a row; 8 KV heads), the queries'
    rows `stride` apart, rotated in place: the last row against the rotation PyTorch computes (HF's rotate_half)."""
    import torch
    import triton

    from liger_kernel.ops.rope import _triton_rope

    rows, heads, kv_heads, hd = x.shape[0], 32, 8, 128
    q = x.as_strided((1, rows, heads, hd), (rows * stride, stride, hd, 1))  # (bs, seq, heads, head_dim)
    k = torch.randn(1, rows, kv_heads, hd, dtype=torch.float16)
    half = torch.randn(1, rows, hd // 2)
    cos, sin = torch.cat([half.cos()] * 2, -1).half(), torch.cat([half.sin()] * 2, -1).half()
    q_last = q[0, -1].float().clone()
    rotated = torch.cat([-q_last[:, hd // 2:], q_last[:, :hd // 2]], -1)
    want = q_last * cos[0, -1].float() + rotated * sin[0, -1].float()
    partial = {"pad_rd": hd, "rd": hd} if "rd" in _triton_rope.arg_names else {}  # 0.8.5 on: the rotary dims
    _triton_rope[(rows,)](q, q.stride(1), k, k.stride(1), cos, cos.stride(-2), sin, sin.stride(-2), rows, 1, 1, heads,
                          kv_heads, hd, heads, kv_heads, hd, **partial, BLOCK_SIZE=triton.next_power_of_2(heads),
                          BACKWARD_PASS=False)
    return "correct" if torch.allclose(q[0, -1].float(), want, atol=2e-2, rtol=2e-2) else "wrong"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", help=argparse.SUPPRESS)  # internal: one case in a child process
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cpu: Triton's interpreter (the default); cuda: the kernels compiled on a GPU")
    ap.add_argument("--out", default=None, help="append the results to this file")
    args = ap.parse_args()
    if args.case:
        print(json.dumps(run_case(*CASES[args.case], device=args.device)))
        return 0
    import importlib.metadata as md

    where = "TRITON_INTERPRET=1" if args.device == "cpu" else "compiled, " + subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    versions = f"liger-kernel {md.version('liger-kernel')}, triton {md.version('triton')} ({where})"
    lines = [versions]
    for name in CASES:
        p = subprocess.run([sys.executable, __file__, "--case", name, "--device", args.device], capture_output=True,
                           text=True, timeout=600)
        if p.returncode == 0:
            result = json.loads(p.stdout.strip().splitlines()[-1])
        elif p.returncode < 0:
            result = f"crashed (signal {-p.returncode})"
        else:
            result = f"crashed: {(p.stderr.strip().splitlines() or ['?'])[-1][:160]}"
        lines.append(f"  {name:58} {result}")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
