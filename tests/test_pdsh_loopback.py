"""The pdsh multi-node path for real, on one machine: two hostfile "hosts" that are both 127.0.0.1.

The test starts a private sshd (own config, host key and authorized_keys under tmp_path, on a free
port of 127.0.0.1), writes a hostfile `localhost slots=1` / `127.0.0.1 slots=1` and .deepspeed_env
(zerokit.spec.hostfile.write_deepspeed_env) for the remote ranks' PATH/PYTHONPATH/TORCH_EXTENSIONS_DIR,
then runs `deepspeed --launcher pdsh --ssh_port P --master_addr 127.0.0.1 --no_ssh_check` over the
tests.helpers.ranks_probe module: pdsh ssh-es into both "hosts", each runs one rank, and the two
ranks all_reduce over gloo.

ssh reads its key and host-key policy from the config file named in PDSH_SSH_ARGS_APPEND (`-F`);
DeepSpeed appends `-p PORT` from --ssh_port. --no_ssh_check because DeepSpeed's own ssh check
does not use PDSH_SSH_ARGS_APPEND (it would hit the key prompt and the known_hosts check).

Needs: pdsh, sshd, ssh, ssh-keygen (apt: pdsh openssh-server openssh-client). sshd needs its
privilege-separation directory (/run/sshd); the test creates it when running as root. Skipped,
with the reason, when any of that is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zerokit.spec.hostfile import parse_hostfile, write_deepspeed_env
from zerokit.launching.command import LaunchSpec, build_launch_command, resolve_resources
from zerokit.measure.ranks import free_port

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
PROBE_LINE = re.compile(r"PROBE tag=pdsh rank=(\d+) world=(\d+) local_rank=(\d+) dist_rank=(\d+) dist_world=(\d+) host=\S+ sum=(\d+)")

pytestmark = pytest.mark.slow




def find_sshd() -> str | None:
    return shutil.which("sshd") or next((p for p in ("/usr/sbin/sshd", "/sbin/sshd") if os.access(p, os.X_OK)), None)


@pytest.fixture
def private_sshd(tmp_path):
    """An sshd on 127.0.0.1:<free port> that lets the current user in with a key made here."""
    missing = [name for name in ("pdsh", "ssh", "ssh-keygen") if not shutil.which(name)]
    sshd = find_sshd()
    if not sshd:
        missing.append("sshd")
    if missing:
        pytest.skip(f"pdsh loopback needs {', '.join(missing)} (apt-get install pdsh openssh-server openssh-client)")
    privsep = Path("/run/sshd")
    if not privsep.is_dir():
        if os.geteuid() != 0:
            pytest.skip("sshd needs its privilege separation directory /run/sshd, which only root can create")
        privsep.mkdir(mode=0o755, parents=True, exist_ok=True)

    d = tmp_path / "ssh"
    d.mkdir(mode=0o700)
    for key in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    (d / "authorized_keys").write_text((d / "user_key.pub").read_text())
    (d / "authorized_keys").chmod(0o600)
    port = free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPidFile {d / 'sshd.pid'}\n"
        "PermitRootLogin yes\nPubkeyAuthentication yes\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nMaxStartups 50\n"
    )
    (d / "ssh_config").write_text(
        f"Host *\n  IdentityFile {d / 'user_key'}\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
        "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  BatchMode yes\n  ConnectTimeout 10\n"
    )
    log = open(d / "sshd.log", "w")
    proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(d / "sshd_config")], stdout=log, stderr=subprocess.STDOUT)
    try:
        ssh = ["ssh", "-F", str(d / "ssh_config"), "-p", str(port)]
        deadline = time.time() + 20
        while True:
            if proc.poll() is not None:
                pytest.skip(f"private sshd exited at start: {(d / 'sshd.log').read_text().strip()[-500:]}")
            r = subprocess.run(ssh + ["127.0.0.1", "true"], capture_output=True, text=True, timeout=30)
            if r.returncode == 0:
                break
            if time.time() > deadline:
                pytest.fail(
                    f"cannot ssh into the private sshd on port {port}: {r.stderr.strip()[-300:]}; "
                    f"sshd log: {(d / 'sshd.log').read_text().strip()[-500:]}"
                )
            time.sleep(0.3)
        yield {"port": port, "ssh_config": d / "ssh_config", "dir": d}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_pdsh_two_hosts_on_loopback(tmp_path, private_sshd):
    pytest.importorskip("deepspeed")
    work = tmp_path / "work"
    work.mkdir()
    hostfile = work / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    hosts = parse_hostfile(hostfile)

    # what the remote ranks need: they get a login shell's environment plus .deepspeed_env
    path = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"
    ext = os.environ.get("TORCH_EXTENSIONS_DIR") or str(REPO / ".cache" / "torch_extensions")
    remote_env = {"PATH": path, "PYTHONPATH": str(REPO), "TORCH_EXTENSIONS_DIR": ext}
    env_file = write_deepspeed_env(work, remote_env)

    spec = LaunchSpec(
        launcher="pdsh",
        num_gpus=1,
        num_nodes=2,
        hostfile=str(hostfile),
        master_addr="127.0.0.1",
        master_port=free_port(),
        ssh_port=private_sshd["port"],
        no_ssh_check=True,
        module="tests.helpers.ranks_probe",
        script_args=["--tag", "pdsh"],
        deepspeed_bin=str(VENV_BIN / "deepspeed"),
    )
    assert resolve_resources(spec, hosts) == {"localhost": [0], "127.0.0.1": [0]}
    argv, extra = build_launch_command(spec)

    env = dict(os.environ)
    env.update(extra)
    env.update(remote_env)
    env["PDSH_SSH_ARGS_APPEND"] = f"-F {private_sshd['ssh_config']}"
    env.pop("CUDA_VISIBLE_DEVICES", None)
    t0 = time.time()
    r = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    elapsed = time.time() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert f"deepspeed_env file = ./{env_file.name}" in out  # DeepSpeed read ours from its cwd
    assert "pdsh -S -f 1024 -w localhost,127.0.0.1" in out
    got = {int(m.group(1)): tuple(map(int, m.groups()[1:])) for m in PROBE_LINE.finditer(out)}
    # rank: (world, local_rank, dist_rank, dist_world, all_reduce sum); both local_rank 0: one per "host"
    assert got == {0: (2, 0, 0, 2, 3), 1: (2, 0, 1, 2, 3)}, out[-4000:]
    # each rank ran under pdsh on its own "host"
    assert re.search(r"^localhost: PROBE tag=pdsh rank=0 ", out, re.M), out[-4000:]
    assert re.search(r"^127\.0\.0\.1: PROBE tag=pdsh rank=1 ", out, re.M), out[-4000:]
    print(f"pdsh loopback launch, 2 hosts x 1 rank: {elapsed:.1f}s")
