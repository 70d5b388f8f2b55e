"""Hardware: the accelerator catalog (zerokit/data/gpus.json) and the cluster a plan targets."""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache

from zerokit.core.errors import ZerokitError
from zerokit.core.limits import at_most
from zerokit.core.options import DIST_BACKENDS, flag
from zerokit.core.resources import bundled_data
from zerokit.core.units import MiB, parse_size
from zerokit.spec.profile import LOCAL_PROFILE_ENV, HardwareProfile, apply_profile, local_profile_path, measured_here


@dataclass(frozen=True)
class Accelerator:
    """One accelerator type. TFLOP/s are dense peaks; bandwidths GB/s per GPU, one direction."""

    name: str
    memory_bytes: int
    bf16_tflops: float
    fp16_tflops: float
    fp32_tflops: float
    bf16: bool
    fp16: bool
    intra_node_bw: float
    inter_node_bw: float
    pcie_bw: float
    efficiency: float = 0.4  # fraction of peak reached in training, priced only where the figures below are missing
    # the GPU time model's figures (estimate/gpu_time.py): datasheet HBM bandwidth GB/s; the Maximum Achievable Matmul
    # FLOPS over the dense peak; the FlashAttention kernels' forward + backward FLOP/s over the peak
    hbm_gbps: float = 0.0
    matmul_fraction: float = 0.0
    attention_fraction: float = 0.0
    # FlashAttention-3's (--attention flash3) forward + backward FLOP/s over the peak; 0 where it does not run: its
    # kernels are written for Hopper (flash-attention's hopper/ directory, sm90)
    flash3_fraction: float = 0.0
    cpu_adam_params_per_s: float = 0.0  # host optimizer rate per node; 0 = timing model default
    # the architecture (volta, ampere, hopper, ...): picks the matmul efficiency fitted on published runs
    # (estimate/gpu_time.py TimeFit); "" or one the fit never saw takes the fit's pooled figure
    generation: str = ""
    is_cpu: bool = False
    source: str = ""
    # what nvidia-smi, rocm-smi and torch.cuda.get_device_name print for this part (first), and names its key does
    # not spell: nvidia-smi's "NVIDIA GH200 480GB" is the 96 GB GH200 (480 GB is its CPU's memory)
    names: tuple[str, ...] = ()
    detected: str = ""  # --gpu auto: what nvidia-smi reported ("8 x NVIDIA A100-SXM4-80GB, 81920 MiB")
    # supported but measured pathologically slow (spec.profile.slow_precisions): the planner leaves them out unless
    # pinned, so a bf16 at 1/50 of fp32's speed never wins a plan by halving memory
    slow_precisions: tuple[str, ...] = ()

    @property
    def prices_kernels(self) -> bool:
        """Whether the GPU time model prices this accelerator (estimate/gpu_time.py), not peak x efficiency."""
        return not self.is_cpu and self.hbm_gbps > 0 and self.matmul_fraction > 0 and self.attention_fraction > 0

    def attention_rate_fraction(self, attention: str) -> float:
        """The attention kernel's FLOP/s over the peak: FlashAttention-3's own rate for flash3, else the
        FlashAttention-2 class rate (sdpa's flash backend vendors FlashAttention-2)."""
        return self.flash3_fraction if attention == "flash3" else self.attention_fraction

    def attention_problem(self, attention: str) -> str | None:
        """Why this accelerator cannot run the attention kernel, in one line; None when it can."""
        if attention != "flash3" or self.flash3_fraction > 0:
            return None
        hopper = ", ".join(name for name, acc in catalog().items() if acc.flash3_fraction > 0)
        return (f"{flag('attention')} flash3: FlashAttention-3 runs on Hopper GPUs ({hopper}), not {self.name}: "
                f"use {flag('attention')} flash")

    def supports(self, precision: str) -> bool:
        return precision == "fp32" or bool(getattr(self, precision))

    def peak_flops(self, precision: str) -> float:
        return getattr(self, f"{precision}_tflops") * 1e12

    @property
    def precisions(self) -> tuple[str, ...]:
        return tuple(p for p in ("bf16", "fp16", "fp32") if self.supports(p))

    @property
    def plannable_precisions(self) -> tuple[str, ...]:
        """What the planner tries unpinned: the supported precisions, less the measured-slow ones."""
        return tuple(p for p in self.precisions if p not in self.slow_precisions) or self.precisions


@lru_cache(maxsize=1)
def catalog() -> dict[str, Accelerator]:
    raw = json.loads(bundled_data("gpus.json").read_text())
    out = {}
    for name, d in raw.items():
        if name.startswith("_"):
            continue
        d = dict(d)
        mib = d.pop("memory_mib")
        d["names"] = tuple(d.get("names", ()))  # frozen dataclass: hashable
        out[name] = Accelerator(name=name, memory_bytes=mib * MiB, **d)
    return out


# Words in GPU names that say nothing about the figures in the catalog: vendor and product lines, and form factors
# whose memory is the same (nvidia-smi: "NVIDIA A100-SXM4-80GB", "Tesla V100-PCIE-16GB", "NVIDIA H100 80GB HBM3",
# "NVIDIA GeForce RTX 4090"; torch.cuda.get_device_name gives the same strings). "nvl" is kept: the H100 NVL has
# 94 GB, not the 80 of the SXM part.
_NAME_NOISE = {"nvidia", "tesla", "geforce", "quadro", "amd", "instinct", "radeon", "sxm", "sxm2", "sxm4", "sxm5",
               "pcie", "hbm2", "hbm2e", "hbm3", "hbm3e", "gpu"}
_SIZE_SUFFIX = re.compile(r"-\d+gb$")


def _compact(name: str) -> str:
    """A GPU name as letters and digits only, without the words in _NAME_NOISE: "NVIDIA A100-SXM4-80GB" and
    "a100-80gb" both give "a10080gb"."""
    tokens = re.findall(r"[a-z0-9]+", name.lower())
    return "".join(t for t in tokens if t not in _NAME_NOISE)


def resolve_gpu_name(name: str) -> tuple[str, str | None]:
    """(catalog key, note) for a GPU name as people type it or nvidia-smi and torch print it: case, dashes,
    spaces, vendor and form-factor words do not matter; a family without its size ("H100", "A100") is the family's
    largest entry, with a note when the family has several sizes. Unknown names: one line with the closest ones."""
    cat = catalog()
    key = name.strip().lower().replace("_", "-")
    if key in cat:
        return key, None
    compact = _compact(name)
    by_compact = {_compact(k): k for k in cat}
    if compact in by_compact:
        return by_compact[compact], None
    aliases = {_compact(n): k for k, acc in cat.items() for n in acc.names}  # gpus.json "names"
    if compact in aliases:
        return aliases[compact], None
    family = [k for k in cat if _compact(_SIZE_SUFFIX.sub("", k)) == compact]
    if family:
        best = max(family, key=lambda k: cat[k].memory_bytes)
        note = None
        if len(family) > 1:
            others = ", ".join(k for k in family if k != best)
            note = f"{flag('gpu')} {name}: planning for {best} (the family also has {others}; name the size to choose)"
        return best, note
    close = difflib.get_close_matches(compact, list(by_compact), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(by_compact[c] for c in close)}? " if close else ""
    raise ZerokitError(f"unknown GPU {name!r}: {hint}known: {', '.join(cat)}; or give {flag('gpu-memory')} SIZE")


def accelerator(name: str) -> Accelerator:
    return catalog()[resolve_gpu_name(name)[0]]


def local_gpus() -> list[tuple[str, int]]:
    """(name, memory MiB) of each local NVIDIA GPU as nvidia-smi reports it, without importing torch; [] when
    there is no nvidia-smi or it lists none."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = []
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        name, _, mib = line.rpartition(",")
        if name.strip() and mib.strip().isdigit():
            gpus.append((name.strip(), int(mib)))
    return gpus


def detect_accelerator() -> tuple[Accelerator, int]:
    """--gpu auto: (the local GPUs' accelerator, with the memory nvidia-smi reports, and how many there are)."""
    gpus = local_gpus()
    if not gpus:
        raise ZerokitError(f"{flag('gpu')} auto found no NVIDIA GPU on this machine (no nvidia-smi, or it lists none): "
                           f"name the GPU with {flag('gpu')} NAME, or give {flag('gpu-memory')} SIZE")
    names = sorted({n for n, _ in gpus})
    if len(names) > 1:
        raise ZerokitError(f"{flag('gpu')} auto found different GPUs ({', '.join(names)}): zerokit plans for one kind; "
                           f"name it with {flag('gpu')} NAME")
    name, mib = gpus[0]
    try:
        key, _ = resolve_gpu_name(name)
    except ZerokitError:
        raise ZerokitError(f"{flag('gpu')} auto found {name!r}, which is not in zerokit's catalog: give {flag('gpu')} "
                           f"NAME of the closest GPU there and {flag('gpu-memory')} {mib}MiB") from None
    found = f"{len(gpus)} x {name}, {mib} MiB (nvidia-smi)"
    return replace(catalog()[key], memory_bytes=mib * MiB, detected=found), len(gpus)


def local_gpus_in_catalog() -> bool:
    """Whether `--gpu auto` can name this machine's GPUs: one kind, and the catalog knows it. A run on the local GPUs
    without --gpu is then priced on that GPU's figures, not only on its memory."""
    try:
        detect_accelerator()
    except ZerokitError:
        return False
    return True


# -- the communication backend (--dist-backend) -------------------------------------------------------------
# The torch.distributed backends DeepSpeed can be told to use: DIST_BACKENDS, the option's choices (core/options.py)
# Per device family: (DeepSpeed's default, the backends that can carry its tensors). The default is what
# deepspeed.comm.init_distributed(dist_backend=None) takes, get_accelerator().communication_backend_name():
# CUDA_Accelerator 'nccl' (ROCm too: torch names RCCL nccl), CPU_Accelerator 'ccl' (Intel's oneCCL) when
# oneccl_bindings_for_pytorch imports, else 'gloo' (deepspeed/accelerator/cpu_accelerator.py), NPU_Accelerator
# (Ascend) and HPU_Accelerator (Gaudi) 'hccl'. What can carry what: torch.distributed's backend table (gloo: CPU,
# and CUDA tensors staged through host memory; nccl: CUDA only; mpi: CPU, CUDA with a CUDA-aware MPI), oneCCL for
# Intel CPUs, HCCL for Ascend and Gaudi.
_FAMILY_BACKENDS = {
    "cpu": ("gloo", ("gloo", "mpi", "ccl")),
    "cuda": ("nccl", ("nccl", "gloo", "mpi")),
    "hccl": ("hccl", ("hccl", "gloo")),
}
# The catalog holds NVIDIA and AMD GPUs and `cpu`; an Ascend or Gaudi entry is told by its name.
_NAME_FAMILIES = (("ascend", "hccl"), ("gaudi", "hccl"))


def device_family(acc: Accelerator) -> str:
    """cpu | cuda | hccl: which DeepSpeed accelerator class runs this device (see _FAMILY_BACKENDS)."""
    if acc.is_cpu:
        return "cpu"
    name = acc.name.lower()
    return next((family for word, family in _NAME_FAMILIES if word in name), "cuda")


@lru_cache(maxsize=1)
def _oneccl_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("oneccl_bindings_for_pytorch") is not None  # finds, imports nothing


def default_dist_backend(acc: Accelerator) -> str:
    """The backend DeepSpeed picks for this accelerator when none is given (see _FAMILY_BACKENDS)."""
    family = device_family(acc)
    if family == "cpu" and _oneccl_installed():
        return "ccl"  # CPU_Accelerator: oneCCL's bindings installed
    return _FAMILY_BACKENDS[family][0]


def check_dist_backend(backend: str, acc: Accelerator) -> None:
    """One line when `backend` is no backend, or cannot carry this accelerator's tensors."""
    if backend not in DIST_BACKENDS:
        raise ZerokitError(f"unknown communication backend {backend!r}: use one of {', '.join(DIST_BACKENDS)}")
    family = device_family(acc)
    if backend in _FAMILY_BACKENDS[family][1]:
        return
    if backend == "nccl" and family == "cpu":
        raise ZerokitError(f"{flag('dist-backend')} nccl needs NVIDIA GPUs: use gloo on CPU")
    ok = ", ".join(_FAMILY_BACKENDS[family][1])
    raise ZerokitError(f"{flag('dist-backend')} {backend} cannot carry {acc.name} tensors: use one of {ok} "
                       f"(default {default_dist_backend(acc)})")


@dataclass(frozen=True)
class Cluster:
    """Where training runs: N nodes of M accelerators, host RAM per node, optional NVMe per node."""

    accelerator: Accelerator
    gpus_per_node: int = 1
    nodes: int = 1
    cpu_memory_bytes: int = 0  # per node; 0 = unknown (CPU budget not checked)
    nvme_path: str | None = None
    nvme_bytes: int = 0  # free NVMe per node
    hosts: tuple[tuple[str, int], ...] = ()  # from a hostfile: (host, slots)
    # --dist-backend: how the ranks communicate (a property of how the job runs, not of the ZeRO setup);
    # None = DeepSpeed's default for the accelerator (comm_backend)
    dist_backend: str | None = None
    # what `zerokit calibrate` measured on this hardware: the time model reads its terms from here
    profile: HardwareProfile | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        # whole numbers, for a library caller as for the CLI: a float world would price fractions of a rank
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (self.gpus_per_node, self.nodes)):
            raise ZerokitError(f"GPUs per node and nodes must be whole numbers, got {self.gpus_per_node!r} and "
                               f"{self.nodes!r}")
        if self.gpus_per_node < 1 or self.nodes < 1:
            raise ZerokitError("GPUs per node and nodes must be at least 1")
        at_most(self.gpus_per_node, "MAX_GPUS_PER_NODE", "GPUs per node")
        at_most(self.world_size, "MAX_WORLD_SIZE", "a world size of")
        if self.dist_backend is not None:
            check_dist_backend(self.dist_backend, self.accelerator)

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def gpu_memory_bytes(self) -> int:
        return self.accelerator.memory_bytes

    @property
    def comm_backend(self) -> str:
        """The backend the ranks communicate over: --dist-backend, else DeepSpeed's default for the accelerator."""
        return self.dist_backend or default_dist_backend(self.accelerator)

    @property
    def time_source(self) -> str:
        """What the step time is priced on: a measured profile (which, and when), or the catalog's figures."""
        if self.profile is not None:
            return self.profile.source
        acc = self.accelerator
        if acc.is_cpu:
            return "the catalog's rough figures for cpu (`zerokit calibrate` measures this machine once, ~50 s)"
        if acc.prices_kernels:
            return (f"the catalog's figures for {acc.name}: matmuls at {acc.matmul_fraction:.0%} of the datasheet peak "
                    f"(MAMF), attention kernels at {acc.attention_fraction:.0%}"
                    + (f" (FlashAttention-3 {acc.flash3_fraction:.0%})" if acc.flash3_fraction else "")
                    + ", element-wise work at "
                    f"{acc.hbm_gbps:g} GB/s HBM")
        return f"the catalog's datasheet peaks for {acc.name} x efficiency {acc.efficiency:g}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["time_source"] = self.time_source
        d.pop("profile")  # its figures are already in the accelerator; accelerator.source names the file
        d["world_size"] = self.world_size
        d["dist_backend"] = self.comm_backend  # what runs; dist_backend_default: not given, DeepSpeed's choice
        d["dist_backend_default"] = self.dist_backend is None
        return d


def machine_profile_for(acc: Accelerator) -> HardwareProfile | None:
    """The profile `zerokit calibrate` wrote on this machine (spec.profile.local_profile_path) when it measured what
    a plan targets: this very CPU for --gpu cpu, the same GPU model for a GPU; else None (the catalog's figures).
    A default profile that is unreadable is a cache miss, not an error; one named by ZEROKIT_HARDWARE_PROFILE must
    exist."""
    path = local_profile_path()
    if path is None:
        return None
    if not os.path.isfile(path):
        if os.environ.get(LOCAL_PROFILE_ENV, "").strip():
            raise ZerokitError(f"{LOCAL_PROFILE_ENV}={path} does not exist: run `zerokit calibrate {flag('output')} "
                               f"{path}`, or set {LOCAL_PROFILE_ENV}=none for the catalog's figures")
        return None
    try:
        profile = HardwareProfile.from_file(path)
    except ZerokitError:
        if os.environ.get(LOCAL_PROFILE_ENV, "").strip():
            raise
        return None
    if acc.is_cpu:
        return profile if profile.device_type == "cpu" and measured_here(profile) else None
    if profile.device_type != "cuda":
        return None
    try:
        return profile if resolve_gpu_name(profile.device_name)[0] == acc.name else None
    except ZerokitError:  # a GPU the catalog does not know
        return None


def build_cluster(
    gpu: str | None = None,
    gpu_memory: str | None = None,
    gpus_per_node: int | None = None,
    nodes: int | None = None,
    hostfile: str | None = None,
    cpu_memory: str | None = None,
    nvme_path: str | None = None,
    nvme_size: str | None = None,
    hardware_profile: str | None = None,
    dist_backend: str | None = None,
    intra_node_bandwidth: float | None = None,
    inter_node_bandwidth: float | None = None,
) -> Cluster:
    """The Cluster from the CLI's hardware options. Explicit numbers override the catalog; --gpu auto reads the
    local GPUs (their kind, memory and, unless given, how many per node)."""
    if gpu is not None and gpu.strip().lower() == "auto":
        acc, found = detect_accelerator()
        gpus_per_node = gpus_per_node if gpus_per_node is not None else (None if hostfile else found)
    else:
        acc = accelerator(gpu or "a100-80gb")
    if hardware_profile is None:
        profile = machine_profile_for(acc)
    elif hardware_profile.strip().lower() == "none":
        profile = None
    else:
        profile = HardwareProfile.from_file(hardware_profile)
    if profile is not None:
        acc = apply_profile(acc, profile)
    # the links as the user's cluster has them (GB/s per GPU, one direction), over the catalog's and a profile's
    for field_name, value, option in (("intra_node_bw", intra_node_bandwidth, "intra-node-bandwidth"),
                                      ("inter_node_bw", inter_node_bandwidth, "inter-node-bandwidth")):
        if value is not None:
            if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise ZerokitError(f"{flag(option)} must be a positive number of GB/s, got {value!r}")
            acc = replace(acc, **{field_name: float(value)})
    if gpu_memory is not None:
        mem = parse_size(gpu_memory, flag("gpu-memory"))
        if mem <= 0:
            raise ZerokitError(f"{flag('gpu-memory')} must be positive, e.g. 80GB")
        acc = replace(acc, memory_bytes=mem, name=acc.name if gpu else "custom")
    hosts: tuple[tuple[str, int], ...] = ()
    if hostfile:
        from zerokit.spec.hostfile import parse_hostfile

        parsed = parse_hostfile(hostfile)
        hosts = tuple(parsed.items())
        slots = set(parsed.values())
        if len(slots) != 1:
            raise ZerokitError(
                f"hostfile {hostfile} gives hosts different slot counts {sorted(slots)}: zerokit plans for equal nodes; "
                "use the same slots=N on every host"
            )
        hf_gpus, hf_nodes = slots.pop(), len(parsed)
        if gpus_per_node is not None and gpus_per_node != hf_gpus:
            raise ZerokitError(f"{flag('gpus-per-node')} {gpus_per_node} disagrees with hostfile slots={hf_gpus}: drop "
                               "one of them")
        if nodes is not None and nodes != hf_nodes:
            raise ZerokitError(f"{flag('nodes')} {nodes} disagrees with the {hf_nodes} hosts in {hostfile}: drop one "
                               "of them")
        gpus_per_node, nodes = hf_gpus, hf_nodes
    cpu_bytes = parse_size(cpu_memory, flag("cpu-memory")) if cpu_memory is not None else 0
    nvme_bytes = parse_size(nvme_size, flag("nvme-size")) if nvme_size is not None else 0
    if nvme_path and nvme_size is None:
        import shutil

        try:
            nvme_bytes = shutil.disk_usage(nvme_path).free
        except OSError:
            raise ZerokitError(f"{flag('nvme-path')} {nvme_path} does not exist: create it or give "
                               f"{flag('nvme-size')}") from None
    if nvme_bytes and not nvme_path:
        nvme_path = "/local_nvme"
    return Cluster(
        accelerator=acc,
        gpus_per_node=gpus_per_node if gpus_per_node is not None else 1,
        nodes=nodes if nodes is not None else 1,
        cpu_memory_bytes=cpu_bytes,
        nvme_path=nvme_path,
        nvme_bytes=nvme_bytes,
        hosts=hosts,
        dist_backend=dist_backend,
        profile=profile,
    )


@dataclass(frozen=True)
class HardwareOptions:
    """The hardware a user described (the same options on every command); build() makes the Cluster."""

    gpu: str | None = None
    gpu_memory: str | None = None
    gpus_per_node: int | None = None
    nodes: int | None = None
    hostfile: str | None = None
    cpu_memory: str | None = None
    nvme_path: str | None = None
    nvme_size: str | None = None
    hardware_profile: str | None = None
    dist_backend: str | None = None  # --dist-backend; None: DeepSpeed's default for the accelerator
    intra_node_bandwidth: float | None = None  # GB/s per GPU over the catalog's (--intra-node-bandwidth)
    inter_node_bandwidth: float | None = None

    def build(self) -> Cluster:
        return build_cluster(**asdict(self))
