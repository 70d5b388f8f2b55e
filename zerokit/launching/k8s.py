"""`zerokit launch --k8s FILE`: the same job as a PyTorchJob for the Kubeflow training operator on Kubernetes.

zerokit prepares the run directory as for a run here (config, tokens, rank options), on a shared volume: the
PersistentVolumeClaim of --k8s-volume CLAIM:PATH, mounted at PATH both where zerokit runs and in every pod, so the
absolute paths in the rank options mean the same file everywhere. The manifest (launching/command.py render_pytorchjob,
templates/pytorchjob.yaml.j2) runs `torchrun ... --module zerokit.launching.train RUN/rank_options.json` in every pod:
one Master and workers, --gpus-per-pod ranks and GPUs each (default --gpus-per-node: a pod per node).

check_request refuses what the request alone gets wrong, before anything slow; job() checks the paths the pods read
and the split of the GPUs into pods (prepare_launch calls it, so a refusal writes nothing) and renders the manifest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from zerokit.core.errors import ZerokitError
from zerokit.core.options import flag
from zerokit.launching.command import DNS1123_SUBDOMAIN, PYTORCHJOB_PORT, k8s_job_name, render_pytorchjob
from zerokit.launching.rank_options import RankOptions

# what the ranks started here get but a pod must not: PYTHONPATH names this checkout (the image has zerokit installed)
_NOT_IN_PODS = ("PYTHONPATH",)


@dataclass(frozen=True)
class K8sJob:
    name: str
    pods: int
    ranks_per_pod: int
    claim: str
    mount_path: str
    manifest: str


def parse_volume(text: str | None) -> tuple[str, str]:
    """--k8s-volume CLAIM:PATH as (claim, absolute mount path)."""
    how = f"give {flag('k8s-volume')} CLAIM:PATH, the PersistentVolumeClaim every pod mounts and where, e.g. shared-runs:/mnt/shared"
    if not text or not text.strip():
        raise ZerokitError(f"{flag('k8s')} needs the shared volume that holds the run directory: {how}")
    claim, sep, path = text.strip().partition(":")
    if not claim:
        raise ZerokitError(f"{flag('k8s-volume')} {text!r} names no PersistentVolumeClaim: {how}")
    if not sep or not path:
        raise ZerokitError(f"{flag('k8s-volume')} {text!r} gives no mount path: {how}")
    if len(claim) > 253 or not DNS1123_SUBDOMAIN.match(claim):
        raise ZerokitError(f"{flag('k8s-volume')} claim {claim!r} is not a PersistentVolumeClaim name (lowercase letters, "
                           f"digits, '-' and '.'): {how}")
    if not path.startswith("/"):
        raise ZerokitError(f"{flag('k8s-volume')} mount path {path!r} is not absolute: {how}")
    return claim, os.path.normpath(path)


def check_request(req: Any) -> None:
    """--k8s and its options, from the request alone (prepare_launch's first step)."""
    if not req.k8s:
        given = [flag(name) for name, value in (("k8s-image", req.k8s_image), ("k8s-volume", req.k8s_volume),
                                                ("gpus-per-pod", req.gpus_per_pod)) if value is not None]
        if given:
            raise ZerokitError(f"{', '.join(given)} only shape{'s' * (len(given) == 1)} the {flag('k8s')} manifest: add "
                               f"{flag('k8s')} FILE, or drop {'it' if len(given) == 1 else 'them'}")
        return
    if req.sbatch:
        raise ZerokitError(f"{flag('k8s')} and {flag('sbatch')} each write the job for another scheduler: keep one")
    others = [flag(name) for name, value in (("hostfile", req.hardware.hostfile), ("launcher", req.launcher),
                                             ("master-addr", req.master_addr)) if value]
    if others:
        raise ZerokitError(f"{flag('k8s')}: the training operator places the pods and gives them the master's address "
                           f"(MASTER_ADDR, PET_*): drop {', '.join(others)}")
    if not req.k8s_image or not req.k8s_image.strip():
        raise ZerokitError(f"{flag('k8s')} needs {flag('k8s-image')} IMAGE: the container image every pod runs, with "
                           "zerokit, DeepSpeed and torch installed (e.g. pip install 'zerokit[train]' on a CUDA torch image)")
    parse_volume(req.k8s_volume)
    from zerokit.core.fsutil import check_writable_file

    check_writable_file(req.k8s, f"{flag('k8s')} {req.k8s}")  # missing folders: created (mkdir -p)


def ranks_per_pod(req: Any, cluster: Any) -> int:
    """--gpus-per-pod, checked: whole pods on every node (a pod's GPUs are one node's)."""
    per_node = cluster.gpus_per_node
    per_pod = req.gpus_per_pod or per_node
    if per_node % per_pod:
        fits = ", ".join(str(d) for d in range(1, per_node + 1) if per_node % d == 0)
        raise ZerokitError(f"{flag('gpus-per-pod')} {per_pod} cannot split {cluster.nodes} node{'s' * (cluster.nodes > 1)} "
                           f"x {per_node} GPUs into whole pods (a pod's GPUs are on one node): give a divisor of "
                           f"{flag('gpus-per-node')} {per_node}: {fits}")
    return per_pod


def _under(path: Path, mount: str) -> bool:
    return any(path == m or m in path.parents for m in {Path(mount), Path(mount).resolve()})


def check_paths(plan: Any, mount: str) -> None:
    """What the pods read must be on the volume: the run directory, and a local model, tokenizer or script (a bundled
    model is named instead: the image's zerokit has it; see rank_options)."""
    from zerokit.core.resources import bundled_tokenizer

    where = f"the pods see only the volume at {mount} ({flag('k8s-volume')})"
    if not _under(plan.out_abs, mount):
        raise ZerokitError(f"{flag('output-dir')} {plan.out} is not under {mount}: {where}; give {flag('output-dir')} "
                           f"{mount}/...")
    reads = []  # (what, path, the fix)
    if plan.model.kind in ("directory", "file"):
        reads.append(("model", plan.model.path, "copy it there, or give its hub id"))
    if plan.tokenizer and plan.tokenizer != str(bundled_tokenizer()) and Path(plan.tokenizer).exists():
        reads.append(("tokenizer", Path(plan.tokenizer), "copy it there, or give its hub id"))
    if plan.report_dir is not None:  # --report-to writes its curves there from rank 0's pod
        reads.append(("tracker directory", plan.report_dir, f"give {flag('report-dir')} under it (default: the run directory)"))
    if plan.script is not None and not plan.script.is_module:
        reads.append(("script", Path(plan.script.target), "copy it there, or run a module installed in the image"))
    for what, path, fix in reads:
        if not _under(Path(path).resolve(), mount):
            raise ZerokitError(f"the {what} {path} is not under {mount}: {where}; {fix}")


def rank_options(plan: Any) -> RankOptions:
    """What the pods' ranks are told (written as RUN/rank_options.json). As for a run here, except: a bundled model
    and tokenizer by name, since the image's zerokit has them elsewhere (the ranks resolve names themselves:
    spec.resolve.resolve_model); and, when the operator restarts pods (--max-restarts), resume set, since the ranks of
    a restarted pod are a first attempt to launching/train.py (no ZEROKIT_ATTEMPT): they must resume from
    checkpoints/latest, and with none yet they start from the beginning (train.py resume_position)."""
    from zerokit.core.resources import bundled_tokenizer

    req = plan.request
    opts = plan.rank_options(req.resume or req.max_restarts > 0)
    if plan.model.kind == "bundled":
        opts = replace(opts, model=plan.model.name)
    if opts.tokenizer == str(bundled_tokenizer()):
        opts = replace(opts, tokenizer=None)
    return opts


def gpu_resource(cluster: Any) -> str | None:
    """The device plugin's resource name for the pods' accelerators: NVIDIA's nvidia.com/gpu (NVIDIA k8s-device-plugin),
    AMD's amd.com/gpu (ROCm k8s-device-plugin) for the catalog's MI GPUs; None for CPU ranks."""
    acc = cluster.accelerator
    if acc.is_cpu:
        return None
    return "amd.com/gpu" if acc.name.lower().startswith("mi") else "nvidia.com/gpu"


def job(plan: Any) -> K8sJob:
    """The PyTorchJob for a prepared plan, every check made (ZerokitError, one line). Pure: writes nothing."""
    req, cluster = plan.request, plan.cluster
    claim, mount = parse_volume(req.k8s_volume)
    per_pod = ranks_per_pod(req, cluster)
    check_paths(plan, mount)
    pods = cluster.world_size // per_pod
    spec = replace(plan.launch_spec(req.resume), master_port=req.master_port or PYTORCHJOB_PORT,
                   env={k: v for k, v in plan.env.items() if k not in _NOT_IN_PODS})
    name = k8s_job_name(plan.out_abs.name)
    text = render_pytorchjob(spec, name, pods=pods, ranks_per_pod=per_pod, image=req.k8s_image.strip(), claim=claim,
                             mount_path=mount, run_dir=str(plan.out_abs), max_restarts=req.max_restarts,
                             gpu_resource=gpu_resource(cluster))
    return K8sJob(name, pods, per_pod, claim, mount, text)
