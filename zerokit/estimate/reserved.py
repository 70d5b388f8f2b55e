"""What nvidia-smi will show per GPU, beside the allocated peak the fit is judged on.

The memory model (memory.py) counts bytes of live tensors: what torch.cuda.max_memory_allocated reports.
nvidia-smi shows more: the CUDA context, NCCL's own buffers (cudaMalloc'd outside torch's allocator) and
what torch's caching allocator has reserved (max_memory_reserved), which exceeds allocated by block rounding
and by freed blocks it keeps cached. ZeRO-3 adds to the latter: every parameter is all-gathered into a fresh
full-size tensor before use and released after (deepspeed/runtime/zero/partition_parameters.py all_gather /
partition), so blocks of parameter sizes are freed and re-requested between activation allocations.

The context is measured (one H200, bench/results/accuracy_h200.txt); the NCCL, rounding and churn terms are derived
from sources, not measured; each carries a low/high range. The fit verdict stays on the allocated peak plus the
fragmentation budget (DEFAULT_MEMORY_FRACTION): this figure is for comparing with nvidia-smi, not for deciding what
fits. Derivation: docs/memory-model.md,
"What nvidia-smi shows".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from zerokit.core.units import GiB, MiB
from zerokit.spec.setup import bytes_per_element

if TYPE_CHECKING:
    from zerokit.spec.hardware import Cluster
    from zerokit.spec.model import ModelSpec
    from zerokit.spec.setup import ZeroKnobs, ZeroSetup

# CUDA context per GPU (central, low, high): what a training process holds outside torch's allocator, less NCCL's
# buffers. Measured on an H200 (torch 2.11, CUDA 13.0, driver 580; bench/results/accuracy_h200.txt, cudaMemGetInfo
# total - free - memory_reserved at step ends): 1,311-1,325 MiB in one-rank ZeRO-3 jobs and 1,697-1,717 MiB at ZeRO-0/1/2
# (kernels loaded lazily as the run first uses them: GEMMs, attention, the fused optimizer, NCCL's); a bare context
# there was 619 MiB after the first tensor and 685 MiB after the first GEMM. Central: their middle, 1.5 GiB; high:
# above the largest measured. Low: PyTorch PR #86509's bare lazy-loading context, 287,047,680 B (torch 1.13 sets
# CUDA_MODULE_LOADING=LAZY; 666,632,192 B eager).
CUDA_CONTEXT_BYTES = (int(1.5 * GiB), 287_047_680, int(1.75 * GiB))
# NCCL's buffers per rank: NCCL_BUFFSIZE (default 4 MiB, NCCL user guide, Environment Variables) per channel
# per ring peer (2 peers: previous and next rank). Channels (central, low, high): 16 (NVLink nodes), 2 (PCIe),
# 32 with a second protocol buffer of the same size (LL128); assumptions, not measured.
NCCL_BUFFSIZE_BYTES = 4 * MiB
NCCL_RING_PEERS = 2
NCCL_BUFFERS_PER_PEER = (16, 2, 64)  # channels x protocol buffers per peer: central, low, high
# torch's caching allocator rounds large allocations up to kRoundLarge = 2 MiB and small ones to 512 B inside
# 2 MiB segments (c10/core/AllocatorConfig.h, torch 2.13): per live tensor about 1 MiB on average (a uniform
# remainder), 0 to 2 MiB. Live tensors at the peak: what activation_bytes_per_layer lists per layer (norm
# copies, q/k/v, attention output, four MLP tensors, masks) plus the layer's gathered parameters, about 16.
ROUNDING_BYTES_PER_TENSOR = (1 * MiB, 0, 2 * MiB)
LIVE_TENSORS_PER_LAYER = 16


@dataclass
class ReservedEstimate:
    """Per-GPU bytes nvidia-smi shows, as named terms with a central value and a low/high range.

    allocated_peak_bytes is the model's allocated peak without its own cuda_context allowance (that
    allowance belongs to the fit; here the context is its own term with its own range)."""

    terms: dict[str, int] = field(default_factory=dict)
    low_terms: dict[str, int] = field(default_factory=dict)
    high_terms: dict[str, int] = field(default_factory=dict)

    @property
    def nvidia_smi_bytes(self) -> int:
        return sum(self.terms.values())

    @property
    def low_bytes(self) -> int:
        return sum(self.low_terms.values())

    @property
    def high_bytes(self) -> int:
        return sum(self.high_terms.values())

    def allocator_reserved(self, terms: dict[str, int] | None = None) -> int:
        """What torch.cuda.max_memory_reserved should show: nvidia-smi less the context and NCCL's buffers."""
        t = self.terms if terms is None else terms
        return t["allocated_peak_bytes"] + t["allocator_rounding_bytes"] + t["zero3_churn_reserve_bytes"]

    def rebased(self, allocated_peak_bytes: int) -> "ReservedEstimate":
        """The same overheads on another allocated peak."""
        out = ReservedEstimate(dict(self.terms), dict(self.low_terms), dict(self.high_terms))
        for t in (out.terms, out.low_terms, out.high_terms):
            t["allocated_peak_bytes"] = int(allocated_peak_bytes)
        return out

    def to_dict(self) -> dict:
        return {
            "nvidia_smi_bytes": self.nvidia_smi_bytes,
            "nvidia_smi_low_bytes": self.low_bytes,
            "nvidia_smi_high_bytes": self.high_bytes,
            "allocator_reserved_bytes": self.allocator_reserved(),
            "allocator_reserved_low_bytes": self.allocator_reserved(self.low_terms),
            "allocator_reserved_high_bytes": self.allocator_reserved(self.high_terms),
            "nvidia_smi_terms": dict(self.terms),
            "nvidia_smi_terms_low": dict(self.low_terms),
            "nvidia_smi_terms_high": dict(self.high_terms),
            "nvidia_smi_basis": "derived from published sources, not measured (docs/memory-model.md)",
        }


def reserved_estimate(allocated_peak_bytes: int, model: ModelSpec, cluster: Cluster, setup: ZeroSetup,
                      knobs: ZeroKnobs) -> ReservedEstimate | None:
    """nvidia-smi's figure per GPU for a run whose allocated peak (without a context allowance) is given;
    None for the cpu accelerator (nvidia-smi has nothing to show)."""
    if cluster.accelerator.is_cpu:
        return None
    e = bytes_per_element(setup.precision)
    peers = NCCL_RING_PEERS if cluster.world_size > 1 else 0  # one rank: no NCCL peers to buffer for
    tensors = LIVE_TENSORS_PER_LAYER * model.num_layers
    if setup.zero_stage == 3:
        # Freed gathered parameters stay cached in blocks of parameter sizes. Central: one more gathered
        # window (the prefetch bucket, at least the largest layer twice: DeepSpeed's estimator's working set)
        # not reused by the activations in between; low: perfect reuse; high: every live parameter cached twice
        # (the stage3_max_live_parameters window). Bounded by the 16-bit model. A derived model, not measured.
        window = max(knobs.stage3_prefetch_bucket_size, 2 * model.largest_layer_params)
        churn = (e * min(model.params, window), 0,
                 e * min(model.params, max(window, knobs.stage3_max_live_parameters)))
    else:
        churn = (0, 0, 0)
    out = ReservedEstimate()
    for i, terms in enumerate((out.terms, out.low_terms, out.high_terms)):
        terms.update(
            allocated_peak_bytes=int(allocated_peak_bytes),
            cuda_context_bytes=CUDA_CONTEXT_BYTES[i],
            nccl_buffers_bytes=NCCL_BUFFSIZE_BYTES * NCCL_BUFFERS_PER_PEER[i] * peers,
            allocator_rounding_bytes=ROUNDING_BYTES_PER_TENSOR[i] * tensors,
            zero3_churn_reserve_bytes=churn[i],
        )
    return out
