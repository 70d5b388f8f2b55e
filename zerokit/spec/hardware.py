"""Hardware: the accelerator catalog (zerokit/data/gpus.json) and the cluster a plan targets."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache

from zerokit.core.errors import ZerokitError
from zerokit.core.limits import at_most
from zerokit.core.resources import bundled_data
from zerokit.core.units import MiB, parse_size
from zerokit.spec.profile import HardwareProfile, apply_profile


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
    efficiency: float = 0.4  # fraction of peak reached in training; a hardware profile replaces it
    cpu_adam_params_per_s: float = 0.0  # host optimizer rate per node; 0 = timing model default
    is_cpu: bool = False
    source: str = ""

    def supports(self, precision: str) -> bool:
        return precision == "fp32" or bool(getattr(self, precision))

    def peak_flops(self, precision: str) -> float:
        return getattr(self, f"{precision}_tflops") * 1e12

    @property
    def precisions(self) -> tuple[str, ...]:
        return tuple(p for p in ("bf16", "fp16", "fp32") if self.supports(p))


@lru_cache(maxsize=1)
def catalog() -> dict[str, Accelerator]:
    raw = json.loads(bundled_data("gpus.json").read_text())
    out = {}
    for name, d in raw.items():
        if name.startswith("_"):
            continue
        d = dict(d)
        mib = d.pop("memory_mib")
        out[name] = Accelerator(name=name, memory_bytes=mib * MiB, **d)
    return out


def accelerator(name: str) -> Accelerator:
    key = name.strip().lower().replace("_", "-")
    cat = catalog()
    if key not in cat:
        raise ZerokitError(f"unknown GPU {name!r}: use one of {', '.join(cat)}, or give --gpu-memory SIZE")
    return cat[key]


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
    # what `zerokit calibrate` measured on this hardware: the time model reads its terms from here
    profile: HardwareProfile | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.gpus_per_node < 1 or self.nodes < 1:
            raise ZerokitError("GPUs per node and nodes must be at least 1")
        at_most(self.gpus_per_node, "MAX_GPUS_PER_NODE", "GPUs per node")
        at_most(self.world_size, "MAX_WORLD_SIZE", "a world size of")

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def gpu_memory_bytes(self) -> int:
        return self.accelerator.memory_bytes

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("profile")  # its figures are already in the accelerator; accelerator.source names the file
        d["world_size"] = self.world_size
        return d


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
) -> Cluster:
    """The Cluster from the CLI's hardware options. Explicit numbers override the catalog."""
    acc = accelerator(gpu or "a100-80gb")
    profile = None
    if hardware_profile:
        profile = HardwareProfile.from_file(hardware_profile)
        acc = apply_profile(acc, profile)
    if gpu_memory is not None:
        mem = parse_size(gpu_memory, "--gpu-memory")
        if mem <= 0:
            raise ZerokitError("--gpu-memory must be positive, e.g. 80GB")
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
            raise ZerokitError(f"--gpus-per-node {gpus_per_node} disagrees with hostfile slots={hf_gpus}: drop one of them")
        if nodes is not None and nodes != hf_nodes:
            raise ZerokitError(f"--nodes {nodes} disagrees with the {hf_nodes} hosts in {hostfile}: drop one of them")
        gpus_per_node, nodes = hf_gpus, hf_nodes
    cpu_bytes = parse_size(cpu_memory, "--cpu-memory") if cpu_memory is not None else 0
    nvme_bytes = parse_size(nvme_size, "--nvme-size") if nvme_size is not None else 0
    if nvme_path and nvme_size is None:
        import shutil

        try:
            nvme_bytes = shutil.disk_usage(nvme_path).free
        except OSError:
            raise ZerokitError(f"--nvme-path {nvme_path} does not exist: create it or give --nvme-size") from None
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

    def build(self) -> Cluster:
        return build_cluster(**asdict(self))
