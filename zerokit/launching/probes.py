"""What launch preparation asks of the machine: local CUDA devices, ssh reachability of hosts, the deepspeed
launcher binary. Each probe is a plain function (tests replace what a machine here lacks)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

from zerokit.core.errors import ZerokitError
from zerokit.spec.hardware import local_gpus

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def cuda_devices() -> tuple[int, int | None]:
    """(count, memory MiB of the first) of local NVIDIA GPUs, without importing torch."""
    gpus = local_gpus()
    return len(gpus), (gpus[0][1] if gpus else None)


def is_local(host: str) -> bool:
    if host in LOCAL_HOSTS or host.startswith("127."):
        return True
    try:
        return host in (socket.gethostname(), socket.getfqdn())
    except OSError:
        return False


def check_hosts_reachable(hosts, timeout: int = 5, need_pdsh: bool = True) -> None:
    """ssh to every non-local host the way DeepSpeed's runner does; one-line error for the first failure."""
    remote = [h for h in hosts if not is_local(h)]
    if not remote:
        return
    ssh = shutil.which("ssh")
    if not ssh:
        raise ZerokitError(f"host {remote[0]} needs ssh but no ssh client is installed: apt-get install openssh-client")
    for h in remote:
        try:
            r = subprocess.run([ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout}",
                                "-o", "StrictHostKeyChecking=accept-new", h, "true"],
                               capture_output=True, text=True, timeout=timeout + 10)
            ok = r.returncode == 0
        except subprocess.TimeoutExpired:
            ok = False
        if not ok:
            raise ZerokitError(f"host {h} from the hostfile is unreachable over ssh (passwordless ssh is needed for "
                               "multi-node launch): fix the host name or ssh keys, or drop it from the hostfile")
    if need_pdsh and not shutil.which("pdsh"):
        raise ZerokitError("multi-node launch uses DeepSpeed's pdsh launcher but pdsh is not installed: apt-get install pdsh")


def deepspeed_bin() -> str:
    here = Path(sys.executable).parent / "deepspeed"
    if here.is_file():
        return str(here)
    found = shutil.which("deepspeed")
    if not found:
        raise ZerokitError("the deepspeed launcher is not installed: pip install 'zerokit[train]'")
    return found
