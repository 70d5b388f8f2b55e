"""`zerokit calibrate`: measure the machine it runs on and write a hardware profile JSON.

Measured: dense matmul throughput per precision the device supports, all-reduce / all-gather bus
bandwidth between 2 local ranks (gloo on CPU, nccl on GPU), host<->device copy bandwidth (GPU),
DeepSpeedCPUAdam and torch AdamW step rates (parameters per second).

``apply_profile(accelerator, path)`` turns a profile into an ``hardware.Accelerator`` for planning:
measured TFLOP/s replace the datasheet peaks with ``efficiency=1.0`` (measured throughput already
includes it), measured bandwidths replace the catalog ones.

Profile keys (schema 1; every number is measured on the machine named in "device"):
  zerokit_hardware_profile: 1
  device: {type: "cpu"|"cuda", name, count, memory_bytes, cpu_cores}
  matmul_tflops: {bf16, fp16, fp32}: TFLOP/s, or null where the device does not support it (see notes)
  matmul_size: n of the n x n x n matmul
  collectives: {backend, world_size, all_reduce_busbw_gbps, all_gather_busbw_gbps, by_size: [...]}
    (bus bandwidth in GB/s, the nccl-tests convention: all-reduce algbw * 2(n-1)/n, all-gather
    algbw * (n-1)/n), or {error: ...}
  h2d_gbps, d2h_gbps: pinned host<->device copies (GPU only, else null)
  cpu_adam_params_per_s: DeepSpeedCPUAdam fp32 step rate (null if its op is not built, see notes)
  torch_adamw_params_per_s: torch.optim.AdamW (default foreach) step rate on the device's host
  compute_timing: {gated|plain: {precision: {coef: {feature: seconds per unit}, tflops, points}}}, the
    features timing.COMPUTE_FEATURES (micro step, layer, recomputed layer, FLOP, score, activation, logit):
    forward + backward with the loss of real HF models (a Llama for "gated", a GPT-2 for "plain") at 1 and 3
    layers over several shapes, timed on every rank at once (as the ranks of a job share the machine; on
    CPU with cores / ranks threads each, see compute_threads), and the seconds per unit of each of
    timing.compute_features fitted (calibrate_compute.py). Used by timing.py instead of matmul_tflops.
    (Profiles written before it have layer_timing, a block benchmark's overhead and throughput: still read.)
  compute_threads: torch threads per rank during the compute benchmark (CPU), null on GPUs
  collective_latency_s: the time of a 4 KiB all-reduce / all-gather, the faster (per-call cost of a collective)
  all_reduce_latency_s, all_gather_latency_s: the same per kind (gradient buckets are all-reduced, ZeRO-3
    parameters all-gathered)
  engine_overhead: {world_size, by_precision: {precision: {"0".."3": {per_step_s, per_layer_micro_s, runs}}}}: what real DeepSpeed
    engines cost beyond the terms above, per ZeRO stage (zerokit/calibrate_engine.py); absent in quick mode
  notes: [str], quick: bool, created, software: {torch, deepspeed}, wall_s
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import socket
import sys
import time
from typing import Any

from zerokit.errors import ZerokitError
from zerokit.timing import COMPUTE_FEATURES

__all__ = [
    "measure_matmul",
    "measure_collectives",
    "measure_cpu_adam",
    "measure_torch_adamw",
    "measure_copy_bandwidth",
    "run_calibration",
    "apply_profile",
    "efficiency_from_run",
    "main",
]

SCHEMA = 1
PRECISIONS = ("bf16", "fp16", "fp32")
_DT = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
MiB = 2**20


def _device(device: Any = None):
    import torch  # noqa: PLC0415

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _sync(device) -> None:
    import torch  # noqa: PLC0415

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def precision_supported(precision: str, device: Any = None) -> tuple[bool, str]:
    """Whether training in this precision works on the device, and why not."""
    import torch  # noqa: PLC0415

    device = _device(device)
    if precision == "fp32":
        return True, ""
    if device.type == "cpu":
        if precision == "fp16":
            return False, "fp16 is not supported on CPU (DeepSpeed: 'Type fp16 is not supported on your device')"
        return True, ""
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        return False, "this GPU has no bf16 support"
    return True, ""


def measure_matmul(precision: str, size: int = 2048, device: Any = None, min_time_s: float = 1.0) -> float:
    """Dense n x n x n matmul throughput in TFLOP/s (2 n^3 FLOPs per matmul), after one warm-up."""
    import torch  # noqa: PLC0415

    if precision not in _DT:
        raise ZerokitError(f"precision {precision!r} is not one of {', '.join(_DT)}")
    device = _device(device)
    ok, why = precision_supported(precision, device)
    if not ok:
        raise ZerokitError(why)
    dtype = getattr(torch, _DT[precision])
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    c = torch.empty(size, size, device=device, dtype=dtype)
    torch.matmul(a, b, out=c)  # warm-up (kernel selection, page faults)
    _sync(device)
    iters, elapsed = 0, 0.0
    t0 = time.perf_counter()
    while elapsed < min_time_s or iters < 2:
        torch.matmul(a, b, out=c)
        iters += 1
        if device.type == "cuda" and iters % 10:
            continue
        _sync(device)
        elapsed = time.perf_counter() - t0
    _sync(device)
    elapsed = time.perf_counter() - t0
    return 2.0 * size**3 * iters / elapsed / 1e12


def measure_copy_bandwidth(nbytes: int = 256 * MiB, device: Any = None, iters: int = 5) -> dict:
    """Pinned host <-> device copy bandwidth in GB/s (GPU only)."""
    import torch  # noqa: PLC0415

    device = _device(device)
    if device.type != "cuda":
        raise ZerokitError("host<->device copy bandwidth needs a GPU")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out = {}
    for name, dst, src in (("h2d_gbps", dev, host), ("d2h_gbps", host, dev)):
        dst.copy_(src, non_blocking=True)
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            dst.copy_(src, non_blocking=True)
        _sync(device)
        out[name] = nbytes * iters / (time.perf_counter() - t0) / 1e9
    return out


# -- collectives ------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collective_worker(rank: int, world_size: int, port: int, sizes: list[int], iters: int, backend: str) -> list[dict]:
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

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
        row = {"bytes": numel * 4}
        for name, fn in (
            ("all_reduce", lambda: dist.all_reduce(x)),
            ("all_gather", lambda: dist.all_gather_into_tensor(out, x)),
        ):
            fn()  # warm-up
            _sync(device)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(n_iter):
                fn()
            _sync(device)
            dt = (time.perf_counter() - t0) / n_iter
            t = torch.tensor([dt], dtype=torch.float64, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the time
            dt = float(t.item())
            n = world_size
            # bus bandwidth (nccl-tests): all-reduce moves 2(n-1)/n of the buffer per rank,
            # all-gather (n-1)/n of the gathered output
            factor = 2 * (n - 1) / n if name == "all_reduce" else (n - 1)
            row[f"{name}_s"] = dt
            row[f"{name}_busbw_gbps"] = numel * 4 * factor / dt / 1e9
        rows.append(row)
    dist.barrier()
    return rows


class _Lockstep:
    """Runs a timed loop on every rank at once, as the ranks of a training job run: all ranks agree on the
    iteration count, start together (barrier) and the slowest rank's median iteration is the time.
    A rank timed alone, or a min over iterations, catches moments when the other ranks are idle and
    reads the uncontended speed: on this project's 2-vCPU machine two 1-thread ranks each run at half
    the speed of one (measured: HF tiny-llama forward + backward 62 ms alone, 120 ms with both ranks busy)."""

    def __init__(self, device):
        self.device = device

    def time(self, fn, min_time_s: float) -> float:
        import statistics  # noqa: PLC0415

        import torch  # noqa: PLC0415
        import torch.distributed as dist  # noqa: PLC0415

        fn()
        _sync(self.device)
        t0 = time.perf_counter()
        fn()
        _sync(self.device)
        once = max(time.perf_counter() - t0, 1e-6)
        n = torch.tensor([max(3, math.ceil(min_time_s / once))], dtype=torch.float64, device=self.device)
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
        times = []
        dist.barrier()
        for _ in range(int(n.item())):
            t1 = time.perf_counter()
            fn()
            _sync(self.device)
            times.append(time.perf_counter() - t1)
        t = torch.tensor([statistics.median(times)], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())


def _worker_main() -> None:
    """Entry of one benchmark rank (a subprocess: no multiprocessing re-import of the caller's __main__)."""
    import warnings  # noqa: PLC0415

    import torch.distributed as dist  # noqa: PLC0415

    warnings.filterwarnings("ignore")
    spec = json.loads(os.environ["ZEROKIT_COLL_SPEC"])
    rank = int(os.environ["ZEROKIT_COLL_RANK"])
    rows = _collective_worker(rank, spec["world_size"], spec["port"], spec["sizes"], spec["iters"], spec["backend"])
    compute = None
    if spec.get("compute"):
        # every rank times the same real HF models at once, in lockstep, as training ranks share the machine
        from zerokit.calibrate_compute import rank_main  # noqa: PLC0415

        cs = spec["compute"]
        device = _device(cs.get("device"))
        compute = rank_main(cs, device, _Lockstep(device))
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print("ZEROKIT_RESULT " + json.dumps(rows), flush=True)
        if compute is not None:
            print("ZEROKIT_COMPUTE " + json.dumps(compute), flush=True)


def run_local_ranks(cmd: list[str], envs: list[dict], timeout_s: float, what: str) -> list[str]:
    """Run one process per env (the ranks of a local benchmark) at once, with this package importable;
    return each rank's stdout. Output goes to files, not pipes: DeepSpeed logs a lot, and a rank blocked on
    a full pipe would stall the others. A timeout or a failed rank raises ZerokitError naming `what` and
    the rank's last line."""
    import subprocess  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    envs = [dict(env, PYTHONPATH=root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""))
            for env in envs]

    with tempfile.TemporaryDirectory(prefix="zerokit-ranks-") as tmp:
        files = [(open(os.path.join(tmp, f"{r}.out"), "w+"), open(os.path.join(tmp, f"{r}.err"), "w+"))
                 for r in range(len(envs))]
        try:
            procs = [subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True)
                     for env, (out, err) in zip(envs, files)]
            deadline = time.monotonic() + timeout_s
            try:
                for p in procs:
                    p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                    p.wait()
                raise ZerokitError(f"{what} took over {timeout_s:.0f} s") from None
            texts = []
            for out, err in files:
                out.seek(0)
                err.seek(0)
                texts.append((out.read(), err.read()))
        finally:
            for out, err in files:
                out.close()
                err.close()
    for r, p in enumerate(procs):
        if p.returncode != 0:
            tail = texts[r][1].strip().splitlines()[-1:] or ["no output"]
            raise ZerokitError(f"{what}: rank {r} exited {p.returncode}: {tail[0]}")
    return [out for out, _ in texts]


def tagged_json(stdout: str, tag: str) -> Any:
    """The JSON a benchmark rank printed on its last line starting with `tag` (its other output is logs), or None."""
    found = None
    for line in stdout.splitlines():
        if line.startswith(tag + " "):
            found = json.loads(line[len(tag) + 1:])
    return found


def measure_collectives(world_size: int = 2, sizes: list[int] | tuple[int, ...] = (1 * MiB, 16 * MiB), iters: int = 5,
                        backend: str | None = None, timeout_s: float = 120.0, compute: dict | None = None,
                        threads: int | None = None) -> dict:
    """All-reduce and all-gather over `world_size` local processes (gloo on CPU, nccl on GPUs).
    Returns per-size times and bus bandwidths (GB/s) and the largest size's figures as the headline;
    with `compute` ({jobs, min_time_s, device}: calibrate_compute.benchmark_jobs) the same ranks then time
    those models in lockstep, returned as "compute_seconds"."""
    import torch  # noqa: PLC0415

    if world_size < 2:
        raise ZerokitError("collective bandwidth needs at least 2 ranks")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo"
    spec = {"world_size": world_size, "port": _free_port(), "sizes": list(sizes), "iters": iters, "backend": backend,
            "compute": compute}
    env = dict(os.environ, ZEROKIT_COLL_SPEC=json.dumps(spec))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    else:
        env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-c", "from zerokit.calibrate import _worker_main; _worker_main()"]
    outs = run_local_ranks(cmd, [dict(env, ZEROKIT_COLL_RANK=str(r)) for r in range(world_size)], timeout_s,
                           f"collective benchmark over {world_size} {backend} ranks")
    rows = tagged_json(outs[0], "ZEROKIT_RESULT")
    compute_seconds = tagged_json(outs[0], "ZEROKIT_COMPUTE")
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
        "by_size": rows,
    }
    if compute_seconds is not None:
        out["compute_seconds"] = compute_seconds
    return out


# -- optimizers -------------------------------------------------------------------------------------
def cpu_adam_available() -> tuple[bool, str]:
    """Whether DeepSpeedCPUAdam's op is prebuilt or already JIT-built (loading it then costs seconds)."""
    try:
        from deepspeed.git_version_info import installed_ops  # noqa: PLC0415
        from deepspeed.ops.op_builder import CPUAdamBuilder  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001
        return False, f"deepspeed is not importable ({type(e).__name__})"
    if installed_ops.get("cpu_adam"):
        return True, "prebuilt"
    from torch.utils.cpp_extension import _get_build_directory  # noqa: PLC0415

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
    import torch  # noqa: PLC0415
    from deepspeed.ops.adam import DeepSpeedCPUAdam  # noqa: PLC0415

    p = torch.nn.Parameter(torch.randn(params))
    p.grad = torch.randn(params) * 1e-3
    with _venv_ninja_first():
        opt = DeepSpeedCPUAdam([p], lr=1e-4, adamw_mode=True)
    return _rate(opt.step, params, min_time_s)


def measure_torch_adamw(params: int = 10_000_000, device: Any = None, min_time_s: float = 1.0) -> float:
    """torch.optim.AdamW (default implementation) step rate in parameters per second."""
    import torch  # noqa: PLC0415

    device = _device(device)
    p = torch.nn.Parameter(torch.randn(params, device=device))
    p.grad = torch.randn(params, device=device) * 1e-3
    opt = torch.optim.AdamW([p], lr=1e-4)

    def step():
        opt.step()
        _sync(device)

    return _rate(step, params, min_time_s)


# -- the whole calibration --------------------------------------------------------------------------
def _device_info(device) -> dict:
    import torch  # noqa: PLC0415

    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"type": "cuda", "name": props.name, "count": torch.cuda.device_count(),
                "memory_bytes": int(props.total_memory), "cpu_cores": os.cpu_count()}
    mem = 0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"type": "cpu", "name": name, "count": 1, "memory_bytes": int(mem), "cpu_cores": os.cpu_count()}


def run_calibration(output_path: str | os.PathLike | None, quick: bool = False, device: Any = None,
                    world_size: int = 2, log=None) -> dict:
    """Measure this machine; write the profile JSON to output_path (if given) and return it.
    quick=True: small sizes and short timings (~15 s on a 2-core CPU machine)."""
    import torch  # noqa: PLC0415

    say = log or (lambda msg: None)
    if output_path:  # before minutes of measuring, not after
        folder = os.path.dirname(os.path.abspath(os.fspath(output_path)))
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            raise ZerokitError(f"cannot create {folder} for the profile ({e.strerror}): pick another --output") from None
        try:
            if os.path.isdir(os.fspath(output_path)):
                raise IsADirectoryError(21, "a directory")
            import tempfile  # noqa: PLC0415

            with tempfile.TemporaryFile(dir=folder):  # a real write: permission bits do not tell for root or sysfs
                pass
        except OSError as e:
            raise ZerokitError(f"cannot write the profile to {os.fspath(output_path)} ({e.strerror}): "
                               "pick a writable file path for --output") from None
    t0 = time.perf_counter()
    device = _device(device)
    notes: list[str] = []
    min_t = 0.3 if quick else 1.5
    if device.type == "cpu":
        size = 1024 if quick else 2048
    else:
        size = 4096 if quick else 8192
    tflops: dict[str, float | None] = {}
    for prec in PRECISIONS:
        ok, why = precision_supported(prec, device)
        if not ok:
            tflops[prec] = None
            notes.append(f"{prec}: skipped, {why}")
            continue
        say(f"matmul {prec} {size}^3 ...")
        try:
            tflops[prec] = measure_matmul(prec, size, device, min_time_s=min_t)
        except Exception as e:  # noqa: BLE001
            tflops[prec] = None
            notes.append(f"{prec}: matmul failed: {type(e).__name__}: {e}")
    if tflops.get("fp32") is None:
        raise ZerokitError("fp32 matmul could not be measured on this machine")

    from zerokit import calibrate_compute  # noqa: PLC0415

    sizes = [4096, 1 * MiB, 16 * MiB] if quick else [4096, 1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
    compute_jobs = calibrate_compute.benchmark_jobs([p for p in PRECISIONS if tflops.get(p)], device.type == "cuda", quick)
    compute_spec = {"jobs": compute_jobs, "min_time_s": 0.05 if quick else 0.3,
                    "device": None if device.type == "cpu" else "cuda"}
    say(f"collectives and the compute of {len(compute_jobs)} HF models over {world_size} local ranks ...")
    threads = None
    if device.type == "cpu":
        # the ranks of a CPU job share the cores: each gets cores / ranks threads (DeepSpeed's
        # --bind_cores_to_rank; bench/accuracy sets OMP_NUM_THREADS so). With torch's default (all cores in
        # every rank) the ranks' OpenMP pools fight for the cores: measured 100x slower steps on 2 cores.
        threads = max(1, (os.cpu_count() or 1) // world_size)
    if device.type == "cuda" and torch.cuda.device_count() < world_size:
        notes.append(f"only {torch.cuda.device_count()} GPU(s): collectives measured over gloo between host processes, "
                     "not GPU links; intra_node_bw is kept from the catalog")
    try:
        coll = measure_collectives(world_size, sizes, iters=3 if quick else 10, compute=compute_spec, threads=threads,
                                   timeout_s=900.0)
    except ZerokitError as e:
        coll = {"error": str(e)}
        notes.append(f"collectives: {e}")

    copies: dict[str, float | None] = {"h2d_gbps": None, "d2h_gbps": None}
    if device.type == "cuda":
        say("host<->device copies ...")
        copies = measure_copy_bandwidth(64 * MiB if quick else 512 * MiB, device)

    n_opt = 2_000_000 if quick else 20_000_000
    ok, where = cpu_adam_available()
    cpu_adam = None
    if ok or not quick:
        say("DeepSpeedCPUAdam ...")
        try:
            cpu_adam = measure_cpu_adam(n_opt, min_time_s=min_t)
        except Exception as e:  # noqa: BLE001
            notes.append(f"cpu_adam: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    else:
        notes.append(f"cpu_adam: skipped in quick mode, {where}")
    say("torch AdamW ...")
    adamw = measure_torch_adamw(n_opt, "cpu", min_time_s=min_t)

    import importlib.metadata as md  # noqa: PLC0415

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
        "collectives": {k: v for k, v in coll.items() if k != "compute_seconds"},
        "compute_timing": calibrate_compute.fit_profile(compute_jobs, coll["compute_seconds"])
        if coll.get("compute_seconds") else None,
        "compute_threads": threads,
        "collective_latency_s": coll.get("latency_s"),
        "all_reduce_latency_s": coll.get("all_reduce_latency_s"),
        "all_gather_latency_s": coll.get("all_gather_latency_s"),
        **copies,
        "cpu_adam_params_per_s": cpu_adam,
        "torch_adamw_params_per_s": adamw,
        "notes": notes,
    }
    if quick:
        notes.append("engine costs: skipped in quick mode (real DeepSpeed engines per ZeRO stage and precision, ~1 min)")
    else:
        from zerokit.calibrate_engine import measure_engine_overhead  # noqa: PLC0415

        precs = [p for p in PRECISIONS if tflops.get(p)]
        try:
            # the offloaded engines need DeepSpeedCPUAdam, measured above when its op loads
            profile["engine_overhead"] = measure_engine_overhead(profile, precs, world_size, threads, log=say,
                                                                 offload=cpu_adam is not None)
        except ZerokitError as e:
            notes.append(f"engine costs: {e}")
    profile["wall_s"] = round(time.perf_counter() - t0, 2)
    if output_path:
        from zerokit.fsutil import atomic_write_text  # noqa: PLC0415

        atomic_write_text(output_path, json.dumps(profile, indent=2) + "\n")
    return profile


# -- using a profile --------------------------------------------------------------------------------
def load_profile(profile_path: str | os.PathLike) -> dict:
    path = os.fspath(profile_path)
    try:
        with open(path) as f:
            prof = json.load(f)
    except FileNotFoundError:
        raise ZerokitError(f"hardware profile {path} does not exist: run `zerokit calibrate --output {path}` first") from None
    except (OSError, ValueError) as e:
        raise ZerokitError(f"hardware profile {path} is not readable JSON ({e}): re-run `zerokit calibrate`") from None
    if not isinstance(prof, dict) or prof.get("zerokit_hardware_profile") != SCHEMA:
        raise ZerokitError(f"{path} is not a zerokit hardware profile (schema {SCHEMA}): re-run `zerokit calibrate`")
    mt = prof.get("matmul_tflops")
    if not isinstance(mt, dict) or not _pos(mt.get("fp32")):
        raise ZerokitError(f"hardware profile {path} has no positive matmul_tflops.fp32: re-run `zerokit calibrate`")
    for prec in PRECISIONS:
        v = mt.get(prec)
        if v is not None and not _pos(v):
            raise ZerokitError(f"hardware profile {path}: matmul_tflops.{prec} = {v!r} is not a positive number or null")
    dev = prof.get("device")
    if not isinstance(dev, dict) or dev.get("type") not in ("cpu", "cuda"):
        raise ZerokitError(f"hardware profile {path} has no device.type (cpu or cuda): re-run `zerokit calibrate`")
    return prof


def _pos(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and v == v and v != float("inf")


def apply_profile(accelerator, profile_path):
    """The accelerator with measured figures from a profile (see the module docstring for the keys).
    TFLOP/s <- matmul_tflops (efficiency 1.0: measured throughput already includes it; a precision
    the profile marks null becomes unsupported), intra_node_bw <- all-reduce bus bandwidth,
    pcie_bw <- min(h2d, d2h), memory_bytes <- device memory, source names the profile."""
    prof = load_profile(profile_path)
    dev = prof["device"]
    is_cpu_profile = dev["type"] == "cpu"
    if bool(getattr(accelerator, "is_cpu", False)) != is_cpu_profile:
        want = "--gpu cpu" if is_cpu_profile else "the --gpu it was measured on"
        raise ZerokitError(
            f"hardware profile {os.fspath(profile_path)} was measured on {dev['type']} ({dev.get('name', '?')}) "
            f"but the plan targets {accelerator.name}: use {want}, or calibrate on the target machine"
        )
    mt = prof["matmul_tflops"]
    changes: dict[str, Any] = {"efficiency": 1.0, "fp32_tflops": float(mt["fp32"])}
    for prec in ("bf16", "fp16"):
        if prec not in mt:
            continue
        if mt[prec] is None:
            changes[prec] = False
            changes[f"{prec}_tflops"] = 0.0
        else:
            changes[prec] = True
            changes[f"{prec}_tflops"] = float(mt[prec])
    coll = prof.get("collectives") or {}
    if _pos(coll.get("all_reduce_busbw_gbps")) and not (dev["type"] == "cuda" and coll.get("backend") != "nccl"):
        changes["intra_node_bw"] = float(coll["all_reduce_busbw_gbps"])
    copies = [prof.get("h2d_gbps"), prof.get("d2h_gbps")]
    if all(_pos(c) for c in copies):
        changes["pcie_bw"] = float(min(copies))
    if _pos(dev.get("memory_bytes")):
        changes["memory_bytes"] = int(dev["memory_bytes"])
    fields = {f.name for f in dataclasses.fields(accelerator)}
    for key in ("cpu_adam_params_per_s", "torch_adamw_params_per_s"):
        if key in fields and _pos(prof.get(key)):
            changes[key] = float(prof[key])
    changes["source"] = (
        f"measured by zerokit calibrate{' --quick' if prof.get('quick') else ''} on {dev.get('name', dev['type'])} "
        f"({prof.get('created', '?')}): {os.fspath(profile_path)}"
    )
    terms = _timing_terms_of(prof)
    if terms:
        _TIMING_TERMS[changes["source"]] = terms
    return dataclasses.replace(accelerator, **{k: v for k, v in changes.items() if k in fields})


# Measured step-time terms of the profiles applied in this process, by the Accelerator.source that
# apply_profile wrote (the Accelerator dataclass has no field for them; source survives replace()).
_TIMING_TERMS: dict[str, dict] = {}


def _timing_terms_of(prof: dict) -> dict:
    out: dict[str, Any] = {}
    compute: dict[str, dict] = {}
    for family, by_prec in (prof.get("compute_timing") or {}).items():
        for prec, v in (by_prec or {}).items():
            coef = (v or {}).get("coef") if isinstance(v, dict) else None
            if prec in PRECISIONS and isinstance(coef, dict) and _pos(coef.get("flop")) and all(
                    isinstance(coef.get(n, 0.0), (int, float)) and coef.get(n, 0.0) >= 0 for n in COMPUTE_FEATURES):
                compute.setdefault(family, {})[prec] = {n: float(coef.get(n, 0.0)) for n in COMPUTE_FEATURES}
    # profiles before compute_timing: a block benchmark's (overhead, throughput) per precision, priced as
    # (layers (x 4/3 with recompute) + 1) x overhead + FLOPs / throughput
    lt = {} if compute else (prof.get("layer_timing") or {})
    for family, block in (("gated", lt), ("plain", lt.get("plain") or {})):
        for prec, v in block.items():
            if prec in PRECISIONS and isinstance(v, dict) and _pos(v.get("layer_tflops")) \
                    and isinstance(v.get("layer_overhead_s"), (int, float)) and v["layer_overhead_s"] >= 0:
                o = float(v["layer_overhead_s"])
                compute.setdefault(family, {})[prec] = {"micro": o, "layer": o, "recompute": o / 3,
                                                        "flop": 1e-12 / float(v["layer_tflops"])}
    if compute:
        out["compute"] = compute
    if _pos(prof.get("collective_latency_s")):
        out["collective_latency_s"] = float(prof["collective_latency_s"])
    for key in ("all_reduce_latency_s", "all_gather_latency_s"):  # profiles before these keys: the shared one
        v = prof.get(key) if _pos(prof.get(key)) else prof.get("collective_latency_s")
        if _pos(v):
            out[key] = float(v)
    for key in ("torch_adamw_params_per_s", "cpu_adam_params_per_s"):
        if _pos(prof.get(key)):
            out[key] = float(prof[key])
    if isinstance(prof.get("engine_overhead"), dict):
        out["engine_overhead"] = prof["engine_overhead"]
    return out


def timing_terms(accelerator) -> dict | None:
    """The measured step-time terms (layer overhead and throughput per precision, collective latency,
    optimizer rates) of the profile this accelerator came from, or None for a catalog accelerator."""
    src = getattr(accelerator, "source", "") or ""
    if src in _TIMING_TERMS:
        return _TIMING_TERMS[src]
    return None


def efficiency_from_run(predicted_step_s: float, measured_step_s: float, current_efficiency: float) -> float:
    """The efficiency that would have made the prediction match the measured step time.
    Step time scales as 1/efficiency, so new = current * predicted / measured, clamped to [0.01, 1]."""
    for name, v in (("predicted_step_s", predicted_step_s), ("measured_step_s", measured_step_s),
                    ("current_efficiency", current_efficiency)):
        if not _pos(v):
            raise ZerokitError(f"{name} must be a positive number, got {v!r}")
    return max(0.01, min(1.0, current_efficiency * predicted_step_s / measured_step_s))


# -- CLI ----------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", "-o", default="hardware-profile.json", help="where to write the profile JSON")
    parser.add_argument("--quick", action="store_true", help="small sizes, ~15 s on a 2-core machine")
    parser.add_argument("--world-size", type=int, default=2, help="local ranks for the collective benchmark")


def run_from_args(args: argparse.Namespace) -> int:
    prof = run_calibration(args.output, quick=args.quick, world_size=args.world_size,
                           log=lambda m: print(m, file=sys.stderr, flush=True))
    print(format_profile(prof))
    print(f"wrote {args.output}")
    return 0


def format_profile(prof: dict) -> str:
    lines = [f"device: {prof['device']['type']} {prof['device'].get('name', '')} ({prof['device'].get('cpu_cores')} cores)"]
    for prec, v in prof["matmul_tflops"].items():
        lines.append(f"matmul {prec}: " + (f"{v * 1000:.1f} GFLOP/s" if v else "unsupported"))
    coll = prof.get("collectives") or {}
    if "error" in coll:
        lines.append(f"collectives: {coll['error']}")
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
    lines.append(f"torch AdamW: {prof['torch_adamw_params_per_s'] / 1e6:.1f} M params/s")
    lines += [f"note: {n}" for n in prof.get("notes", [])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zerokit calibrate", description="measure this machine; write a hardware profile")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_from_args(args)
    except ZerokitError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
