"""Per-phase memory peaks of one optimizer step, as the metrics JSONL records them.

One class for both places a training step is measured: zerokit's own loop (zerokit/launching/train.py: phases
forward, backward, step) and a user's HF Trainer through zerokit.integrations.hf.ZerokitCallback (one phase,
"step", from on_step_begin to on_step_end, since the Trainer runs forward and backward inside one call).
The same figures in both, so the predicted-vs-measured report reads them the same way.

CUDA: the allocator's max_memory_allocated/reserved, reset at each phase start (one synchronize per phase), and at
each step's end the device's used memory (cudaMemGetInfo: what nvidia-smi shows).
CPU: zerokit.measure.meter.MemoryMeter's exact live tensor bytes; each phase opens a fresh peak window
(MemoryMeter.reset_peak), so the category mix recorded is the one at that phase's own peak (parameters,
buffers, gradients, optimizer_states as labelled by register_deepspeed_engine; other tensors carry the phase
that created them: "forward" = activations and logits). The run's overall peak is kept here (max of the
init peak and every phase peak).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


# CPU: the live-tensor meter runs for this many optimizer steps of a run (attempt), then stops, so the step times
# after it carry none of its dispatch overhead (env ZEROKIT_MEMORY_STEPS; 0 meters every step). Two is enough for
# the peak: step 1 creates the optimizer states lazily, step 2 is the steady state; every peak of the accuracy grid
# (bench/results/accuracy_cpu.txt) was taken over the first 2 steps. Measured on the demo (tiny-llama ZeRO-0, 2
# ranks): 74 ms per step metered against 46 ms after the meter stopped, which the quick profile predicted (46 ms).
DEFAULT_MEMORY_STEPS = 2


def memory_steps_from_env() -> int:
    """ZEROKIT_MEMORY_STEPS as an int (0: every step), DEFAULT_MEMORY_STEPS when unset or not a number."""
    import os

    v = os.environ.get("ZEROKIT_MEMORY_STEPS", "").strip()
    return int(v) if v.isdigit() else DEFAULT_MEMORY_STEPS


class StepPhaseMeter:
    def __init__(self, meter, on_cuda: bool):
        import torch

        self.torch = torch
        self.meter = meter  # a started MemoryMeter on CPU, or None
        self.on_cuda = on_cuda
        self.active = meter is not None or on_cuda
        self.overall = 0
        self.reserved = 0
        self.step_phases: dict[str, dict] = {}

    def init_peak(self) -> int:
        """Peak before the first step (model build, deepspeed.initialize)."""
        if self.on_cuda:
            p = int(self.torch.cuda.max_memory_allocated())
            self.reserved = max(self.reserved, int(self.torch.cuda.max_memory_reserved()))
        elif self.meter is not None:
            p = int(self.meter.peak_bytes())
        else:
            return 0
        self.overall = max(self.overall, p)
        return p

    def new_step(self) -> None:
        self.step_phases = {}

    def stop(self) -> None:
        """CPU: stop metering (the live-byte figures freeze; the recorded peaks stay)."""
        if self.meter is not None and not self.on_cuda:
            try:
                self.meter.stop()
            except Exception:
                pass
            self.meter = None
        self.active = self.on_cuda

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Measure the block as phase `name` of the current step."""
        if not self.active:
            yield
            return
        torch = self.torch
        if self.on_cuda:
            torch.cuda.synchronize()
            start = int(torch.cuda.memory_allocated())
            torch.cuda.reset_peak_memory_stats()
            yield
            torch.cuda.synchronize()
            peak = int(torch.cuda.max_memory_allocated())
            reserved = int(torch.cuda.max_memory_reserved())
            self.reserved = max(self.reserved, reserved)
            rec = {"peak_bytes": peak, "start_bytes": start, "reserved_peak_bytes": reserved}
        else:
            m = self.meter
            m.reset_peak()
            start = int(m.current_bytes())
            with m.phase(name):
                yield
            live = m._live
            with live.lock:
                peak = int(live.peak)
                cats = {k: int(v) for k, v in live.peak_by_category.items() if v}
            rec = {"peak_bytes": peak, "start_bytes": start, "categories": cats}
            if live.explain:  # ZEROKIT_METER_EXPLAIN=1: what made the tensors live at this phase's peak
                rec["peak_tensors"] = m.peak_tensors()
        self.overall = max(self.overall, peak)
        prev = self.step_phases.get(name)
        if prev is None or peak > prev["peak_bytes"]:  # accumulation repeats phases: keep the highest
            self.step_phases[name] = rec

    def run(self, name: str, fn):
        with self.phase(name):
            return fn()

    def step_fields(self) -> dict:
        """What a "step" metrics record carries about memory (train.py and the HF callback write the same)."""
        rec: dict = {}
        if self.step_phases:
            # this step's own peak per phase and, on CPU, the category mix at it
            rec["phases"] = self.step_phases
            rec["step_peak_bytes"] = max(p["peak_bytes"] for p in self.step_phases.values())
        if self.overall:
            rec["peak_allocated_bytes"] = int(self.overall)  # running peak of the run so far
        if self.on_cuda:
            rec["peak_reserved_bytes"] = int(self.reserved)
            rec.update(self.device_fields())
        return rec

    def device_fields(self) -> dict:
        """CUDA: what nvidia-smi shows for this GPU now (cudaMemGetInfo's total - free: the CUDA context, NCCL's
        buffers, cuBLAS's and every other library's cudaMalloc outside torch's allocator, and the allocator's
        reserve) and the allocator's reserve now; their difference is what estimate/reserved.py prices as the
        context and NCCL buffers. One process per GPU is assumed (the launcher's layout): the device-wide figure is
        then this rank's."""
        torch = self.torch
        free, total = torch.cuda.mem_get_info()
        used, reserved = int(total - free), int(torch.cuda.memory_reserved())
        return {"device_used_bytes": used, "reserved_now_bytes": reserved, "outside_allocator_bytes": used - reserved}
