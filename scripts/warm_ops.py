"""Build DeepSpeed's JIT ops that CPU runs need, so the first training job doesn't pay for it.

deepspeed_shm_comm is loaded by every CPU run (init_distributed); cpu_adam by optimizer offload.
Both are cached in TORCH_EXTENSIONS_DIR; a cached op loads in well under a second.
"""

import os
import sys
import time


def main() -> int:
    try:
        import torch

        if torch.cuda.is_available():
            return 0  # GPU machines build their own ops (or use a prebuilt deepspeed wheel)
        from deepspeed.ops.op_builder.cpu import CPUAdamBuilder, ShareMemCommBuilder
    except ImportError as e:
        print(f"warm_ops: skipped ({e})", file=sys.stderr)
        return 0
    for builder in (ShareMemCommBuilder(), CPUAdamBuilder()):
        t = time.time()
        builder.load(verbose=False)
        print(f"warm_ops: {builder.name} ready ({time.time() - t:.1f} s, cache {os.environ.get('TORCH_EXTENSIONS_DIR')})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
