"""--dist-backend: DeepSpeed's default per accelerator (its own accelerator classes are the oracle), the backend's
bandwidth and the config's communication_data_type in the time model (DeepSpeed's bytes per element), a calibrated
figure per backend, the refusal of a backend this torch lacks before any rank starts, and a real 2-rank gloo run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from zerokit.cli import main
from zerokit.core.errors import ZerokitError
from zerokit.estimate.gpu_time import time_fit
from zerokit.estimate.timing import (GLOO_ON_GPU_BUSBW_GBPS, collective_bytes, estimate_time, link_bandwidth,
                                     ring_node_share)
from zerokit.spec.hardware import Cluster, HardwareOptions, accelerator, catalog, default_dist_backend
from zerokit.spec.model import spec_from_params
from zerokit.spec.setup import Workload, ZeroSetup

REPO = Path(__file__).resolve().parents[1]
MODEL = spec_from_params(7e9)
WORKLOAD = Workload(seq_len=2048)
# a real `zerokit calibrate` profile of this project's CPU machine: collectives over gloo, 2 ranks
CPU_PROFILE = REPO / "bench" / "results" / "accuracy_cpu_profile.json"
LAUNCH = ["launch", "--model", "tiny-llama", "--gpus-per-node", "2", "--seq-len", "32", "--steps", "2", "--plan"]


def _cluster(gpu="a100-80gb", **kw) -> Cluster:
    return HardwareOptions(gpu=gpu, **{"gpus_per_node": 8, **kw}).build()


# ---------------------------------------------------------------------------------------------- the default


def test_default_is_deepspeeds_choice_for_each_accelerator():
    """deepspeed.comm.init_distributed(dist_backend=None) takes get_accelerator().communication_backend_name()."""
    pytest.importorskip("deepspeed")
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator
    from deepspeed.accelerator.npu_accelerator import NPU_Accelerator

    for name, acc in catalog().items():  # NVIDIA and AMD GPUs run under CUDA_Accelerator, `cpu` under CPU_Accelerator
        want = (CPU_Accelerator() if acc.is_cpu else CUDA_Accelerator()).communication_backend_name()
        assert default_dist_backend(acc) == want, name
        cluster = Cluster(accelerator=acc, gpus_per_node=2)
        assert cluster.comm_backend == want and cluster.to_dict()["dist_backend"] == want, name
        assert cluster.to_dict()["dist_backend_default"] is True
    ascend = replace(accelerator("a100-80gb"), name="ascend-910b")
    assert default_dist_backend(ascend) == NPU_Accelerator().communication_backend_name()


def test_a_backend_that_cannot_carry_the_devices_tensors_is_refused():
    with pytest.raises(ZerokitError, match="nccl needs NVIDIA GPUs: use gloo on CPU"):
        _cluster("cpu", gpus_per_node=2, dist_backend="nccl")
    with pytest.raises(ZerokitError, match="cannot carry a100-80gb tensors"):
        _cluster(dist_backend="ccl")
    with pytest.raises(ZerokitError, match="unknown communication backend"):
        _cluster(dist_backend="nccl2")
    given = _cluster(dist_backend="gloo")
    assert given.comm_backend == "gloo" and given.to_dict()["dist_backend_default"] is False


def test_plan_shows_the_backend(capsys):
    assert main(["plan", "--params", "7e9", "--gpu", "a100-80gb", "--gpus-per-node", "8", "--dist-backend", "gloo",
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["hardware"]["dist_backend"] == "gloo" and plan["time"]["link_gbps"] == GLOO_ON_GPU_BUSBW_GBPS
    main(["plan", "--params", "7e9", "--gpu", "a100-80gb", "--gpus-per-node", "8"])
    assert "backend nccl (DeepSpeed's default)" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------- the time model


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-80gb", "rtx4090"])
@pytest.mark.parametrize("nodes", [1, 2])
def test_gloo_on_gpus_is_slower_by_the_host_staged_figure(gpu, nodes):
    setup = ZeroSetup(zero_stage=2, precision="bf16", micro_batch_size=1, gradient_accumulation_steps=4)
    nccl, gloo = _cluster(gpu, nodes=nodes), _cluster(gpu, nodes=nodes, dist_backend="gloo")
    t_nccl, t_gloo = estimate_time(MODEL, nccl, setup, WORKLOAD), estimate_time(MODEL, gloo, setup, WORKLOAD)
    acc = nccl.accelerator
    # NCCL's links: across nodes a ring runs at the slower of NVLink and the node's NICs' share (timing.ring_node_share)
    catalog_gbps = acc.intra_node_bw if nodes == 1 else min(acc.intra_node_bw, acc.inter_node_bw / ring_node_share(nccl))
    factor = catalog_gbps / min(catalog_gbps, GLOO_ON_GPU_BUSBW_GBPS)
    assert factor > 1
    # the bytes' time (what waits plus what overlaps compute: estimate/gpu_time.py exposed_communication) scales with
    # the bandwidth; gloo's host-staged rate leaves more of it exposed
    def moved(t):
        return t.communication_seconds + t.communication_hidden_seconds

    assert moved(t_gloo) == pytest.approx(factor * moved(t_nccl))
    assert t_gloo.communication_seconds > t_nccl.communication_seconds
    assert t_gloo.compute_seconds == t_nccl.compute_seconds and t_gloo.link_gbps == GLOO_ON_GPU_BUSBW_GBPS
    # a CUDA-aware MPI runs over the same links (timing.py's source): priced as the catalog's
    assert link_bandwidth(_cluster(gpu, nodes=nodes, dist_backend="mpi")) == link_bandwidth(nccl)


def test_communication_data_type_sets_the_bytes_of_the_gradient_reduce():
    """DeepSpeed casts gradients to communication_data_type before reducing them; parameters are gathered in their
    own dtype. Bytes per element from DeepSpeed's own reading of the key (runtime/config.py)."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import get_communication_data_type

    def itemsize(name):
        return get_communication_data_type({"communication_data_type": name}).itemsize

    assert get_communication_data_type({}) is None  # absent: the engine takes the training precision
    cluster = _cluster()
    for stage in (0, 1, 2, 3):
        for precision in ("bf16", "fp32"):
            base = ZeroSetup(zero_stage=stage, precision=precision, gradient_accumulation_steps=2)
            default = collective_bytes(MODEL, cluster, base)
            assert default == collective_bytes(MODEL, cluster, replace(base, communication_data_type=precision))
            for comm in ("fp32", "fp16", "bf16"):
                got = collective_bytes(MODEL, cluster, replace(base, communication_data_type=comm))
                assert got.gradients == pytest.approx(default.gradients * itemsize(comm) / itemsize(precision))
                assert got.parameters == default.parameters
            assert default.gradients > 0 and (default.parameters > 0) == (stage > 0)
    # in the step time: bf16 training with fp32 gradient reduces doubles the gradient term of ZeRO-0 (all gradients)
    z0 = ZeroSetup(zero_stage=0, precision="bf16")
    t16, t32 = (estimate_time(MODEL, cluster, replace(z0, communication_data_type=c), WORKLOAD) for c in ("bf16", "fp32"))
    assert t32.communication_seconds == pytest.approx(t16.communication_seconds * itemsize("fp32") / itemsize("bf16"))


def test_check_reads_communication_data_type_from_the_users_config(tmp_path, capsys):
    pytest.importorskip("deepspeed")
    cfg = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
           "bf16": {"enabled": True}, "zero_optimization": {"stage": 2},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    times = {}
    for comm in (None, "FP32"):  # DeepSpeed lower-cases the value (get_communication_data_type)
        path = tmp_path / f"{comm}.json"
        path.write_text(json.dumps({**cfg, **({"communication_data_type": comm} if comm else {})}))
        assert main(["check", str(path), "--params", "1e9", "--gpu", "a100-80gb", "--gpus-per-node", "8", "--json"]) == 0
        ev = json.loads(capsys.readouterr().out)["evaluation"]
        assert ev["setup"]["communication_data_type"] == (comm.lower() if comm else None)
        times[comm] = ev["time"]["communication_seconds"]
    setup = ZeroSetup(zero_stage=2, precision="bf16", micro_batch_size=1, gradient_accumulation_steps=2)
    cluster, model = _cluster(), spec_from_params(1e9)
    # at the bus bandwidth the fit found NCCL reaches of the catalog's links (gpu_time.TimeFit.collective_efficiency)
    extra = (collective_bytes(model, cluster, replace(setup, communication_data_type="fp32")).gradients
             - collective_bytes(model, cluster, setup).gradients) / link_bandwidth(cluster) / time_fit().collective_efficiency
    assert extra > 0 and times["FP32"] - times[None] == pytest.approx(extra)


# ---------------------------------------------------------------------------------------------- calibrated figures


def test_measured_collectives_are_keyed_by_their_backend(tmp_path):
    """A real 2-rank gloo measurement, stored as calibrate stores it, read back for a plan over gloo."""
    pytest.importorskip("torch")
    from zerokit.core.units import MiB
    from zerokit.measure.calibrate import collectives_by_backend, measure_collectives

    coll = measure_collectives(2, sizes=(4096, 1 * MiB), iters=2, backend="gloo", threads=1)
    prof = json.loads(CPU_PROFILE.read_text())
    prof.update(collectives=coll, collectives_by_backend=collectives_by_backend(coll))
    (tmp_path / "p.json").write_text(json.dumps(prof))
    cluster = _cluster("cpu", gpus_per_node=2, hardware_profile=str(tmp_path / "p.json"), dist_backend="gloo")
    assert link_bandwidth(cluster) == pytest.approx(coll["all_reduce_busbw_gbps"] * 1e9)
    assert collectives_by_backend({"error": "no ranks"}) == {}


def test_a_calibrated_backend_figure_is_used_when_present(tmp_path):
    prof = json.loads(CPU_PROFILE.read_text())
    prof.pop("collectives_by_backend", None)  # a profile written before the key: still read, as gloo's figure
    gloo_gbps = prof["collectives"]["all_reduce_busbw_gbps"]
    (tmp_path / "old.json").write_text(json.dumps(prof))
    old = _cluster("cpu", gpus_per_node=2, hardware_profile=str(tmp_path / "old.json"))
    assert old.comm_backend == "gloo" and link_bandwidth(old) == pytest.approx(gloo_gbps * 1e9)

    # a GPU host with one GPU measures gloo between host processes (calibrate's note): plans over gloo on that GPU
    # use the measured figure, plans over nccl keep the catalog's NVLink figure
    gpu_prof = {**prof, "device": {"type": "cuda", "name": "NVIDIA A100-SXM4-80GB", "count": 1,
                                   "memory_bytes": 85899345920, "cpu_cores": 16},
                "collectives_by_backend": {"gloo": {"world_size": 2, "all_reduce_busbw_gbps": 3 * gloo_gbps,
                                                    "all_gather_busbw_gbps": 1.0}}}
    (tmp_path / "gpu.json").write_text(json.dumps(gpu_prof))
    gloo = _cluster(hardware_profile=str(tmp_path / "gpu.json"), dist_backend="gloo")
    nccl = _cluster(hardware_profile=str(tmp_path / "gpu.json"))
    assert link_bandwidth(gloo) == pytest.approx(3 * gloo_gbps * 1e9)
    assert link_bandwidth(nccl) == accelerator("a100-80gb").intra_node_bw * 1e9
    setup = ZeroSetup(zero_stage=1, precision="bf16")
    assert estimate_time(MODEL, gloo, setup, WORKLOAD).link_gbps == pytest.approx(3 * gloo_gbps)


# ---------------------------------------------------------------------------------------------- launch


def _launch(*args, cwd: Path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH", "")) if x))
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run([sys.executable, "-m", "zerokit", *map(str, args)], capture_output=True, text=True,
                          cwd=str(cwd), env=env, timeout=600)


def _one_line_refusal(p, *needles):
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr and p.stdout == ""
    for n in needles:
        assert n in lines[0], lines[0]


def test_a_backend_this_torch_lacks_is_refused_before_any_rank_starts(tmp_path):
    import importlib.util

    import torch

    assert not torch.distributed.is_mpi_available()  # PyPI's torch: the refusal below is what it must get
    assert not torch.cuda.is_available() and not torch.distributed.is_nccl_available()
    assert importlib.util.find_spec("oneccl_bindings_for_pytorch") is None
    for backend, gpu, needles in (
            ("mpi", "cpu", ["PyPI's torch is built without MPI: build torch from source with MPI, or use gloo"]),
            ("nccl", "cpu", ["nccl needs NVIDIA GPUs: use gloo on CPU"]),
            ("nccl", "a100-80gb", ["nccl needs NVIDIA GPUs", "use gloo on CPU"]),  # planned for GPUs, launched here
            ("ccl", "cpu", ["pip install oneccl_bind_pt"])):
        out = tmp_path / f"run-{backend}-{gpu}"
        _one_line_refusal(_launch(*LAUNCH, "--gpu", gpu, "--dist-backend", backend, "--output-dir", out, cwd=tmp_path),
                          *needles)
        assert not out.exists() and not (tmp_path / "runs").exists()


def test_the_backend_reaches_the_ranks_and_torch_is_imported_only_when_given(tmp_path):
    code = ("import json, sys\n"
            "from zerokit.launching.prepare import LaunchRequest, prepare_launch\n"
            "from zerokit.spec.hardware import HardwareOptions\n"
            "backend = sys.argv[1] or None\n"
            f"req = LaunchRequest(model='tiny-llama', seq_len=32, steps=2, output_dir={str(tmp_path / 'run')!r},\n"
            "    hardware=HardwareOptions(gpu='cpu', gpus_per_node=2, dist_backend=backend))\n"
            "plan = prepare_launch(req)\n"
            "print(json.dumps({'options': plan.rank_options(False).to_dict(), 'torch': 'torch' in sys.modules}))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH", "")) if x))
    seen = {}
    for backend in ("", "gloo"):
        r = subprocess.run([sys.executable, "-c", code, backend], capture_output=True, text=True, env=env,
                           cwd=str(tmp_path), timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        seen[backend] = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen[""]["torch"] is False
    from zerokit.launching.rank_options import RankOptions

    # what the ranks read back from rank_options.json
    assert RankOptions.from_dict(seen["gloo"]["options"]).dist_backend == "gloo"
    assert RankOptions.from_dict(seen[""]["options"]).dist_backend is None


# A real 2-rank launch told --dist-backend gloo: tests/test_learn.py's run checks the backend on every rank.


# ------------------------------------------------------------------------------ TORCH_CUDA_ARCH_LIST variants


def test_an_arch_list_variant_deepspeed_cannot_parse_is_refused_before_any_rank_starts(monkeypatch):
    """Seen on an H200 (DeepSpeed 0.19.8, torch 2.11): with TORCH_CUDA_ARCH_LIST holding "9.0a" every rank died building
    FusedAdam with "invalid literal for int() with base 10: '0a'" (op_builder/builder.py compute_capability_args;
    deepspeedai/DeepSpeed#7589). The oracle is DeepSpeed's own builder, asked with the same list: the check refuses what
    it cannot parse, with the list that it can, and passes a plain list and CPU ranks."""
    pytest.importorskip("deepspeed")
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder

    from zerokit.launching.prepare import check_cuda_arch_list

    def deepspeed_parses(archs: str) -> bool:
        b = FusedAdamBuilder()
        b.jit_mode, b._jit_arch_list = True, archs
        try:
            b.compute_capability_args()
        except ValueError:
            return False
        return True

    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0a")
    assert not deepspeed_parses("8.0;9.0a")  # the DeepSpeed installed here still cannot: else this test has no case
    with pytest.raises(ZerokitError) as err:
        check_cuda_arch_list(_cluster("h100-80gb"), ranks_here=True)
    assert "export TORCH_CUDA_ARCH_LIST='8.0;9.0'" in str(err.value) and "\n" not in str(err.value)
    assert deepspeed_parses("8.0;9.0")
    check_cuda_arch_list(_cluster("cpu"), ranks_here=True)  # CPU ranks build no CUDA op
    check_cuda_arch_list(_cluster("h100-80gb"), ranks_here=False)  # other hosts' environments are their own
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX")
    check_cuda_arch_list(_cluster("h100-80gb"), ranks_here=True)
