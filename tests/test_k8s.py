"""`zerokit launch --k8s FILE`: a PyTorchJob for the Kubeflow training operator, tested without a cluster.

1. The manifest deserializes into the Kubeflow SDK's own models (kubeflow-training's KubeflowOrgV1PyTorchJob,
   through its ApiClient, which builds the Kubernetes models of the pod template too) and serializes back to the
   same document (so no key was unknown to the models and dropped), and passes the rules of the training operator's
   admission webhook (pkg/webhooks/pytorch/pytorchjob_webhook.go validatePyTorchJob in kubeflow/training-operator).
2. The command inside each pod, run here as 2 "pods" of 1 rank with the environment the operator would set
   (pkg/controller.v1/pytorch/envvar.go setPodEnv and master.go: MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK and
   PET_* per pod; MASTER_ADDR 127.0.0.1 instead of the master pod's service name), trains to the losses of
   `zerokit launch` with 2 ranks on this machine (tiny-llama, CPU, gloo).
3. Bad input is one line, exit 2, nothing written.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from zerokit.core.errors import ZerokitError
from zerokit.launching.command import LaunchSpec, k8s_job_name, render_pytorchjob

REPO = Path(__file__).resolve().parents[1]
K8S = ["--model", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", "32", "--steps", "3", "--plan"]


def k8s_args(tmp_path: Path, *extra) -> list:
    return [*K8S, "--output-dir", tmp_path / "vol" / "run", "--k8s", tmp_path / "job.yaml", "--k8s-image",
            "registry.example.com/zerokit:1", "--k8s-volume", f"shared-runs:{tmp_path / 'vol'}", *extra]


def deserialize(doc: dict):
    """The manifest as the Kubeflow SDK's models, by the SDK's own ApiClient (what it does with the API server's
    answer: kubernetes' ApiClient.deserialize of a response body)."""
    pytest.importorskip("kubeflow.training")
    from kubeflow.training import ApiClient

    class Response:  # what ApiClient.deserialize reads: the body as JSON text
        data = json.dumps(doc)

    client = ApiClient()
    job = client.deserialize(Response(), "KubeflowOrgV1PyTorchJob")
    return job, client.sanitize_for_serialization(job)


def webhook_problems(job) -> list[str]:
    """The training operator's admission rules for a PyTorchJob (validatePyTorchJob, validatePyTorchReplicaSpecs,
    util.ValidateRunPolicy), on the SDK's model."""
    problems = []
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", job.metadata.name) or len(job.metadata.name) > 63:
        problems.append(f"name {job.metadata.name} is not a DNS-1035 label")
    specs = job.spec.pytorch_replica_specs
    if not specs:
        problems.append("no pytorchReplicaSpecs")
    for role, rs in (specs or {}).items():
        if role not in ("Master", "Worker"):
            problems.append(f"replica type {role}")
        containers = rs.template.spec.containers or []
        if not containers:
            problems.append(f"{role}: no containers")
        if any(not c.image for c in containers):
            problems.append(f"{role}: a container without image")
        if not any(c.name == "pytorch" for c in containers):
            problems.append(f"{role}: no container named pytorch")
        if role == "Master" and rs.replicas != 1:
            problems.append("Master replicas must be 1")
        if role == "Worker" and rs.replicas is not None and rs.replicas < 1:
            problems.append("Worker replicas must be at least 1")
    rp = job.spec.run_policy
    if rp.backoff_limit is not None and rp.backoff_limit < 0:
        problems.append("backoffLimit < 0")
    return problems


def test_manifest_is_a_valid_pytorchjob_for_the_kubeflow_sdk():
    import yaml

    spec = LaunchSpec(num_gpus=8, master_port=29555, script_args=["/mnt/shared/runs/x/rank_options.json"],
                      env={"NCCL_DEBUG": "INFO", "TAG": "$(HOME) costs $5"})
    text = render_pytorchjob(spec, k8s_job_name("Llama-3 8B_run"), pods=4, ranks_per_pod=8, image="reg.example/zk:1",
                             claim="shared-runs", mount_path="/mnt/shared", run_dir="/mnt/shared/runs/x",
                             max_restarts=3)
    doc = yaml.safe_load(text)
    job, back = deserialize(doc)
    assert back == doc  # every key is one the SDK's models know (an unknown one would be dropped)
    assert webhook_problems(job) == []
    assert (job.api_version, job.kind, job.metadata.name) == ("kubeflow.org/v1", "PyTorchJob", "zerokit-llama-3-8b-run")
    assert job.spec.nproc_per_node == "8" and job.spec.run_policy.backoff_limit == 3 * 4 + 1
    specs = job.spec.pytorch_replica_specs
    assert (specs["Master"].replicas, specs["Worker"].replicas) == (1, 3)
    for rs in specs.values():
        assert rs.restart_policy == "OnFailure"
        pod = rs.template.spec
        (c,) = pod.containers
        assert c.command == ["torchrun", "--nnodes=4", "--nproc-per-node=8", "--module", "zerokit.launching.train",
                             "/mnt/shared/runs/x/rank_options.json"]
        assert c.resources.limits == {"nvidia.com/gpu": "8"}
        assert [(p.name, p.container_port) for p in c.ports] == [("pytorchjob-port", 29555)]
        env = {e.name: e.value for e in c.env}
        # $ doubled: Kubernetes reduces $$ to $ and expands no $(VAR) the user wrote
        assert env == {"NCCL_DEBUG": "INFO", "TAG": "$$(HOME) costs $$5", "LOCAL_SIZE": "8"}
        (claim,) = [v.persistent_volume_claim.claim_name for v in pod.volumes if v.persistent_volume_claim]
        mounts = {m.name: m.mount_path for m in c.volume_mounts}
        assert claim == "shared-runs" and mounts["run"] == "/mnt/shared" and mounts["dshm"] == "/dev/shm"
    # one pod: a Master alone; no restarts: Never
    doc1 = yaml.safe_load(render_pytorchjob(spec, "j", pods=1, ranks_per_pod=2, image="i", claim="c", mount_path="/m",
                                            run_dir="/m/r", gpu_resource=None))
    job1, back1 = deserialize(doc1)
    assert back1 == doc1 and webhook_problems(job1) == []
    assert list(job1.spec.pytorch_replica_specs) == ["Master"] and job1.spec.run_policy.backoff_limit == 0
    master = job1.spec.pytorch_replica_specs["Master"]
    assert master.restart_policy == "Never" and master.template.spec.containers[0].resources is None


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(image=""), "not an image reference"),
    (dict(image="zk 1"), "not an image reference"),
    (dict(claim=""), "not a PersistentVolumeClaim name"),
    (dict(claim="Shared_Runs"), "not a PersistentVolumeClaim name"),
    (dict(mount_path="mnt"), "not an absolute path"),
    (dict(job_name="9-lives"), "DNS-1035"),
    (dict(pods=0), "pods must be"),
    (dict(max_restarts=-1), "max_restarts must be"),
])
def test_render_pytorchjob_rejects(kwargs, fragment):
    args = dict(job_name="j", pods=2, ranks_per_pod=1, image="i", claim="c", mount_path="/m", run_dir="/m/r") | kwargs
    with pytest.raises(ZerokitError, match=re.escape(fragment)):
        render_pytorchjob(LaunchSpec(), **args)


def test_job_names_are_dns_labels():
    assert k8s_job_name("tiny-llama-20261126-204812") == "zerokit-tiny-llama-20261126-204812"
    assert k8s_job_name("__") == "zerokit"
    long = k8s_job_name("x" * 100)
    assert len(long) <= 40 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", long)


def losses(run: Path, rank: int = 0) -> dict[int, float]:
    recs = [json.loads(x) for x in (run / "metrics" / f"rank{rank}.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: r["loss"] for r in recs if r.get("event") == "step"}


def operator_env(manifest: dict, role: str, index: int) -> dict[str, str]:
    """What the training operator (v1.9) adds to the pod's container env: setPodEnv (envvar.go) and the master's
    address and port (master.go), with MASTER_ADDR 127.0.0.1 for the service name <job>-master-0."""
    spec = manifest["spec"]
    replicas = {r: s["replicas"] for r, s in spec["pytorchReplicaSpecs"].items()}
    nproc = int(spec["nprocPerNode"])
    master = spec["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    port = str(next(p["containerPort"] for p in master["ports"] if p["name"] == "pytorchjob-port"))
    rank = index + (1 if role == "Worker" else 0)
    return {"PYTHONUNBUFFERED": "1", "MASTER_PORT": port, "PET_MASTER_PORT": port, "MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": str(sum(replicas.values()) * nproc), "RANK": str(rank),
            "PET_NODE_RANK": str(rank), "PET_NPROC_PER_NODE": spec["nprocPerNode"],
            "PET_NNODES": str(sum(replicas.values()))}


def kubelet(word: str) -> str:
    """Kubernetes' expansion of a command word or env value: $$ -> $ (zerokit writes no $(VAR) of its own)."""
    assert not re.search(r"(?<!\$)\$\(", word), word
    return word.replace("$$", "$")


@pytest.mark.slow
def test_pod_command_reproduces_a_local_run(tmp_path, capfd):
    """2 pods x 1 rank, each pod's command run here with the operator's environment, against `zerokit launch` with
    2 ranks on this machine: the same losses at every step."""
    pytest.importorskip("deepspeed")
    import yaml

    from zerokit.measure.ranks import free_port

    from zerokit.cli import main

    ref = tmp_path / "ref"  # the CLI in-process (the ranks are processes all the same): no interpreter start
    assert main(["launch", *map(str, K8S), "--output-dir", str(ref), "--no-report"]) == 0
    want = losses(ref)
    assert sorted(want) == [1, 2, 3]

    capfd.readouterr()
    assert main(["launch", *map(str, k8s_args(tmp_path, "--gpus-per-pod", "1", "--master-port", free_port()))]) == 0
    out = capfd.readouterr().out
    assert out.strip().endswith(f"submit with: kubectl apply -f {tmp_path / 'job.yaml'}"), out
    manifest = yaml.safe_load((tmp_path / "job.yaml").read_text())
    job, _ = deserialize(manifest)
    assert webhook_problems(job) == []
    run = tmp_path / "vol" / "run"
    assert (run / "ds_config.json").is_file() and (run / "data" / "tokens.npy").is_file()
    assert json.loads((run / "ds_config.json").read_text()) == json.loads((ref / "ds_config.json").read_text())

    # the image: python with zerokit, torch and DeepSpeed importable, torchrun on PATH; nothing of the rendezvous
    image_env = {k: v for k, v in os.environ.items()
                 if not k.startswith("PET_") and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                           "MASTER_PORT", "LOCAL_SIZE", "OMP_NUM_THREADS")}
    image_env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{image_env.get('PATH', '')}"
    image_env["PYTHONPATH"] = str(REPO)
    pods = []
    for role, rs in manifest["spec"]["pytorchReplicaSpecs"].items():
        (c,) = rs["template"]["spec"]["containers"]
        for i in range(rs["replicas"]):
            env = {**image_env, **{e["name"]: kubelet(e["value"]) for e in c["env"]}, **operator_env(manifest, role, i)}
            cwd = tmp_path / f"pod-{role}-{i}"
            cwd.mkdir()
            log = open(cwd / "log", "w")
            pods.append((subprocess.Popen([kubelet(w) for w in c["command"]], cwd=cwd, env=env, stdout=log,
                                          stderr=subprocess.STDOUT), cwd, log))
    assert len(pods) == 2
    try:
        codes = [proc.wait(timeout=300) for proc, _, _ in pods]
    finally:
        for proc, _, log in pods:
            if proc.poll() is None:  # torchrun stops its ranks on SIGTERM
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            log.close()
    assert codes == [0, 0], "\n".join((cwd / "log").read_text()[-2000:] for _, cwd, _ in pods)
    starts = [json.loads(x) for r in (0, 1) for x in (run / "metrics" / f"rank{r}.jsonl").read_text().splitlines()
              if '"start"' in x]
    assert sorted((s["rank"], s["world_size"]) for s in starts) == [(0, 2), (1, 2)]
    got = losses(run)
    assert sorted(got) == sorted(want)
    # the same ranks on the same data, summing 2 gradients over gloo either way: bit-identical (seen on 2 cores)
    assert got == want
    assert (run / "final").is_dir()


def test_dry_run_prints_the_manifest_and_writes_nothing(tmp_path, capsys):
    import yaml

    from zerokit.cli import main

    assert main(["launch", *map(str, k8s_args(tmp_path, "--nodes", "2", "--max-restarts", "1")), "--dry-run"]) == 0
    out = capsys.readouterr().out
    manifest = yaml.safe_load(out.split(" (not written):\n", 1)[1].split("# dry run:")[0])
    job, back = deserialize(manifest)
    assert back == manifest and webhook_problems(job) == []
    specs = job.spec.pytorch_replica_specs  # --nodes 2 x --gpus-per-node 2: a pod per node
    assert (job.spec.nproc_per_node, specs["Worker"].replicas, job.spec.run_policy.backoff_limit) == ("2", 1, 3)
    # the pods' ranks: the bundled model by name (the image's zerokit has it), resuming when a pod restarts
    opts = json.loads(out.split("/rank_options.json):\n", 1)[1].splitlines()[0])
    assert (opts["model"], opts["tokenizer"], opts["resume"]) == ("tiny-llama", None, True)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


BAD = [  # (id, flags dropped, flags set, what the one line says)
    ("no-image", ["--k8s-image"], [], "needs --k8s-image IMAGE"),
    ("no-volume", ["--k8s-volume"], [], "needs the shared volume"),
    ("unnamed-volume", [], ["--k8s-volume", ":/mnt/shared"], "names no PersistentVolumeClaim"),
    ("bad-claim", [], ["--k8s-volume", "Shared_Runs:/mnt/shared"], "not a PersistentVolumeClaim name"),
    ("split", [], ["--gpus-per-pod", "3", "--gpus-per-node", "4"], "--gpus-per-pod 3 cannot split 1 node x 4 GPUs"),
    ("outside", [], ["--output-dir", "OUTSIDE"], "is not under"),
    ("pod-option-alone", ["--k8s", "--k8s-image", "--k8s-volume"], ["--gpus-per-pod", "1"],
     "--gpus-per-pod only shapes the --k8s manifest"),
    ("hostfile", [], ["--hostfile", REPO / "hostfiles" / "localhost-2"], "drop --hostfile"),
    ("tracker-outside", [], ["--report-to", "csv", "--report-dir", "OUTSIDE"], "the tracker directory"),
]


@pytest.mark.parametrize("name,drop,change,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_and_writes_nothing(name, drop, change, needle, tmp_path, capsys):
    from zerokit.cli import main

    args = [str(a) for a in k8s_args(tmp_path)]
    for flag_ in drop:
        i = args.index(flag_)
        del args[i:i + 2]
    change = [str(tmp_path / "elsewhere" / "run") if a == "OUTSIDE" else str(a) for a in change]
    for flag_, value in zip(change[::2], change[1::2]):
        if flag_ in args:
            args[args.index(flag_) + 1] = value
        else:
            args += [flag_, value]
    assert main(["launch", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no manifest, no run directory
