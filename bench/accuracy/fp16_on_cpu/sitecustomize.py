"""Measurement harness only: let DeepSpeed take its fp16 code paths on a CPU without AVX512-FP16.

Why: fp16 is what V100, T4 and RTX 20xx users must train in, and DeepSpeed's fp16 paths allocate
memory bf16 never does (FP16_Optimizer at ZeRO-0, fp32 gradient partitions and overflow checks at
ZeRO-1/2/3, the dynamic loss scaler), so zerokit must measure them. DeepSpeed's CPU accelerator
reports fp16 supported only where oneDNN has fp16 kernels (deepspeed/accelerator/cpu_accelerator.py
`CPU_Accelerator.is_fp16_supported`: `torch.ops.mkldnn._is_mkldnn_fp16_supported()`, AVX512-FP16/AMX
CPUs), and `DeepSpeedEngine._configure_distributed_model` (runtime/engine.py) then raises "Type fp16
is not supported on your device.". torch's generic CPU half kernels run every op the engine needs
(slowly: ~2.7 GFLOP/s fp16 matmul vs ~100 fp32 on the project's CPU), so with the check lifted the
engine trains in fp16 and its memory can be metered. The times are NOT comparable to any GPU.

Python imports `sitecustomize` at start-up from the first match on sys.path: put this directory on
PYTHONPATH (bench/accuracy/run.py does so for fp16 jobs on CPU; tests/test_fp16_cpu.py too). Nothing
in zerokit/ imports it; users never get it.

The patch is applied when the program itself imports DeepSpeed's CPU accelerator (an import hook), not
here: importing DeepSpeed at start-up would cost every Python process of a job ~2 s and print DeepSpeed's
"Setting accelerator" line on stdout, which breaks the subprocesses whose stdout is JSON (calibrate's).
"""

import sys

_TARGET = "deepspeed.accelerator.cpu_accelerator"


def _fp16_supported(self):
    return True


class _PatchCpuAccelerator:
    """A meta path finder that only wraps the real loader of _TARGET, then patches the class it defined."""

    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            module.CPU_Accelerator.is_fp16_supported = _fp16_supported

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchCpuAccelerator())
