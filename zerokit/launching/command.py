"""The `deepspeed` launcher command for a run: a pure function from a LaunchSpec to (argv, env).

Nothing here starts a process or touches the file system (render_sbatch and render_pytorchjob read
their templates).
The argv is what DeepSpeed's own runner (deepspeed/launcher/runner.py, 0.19) parses:

  local    deepspeed --num_gpus G --master_port P --module zerokit.launching.train ARGS...
  pdsh     deepspeed --hostfile H --launcher pdsh --num_nodes N --num_gpus G [--master_addr A]
                     --master_port P [--ssh_port S] [--no_ssh_check] --module zerokit.launching.train ARGS...
  openmpi  deepspeed --hostfile H --launcher openmpi [--master_addr A] --master_port P
  mpich              [--no_ssh_check] --module zerokit.launching.train ARGS...
  slurm    deepspeed --hostfile H --launcher slurm --num_nodes N --num_gpus G --master_addr A
                     --master_port P --no_ssh_check /abs/zerokit/launching/command.py zerokit.launching.train ARGS...

--include/--exclude replace --num_nodes/--num_gpus (DeepSpeed refuses both together). openmpi and
mpich take no --num_nodes/--num_gpus/--include/--exclude (DeepSpeed's runners refuse them): every
slot of the hostfile runs; resolve_resources() checks the hostfile agrees with the spec.

Slurm: DeepSpeed's SlurmRunner ignores --module (it runs `srun ... python -u USER_SCRIPT`) and sets
no RANK/LOCAL_RANK/WORLD_SIZE for the tasks srun starts. So for slurm the user script is this file,
run as a script: its __main__ block maps SLURM_PROCID/SLURM_LOCALID/SLURM_NTASKS to
RANK/LOCAL_RANK/WORLD_SIZE when they are unset and then runs the module like `python -m`. The
path must be the same on every node (a shared install, as DeepSpeed also assumes for python).
MASTER_ADDR/MASTER_PORT are in the returned env so `srun --export=ALL` hands them to every task.

Environment: the returned env is for the `deepspeed` process (merge it into os.environ). With
local and slurm the ranks inherit it. pdsh/openmpi/mpich ranks on other hosts only get PYTHON*,
UCX*, NCCL*-style variables and what .deepspeed_env says: write spec.env there with
zerokit.spec.hostfile.write_deepspeed_env(<directory deepspeed starts in>, env).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

if __name__ == "__main__":  # launcher slurm's entry script: make `zerokit` importable like `python -m` does
    import os
    import sys

    sys.path[0] = os.getcwd()
    sys.path.append(str(Path(__file__).resolve().parents[2]))  # a checkout that is not pip-installed

from zerokit.core.errors import ZerokitError
from zerokit.core.options import flag
from zerokit.spec.hostfile import ENV_KEY

LAUNCHERS = ("local", "pdsh", "openmpi", "mpich", "slurm")
MULTI_NODE = ("pdsh", "openmpi", "mpich", "slurm")
DEFAULT_MODULE = "zerokit.launching.train"

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass
class LaunchSpec:
    """What to launch and how. num_gpus is per node (on CPU it is the number of ranks per node)."""

    launcher: str = "local"
    num_gpus: int = 1
    num_nodes: int = 1
    hostfile: str | None = None
    include: str | None = None
    exclude: str | None = None
    master_addr: str | None = None
    master_port: int = 29500
    no_ssh_check: bool = False
    ssh_port: int | None = None
    module: str = DEFAULT_MODULE
    script_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    bind_cores_to_rank: bool = False
    deepspeed_bin: str = "deepspeed"

    def __post_init__(self):
        validate(self)


def validate(spec: LaunchSpec) -> None:
    """Every check on a LaunchSpec, in one place. Raises ZerokitError with the fix."""
    launcher = spec.launcher
    if launcher not in LAUNCHERS:
        raise ZerokitError(f"unknown launcher {launcher!r}: use one of {', '.join(LAUNCHERS)}")
    for name in ("num_gpus", "num_nodes", "master_port"):
        value = getattr(spec, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ZerokitError(f"{name} must be an integer, got {value!r}")
    if spec.num_gpus < 1:
        raise ZerokitError(f"num_gpus must be at least 1 (ranks per node), got {spec.num_gpus}")
    if spec.num_nodes < 1:
        raise ZerokitError(f"num_nodes must be at least 1, got {spec.num_nodes}")
    if not 1 <= spec.master_port <= 65535:
        raise ZerokitError(f"master_port {spec.master_port} is not a TCP port: use 1024-65535, e.g. 29500")
    if spec.include and spec.exclude:
        raise ZerokitError("include and exclude are mutually exclusive (DeepSpeed refuses both): give only one")
    if not spec.deepspeed_bin:
        raise ZerokitError("deepspeed_bin is empty: give the deepspeed launcher, e.g. 'deepspeed' or '.venv/bin/deepspeed'")
    if not isinstance(spec.module, str) or not _MODULE.match(spec.module):
        raise ZerokitError(f"module {spec.module!r} is not a dotted Python module name, e.g. zerokit.launching.train")
    if not isinstance(spec.script_args, list) or not all(isinstance(a, str) for a in spec.script_args):
        raise ZerokitError("script_args must be a list of strings")
    for key, value in spec.env.items():
        if not isinstance(key, str) or not ENV_KEY.match(key):
            raise ZerokitError(f"environment name {key!r} is not valid: use letters, digits and '_'")
        if not isinstance(value, str):
            raise ZerokitError(f"environment value of {key} must be a string, got {type(value).__name__}")
    if spec.ssh_port is not None:
        if launcher != "pdsh":
            raise ZerokitError(f"ssh_port only applies to launcher pdsh, not {launcher}: drop it")
        if not isinstance(spec.ssh_port, int) or not 1 <= spec.ssh_port <= 65535:
            raise ZerokitError(f"ssh_port {spec.ssh_port!r} is not a TCP port: use e.g. 22")
    if spec.bind_cores_to_rank and launcher != "local":
        raise ZerokitError(
            f"bind_cores_to_rank works only with launcher local (DeepSpeed's {launcher} runner drops it): drop it"
        )
    if spec.master_addr is not None and (not spec.master_addr or any(c.isspace() for c in spec.master_addr)):
        raise ZerokitError(f"master_addr {spec.master_addr!r} is not a host name or IP address")

    if launcher == "local":
        if spec.num_nodes != 1:
            raise ZerokitError(
                f"launcher local runs on this machine only but num_nodes={spec.num_nodes}: "
                "use num_nodes 1 or a multi-node launcher (pdsh, openmpi, mpich, slurm) with a hostfile"
            )
        if spec.hostfile:
            raise ZerokitError("launcher local does not use a hostfile: drop it, or use launcher pdsh for hosts in a hostfile")
        return
    if not spec.hostfile:
        raise ZerokitError(f"launcher {launcher} needs a hostfile ('HOST slots=N' per node): give one")
    if launcher in ("openmpi", "mpich") and (spec.include or spec.exclude):
        raise ZerokitError(
            f"DeepSpeed's {launcher} launcher does not support include/exclude: "
            "write a hostfile with only the hosts and slots to use"
        )
    if launcher == "slurm" and not spec.master_addr:
        raise ZerokitError(
            "launcher slurm needs master_addr (DeepSpeed would ssh to find it): give the first node, "
            "e.g. $(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1); render_sbatch does this"
        )


def slurm_entry_script() -> str:
    """Absolute path of this file, the user script for launcher slurm (see the module docstring)."""
    return str(Path(__file__).resolve())


def build_launch_command(spec: LaunchSpec) -> tuple[list[str], dict[str, str]]:
    """The `deepspeed` argv for `spec` and the environment to add for the launcher process. Pure."""
    validate(spec)
    argv = [spec.deepspeed_bin]
    env = dict(spec.env)
    launcher = spec.launcher

    if launcher != "local":
        argv += ["--hostfile", spec.hostfile, "--launcher", launcher]
    if spec.include:
        argv += ["--include", spec.include]
    elif spec.exclude:
        argv += ["--exclude", spec.exclude]
    elif launcher in ("pdsh", "slurm"):
        argv += ["--num_nodes", str(spec.num_nodes), "--num_gpus", str(spec.num_gpus)]
    elif launcher == "local":
        argv += ["--num_gpus", str(spec.num_gpus)]
    # openmpi/mpich: DeepSpeed's runners refuse --num_nodes/--num_gpus; the hostfile decides.

    if spec.master_addr and launcher != "local":
        argv += ["--master_addr", spec.master_addr]
    argv += ["--master_port", str(spec.master_port)]
    if launcher == "pdsh" and spec.ssh_port is not None:
        argv += ["--ssh_port", str(spec.ssh_port)]
    if launcher == "slurm" or (launcher in MULTI_NODE and spec.no_ssh_check):
        argv.append("--no_ssh_check")
    if spec.bind_cores_to_rank:
        argv.append("--bind_cores_to_rank")

    if launcher == "slurm":
        argv += [slurm_entry_script(), spec.module]
        env["MASTER_ADDR"] = spec.master_addr
        env["MASTER_PORT"] = str(spec.master_port)
    else:
        argv += ["--module", spec.module]
    argv += list(spec.script_args)
    return argv, env


def resolve_resources(spec: LaunchSpec, hosts: dict[str, int]) -> dict[str, list[int]]:
    """The host -> slot ids DeepSpeed will run `spec` on, given the parsed hostfile `hosts`.

    Also refuses a spec the hostfile cannot satisfy (DeepSpeed would silently start ranks on
    slots a host does not have, or ignore the spec's counts). Pure: parse the file with
    zerokit.spec.hostfile.parse_hostfile first.
    """
    from zerokit.spec.hostfile import apply_filters

    validate(spec)
    if spec.launcher == "local":
        raise ZerokitError("launcher local does not use a hostfile")
    active = apply_filters(hosts, spec.include, spec.exclude)
    if spec.include or spec.exclude:
        return active
    if spec.launcher in ("openmpi", "mpich"):
        slots = set(hosts.values())
        if len(hosts) != spec.num_nodes or slots != {spec.num_gpus}:
            raise ZerokitError(
                f"launcher {spec.launcher} runs every slot of the hostfile ({len(hosts)} hosts, slots {sorted(slots)}) "
                f"but the spec asks for {spec.num_nodes} nodes x {spec.num_gpus}: edit the hostfile to match"
            )
        return active
    if spec.num_nodes > len(hosts):
        raise ZerokitError(
            f"num_nodes {spec.num_nodes} but the hostfile lists {len(hosts)} hosts: add hosts or lower num_nodes"
        )
    chosen = list(hosts)[: spec.num_nodes]
    short = [h for h in chosen if hosts[h] < spec.num_gpus]
    if short:
        raise ZerokitError(
            f"num_gpus {spec.num_gpus} per node but {short[0]} has slots={hosts[short[0]]} in the hostfile: "
            "lower num_gpus or fix the hostfile"
        )
    return {h: list(range(spec.num_gpus)) for h in chosen}


# ----------------------------------------------------------------------------------------------
# sbatch script


_SLURM_TIME = re.compile(r"^(\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2})$")
_SBATCH_WORD = re.compile(r"^[A-Za-z0-9_.,+@%/=-]+$")
_HOSTFILE_MARK = "ZKHOSTFILEMARK"
_MASTER_MARK = "ZKMASTERADDRMARK"


def render_sbatch(
    spec: LaunchSpec,
    job_name: str,
    nodes: int,
    gpus_per_node: int,
    time_limit: str,
    partition: str | None = None,
    output_dir: str = ".",
) -> str:
    """An sbatch script that runs `spec` with DeepSpeed's slurm launcher inside the allocation.

    nodes/gpus_per_node set both the #SBATCH request and the spec's num_nodes/num_gpus (they
    override the spec's); the spec's launcher, hostfile, master_addr and ssh_port are replaced too,
    so any spec will do (e.g. LaunchSpec(module=..., script_args=..., env=...)). The script writes a hostfile from `scontrol show hostnames`, takes the
    first node as MASTER_ADDR, exports spec.env and execs `deepspeed --launcher slurm ...`.
    Slurm opens the --output file before the script runs: create output_dir before sbatch.
    """

    for name, value in (("job_name", job_name), ("output_dir", output_dir)) + (
        (("partition", partition),) if partition is not None else ()
    ):
        if not isinstance(value, str) or not _SBATCH_WORD.match(value):
            raise ZerokitError(f"sbatch {name} {value!r} must be one word without spaces or quotes")
    if not isinstance(time_limit, str) or not _SLURM_TIME.match(time_limit):
        raise ZerokitError(
            f"sbatch time limit {time_limit!r} is not a Slurm time: use MINUTES, HH:MM:SS or D-HH:MM:SS, e.g. 04:00:00"
        )
    if spec.include or spec.exclude:
        raise ZerokitError("render_sbatch runs on the whole allocation: drop include/exclude and size the job with nodes")
    spec = replace(
        spec,
        launcher="slurm",
        num_nodes=nodes,
        num_gpus=gpus_per_node,
        hostfile=_HOSTFILE_MARK,
        master_addr=_MASTER_MARK,
        ssh_port=None,
    )
    argv, _ = build_launch_command(spec)
    def word(a: str) -> str:
        return {_HOSTFILE_MARK: '"$HOSTFILE"', _MASTER_MARK: '"$MASTER_ADDR"'}.get(a) or shlex.quote(a)

    script_at = argv.index(slurm_entry_script())
    lines, i = [word(argv[0])], 1
    while i < script_at:  # one launcher option (and its value) per line
        if i + 1 < script_at and not argv[i + 1].startswith("--"):
            lines.append(f"{word(argv[i])} {word(argv[i + 1])}")
            i += 2
        else:
            lines.append(word(argv[i]))
            i += 1
    lines.append(" ".join(word(a) for a in argv[script_at:]))
    from zerokit.core.resources import template_environment

    env = template_environment(keep_trailing_newline=True)
    return env.get_template("sbatch.sh.j2").render(
        job_name=job_name,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        time_limit=time_limit,
        partition=partition,
        output_dir=output_dir,
        master_port=spec.master_port,
        exports=[(k, shlex.quote(v)) for k, v in spec.env.items()],
        command=" \\\n    ".join(lines),
    )


# ----------------------------------------------------------------------------------------------
# Kubernetes: a PyTorchJob for the Kubeflow training operator


# Kubernetes names as the API server checks them: a PersistentVolumeClaim is a DNS-1123 subdomain; a PyTorchJob a
# DNS-1035 label (the operator's webhook, pkg/webhooks/pytorch/pytorchjob_webhook.go validatePyTorchJob), and its pods
# and their services are named <job>-master-0 / <job>-worker-<i> (envvar.go replicaName), labels of at most 63.
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
K8S_JOB_NAME_MAX = 40  # leaves room for -worker-<index> within 63
PYTORCHJOB_PORT = 23456  # the operator's default (PyTorchJobDefaultPort, pkg/apis/kubeflow.org/v1/pytorch_types.go)


def k8s_job_name(run_name: str) -> str:
    """A PyTorchJob name from the run directory's: zerokit-<name>, lowercase, other characters as '-', cut to fit."""
    name = "zerokit-" + re.sub(r"[^a-z0-9]+", "-", run_name.lower()).strip("-")
    return name[:K8S_JOB_NAME_MAX].rstrip("-")


def pytorchjob_pod_command(spec: LaunchSpec, pods: int, ranks_per_pod: int) -> list[str]:
    """What every pod runs: torchrun starting `ranks_per_pod` ranks of spec.module (zerokit.launching.train
    RUN/rank_options.json, or a user's script through launch.user_script), as the deepspeed launcher does here.

    torchrun, not DeepSpeed's runner, because the operator's rendezvous is torchrun's: it sets PET_NNODES,
    PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR and PET_MASTER_PORT in every pod (training-operator
    pkg/controller.v1/pytorch/envvar.go setPodEnv, master.go), which torch.distributed.run reads as its own options
    (torch/distributed/argparse_util.py `env`: PET_<OPTION>), so one command serves every pod; the Kubeflow SDK's own
    PyTorchJobs run torchrun too (kubeflow.training constants.ENTRYPOINT_TORCH). DeepSpeed's runner with --no_ssh
    would need a hostfile naming every pod in each of them (deepspeed/launcher/runner.py main: the world comes from
    fetch_hostfile, and --node_rank must index it) and the pod's index spliced into its arguments. The ranks are the
    same either way: zerokit.launching.train reads LOCAL_RANK, and deepspeed.init_distributed RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT, which torchrun sets for every rank as deepspeed/launcher/launch.py does;
    pytorchjob_env adds the one variable of launch.py's that DeepSpeed reads and torchrun does not set. Restarts
    are the operator's (restartPolicy), so torchrun keeps its default --max-restarts 0."""
    return ["torchrun", f"--nnodes={pods}", f"--nproc-per-node={ranks_per_pod}", "--module", spec.module,
            *spec.script_args]


def pytorchjob_env(spec: LaunchSpec, ranks_per_pod: int) -> dict[str, str]:
    """The pod's own environment: the spec's, and LOCAL_SIZE, which deepspeed/launcher/launch.py sets for every rank
    (torchrun names it LOCAL_WORLD_SIZE): DeepSpeed's CPU accelerator counts its devices from it, else by running
    numactl on every device_count() call (deepspeed/accelerator/cpu_accelerator.py)."""
    return {**spec.env, "LOCAL_SIZE": str(ranks_per_pod)}


def _k8s_literal(text: str) -> str:
    """Kubernetes expands $(VAR) in a container's command, args and env values and reduces $$ to $ (the Container
    API reference, `args`): every $ doubled, a value reaches the pod as written."""
    return text.replace("$", "$$")


def render_pytorchjob(
    spec: LaunchSpec,
    job_name: str,
    pods: int,
    ranks_per_pod: int,
    image: str,
    claim: str,
    mount_path: str,
    run_dir: str,
    max_restarts: int = 0,
    gpu_resource: str | None = "nvidia.com/gpu",
) -> str:
    """A PyTorchJob manifest (kubeflow.org/v1, the Kubeflow training operator) that runs `spec`'s module and
    arguments on `pods` pods of `ranks_per_pod` ranks: one Master and pods - 1 Workers, each asking for
    `ranks_per_pod` of `gpu_resource` (None: CPU ranks, no accelerator), all mounting the PersistentVolumeClaim
    `claim` at `mount_path`, where run_dir (the ranks' options, config and data) lies. The rendezvous port is
    spec.master_port (the operator reads it from the port named pytorchjob-port). Pure: reads the template."""
    for name, value in (("pods", pods), ("ranks_per_pod", ranks_per_pod), ("max_restarts", max_restarts)):
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "max_restarts" else 1):
            raise ZerokitError(f"PyTorchJob {name} must be a whole number ({'0' if name == 'max_restarts' else '1'} "
                               f"or more), got {value!r}")
    if not isinstance(job_name, str) or len(job_name) > K8S_JOB_NAME_MAX or not _DNS1035_LABEL.match(job_name):
        raise ZerokitError(f"PyTorchJob name {job_name!r} is not a Kubernetes DNS-1035 label of at most "
                           f"{K8S_JOB_NAME_MAX} characters: use lowercase letters, digits and '-', starting with a letter")
    if not isinstance(image, str) or not image or any(c.isspace() for c in image):
        raise ZerokitError(f"container image {image!r} is not an image reference: give one such as "
                           "registry.example.com/team/zerokit:1.0 (with zerokit, DeepSpeed and torch installed)")
    if not isinstance(claim, str) or len(claim) > 253 or not DNS1123_SUBDOMAIN.match(claim):
        raise ZerokitError(f"volume claim {claim!r} is not a PersistentVolumeClaim name: lowercase letters, digits, "
                           "'-' and '.', e.g. shared-runs")
    if not isinstance(mount_path, str) or not mount_path.startswith("/") or any(c == ":" or ord(c) < 32
                                                                                 for c in mount_path):
        raise ZerokitError(f"mount path {mount_path!r} is not an absolute path without ':': give one such as /mnt/shared")
    restart_note = (
        f"no restarts ({flag('max-restarts')} 0): a rank that fails fails the job" if not max_restarts else
        # the operator fails the job once the pods' container restarts, summed, reach backoffLimit (pkg/core/job.go
        # PastBackoffLimit, counted for restartPolicy OnFailure); a dying rank takes every pod's ranks down (their
        # collectives break), so R restarts of the job are R x pods container restarts: the limit is one more
        f"up to {max_restarts} restart{'s' * (max_restarts > 1)} of the pods ({flag('max-restarts')}): container "
        f"restarts summed over the {pods} pod{'s' * (pods > 1)}; the ranks resume from checkpoints/latest")
    from zerokit.core.resources import template_environment

    env = template_environment(keep_trailing_newline=True)
    return env.get_template("pytorchjob.yaml.j2").render(
        name=job_name,
        pods=pods,
        ranks_per_pod=ranks_per_pod,
        roles=[("Master", 1)] + ([("Worker", pods - 1)] if pods > 1 else []),
        restart_policy="OnFailure" if max_restarts else "Never",
        backoff_limit=max_restarts * pods + 1 if max_restarts else 0,
        restart_note=restart_note,
        image=image,
        command=[_k8s_literal(w) for w in pytorchjob_pod_command(spec, pods, ranks_per_pod)],
        env=[(k, _k8s_literal(v)) for k, v in pytorchjob_env(spec, ranks_per_pod).items()],
        master_port=spec.master_port,
        gpu_resource=gpu_resource,
        claim=claim,
        mount_path=mount_path,
        run_dir=run_dir,
    )


# ----------------------------------------------------------------------------------------------
# Entry for launcher slurm: `python -u command.py MODULE ARGS...` (see the module docstring).


def _slurm_entry(argv: list[str]) -> None:
    import os
    import runpy
    import sys

    if not argv:
        raise SystemExit("usage: python command.py MODULE [ARGS...]")
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
        os.environ["WORLD_SIZE"] = os.environ.get("SLURM_NTASKS", "1")
        tasks_per_node = os.environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
        if tasks_per_node.isdigit():
            os.environ.setdefault("LOCAL_SIZE", tasks_per_node)
    sys.argv = list(argv)
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    import sys

    _slurm_entry(sys.argv[1:])
