"""The local-rank harness of zerokit's benchmarks: start N processes at once, time a loop on all of them in
lockstep, read what rank 0 printed. Used by the collective, compute and engine benchmarks of calibration."""

from __future__ import annotations

import json
import math
import os
import socket
import time
from typing import Any

from zerokit.core.errors import ZerokitError


def free_port() -> int:
    """A TCP port free on this host now (for a rendezvous), chosen by the kernel."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def device_of(device: Any = None):
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Lockstep:
    """Runs a timed loop on every rank at once, as the ranks of a training job run: all ranks agree on the
    iteration count, start together (barrier) and the slowest rank's median iteration is the time.
    A rank timed alone, or a min over iterations, catches moments when the other ranks are idle and
    reads the uncontended speed: on this project's 2-vCPU machine two 1-thread ranks each run at half
    the speed of one (measured: HF tiny-llama forward + backward 62 ms alone, 120 ms with both ranks busy)."""

    def __init__(self, device):
        self.device = device

    def time(self, fn, min_time_s: float) -> float:
        import statistics

        import torch
        import torch.distributed as dist

        fn()
        sync(self.device)
        t0 = time.perf_counter()
        fn()
        sync(self.device)
        once = max(time.perf_counter() - t0, 1e-6)
        n = torch.tensor([max(3, math.ceil(min_time_s / once))], dtype=torch.float64, device=self.device)
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
        times = []
        dist.barrier()
        for _ in range(int(n.item())):
            t1 = time.perf_counter()
            fn()
            sync(self.device)
            times.append(time.perf_counter() - t1)
        t = torch.tensor([statistics.median(times)], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())


def run_local_ranks(cmd: list[str], envs: list[dict], timeout_s: float, what: str) -> list[str]:
    """Run one process per env (the ranks of a local benchmark) at once, with this package importable;
    return each rank's stdout. Output goes to files, not pipes: DeepSpeed logs a lot, and a rank blocked on
    a full pipe would stall the others. A timeout or a failed rank raises ZerokitError naming `what` and
    the rank's last line."""
    import subprocess
    import tempfile

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
