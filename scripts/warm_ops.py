"""Build DeepSpeed's JIT ops that CPU runs need, so the first training job doesn't pay for it.

deepspeed_shm_comm is loaded by every CPU run (init_distributed); cpu_adam by optimizer offload.
Both are cached in TORCH_EXTENSIONS_DIR; a cached op loads in well under a second. The two build at once, each in
its own process (bench/results/first_run.txt has both timings).
"""

import os
import subprocess
import sys
import time

OPS = ("ShareMemCommBuilder", "CPUAdamBuilder")


def build(name: str) -> int:
    from deepspeed.ops.op_builder import cpu

    builder = getattr(cpu, name)()
    t = time.time()
    builder.load(verbose=False)
    print(f"warm_ops: {builder.name} ready ({time.time() - t:.1f} s, cache {os.environ.get('TORCH_EXTENSIONS_DIR')})",
          flush=True)
    return 0


def main() -> int:
    try:
        import torch

        if torch.cuda.is_available():
            return 0  # GPU machines build their own ops (or use a prebuilt deepspeed wheel)
        # no GPU: say so, as zerokit's CPU launches do, instead of DeepSpeed warning "Setting accelerator to CPU" on
        # each import (here and in the two builders, which inherit it)
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed.ops.op_builder.cpu  # noqa: F401 - the import is the check
    except ImportError as e:
        print(f"warm_ops: skipped ({e})", file=sys.stderr)
        return 0
    procs = [subprocess.Popen([sys.executable, __file__, name]) for name in OPS]
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    raise SystemExit(build(sys.argv[1]) if len(sys.argv) > 1 else main())
