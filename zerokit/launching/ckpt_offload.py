"""Activation-checkpoint offload in zerokit's loop (`--activation-checkpointing offload`, RankOptions.checkpoint_offload).

How ALST does it for HF models: HF's gradient checkpointing (torch.utils.checkpoint, use_reentrant=False) keeps each
decoder layer's input hidden states for the recompute; those inputs are moved to pinned host memory in forward and
brought back when backward recomputes the layer. ArcticTraining first did it by replacing torch.utils.checkpoint's
CheckpointFunction (arctic_training/monkey_patches.py monkey_patch_checkpoint_function_with_cpu_offload, reentrant
only); DeepSpeed 0.19.8 ships the non-reentrant form zerokit uses:
deepspeed/runtime/activation_checkpointing/offload_activations.py CheckpointHiddenStatesOffload, a
torch.autograd.graph.saved_tensors_hooks context that marks args[0] of every transformers GradientCheckpointingLayer
call and offloads only those when torch.utils.checkpoint saves them (_NoopSaveInputs.save_for_backward, outside the
checkpoint's own inner hooks), keeping the newest one on the device (keep_last_count=1). The context must span forward
and backward (its docstring: "keep engine.backward(loss) ... so the offload context stays open until unpack").

On a CPU rank DeepSpeed's engine skips every tensor (_should_skip: a synchronized device, nothing "on the
accelerator"), since host memory is the rank's memory. zerokit runs the same engine there with that one test dropped,
so a CPU run goes through the path a GPU run takes (copy into a host buffer in the pack hook, copy back into a fresh
tensor in the unpack hook) and its stats prove it; the memory model prices no change on CPU (estimate/memory.py).
"""

from __future__ import annotations


def offload_context(on_accelerator: bool):
    """A fresh CheckpointHiddenStatesOffload (one per micro batch: its __enter__ resets, its __exit__ syncs and clears),
    its stats readable after the with-block."""
    import torch
    from deepspeed.runtime.activation_checkpointing.offload_activations import CheckpointHiddenStatesOffload

    if on_accelerator:
        return CheckpointHiddenStatesOffload()

    class CpuRankOffload(CheckpointHiddenStatesOffload):
        """DeepSpeed's engine on a CPU rank: every marked input is copied out and back (no pinning, no streams: the
        CPU accelerator has neither); its other skips kept (tiny, parameters, buffers, overlapping views)."""

        def _should_skip(self, tensor):
            return (self._num_bytes(tensor) < self.min_offload_bytes or isinstance(tensor, torch.nn.Parameter)
                    or (tensor.numel() > 1 and 0 in tensor.stride()))

    return CpuRankOffload(use_pin_memory=False, use_streams=False)


STAT_FIELDS = ("marked_tensors", "offloaded_tensors", "restored_tensors", "kept_last_tensors", "offloaded_bytes",
               "restored_bytes")


def add_stats(total: dict, ctx) -> dict:
    """The step's sums of the context's stats (STAT_FIELDS), for the step record's checkpoint_offload field."""
    for name in STAT_FIELDS:
        total[name] = total.get(name, 0) + int(getattr(ctx.stats, name, 0))
    return total
