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

Each input comes back once: DeepSpeed's unpack hook restores with cache=True, keeping every restored input on the
device until the context exits (for a graph backed through twice, retain_graph), so by the end of backward all L inputs
are back and the peak is plain checkpointing's. Measured on an H200 (gpu-1b, 22 layers, 64K-256K tokens:
bench/results/accuracy_gpu_long_20261128_*.txt), the allocated peak was the plan's plus 20 more layer inputs. zerokit's
loop backs each graph once, so it restores with cache=False (DeepSpeed's `restore_input`, "for a single consumption"):
the restored input is freed with its layer's recompute, as ArcticTraining's reentrant form frees it, and the plan's 2
inputs on the device hold. A second unpack of one input raises DeepSpeed's "no longer tracked" error.

A mark follows the tensor's memory, not its Python object. DeepSpeed marks the hidden states a
GradientCheckpointingLayer is called with by id() and offloads the saved tensor with that id. transformers 5.23
checkpoints the layer's forward, not its __call__, so module hooks run before the checkpoint saves its inputs, and
ZeRO-3's forward pre-hook (PostBackwardFunctionModule over the inputs) hands forward a new tensor over the same memory.
Under ZeRO-3 no mark was ever consumed and nothing was offloaded, with no error (a CPU launch: 2 marked, 0 offloaded;
the H200 lend, on transformers 5.17, offloaded 21 of 22). zerokit keys a mark by storage, offset, shape, stride and
dtype, which the hook's tensor shares.

On a CPU rank DeepSpeed's engine skips every tensor (_should_skip: a synchronized device, nothing "on the
accelerator"), since host memory is the rank's memory. zerokit runs the same engine there with that one test dropped,
so a CPU run goes through the path a GPU run takes (copy into a host buffer in the pack hook, copy back into a fresh
tensor in the unpack hook) and its stats prove it; the memory model prices no change on CPU (estimate/memory.py).
"""

from __future__ import annotations


def offload_context(on_accelerator: bool):
    """A CheckpointHiddenStatesOffload that restores each input once, for one run: entered once per micro batch (its
    __enter__ resets the stats and the tracking, its __exit__ syncs and clears them), its stats readable after each
    with-block. One for the run, not one per micro batch: each instance makes its own side stream, and the caching
    allocator keeps a stream's freed blocks for that stream only. On the H200 (128K tokens, a fresh context per micro
    batch) the reserve grew by the 20 restored inputs every step, 47 to 80 GB over 4 steps, with the allocated peak
    flat (bench/results/gpu_long_s131072_rank0_20261128.jsonl); one instance also keeps its pinned host buffers."""
    import torch
    from deepspeed.runtime.activation_checkpointing.offload_activations import (
        CheckpointHiddenStatesOffload,
        _OffloadedTensorRef,
    )

    class RestoreOnce(CheckpointHiddenStatesOffload):
        """DeepSpeed's context, each offloaded input restored for one use (no cache), its marks keyed by memory (see
        the module docstring)."""

        @staticmethod
        def _mark_key(tensor):
            return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                    tuple(tensor.stride()), tensor.dtype)

        def mark(self, tensor):
            key = self._mark_key(tensor)
            self._allowed[key] = self._allowed.get(key, 0) + 1
            self.stats.marked_tensors += 1

        def _consume_mark(self, tensor):
            key = self._mark_key(tensor)
            count = self._allowed.get(key, 0)
            if count <= 0:
                return False
            if count == 1:
                del self._allowed[key]
            else:
                self._allowed[key] = count - 1
            return True

        def _unpack_tensor(self, maybe_ref):
            if isinstance(maybe_ref, _OffloadedTensorRef):
                return self._restore_tensor(maybe_ref.tensor_id, cache=False)
            return maybe_ref

    if on_accelerator:
        return RestoreOnce()

    class CpuRankOffload(RestoreOnce):
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
