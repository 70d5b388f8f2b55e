"""`zerokit calibrate`: measure the machine it runs on and write a hardware profile JSON.

Measured: dense matmul throughput per precision the device supports, all-reduce / all-gather bus
bandwidth between local ranks (gloo on CPU, nccl on GPU) and their per-call latency, host<->device copy
bandwidth (GPU), DeepSpeedCPUAdam and torch AdamW step rates (parameters per second), the forward +
backward of real HF models (compute_fit.py) and, in full mode, real DeepSpeed engines (engine_fit.py).

The profile's keys are documented where they are read: zerokit/spec/profile.py. Estimation reads a
profile only through that module (build_cluster(hardware_profile=...) puts it on the Cluster).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

from zerokit.core.errors import ZerokitError
from zerokit.core.options import flag
from zerokit.core.quiet import library_output
from zerokit.spec.setup import TORCH_DTYPE_NAMES
from zerokit.core.units import MiB
from zerokit.measure.ranks import Lockstep, device_of, free_port, run_local_ranks, sync, tagged_json
from zerokit.spec.profile import PRECISIONS, SANITY, SCHEMA, SLOW_PRECISION_FACTOR, matmul_problem, slow_precisions

__all__ = [
    "measure_matmul",
    "measure_collectives",
    "measure_cpu_adam",
    "measure_torch_adamw",
    "measure_copy_bandwidth",
    "run_calibration",
    "measure_until_sane",
    "EXIT_TOO_BUSY",
    "format_profile",
]

# `zerokit calibrate`'s exit code when the machine was too busy to measure (spec.profile.SANITY failed after its
# re-measurements): not bad input (2) nor "does not fit" (1); rerunning on an idle machine fixes it
EXIT_TOO_BUSY = 3
MATMUL_REPEATS = 3  # matmul_tflops is their mean, matmul_spread_cv their coefficient of variation
PROBE_SIZE = 256  # the n of the probe matmul that finds a pathologically slow precision before timing it at size
# a precision whose matmul at the calibration's size would take longer than this (projected from the probe) is
# timed at PROBE_SIZE only. A time, not a ratio to the other precisions: a 0.05 s probe is easily hit by another
# tenant's burst, and a ratio rule once put this machine's fp32 under 1/10 of its bf16 (1.5-2.5x apart) in CI
MAX_MATMUL_SECONDS = 2.0
# a slow precision's models are timed on the smallest shapes only: all 7 CPU shapes of bf16 with AVX2 kernels forced
# took the calibration from 128 s to 579 s; 12 points per family still determine the 7 costs
SLOW_PRECISION_SHAPES = 4
COMPUTE_PASSES = 2  # the compute benchmark's passes; each point keeps its fastest (_fit_compute best_of_passes)



def precision_supported(precision: str, device: Any = None) -> tuple[bool, str]:
    """Whether training in this precision works on the device, and why not."""
    import torch

    device = device_of(device)
    if precision == "fp32":
        return True, ""
    if device.type == "cpu":
        if precision == "fp16":
            # DeepSpeed decides: DeepSpeedEngine._do_sanity_check raises "Type fp16 is not supported on your
            # device." unless the CPU accelerator says yes (cpu_accelerator.py CPU_Accelerator.is_fp16_supported:
            # oneDNN fp16, AVX512-FP16/AMX CPUs; bench/accuracy/fp16_on_cpu lifts it for measurement). The CPU
            # class itself, not get_accelerator(): on a CUDA machine that is the CUDA accelerator.
            with library_output():  # DeepSpeed's import warns "Setting accelerator to CPU" on a CPU machine
                from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

            if not CPU_Accelerator().is_fp16_supported():
                return False, ("fp16 is not supported on this CPU (DeepSpeed: 'Type fp16 is not supported on your "
                               "device', it needs AVX512-FP16/AMX): use bf16 or fp32")
        return True, ""
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        return False, "this GPU has no bf16 support"
    return True, ""


def measure_matmul(precision: str, size: int = 2048, device: Any = None, min_time_s: float = 1.0) -> float:
    """Dense n x n x n matmul throughput in TFLOP/s (2 n^3 FLOPs per matmul), after one warm-up."""
    import torch

    if precision not in TORCH_DTYPE_NAMES:
        raise ZerokitError(f"precision {precision!r} is not one of {', '.join(TORCH_DTYPE_NAMES)}")
    device = device_of(device)
    ok, why = precision_supported(precision, device)
    if not ok:
        raise ZerokitError(why)
    dtype = getattr(torch, TORCH_DTYPE_NAMES[precision])
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    c = torch.empty(size, size, device=device, dtype=dtype)
    torch.matmul(a, b, out=c)  # warm-up (kernel selection, page faults)
    sync(device)
    iters, elapsed = 0, 0.0
    t0 = time.perf_counter()
    while elapsed < min_time_s or iters < 2:
        torch.matmul(a, b, out=c)
        iters += 1
        if device.type == "cuda" and iters % 10:
            continue
        sync(device)
        elapsed = time.perf_counter() - t0
    sync(device)
    elapsed = time.perf_counter() - t0
    return 2.0 * size**3 * iters / elapsed / 1e12


def measure_copy_bandwidth(nbytes: int = 256 * MiB, device: Any = None, iters: int = 5) -> dict:
    """Pinned host <-> device copy bandwidth in GB/s (GPU only)."""
    import torch

    device = device_of(device)
    if device.type != "cuda":
        raise ZerokitError("host<->device copy bandwidth needs a GPU")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out = {}
    for name, dst, src in (("h2d_gbps", dev, host), ("d2h_gbps", host, dev)):
        dst.copy_(src, non_blocking=True)
        sync(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            dst.copy_(src, non_blocking=True)
        sync(device)
        out[name] = nbytes * iters / (time.perf_counter() - t0) / 1e9
    return out


# -- collectives ------------------------------------------------------------------------------------
def _collective_worker(rank: int, world_size: int, port: int, sizes: list[int], iters: int, backend: str) -> list[dict]:
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    rows = []
    for nbytes in sizes:
        numel = max(1, nbytes // 4)
        n_iter = max(iters, 50) if nbytes <= 64 * 1024 else iters  # latency: ~1 ms per call, noisy
        x = torch.ones(numel, device=device)
        out = torch.empty(numel * world_size, device=device)
        # all-to-all of the same bytes per rank (Ulysses' q/k/v exchange: ulysses_sp.py _dim_zero_all_to_all);
        # its input split evenly over the ranks
        a2a_in = torch.ones(max(world_size, numel - numel % world_size), device=device)
        a2a_out = torch.empty_like(a2a_in)
        row = {"bytes": numel * 4}
        for name, fn in (
            ("all_reduce", lambda: dist.all_reduce(x)),
            ("all_gather", lambda: dist.all_gather_into_tensor(out, x)),
            ("all_to_all", lambda: dist.all_to_all_single(a2a_out, a2a_in)),
        ):
            fn()  # warm-up
            sync(device)
            dist.barrier()
            # a mean over the calls, bursts included: a call inside a step meets them too. Medians (each call timed)
            # were tried: 0.59 ms for a 4 KiB all-reduce against the means' 0.6-2.1 ms, and the engine fits then put
            # the difference on every layer (ZeRO-2: 0.9 -> 12.5 ms a layer), which LoRA rows, with few gradient
            # buckets, do not pay: their grid went from 12.2% to 14.6% median, 23.5% to 51.7% max
            t0 = time.perf_counter()
            for _ in range(n_iter):
                fn()
            sync(device)
            dt = (time.perf_counter() - t0) / n_iter
            t = torch.tensor([dt], dtype=torch.float64, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the time
            dt = float(t.item())
            n = world_size
            # bus bandwidth (nccl-tests): all-reduce moves 2(n-1)/n of the buffer per rank,
            # all-gather (n-1)/n of the gathered output
            # all-to-all sends (n-1)/n of its buffer
            factor = 2 * (n - 1) / n if name == "all_reduce" else (n - 1) / n if name == "all_to_all" else (n - 1)
            row[f"{name}_s"] = dt
            row[f"{name}_busbw_gbps"] = numel * 4 * factor / dt / 1e9
        rows.append(row)
    dist.barrier()
    return rows


def _worker_main() -> None:
    """Entry of one benchmark rank (a subprocess: no multiprocessing re-import of the caller's __main__)."""
    import warnings

    import torch.distributed as dist

    from zerokit.core.process import finish_rank

    warnings.filterwarnings("ignore")
    spec = json.loads(os.environ["ZEROKIT_COLL_SPEC"])
    rank = int(os.environ["ZEROKIT_COLL_RANK"])
    rows = _collective_worker(rank, spec["world_size"], spec["port"], spec["sizes"], spec["iters"], spec["backend"])
    compute = None
    if spec.get("compute"):
        # every rank times the same real HF models at once, in lockstep, as training ranks share the machine
        from zerokit.measure.compute_fit import rank_main

        cs = spec["compute"]
        device = device_of(cs.get("device"))
        compute = rank_main(cs, device, Lockstep(device))
    dist.barrier()
    if rank == 0:
        print("ZEROKIT_RESULT " + json.dumps(rows), flush=True)
        if compute is not None:
            print("ZEROKIT_COMPUTE " + json.dumps(compute), flush=True)
    # out as zerokit's other ranks end (core.process.finish_rank): the process group destroyed, then no interpreter
    # teardown. Destroying the group alone was not enough here: a clean CI's quick calibration lost its compute
    # benchmark to "rank 1 exited -6: terminate called without an active exception" at this worker's exit
    finish_rank(0)


def _run_benchmark_ranks(world_size: int, sizes: list[int], iters: int, backend: str | None, timeout_s: float,
                         compute: dict | None, threads: int | None, what: str) -> tuple[str, list[dict], list | None]:
    """Run `world_size` benchmark ranks (_worker_main): the collectives over `sizes`, then the compute jobs of
    `compute` in lockstep. Returns the backend (nccl when there is a GPU per rank, else gloo, unless given) and rank
    0's collective rows and compute seconds (None without `compute`)."""
    import torch

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo"
    spec = {"world_size": world_size, "port": free_port(), "sizes": list(sizes), "iters": iters, "backend": backend,
            "compute": compute}
    env = dict(os.environ, ZEROKIT_COLL_SPEC=json.dumps(spec))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    else:
        env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-c", "from zerokit.measure.calibrate import _worker_main; _worker_main()"]
    outs = run_local_ranks(cmd, [dict(env, ZEROKIT_COLL_RANK=str(r)) for r in range(world_size)], timeout_s,
                           f"{what} over {world_size} {backend} rank(s)")
    return backend, tagged_json(outs[0], "ZEROKIT_RESULT") or [], tagged_json(outs[0], "ZEROKIT_COMPUTE")


def time_compute(world_size: int, compute: dict, threads: int | None = None, timeout_s: float = 900.0) -> list[float]:
    """The compute benchmark alone ({jobs, min_time_s, device}: compute_fit.benchmark_jobs) on `world_size` ranks in
    lockstep, one rank per GPU on a GPU machine: each job's seconds, in the jobs' order."""
    _, _, secs = _run_benchmark_ranks(world_size, [], 1, None, timeout_s, compute, threads, "compute benchmark")
    if secs is None or len(secs) != len(compute["jobs"]):
        raise ZerokitError("the compute benchmark printed no result: rerun `zerokit calibrate`")
    return secs


def measure_collectives(world_size: int = 2, sizes: list[int] | tuple[int, ...] = (1 * MiB, 16 * MiB), iters: int = 5,
                        backend: str | None = None, timeout_s: float = 120.0, compute: dict | None = None,
                        threads: int | None = None) -> dict:
    """All-reduce and all-gather over `world_size` local processes (gloo on CPU, nccl on GPUs).
    Returns per-size times and bus bandwidths (GB/s) and the largest size's figures as the headline;
    with `compute` ({jobs, min_time_s, device}: compute_fit.benchmark_jobs) the same ranks then time
    those models in lockstep, returned as "compute_seconds"."""
    if world_size < 2:
        raise ZerokitError("collective bandwidth needs at least 2 ranks")
    backend, rows, compute_seconds = _run_benchmark_ranks(world_size, list(sizes), iters, backend, timeout_s, compute, threads,
                                                 "collective benchmark")
    if not rows:
        raise ZerokitError("collective benchmark printed no result")
    last = rows[-1]
    first = rows[0]
    out = {
        "backend": backend,
        "world_size": world_size,
        "all_reduce_busbw_gbps": last["all_reduce_busbw_gbps"],
        "all_gather_busbw_gbps": last["all_gather_busbw_gbps"],
        # the smallest message's time is the per-call latency (gloo/nccl launch + rendezvous), per kind:
        # on gloo a 4 KiB all-reduce costs ~2-3x an all-gather (measured 1.4-2.0 ms vs 0.6-1.1 ms), and
        # ZeRO-1/2 reduce every gradient bucket with an all-reduce (counted in a real step: 37 calls, 1.4 ms each)
        "latency_s": min(first["all_reduce_s"], first["all_gather_s"]) if first["bytes"] <= 64 * 1024 else None,
        "all_reduce_latency_s": first["all_reduce_s"] if first["bytes"] <= 64 * 1024 else None,
        "all_gather_latency_s": first["all_gather_s"] if first["bytes"] <= 64 * 1024 else None,
        "all_to_all_latency_s": first.get("all_to_all_s") if first["bytes"] <= 64 * 1024 else None,
        "by_size": rows,
    }
    if compute_seconds is not None:
        out["compute_seconds"] = compute_seconds
    return out


def collectives_by_backend(coll: dict) -> dict:
    """measure_collectives' headline figures keyed by the backend they were measured over (the profile's
    collectives_by_backend): a plan over that backend (--dist-backend) prices its collectives with them."""
    if "backend" not in coll:  # {error: ...}
        return {}
    return {coll["backend"]: {k: coll[k] for k in ("world_size", "all_reduce_busbw_gbps", "all_gather_busbw_gbps")}}


# -- optimizers -------------------------------------------------------------------------------------
def cpu_adam_available() -> tuple[bool, str]:
    """Whether DeepSpeedCPUAdam's op is prebuilt or already JIT-built (loading it then costs seconds)."""
    try:
        with library_output():  # DeepSpeed's import warns "Setting accelerator to CPU" on a CPU machine
            from deepspeed.git_version_info import installed_ops
            from deepspeed.ops.op_builder import CPUAdamBuilder
    except Exception as e:
        return False, f"deepspeed is not importable ({type(e).__name__})"
    if installed_ops.get("cpu_adam"):
        return True, "prebuilt"
    from torch.utils.cpp_extension import _get_build_directory

    name = CPUAdamBuilder().name
    path = os.path.join(_get_build_directory(name, verbose=False), f"{name}.so")
    if os.path.exists(path):
        return True, path
    return False, f"the cpu_adam op is not built (no {path}); a full `zerokit calibrate` builds it (~80 s on 2 cores)"


def _rate(step, params: int, min_time_s: float) -> float:
    step()  # warm-up: creates states
    n, t0 = 0, time.perf_counter()
    while True:
        step()
        n += 1
        el = time.perf_counter() - t0
        if el >= min_time_s and n >= 2:
            return params * n / el


@contextlib.contextmanager
def _venv_ninja_first():
    """JIT builds run `ninja` from PATH. A venv run as `.venv/bin/python` without its bin/ on PATH picks
    the system ninja, whose log differs: the cached op is rebuilt (80 s), and flips back for the next
    process that has the venv's ninja. Put the interpreter's bin/ first while loading the op."""
    bindir = os.path.dirname(sys.executable)
    old = os.environ.get("PATH", "")
    if os.path.exists(os.path.join(bindir, "ninja")) and old.split(os.pathsep)[0] != bindir:
        os.environ["PATH"] = bindir + os.pathsep + old
        try:
            yield
        finally:
            os.environ["PATH"] = old
    else:
        yield


def measure_cpu_adam(params: int = 10_000_000, min_time_s: float = 1.0) -> float:
    """DeepSpeedCPUAdam (AdamW mode, fp32 states) step rate in parameters per second. Loads (or
    JIT-builds, ~80 s on 2 cores, cached in TORCH_EXTENSIONS_DIR) DeepSpeed's cpu_adam op."""
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    p = torch.nn.Parameter(torch.randn(params))
    p.grad = torch.randn(params) * 1e-3
    with _venv_ninja_first():
        opt = DeepSpeedCPUAdam([p], lr=1e-4, adamw_mode=True)
    return _rate(opt.step, params, min_time_s)


def measure_torch_adamw(params: int = 10_000_000, device: Any = None, min_time_s: float = 1.0) -> float:
    """torch.optim.AdamW (default implementation) step rate in parameters per second."""
    import torch

    device = device_of(device)
    p = torch.nn.Parameter(torch.randn(params, device=device))
    p.grad = torch.randn(params, device=device) * 1e-3
    opt = torch.optim.AdamW([p], lr=1e-4)

    def step():
        opt.step()
        sync(device)

    return _rate(step, params, min_time_s)


# -- the whole calibration --------------------------------------------------------------------------
def measure_until_sane(measure, problems, retries: int = SANITY.retries, log=None) -> dict:
    """values = measure(None) (every point), then, while problems(values) names keys ({key: why}), re-measure
    only those (values.update(measure(keys))), at most `retries` times. Still bad: a one-line ZerokitError with
    EXIT_TOO_BUSY, and the caller writes no profile (it writes only at the very end)."""
    say = log or (lambda msg: None)
    values = measure(None)
    for attempt in range(retries + 1):
        bad = problems(values)
        if not bad:
            return values
        if attempt < retries:
            say(f"re-measuring ({attempt + 1}/{retries}): {'; '.join(bad.values())} ...")
            values.update(measure(sorted(bad)))
    raise ZerokitError(f"calibration failed: the machine was too busy to measure ({'; '.join(bad.values())}, "
                       f"after {retries} re-measurements): rerun on an idle machine", exit_code=EXIT_TOO_BUSY)


def _device_info(device) -> dict:
    import torch

    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"type": "cuda", "name": props.name, "count": torch.cuda.device_count(),
                "memory_bytes": int(props.total_memory), "cpu_cores": os.cpu_count()}
    mem = 0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    from zerokit.spec.profile import cpu_model_name  # what spec.profile.measured_here compares

    return {"type": "cpu", "name": cpu_model_name(), "count": 1, "memory_bytes": int(mem), "cpu_cores": os.cpu_count()}


def measure_adapter_costs(compute_timing: dict, jobs: list[dict], compute_spec: dict, world_size: int,
                          threads: int | None) -> dict:
    """Time the LoRA jobs (compute_fit.adapter_jobs) on the benchmark ranks in lockstep, the fastest of COMPUTE_PASSES
    passes per point as for the full models, and add their fitted adapter costs to compute_timing
    (compute_fit.fit_adapters). bench/calibrate_adapters.py runs this alone against an existing profile."""
    from zerokit.measure import compute_fit

    passes = [time_compute(world_size, compute_spec, threads) for _ in range(COMPUTE_PASSES)]
    return compute_fit.fit_adapters(compute_timing, jobs, [min(ts) for ts in zip(*passes)])


def measure_peft_modules(profile: dict, precisions: list[str], world_size: int, threads: int | None, notes: list[str],
                         log=None) -> None:
    """What each module peft adds costs a step at every ZeRO stage (engine_fit.measure_peft_module_costs), when peft
    is installed; a failure is a note (the rules it refines stay)."""
    try:
        import peft  # noqa: F401 - the import is the check
    except ImportError:
        notes.append("LoRA engine costs: skipped, peft is not installed (pip install 'zerokit[train]')")
        return
    from zerokit.measure.engine_fit import measure_peft_module_costs

    try:
        measure_peft_module_costs(profile, precisions, world_size, threads, log=log)
    except ZerokitError as e:
        notes.append(f"LoRA engine costs: {e}")


def benchmark_world_size(device) -> int:
    """How many local ranks calibration runs: one per GPU on a GPU machine (a training job's ranks never share a GPU:
    two ranks timing compute on one GPU would each read half its speed), two on a CPU machine (they share the cores
    as a CPU job's ranks do: Lockstep)."""
    import torch

    return max(1, torch.cuda.device_count()) if device.type == "cuda" else 2


def measure_model_parallel(profile: dict, precisions: list[str], world_size: int, threads: int | None, notes: list[str],
                           log=None) -> None:
    """What a TP or SP call costs inside a step (engine_fit.measure_model_parallel_calls); a failure is a note (the
    back-to-back latencies then price those calls), as is a machine with too few ranks for TP 2 / SP 2."""
    from zerokit.measure.engine_fit import MODEL_PARALLEL_DEGREE, measure_model_parallel_calls

    if world_size % MODEL_PARALLEL_DEGREE:
        notes.append(f"TP/SP calls: {world_size} rank(s), none of TP {MODEL_PARALLEL_DEGREE} or SP "
                     f"{MODEL_PARALLEL_DEGREE} to time; back-to-back latencies price them")
        return
    if log:
        log(f"TP {MODEL_PARALLEL_DEGREE} and SP {MODEL_PARALLEL_DEGREE} engines ...")
    try:
        measure_model_parallel_calls(profile, precisions, world_size, threads, log=log)
    except ZerokitError as e:
        notes.append(f"TP/SP calls: {e}")


def measure_zero_ring(profile: dict, precisions: list[str], threads: int | None, notes: list[str], log=None) -> None:
    """What a ZeRO-3 call costs per ring step on RING_RANKS ranks inside real steps (engine_fit.measure_zero_ring_calls),
    on a CPU machine; a failure is a note (the back-to-back latencies then price those calls)."""
    from zerokit.measure.engine_fit import RING_RANKS, measure_zero_ring_calls

    if log:
        log(f"ZeRO-3 engines on {RING_RANKS} ranks ...")
    try:
        measure_zero_ring_calls(profile, precisions, threads, log=log)
    except ZerokitError as e:
        notes.append(f"ZeRO-3 ring calls: {e}")


def _check_output_path(output_path: str | os.PathLike) -> None:
    """Fail on a profile path that cannot be written before minutes of measuring, not after (run_calibration)."""
    from zerokit.core.fsutil import check_writable_file, missing_folders

    # missing folders are made when the profile is written (atomic_write_text, as mkdir -p): a calibration that
    # fails leaves none behind
    check_writable_file(output_path, f"{flag('output')} {os.fspath(output_path)}")
    folder = os.path.dirname(os.path.abspath(os.fspath(output_path)))
    if not missing_folders(output_path):
        try:
            import tempfile

            with tempfile.TemporaryFile(dir=folder):  # a real write: permission bits do not tell for root or sysfs
                pass
        except OSError as e:
            raise ZerokitError(f"cannot write the profile to {os.fspath(output_path)} ({e.strerror}): "
                               f"pick a writable file path for {flag('output')}") from None


def _measure_matmuls(device, size: int, min_t: float, precisions: tuple[str, ...] | None, notes: list[str],
                     say) -> tuple[dict[str, float | None], dict[str, float]]:
    """run_calibration's matmul_tflops (None where unsupported, not asked for or failed) and matmul_spread_cv: each
    precision's matmul in MATMUL_REPEATS repeats, re-measured until spec.profile.SANITY passes."""
    matmul_n: dict[str, int] = {}  # per precision: `size`, or PROBE_SIZE for a pathologically slow one

    def matmul_repeats(prec: str) -> list[float]:  # min_t split into repeats: the spread at no extra time
        return [measure_matmul(prec, matmul_n[prec], device, min_time_s=min_t / MATMUL_REPEATS)
                for _ in range(MATMUL_REPEATS)]

    supported = []
    tflops: dict[str, float | None] = {}
    for prec in PRECISIONS:
        ok, why = precision_supported(prec, device)
        tflops[prec] = None
        if precisions is not None and prec not in precisions and prec != "fp32":
            notes.append(f"{prec}: not measured (calibrate was asked for {', '.join(precisions)})")
        elif ok:
            supported.append(prec)
        else:
            notes.append(f"{prec}: skipped, {why}")
    # a small probe first: a precision whose matmul at `size` would take over MAX_MATMUL_SECONDS is measured at the
    # probe's size only (bf16 with AVX2 kernels forced here: each 2048^3 matmul took ~7 s, bf16's matmul 3.5 min)
    probe = {}
    for prec in supported:
        try:
            probe[prec] = measure_matmul(prec, PROBE_SIZE, device, min_time_s=0.05)
        except Exception:  # the full measurement below says why
            pass
    first: dict[str, list[float]] = {}
    for prec in supported:
        projected_s = 2 * size ** 3 / (probe[prec] * 1e12) if probe.get(prec) else 0.0
        matmul_n[prec] = PROBE_SIZE if projected_s > MAX_MATMUL_SECONDS else size
        if matmul_n[prec] == PROBE_SIZE:
            notes.append(f"{prec}: matmul measured at {PROBE_SIZE}^3 only: a probe ran it at {probe[prec] * 1e3:.3g} "
                         f"GFLOP/s, {projected_s:.0f} s per {size}^3 matmul")
        say(f"matmul {prec} {matmul_n[prec]}^3 ...")
        try:
            first[prec] = matmul_repeats(prec)
        except Exception as e:
            notes.append(f"{prec}: matmul failed: {type(e).__name__}: {e}")
    if "fp32" not in first:
        raise ZerokitError("fp32 matmul could not be measured on this machine")
    repeats = measure_until_sane(lambda precs: {p: matmul_repeats(p) for p in precs} if precs else dict(first),
                                 lambda v: {p: w for p in v if (w := matmul_problem(p, v[p]))}, log=say)
    spread = {}
    for prec, reps in repeats.items():
        tflops[prec] = statistics.fmean(reps)
        spread[prec] = round(statistics.pstdev(reps) / tflops[prec], 4)
    return tflops, spread


def _block_families(gated_mlp: bool | None, tflops: dict[str, float | None], spread: dict[str, float],
                    notes: list[str]) -> tuple[str, ...]:
    """The block families run_calibration times (compute_fit.FAMILIES, or the one of the model calibrated for); for
    that model also un-times (tflops None) every 16-bit precision slower than the fastest."""
    from zerokit.measure import compute_fit

    families = compute_fit.FAMILIES
    if gated_mlp is not None:  # scoped to one model's plan
        families = ("gated",) if gated_mlp else ("plain",)
        halves = [p for p in tflops if p != "fp32" and tflops[p]]
        fastest = max(halves, key=lambda p: tflops[p]) if halves else None
        for p in halves:
            if p != fastest:
                notes.append(f"{p}: not timed, its matmul ({tflops[p] * 1e3:.3g} GFLOP/s) is slower than {fastest}'s "
                             f"({tflops[fastest] * 1e3:.3g}): a plan of the model calibrated for would not choose it")
                tflops[p] = None
                spread.pop(p, None)
        notes.append(f"compute: the {families[0]} block family only (calibrated for one model)")
    return families


def _compute_jobs(tflops: dict[str, float | None], slow, families: tuple[str, ...], device, quick: bool,
                  notes: list[str]) -> list[dict]:
    """The HF models run_calibration's compute benchmark times (compute_fit.benchmark_jobs): every shape of each
    timed precision, the SLOW_PRECISION_SHAPES smallest quick ones of a slow precision."""
    from zerokit.measure import compute_fit

    best = max(v for v in tflops.values() if v)
    for p in slow:  # never planned here (spec.profile.SLOW_PRECISION_FACTOR), but a config may ask for it: timed on
        # the smallest quick shapes only. Its matmul does not price models: with AVX2 kernels forced, bf16 ran a
        # 2048^3 matmul at 0.4 GFLOP/s while tiny models' steps were only 3-6x fp32's, and pricing them by that
        # matmul predicted 24-32x too slow (bench/results/accuracy_cpu_avx2.txt)
        notes.append(f"{p}: compute benchmark on the {SLOW_PRECISION_SHAPES} smallest shapes only, its matmul "
                     f"({tflops[p] * 1e3:.3g} GFLOP/s) is under 1/{SLOW_PRECISION_FACTOR:g} of the best precision's ({best * 1e3:.3g}): never planned here")
    compute_jobs = compute_fit.benchmark_jobs([p for p in PRECISIONS if tflops[p] and p not in slow],
                                              device.type == "cuda", quick, families=families)
    if slow:
        compute_jobs += compute_fit.benchmark_jobs(list(slow), device.type == "cuda", True, SLOW_PRECISION_SHAPES,
                                                   families=families)
    return compute_jobs


def _measure_ranks(device, world_size: int, quick: bool, compute_spec: dict, threads: int | None,
                   notes: list[str]) -> dict:
    """run_calibration's collectives (measure_collectives) and first compute pass over the local ranks; with one rank
    the compute only. A failure is {"error": ...} and a note."""
    import torch

    coll_bytes = [4096, 1 * MiB, 16 * MiB] if quick else [4096, 1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
    if device.type == "cuda" and torch.cuda.device_count() < world_size:
        notes.append(f"only {torch.cuda.device_count()} GPU(s): collectives measured over gloo between host processes, "
                     f"not GPU links; intra_node_bw is kept from the catalog (plans with {flag('dist-backend')} gloo "
                     "use them)")
    if world_size < 2:  # one GPU: no peer to measure a link with
        notes.append("collectives: one rank, no link to measure; the catalog's bandwidths stand")
        try:
            coll = {"compute_seconds": time_compute(world_size, compute_spec, threads)}
        except ZerokitError as e:
            coll = {"error": str(e)}
            notes.append(f"compute: {e}")
    else:
        try:
            coll = measure_collectives(world_size, coll_bytes, iters=3 if quick else 10, compute=compute_spec,
                                       threads=threads, timeout_s=900.0)
        except ZerokitError as e:
            coll = {"error": str(e)}
            notes.append(f"collectives: {e}")
    return coll


def _fit_compute(coll: dict, compute_spec: dict, world_size: int, threads: int | None,
                 tflops: dict[str, float | None], slow, device, quick: bool, adapters: bool, notes: list[str],
                 say) -> dict:
    """run_calibration's compute_timing: compute_fit.fit_profile of the compute benchmark (the first pass in coll,
    COMPUTE_PASSES in all, re-timed until sane), plus the LoRA adapters' fitted costs when adapters."""
    from zerokit.measure import compute_fit

    compute_jobs = compute_spec["jobs"]

    def jobs_of(key):
        return [j for j in compute_jobs if (j["family"], j["precision"]) == key]

    def compute_seconds(keys):  # {(family, precision): seconds of its jobs}: the first run's, or re-timed ones
        if keys is None:
            jobs, secs = compute_jobs, coll["compute_seconds"]
        else:  # the same ranks in lockstep
            jobs = [j for k in keys for j in jobs_of(k)]
            secs = time_compute(world_size, dict(compute_spec, jobs=jobs), threads)
        out: dict = {}
        for j, t in zip(jobs, secs):
            out.setdefault((j["family"], j["precision"]), []).append(t)
        return out

    def fitted(seconds: dict) -> dict:
        return compute_fit.fit_profile([j for k in seconds for j in jobs_of(k)], [t for k in seconds for t in seconds[k]])

    def best_of_passes(keys):
        # every point timed in COMPUTE_PASSES passes, tens of seconds apart, keeping each point's fastest:
        # another tenant's burst only adds time, and it hits a few consecutive points of one pass (on a noisy
        # day here the grid's repeats spread 17% median and one pass fitted a 1.4 x too slow plain fp32 model)
        passes = [compute_seconds(keys)]
        for _ in range(COMPUTE_PASSES - 1):
            passes.append(compute_seconds(sorted(passes[0])))
        return {k: [min(ts) for ts in zip(*(p[k] for p in passes))] for k in passes[0]}

    # a slow precision's fit is not held to its (unrepresentative) matmul
    plausible = {p: (None if p in slow else t) for p, t in tflops.items()}
    seconds = measure_until_sane(best_of_passes, lambda v: compute_fit.compute_fit_problems(fitted(v), plausible), log=say)
    compute_timing = fitted(seconds)
    adapter_runs = compute_fit.adapter_jobs([p for p in PRECISIONS if tflops[p] and p not in slow],
                                            device.type == "cuda", quick) if adapters else []
    if adapter_runs:
        say(f"LoRA adapters: {len(adapter_runs)} HF models over {world_size} local ranks ...")
        try:
            measure_adapter_costs(compute_timing, adapter_runs, dict(compute_spec, jobs=adapter_runs), world_size,
                                  threads)
        except ZerokitError as e:  # the full models' fit stands; adapters then cost their FLOPs only
            notes.append(f"LoRA adapter costs: {e}")
    elif not adapters:
        notes.append(f"LoRA adapter costs: not measured (calibrate {flag('finetune')} full); LoRA plans price "
                     "their FLOPs")
    else:
        notes.append("LoRA adapter costs: skipped, peft is not installed (pip install 'zerokit[train]')")
    return compute_timing


def _measure_optimizers(device, quick: bool, min_t: float, notes: list[str], say) -> tuple[float | None, float]:
    """run_calibration's cpu_adam_params_per_s (None where DeepSpeedCPUAdam is not measured) and
    torch_adamw_params_per_s."""
    n_opt = 2_000_000 if quick else 20_000_000
    ok, where = cpu_adam_available()
    cpu_adam = None
    if ok or not quick:
        say("DeepSpeedCPUAdam ...")
        try:
            cpu_adam = measure_cpu_adam(n_opt, min_time_s=min_t)
        except Exception as e:
            notes.append(f"cpu_adam: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    else:
        notes.append(f"cpu_adam: skipped in quick mode, {where}")
    say("torch AdamW ...")
    # on the device a step without optimizer offload updates on: a GPU's (DeepSpeed's FusedAdam there; torch's
    # foreach AdamW is the same bandwidth-bound pass). Profiles before torch_adamw_device timed the host's on GPUs
    # too, and priced a 246M-parameter H200 step's update at 316 ms against ~3 ms of HBM traffic (an H200 profile
    # of 2026-11-26: its gpu-llama ZeRO-0 row predicted 382 ms, measured 89)
    adamw = measure_torch_adamw(n_opt, device, min_time_s=min_t)
    return cpu_adam, adamw


def _measure_engines(profile: dict, tflops: dict[str, float | None], slow, device, world_size: int,
                     threads: int | None, quick: bool, cpu_adam: float | None, notes: list[str], say) -> None:
    """Add the real DeepSpeed engines' costs to run_calibration's profile (engine_fit.measure_engine_overhead; in full
    mode also the peft modules, TP / SP and, on a CPU machine, the ZeRO-3 ring); a failure is a note."""
    from zerokit.measure.engine_fit import measure_engine_overhead

    precs = [p for p in PRECISIONS if tflops.get(p) and p not in slow]  # slow ones are never planned
    if quick:  # the precision a plan here picks (the fastest matmul); the others borrow its fit (timing.engine_fits)
        precs = [max(precs, key=lambda p: tflops[p])]
    try:
        # the offloaded engines need DeepSpeedCPUAdam, measured above when its op loads
        profile["engine_overhead"] = measure_engine_overhead(profile, precs, world_size, threads, log=say,
                                                             offload=cpu_adam is not None, quick=quick)
    except ZerokitError as e:
        notes.append(f"engine costs: {e}")
    else:
        if quick:
            notes.append(f"engine costs: one pass of the plain engines in {precs[0]} (quick mode; other precisions "
                         "borrow it): no recompute, offload, LoRA, TP/SP or 4-rank terms (the full calibration, "
                         "~10 min, measures them)")
        else:
            measure_peft_modules(profile, precs, world_size, threads, notes, say)
            measure_model_parallel(profile, precs, world_size, threads, notes, say)
            if device.type == "cpu":  # on GPUs the engines above already ran on every GPU of the node
                measure_zero_ring(profile, precs, threads, notes, say)


def run_calibration(output_path: str | os.PathLike | None, quick: bool = False, device: Any = None,
                    world_size: int | None = None, log=None, precisions: tuple[str, ...] | None = None,
                    adapters: bool = True, gated_mlp: bool | None = None) -> dict:
    """Measure this machine; write the profile JSON to output_path (if given) and return it.
    world_size: the local ranks the benchmarks run on (default benchmark_world_size); with one, no collectives.
    quick=True: small sizes and short timings, the plain engines once (~130 s on a 2-core CPU machine with peft and bitsandbytes; the
    full calibration 554 s, with the LoRA and QLoRA models, the engines (2 passes), the TP / SP engines and the 4-rank
    ZeRO-3 ones).
    precisions: measure these only (fp32 always: every profile prices its matmul); adapters=False: no LoRA/QLoRA
    models (a plan of a full fine-tune prices none of their costs).
    gated_mlp: time what a plan of such a model prices, no more: its block family only (compute_fit.FAMILIES; the
    profile's other family falls back to it, TimingTerms.compute_coefficients), and of the 16-bit precisions only the
    one whose matmul is fastest here (the planner never prefers a slower one at equal memory; the others are left
    unmeasured, so plans on this profile do not choose them). `make demo` measures so for its model, in about 1.5
    minutes on 2 cores."""
    import torch

    say = log or (lambda msg: None)
    if output_path:  # before minutes of measuring, not after
        _check_output_path(output_path)
    t0 = time.perf_counter()
    device = device_of(device)
    world_size = world_size or benchmark_world_size(device)
    notes: list[str] = []
    min_t = 0.3 if quick else 1.5
    if device.type == "cpu":
        size = 1024 if quick else 2048
    else:
        size = 4096 if quick else 8192

    tflops, spread = _measure_matmuls(device, size, min_t, precisions, notes, say)
    families = _block_families(gated_mlp, tflops, spread, notes)
    slow = slow_precisions(tflops)
    compute_jobs = _compute_jobs(tflops, slow, families, device, quick, notes)
    compute_spec = {"jobs": compute_jobs, "min_time_s": 0.05 if quick else 0.3,
                    "device": None if device.type == "cpu" else "cuda"}
    say(f"collectives and the compute of {len(compute_jobs)} HF models over {world_size} local ranks ...")
    threads = None
    if device.type == "cpu":
        # the ranks of a CPU job share the cores: each gets cores / ranks threads (DeepSpeed's
        # --bind_cores_to_rank; bench/accuracy sets OMP_NUM_THREADS so). With torch's default (all cores in
        # every rank) the ranks' OpenMP pools fight for the cores: measured 100x slower steps on 2 cores.
        threads = max(1, (os.cpu_count() or 1) // world_size)
    coll = _measure_ranks(device, world_size, quick, compute_spec, threads, notes)

    compute_timing = None
    if coll.get("compute_seconds"):
        compute_timing = _fit_compute(coll, compute_spec, world_size, threads, tflops, slow, device, quick, adapters,
                                      notes, say)

    copies: dict[str, float | None] = {"h2d_gbps": None, "d2h_gbps": None}
    if device.type == "cuda":
        say("host<->device copies ...")
        copies = measure_copy_bandwidth(64 * MiB if quick else 512 * MiB, device)

    cpu_adam, adamw = _measure_optimizers(device, quick, min_t, notes, say)

    import importlib.metadata as md

    try:
        ds_version = md.version("deepspeed")
    except md.PackageNotFoundError:
        ds_version = None
    profile = {
        "zerokit_hardware_profile": SCHEMA,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "quick": quick,
        "device": _device_info(device),
        "software": {"torch": torch.__version__, "deepspeed": ds_version, "torch_threads": torch.get_num_threads()},
        "matmul_size": size,
        "matmul_tflops": tflops,
        "matmul_spread_cv": spread,
        "collectives": {k: v for k, v in coll.items() if k != "compute_seconds"},
        "collectives_by_backend": collectives_by_backend(coll),
        "compute_timing": compute_timing,
        "compute_threads": threads,
        "collective_latency_s": coll.get("latency_s"),
        "all_reduce_latency_s": coll.get("all_reduce_latency_s"),
        "all_gather_latency_s": coll.get("all_gather_latency_s"),
        "all_to_all_latency_s": coll.get("all_to_all_latency_s"),
        **copies,
        "cpu_adam_params_per_s": cpu_adam,
        "torch_adamw_params_per_s": adamw,
        "torch_adamw_device": device.type,
        "notes": notes,
    }
    _measure_engines(profile, tflops, slow, device, world_size, threads, quick, cpu_adam, notes, say)
    profile["wall_s"] = round(time.perf_counter() - t0, 2)
    if output_path:
        from zerokit.core.fsutil import atomic_write_text

        atomic_write_text(output_path, json.dumps(profile, indent=2) + "\n")
    return profile


# -- summary ------------------------------------------------------------------------------------------
def format_profile(prof: dict) -> str:
    lines = [f"device: {prof['device']['type']} {prof['device'].get('name', '')} ({prof['device'].get('cpu_cores')} cores)"]
    for prec, v in prof["matmul_tflops"].items():
        lines.append(f"matmul {prec}: " + (f"{v * 1000:.1f} GFLOP/s" if v else "unsupported"))
    coll = prof.get("collectives") or {}
    if "error" in coll:
        lines.append(f"collectives: {coll['error']}")
    elif "backend" not in coll:  # one rank (one GPU): no link measured, the catalog's bandwidths stand
        lines.append("collectives: one rank, not measured")
    else:
        lines.append(f"all-reduce busbw ({coll['backend']}, {coll['world_size']} ranks): {coll['all_reduce_busbw_gbps']:.2f} GB/s; "
                     f"all-gather: {coll['all_gather_busbw_gbps']:.2f} GB/s")
    if prof.get("h2d_gbps"):
        lines.append(f"host->device {prof['h2d_gbps']:.1f} GB/s, device->host {prof['d2h_gbps']:.1f} GB/s")
    for family, by_prec in (prof.get("compute_timing") or {}).items():
        for prec, v in by_prec.items():
            c = v["coef"]
            lines.append(f"compute {family} {prec}: {c['micro'] * 1e3:.2f} ms per micro step + {c['layer'] * 1e3:.2f} ms "
                         f"per layer, {v['tflops'] * 1e3 if v.get('tflops') else 0:.1f} GFLOP/s")
    ca = prof.get("cpu_adam_params_per_s")
    lines.append("DeepSpeedCPUAdam: " + (f"{ca / 1e6:.1f} M params/s" if ca else "not measured"))
    lines.append(f"torch AdamW ({prof.get('torch_adamw_device', 'cpu')}): {prof['torch_adamw_params_per_s'] / 1e6:.1f} M params/s")
    lines += [f"note: {n}" for n in prof.get("notes", [])]
    return "\n".join(lines)
