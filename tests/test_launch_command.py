"""zerokit.launching.command: the argv parsed back by DeepSpeed's own runner, the sbatch script, real launches."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zerokit.core.errors import ZerokitError
from zerokit.measure.ranks import free_port
from zerokit.launching.command import (
    LaunchSpec,
    build_launch_command,
    render_sbatch,
    resolve_resources,
    slurm_entry_script,
)

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
PROBE = "tests.helpers.ranks_probe"
PROBE_LINE = re.compile(r"PROBE tag=(\S*) rank=(\d+) world=(\d+) local_rank=(\d+) dist_rank=(\d+) dist_world=(\d+) host=\S+ sum=(\d+)")


@pytest.fixture(scope="module")
def ds_runner():
    pytest.importorskip("deepspeed")
    from deepspeed.launcher import runner

    return runner


def parse_back(runner_mod, argv):
    assert argv[0] == "deepspeed" or argv[0].endswith("deepspeed")
    return runner_mod.parse_args(argv[1:])


# ------------------------------------------------------------------------------------------------
# argv, parsed back by deepspeed.launcher.runner.parse_args


def test_local(ds_runner):
    spec = LaunchSpec(launcher="local", num_gpus=2, master_port=29555, script_args=["--config", "run.json", "--steps", "5"])
    argv, env = build_launch_command(spec)
    assert argv == [
        "deepspeed", "--num_gpus", "2", "--master_port", "29555",
        "--module", "zerokit.launching.train", "--config", "run.json", "--steps", "5",
    ]  # fmt: skip
    assert env == {}
    a = parse_back(ds_runner, argv)
    assert (a.num_gpus, a.num_nodes, a.master_port, a.module) == (2, -1, 29555, True)
    assert (a.include, a.exclude, a.launcher) == ("", "", "pdsh")  # launcher unused on one node
    assert a.hostfile == ds_runner.DLTS_HOSTFILE  # not given: DeepSpeed falls back to local resources
    assert a.user_script == "zerokit.launching.train"
    assert a.user_args == ["--config", "run.json", "--steps", "5"]


def test_local_include_replaces_num_gpus(ds_runner):
    argv, _ = build_launch_command(LaunchSpec(launcher="local", num_gpus=2, include="localhost:1,3"))
    a = parse_back(ds_runner, argv)
    assert "--num_gpus" not in argv  # DeepSpeed refuses --num_gpus with --include
    assert (a.include, a.num_gpus) == ("localhost:1,3", -1)


def test_local_bind_cores_and_env(ds_runner):
    spec = LaunchSpec(launcher="local", num_gpus=1, bind_cores_to_rank=True, env={"OMP_NUM_THREADS": "4"})
    argv, env = build_launch_command(spec)
    assert parse_back(ds_runner, argv).bind_cores_to_rank is True
    assert env == {"OMP_NUM_THREADS": "4"}
    env["X"] = "1"
    assert spec.env == {"OMP_NUM_THREADS": "4"}  # the builder never hands out the spec's own dict


def test_pdsh(ds_runner):
    spec = LaunchSpec(
        launcher="pdsh", num_gpus=8, num_nodes=2, hostfile="hostfiles/two-nodes-8gpu",
        master_addr="10.0.0.1", master_port=29600, ssh_port=2222, no_ssh_check=True,
        script_args=["--plan", "plan.json"],
    )  # fmt: skip
    argv, env = build_launch_command(spec)
    a = parse_back(ds_runner, argv)
    assert (a.hostfile, a.launcher, a.num_nodes, a.num_gpus) == ("hostfiles/two-nodes-8gpu", "pdsh", 2, 8)
    assert (a.master_addr, a.master_port, a.ssh_port, a.no_ssh_check) == ("10.0.0.1", 29600, 2222, True)
    assert (a.module, a.user_script, a.user_args) == (True, "zerokit.launching.train", ["--plan", "plan.json"])
    assert env == {}


def test_pdsh_include_exclude(ds_runner):
    base = dict(launcher="pdsh", num_gpus=8, num_nodes=2, hostfile="hostfiles/two-nodes-8gpu")
    a = parse_back(ds_runner, build_launch_command(LaunchSpec(**base, include="worker-0@worker-1:0,2"))[0])
    assert (a.include, a.exclude, a.num_nodes, a.num_gpus) == ("worker-0@worker-1:0,2", "", -1, -1)
    a = parse_back(ds_runner, build_launch_command(LaunchSpec(**base, exclude="worker-1:7"))[0])
    assert (a.include, a.exclude, a.num_nodes, a.num_gpus) == ("", "worker-1:7", -1, -1)
    a = parse_back(ds_runner, build_launch_command(LaunchSpec(**base))[0])
    assert (a.master_addr, a.no_ssh_check, a.ssh_port) == ("", False, None)  # DeepSpeed defaults


def test_pdsh_command_from_deepspeeds_runner(ds_runner):
    """What DeepSpeed's PDSHRunner makes of our argv: the remote launch keeps --module."""
    argv, _ = build_launch_command(
        LaunchSpec(launcher="pdsh", num_gpus=1, num_nodes=2, hostfile="h", master_addr="127.0.0.1", ssh_port=2200,
                   script_args=["--tag", "a b"])
    )  # fmt: skip
    a = parse_back(ds_runner, argv)
    r = ds_runner.PDSHRunner(a, "WORLD")
    cmd, _kill, env = r.get_cmd({}, {"n0": [0], "n1": [0]})
    assert cmd[:6] == ["pdsh", "-S", "-f", "1024", "-w", "n0,n1"]
    tail = cmd[cmd.index("deepspeed.launcher.launch") :]
    assert "--module" in tail and "--master_addr=127.0.0.1" in tail
    assert tail[-3:] == ["zerokit.launching.train", "--tag", '"a b"']
    assert env["PDSH_SSH_ARGS_APPEND"].split()[-2:] == ["-p", "2200"]


@pytest.mark.parametrize("launcher", ["openmpi", "mpich"])
def test_mpi_launchers(ds_runner, launcher):
    spec = LaunchSpec(launcher=launcher, num_gpus=8, num_nodes=2, hostfile="hostfiles/two-nodes-8gpu",
                      master_addr="10.0.0.1", no_ssh_check=True, script_args=["--x"])  # fmt: skip
    argv, _ = build_launch_command(spec)
    a = parse_back(ds_runner, argv)
    assert (a.launcher, a.hostfile, a.master_addr, a.no_ssh_check) == (launcher, "hostfiles/two-nodes-8gpu", "10.0.0.1", True)
    assert (a.num_nodes, a.num_gpus, a.include, a.exclude) == (-1, -1, "", "")  # refused by these runners
    assert (a.module, a.user_script, a.user_args) == (True, "zerokit.launching.train", ["--x"])
    # DeepSpeed's runner accepts it (validate_args runs in the constructor) and keeps `python -m`
    pool = {"worker-0": 8, "worker-1": 8}
    cls = ds_runner.OpenMPIRunner if launcher == "openmpi" else ds_runner.MPICHRunner
    cmd = cls(a, "WORLD", pool).get_cmd({}, {h: list(range(8)) for h in pool})
    i = cmd.index(sys.executable)
    if launcher == "openmpi":
        assert cmd[:3] == ["mpirun", "-n", "16"]
        assert cmd[i:] == [sys.executable, "-u", "-m", "zerokit.launching.train", "--x"]
    else:
        assert cmd[:5] == ["mpirun", "-n", "16", "-ppn", "8"]
        assert cmd[i + 1 : i + 3] == ["-u", "-m"] and "--module" in cmd and cmd[-2:] == ["zerokit.launching.train", "--x"]


def test_slurm(ds_runner):
    spec = LaunchSpec(launcher="slurm", num_gpus=8, num_nodes=2, hostfile="hosts", master_addr="gpu01",
                      master_port=29700, script_args=["--plan", "p.json"], env={"NCCL_DEBUG": "WARN"})  # fmt: skip
    argv, env = build_launch_command(spec)
    a = parse_back(ds_runner, argv)
    assert (a.launcher, a.hostfile, a.num_nodes, a.num_gpus) == ("slurm", "hosts", 2, 8)
    assert (a.master_addr, a.master_port, a.no_ssh_check) == ("gpu01", 29700, True)  # no ssh inside an allocation
    # DeepSpeed's SlurmRunner ignores --module, so the entry script is command.py, given the module
    assert a.module is False
    assert a.user_script == slurm_entry_script() and Path(a.user_script).is_file()
    assert a.user_args == ["zerokit.launching.train", "--plan", "p.json"]
    assert env == {"NCCL_DEBUG": "WARN", "MASTER_ADDR": "gpu01", "MASTER_PORT": "29700"}
    active = {"gpu01": list(range(8)), "gpu02": list(range(8))}
    cmd = ds_runner.SlurmRunner(a, "WORLD", {"gpu01": 8, "gpu02": 8}).get_cmd({}, active)
    assert cmd[:3] == ["srun", "-n", "16"]
    assert cmd[cmd.index("--nodes") + 1] == "2" and cmd[cmd.index("--gpus-per-node") + 1] == "8"
    assert cmd[-5:] == [sys.executable, "-u", slurm_entry_script(), "zerokit.launching.train", "--plan", "p.json"][-5:]


# ------------------------------------------------------------------------------------------------
# validation


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        (dict(launcher="torchrun"), "unknown launcher"),
        (dict(num_gpus=0), "num_gpus must be at least 1"),
        (dict(num_nodes=0), "num_nodes must be at least 1"),
        (dict(num_gpus="2"), "must be an integer"),
        (dict(master_port=70000), "not a TCP port"),
        (dict(launcher="local", num_nodes=2), "this machine only"),
        (dict(launcher="local", hostfile="h"), "does not use a hostfile"),
        (dict(launcher="pdsh"), "needs a hostfile"),
        (dict(launcher="openmpi"), "needs a hostfile"),
        (dict(launcher="slurm", hostfile="h"), "needs master_addr"),
        (dict(launcher="pdsh", hostfile="h", include="a", exclude="b"), "mutually exclusive"),
        (dict(launcher="openmpi", hostfile="h", include="a"), "does not support include/exclude"),
        (dict(launcher="mpich", hostfile="h", exclude="a"), "does not support include/exclude"),
        (dict(launcher="openmpi", hostfile="h", ssh_port=22), "only applies to launcher pdsh"),
        (dict(launcher="pdsh", hostfile="h", ssh_port=0), "not a TCP port"),
        (dict(launcher="pdsh", hostfile="h", bind_cores_to_rank=True), "works only with launcher local"),
        (dict(module="zerokit/launching/train.py"), "dotted Python module"),
        (dict(script_args="--x"), "list of strings"),
        (dict(env={"BAD-NAME": "1"}), "not valid"),
        (dict(env={"A": 1}), "must be a string"),
        (dict(deepspeed_bin=""), "deepspeed_bin is empty"),
        (dict(launcher="pdsh", hostfile="h", master_addr="a b"), "not a host name"),
    ],
)
def test_invalid_spec(kwargs, fragment):
    with pytest.raises(ZerokitError) as exc:
        LaunchSpec(**kwargs)
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


def test_builder_revalidates_a_mutated_spec():
    spec = LaunchSpec()
    spec.num_gpus = 0
    with pytest.raises(ZerokitError, match="num_gpus"):
        build_launch_command(spec)


def test_resolve_resources():
    hosts = {"a": 8, "b": 8, "c": 4}
    pdsh = dict(launcher="pdsh", hostfile="h")
    assert resolve_resources(LaunchSpec(**pdsh, num_nodes=2, num_gpus=4), hosts) == {"a": [0, 1, 2, 3], "b": [0, 1, 2, 3]}
    assert resolve_resources(LaunchSpec(**pdsh, include="c:1"), hosts) == {"c": [1]}
    with pytest.raises(ZerokitError, match="lists 3 hosts"):
        resolve_resources(LaunchSpec(**pdsh, num_nodes=4), hosts)
    with pytest.raises(ZerokitError, match="c has slots=4"):
        resolve_resources(LaunchSpec(**pdsh, num_nodes=3, num_gpus=8), hosts)
    with pytest.raises(ZerokitError, match="runs every slot"):
        resolve_resources(LaunchSpec(launcher="openmpi", hostfile="h", num_nodes=3, num_gpus=8), hosts)
    even = {"a": 8, "b": 8}
    assert resolve_resources(LaunchSpec(launcher="mpich", hostfile="h", num_nodes=2, num_gpus=8), even) == {
        "a": list(range(8)), "b": list(range(8)),
    }  # fmt: skip


def test_resolve_resources_matches_deepspeed(ds_runner):
    hosts = {"a": 8, "b": 8, "c": 8}
    spec = LaunchSpec(launcher="pdsh", hostfile="h", num_nodes=2, num_gpus=4)
    a = parse_back(ds_runner, build_launch_command(spec)[0])
    active = ds_runner.parse_inclusion_exclusion(hosts, a.include, a.exclude)
    theirs = ds_runner.apply_num_nodes_and_gpus(active, a.num_nodes, a.num_gpus)
    assert resolve_resources(spec, hosts) == dict(theirs)


# ------------------------------------------------------------------------------------------------
# sbatch


def sbatch_values(script: str) -> dict[str, str]:
    return dict(m.groups() for m in re.finditer(r"^#SBATCH --([\w-]+)=(\S+)$", script, re.M))


def test_render_sbatch(tmp_path):
    spec = LaunchSpec(master_port=29777, script_args=["--plan", "my plan.json"],
                      env={"NCCL_DEBUG": "INFO", "TAG": "a b"})  # fmt: skip
    script = render_sbatch(spec, "zk-run", nodes=4, gpus_per_node=8, time_limit="1-02:00:00",
                           partition="gpu", output_dir="runs/zk")  # fmt: skip
    assert script.startswith("#!/bin/bash\n")
    assert sbatch_values(script) == {
        "job-name": "zk-run", "nodes": "4", "ntasks-per-node": "8", "gpus-per-node": "8",
        "time": "1-02:00:00", "partition": "gpu", "output": "runs/zk/%x-%j.out",
    }  # fmt: skip
    # all #SBATCH lines come before the first command (sbatch stops reading them there)
    lines = [ln for ln in script.splitlines() if ln.strip()]
    first_cmd = next(i for i, ln in enumerate(lines) if not ln.startswith("#"))
    assert not any(ln.startswith("#SBATCH") for ln in lines[first_cmd:])
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in script
    assert "export MASTER_PORT=29777" in script and "export TAG='a b'" in script
    p = tmp_path / "job.sh"
    p.write_text(script)
    r = subprocess.run(["bash", "-n", str(p)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "partition" not in sbatch_values(render_sbatch(spec, "j", 1, 1, "30"))


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        (dict(job_name="my job"), "one word"),
        (dict(time_limit="2h"), "not a Slurm time"),
        (dict(partition="gpu;rm"), "one word"),
        (dict(output_dir="my runs"), "one word"),
        (dict(nodes=0), "num_nodes must be at least 1"),
    ],
)
def test_render_sbatch_rejects(kwargs, fragment):
    args = dict(job_name="j", nodes=2, gpus_per_node=8, time_limit="04:00:00") | kwargs
    with pytest.raises(ZerokitError) as exc:
        render_sbatch(LaunchSpec(), **args)
    assert fragment in str(exc.value)


def test_sbatch_script_runs_the_deepspeed_command(tmp_path, ds_runner):
    """Run the rendered script with stand-ins for scontrol and deepspeed; parse what deepspeed got."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_ds = bin_dir / "deepspeed"
    fake_ds.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$ARGS_OUT"\nenv > "$ENV_OUT"\n')
    (bin_dir / "scontrol").write_text('#!/bin/bash\n[ "$1 $2" = "show hostnames" ] && printf "gpu07\\ngpu08\\n"\n')
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    spec = LaunchSpec(deepspeed_bin=str(fake_ds), script_args=["--plan", "my plan.json", "$HOME"], env={"TAG": "x y"})
    (tmp_path / "out").mkdir()
    script = tmp_path / "job.sh"
    script.write_text(render_sbatch(spec, "j", 2, 4, "10", output_dir="out"))
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_NODELIST="gpu[07-08]",
               SLURM_JOB_ID="123", SLURM_JOB_NUM_NODES="2", ARGS_OUT=str(tmp_path / "args"), ENV_OUT=str(tmp_path / "env"))  # fmt: skip
    r = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    argv = ["deepspeed"] + (tmp_path / "args").read_text().splitlines()
    a = parse_back(ds_runner, argv)
    assert (a.launcher, a.num_nodes, a.num_gpus, a.master_addr, a.no_ssh_check) == ("slurm", 2, 4, "gpu07", True)
    assert a.user_args == ["zerokit.launching.train", "--plan", "my plan.json", "$HOME"]  # no shell expansion
    assert (tmp_path / a.hostfile).read_text() == "gpu07 slots=4\ngpu08 slots=4\n"
    ran_env = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line)
    assert (ran_env["MASTER_ADDR"], ran_env["MASTER_PORT"], ran_env["TAG"]) == ("gpu07", "29500", "x y")


# ------------------------------------------------------------------------------------------------
# real launches (2 ranks over gloo on CPU)




def launch_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    env.pop("CUDA_VISIBLE_DEVICES", None)  # DeepSpeed would turn it into --include
    return env


def probe_results(output: str, tag: str) -> dict[int, tuple[int, ...]]:
    out = {}
    for m in PROBE_LINE.finditer(output):
        if m.group(1) == tag:
            rank, world, local_rank, dist_rank, dist_world, total = map(int, m.groups()[1:])
            out[rank] = (world, local_rank, dist_rank, dist_world, total)
    return out


@pytest.mark.slow
def test_real_local_launch(tmp_path):
    pytest.importorskip("deepspeed")
    spec = LaunchSpec(launcher="local", num_gpus=2, master_port=free_port(), module=PROBE,
                      script_args=["--tag", "local"], deepspeed_bin=str(VENV_BIN / "deepspeed"))  # fmt: skip
    argv, env = build_launch_command(spec)
    t0 = time.time()
    r = subprocess.run(argv, cwd=REPO, env=launch_env(env), capture_output=True, text=True, timeout=600)
    elapsed = time.time() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    got = probe_results(out, "local")
    assert got == {0: (2, 0, 0, 2, 3), 1: (2, 1, 1, 2, 3)}, out[-4000:]
    print(f"local launch, 2 ranks: {elapsed:.1f}s")


FAKE_SRUN = r'''#!PYTHON
"""Stand-in for srun inside an allocation: srun -n N [opts] [--export=ALL,K=V,...] CMD... -> N tasks."""
import os, subprocess, sys
args = sys.argv[1:]
n, nodes, env = 1, 1, dict(os.environ)
while args and args[0].startswith("-"):
    opt = args.pop(0)
    if opt == "-n":
        n = int(args.pop(0))
    elif opt == "--nodes":
        nodes = int(args.pop(0))
    elif opt.startswith("--export="):
        for kv in opt.split("=", 1)[1].split(",")[1:]:
            k, v = kv.split("=", 1)
            env[k] = v
    else:
        args.pop(0)  # --gpus-per-node G, --nodelist L
with open(os.environ["SRUN_LOG"], "w") as f:
    f.write(" ".join(sys.argv) + "\n")
per_node = n // nodes
procs = [subprocess.Popen(args, env=dict(env, SLURM_PROCID=str(i), SLURM_LOCALID=str(i % per_node), SLURM_NTASKS=str(n),
                                         SLURM_NTASKS_PER_NODE=str(per_node), SLURM_NODEID=str(i // per_node)))
         for i in range(n)]
sys.exit(max(p.wait() for p in procs))
'''


@pytest.mark.slow
def test_real_slurm_launch_with_fake_srun(tmp_path):
    """`deepspeed --launcher slurm` through DeepSpeed's SlurmRunner, with srun/sinfo stand-ins.

    Checks the slurm entry script: srun starts plain `python -u command.py MODULE` tasks with
    only SLURM_* set, and the ranks still find each other."""
    pytest.importorskip("deepspeed")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN.replace("PYTHON", sys.executable, 1))
    (bin_dir / "sinfo").write_text("#!/bin/sh\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    (tmp_path / "hosts").write_text("node-a slots=1\nnode-b slots=1\n")
    spec = LaunchSpec(launcher="slurm", num_gpus=1, num_nodes=2, hostfile="hosts", master_addr="127.0.0.1",
                      master_port=free_port(), module=PROBE, script_args=["--tag", "slurm"],
                      deepspeed_bin=str(VENV_BIN / "deepspeed"))  # fmt: skip
    argv, env = build_launch_command(spec)
    env = launch_env(env)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["SRUN_LOG"] = str(tmp_path / "srun.log")
    env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    t0 = time.time()
    r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    elapsed = time.time() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    srun = (tmp_path / "srun.log").read_text()
    assert " -n 2 " in srun and "--gpus-per-node 1" in srun and f"{slurm_entry_script()} {PROBE}" in srun
    got = probe_results(out, "slurm")
    assert got == {0: (2, 0, 0, 2, 3), 1: (2, 0, 1, 2, 3)}, out[-4000:]
    print(f"slurm launch (fake srun), 2 ranks: {elapsed:.1f}s")

