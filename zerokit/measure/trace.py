"""Activation memory at real scale without a GPU: trace one training step under FakeTensorMode.

The model is built from its HF config under ``FakeTensorMode`` (random init, no memory allocated) and
one forward + backward (+ optionally an AdamW step) runs under
``torch.distributed._tools.mem_tracker.MemTracker``, which attributes every tensor's storage to
parameters, buffers, gradients, activations, temporaries or optimizer states. A 1.1B-parameter model at
sequence 2048 traces in tens of seconds with a few hundred MiB of RSS.

What it does and does not model:

* The tensors a real step on the same device type would hold, op by op, with the kernels of the host
  (CPU). Attention: ``sdpa`` on fake CPU tensors takes torch's CPU flash-attention path, which stores
  the output and the log-sum-exp only (no s^2 score matrix), like flash/memory-efficient attention on
  a GPU; ``eager`` stores the scores and probabilities (the 5*a*s^2*b term). The result says which ran.
* Not modelled: allocator rounding and fragmentation, the CUDA context, DeepSpeed's buckets and
  partitioning, kernel workspaces. Parameters/gradients are in the traced dtype; with
  ``optimizer_step=True`` the AdamW states are too (DeepSpeed's mixed-precision optimizer keeps fp32
  master + states instead: use the memory model for those terms, this trace for activations).

Gotchas handled here (measured: docs/measured-on-cpu.md): ``model.to(dtype)`` fails on fake tensors,
so the dtype is set with ``torch.set_default_dtype`` around construction; if ``sdpa`` fails on fake
tensors (older transformers call ``.item()`` in mask code), it falls back to ``eager`` with an explicit
attention mask and says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

from zerokit.core.errors import ZerokitError
from zerokit.spec.setup import TORCH_DTYPE_NAMES

__all__ = ["trace_activation_memory", "load_config"]

_CATS = {
    "Parameter": "parameters",
    "Buffer": "buffers",
    "Gradient": "gradients",
    "Activation": "activations",
    "Temp": "temporaries",
    "Optstate": "optimizer_states",
    "Other": "other",
}


def load_config(config_or_model_dir: Any):
    """A transformers PretrainedConfig from a config object, a dict, a config.json path or a model dir."""
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(config_or_model_dir, PretrainedConfig):
        return config_or_model_dir
    if isinstance(config_or_model_dir, dict):
        d = dict(config_or_model_dir)
        mt = d.pop("model_type", None)
        if not mt:
            raise ZerokitError("config dict has no model_type: add e.g. \"model_type\": \"llama\"")
        return AutoConfig.for_model(mt, **d)
    path = os.fspath(config_or_model_dir)
    if os.path.isfile(path):
        try:
            with open(path) as f:
                d = json.load(f)
        except (OSError, ValueError) as e:
            raise ZerokitError(f"cannot read model config {path}: {e}; give a config.json or a model directory") from None
        return load_config(d)
    try:
        return AutoConfig.from_pretrained(path)
    except Exception as e:  # transformers raises many kinds
        raise ZerokitError(f"cannot load a model config from {path!r}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None


def _snap(mt, kind: str = "current") -> dict[str, int]:
    import torch

    snap = mt.get_tracker_snapshot(kind)
    dev = snap.get(torch.device("cpu"), {})
    out = {name: 0 for name in _CATS.values()}
    total = 0
    for k, v in dev.items():
        key = getattr(k, "value", k)
        if key == "Total":
            total = int(v)
        elif key in _CATS:
            out[_CATS[key]] = int(v)
    out["total"] = total
    return out


def _reset_peak(mt) -> None:
    """Start a new peak window in MemTracker (private fields; harmless if they change name)."""
    import copy

    cur = getattr(mt, "_curr_mem_snap", None)
    if cur is None or not hasattr(mt, "_peak_mem"):
        return
    mt._peak_mem_snap = copy.deepcopy(cur)
    mt._peak_mem = {dev: snap.get("Total", 0) for dev, snap in cur.items()}


@contextlib.contextmanager
def _no_packed_sequence_check(active: bool):
    """transformers looks at position_ids for packed sequences when no attention mask is given; on fake
    tensors it cannot read them and builds a full 4-D mask plus the explicit-mask attention path (GQA
    heads repeated). A real run with ordinary position ids finds no packing: say so up front."""
    mu = None
    if active:
        try:
            import transformers.masking_utils as mu
        except ImportError:
            mu = None
    if mu is None or not hasattr(mu, "find_packed_sequence_indices"):
        yield
        return
    orig = mu.find_packed_sequence_indices
    mu.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        mu.find_packed_sequence_indices = orig


class MaxLiveActivations:
    """Records the most activations + temporaries alive at any op (a hook on MemTracker's peak update).

    MemTracker's per-phase peak is the moment the phase's *total* peaks: in backward with activation
    checkpointing that comes late, when gradients have grown and the activations are gone, and misses
    the start of backward where checkpoints, logits and the logits gradient are alive together.
    """

    def __enter__(self):
        from torch.distributed._tools.mem_tracker import MemTracker

        self.cls, self.orig, self.max = MemTracker, MemTracker._update_peak_stats, 0
        me = self

        def patched(tracker, peak_state):
            me.orig(tracker, peak_state)
            for snap in tracker._curr_mem_snap.values():
                live = sum(v for k, v in snap.items() if getattr(k, "value", k) in ("Activation", "Temp"))
                me.max = max(me.max, live)

        MemTracker._update_peak_stats = patched
        return self

    def __exit__(self, *exc):
        self.cls._update_peak_stats = self.orig


def _run_step(model, config, seq_len, micro_batch, attention_mask, optimizer_step, activation_checkpointing):
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    vocab = int(getattr(config, "vocab_size", 0) or 32000)
    ids = torch.randint(0, vocab, (micro_batch, seq_len))
    labels = ids.clone()
    mask = torch.ones(micro_batch, seq_len, dtype=torch.long) if attention_mask else None
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4) if optimizer_step else None
    model.train()
    if activation_checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
        model.config.use_cache = False
    mt = MemTracker()
    mt.track_external(model, ids, labels, *([mask] if mask is not None else []))
    phases: dict[str, Any] = {}
    with mt:
        start = _snap(mt)
        _reset_peak(mt)
        out = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False)
        after_fw = _snap(mt)
        phases["forward"] = {"peak_bytes": _snap(mt, "peak")["total"], "start_bytes": start["total"],
                             "end_bytes": after_fw["total"], "peak_categories": _snap(mt, "peak")}
        _reset_peak(mt)
        loss = out.loss
        del out
        loss.backward()
        del loss
        after_bw = _snap(mt)
        phases["backward"] = {"peak_bytes": _snap(mt, "peak")["total"], "start_bytes": after_fw["total"],
                              "end_bytes": after_bw["total"], "peak_categories": _snap(mt, "peak")}
        if opt is not None:
            _reset_peak(mt)
            opt.step()
            after_opt = _snap(mt)
            phases["optimizer"] = {"peak_bytes": _snap(mt, "peak")["total"], "start_bytes": after_bw["total"],
                                   "end_bytes": after_opt["total"], "peak_categories": _snap(mt, "peak")}
    return start, after_fw, after_bw, phases, (after_opt if opt is not None else None)


def trace_activation_memory(
    config_or_model_dir: Any,
    seq_len: int,
    micro_batch: int,
    precision: str = "bf16",
    activation_checkpointing: bool = False,
    attn_implementation: str = "sdpa",
    optimizer_step: bool = False,
    attention_mask: bool | None = None,
    fake: bool = True,
) -> dict:
    """Trace one training step of an HF causal LM built from its config; return bytes by category.

    Returns a dict with:
      peak_bytes: the highest total of tracked bytes in the step (parameters + buffers + gradients +
        activations + temporaries [+ optimizer states]);
      activation_bytes: activations still held at the end of the forward pass (what backward needs,
        including logits and loss);
      peak_activation_bytes: the most activations + temporaries held at once at any op of forward or
        backward (the part of the peak that scales with batch and sequence length);
      params_bytes / buffers_bytes / gradients_bytes / optimizer_states_bytes: model states;
      peak_categories: the mix at the overall peak; phases: forward/backward[/optimizer] peaks with
        their mixes; attn_implementation: the attention that actually ran; wall_s: trace time.
    attention_mask: None = no mask for sdpa (what a real run with an all-ones mask does), an explicit
      all-ones mask for eager; True/False force it.
    fake=False runs the same step on real tensors (small configs only: it allocates everything).
    """
    if precision not in TORCH_DTYPE_NAMES:
        raise ZerokitError(f"precision {precision!r} is not one of {', '.join(TORCH_DTYPE_NAMES)}")
    if seq_len < 1 or micro_batch < 1:
        raise ZerokitError("seq_len and micro_batch must be at least 1")
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AutoModelForCausalLM

    config = load_config(config_or_model_dir)
    dtype = getattr(torch, TORCH_DTYPE_NAMES[precision])
    t0 = time.perf_counter()
    tried = [attn_implementation] if attn_implementation == "eager" else [attn_implementation, "eager"]
    errors = []
    for attn in tried:
        old_dtype = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            mode = FakeTensorMode() if fake else contextlib.nullcontext()
            with mode, _no_packed_sequence_check(fake):
                model = AutoModelForCausalLM.from_config(config, attn_implementation=attn)
                n_params = sum(p.numel() for p in model.parameters())
                # sdpa: no mask (a real run with an all-ones mask drops it after looking at the data,
                # which fake tensors cannot do); eager: an explicit all-ones mask
                mask = (attn == "eager") if attention_mask is None else attention_mask
                with MaxLiveActivations() as live:
                    start, after_fw, after_bw, phases, after_opt = _run_step(
                        model, config, seq_len, micro_batch, mask, optimizer_step, activation_checkpointing
                    )
            break
        except ZerokitError:
            raise
        except Exception as e:  # fall back to eager attention, then give up
            errors.append(f"{attn}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        finally:
            torch.set_default_dtype(old_dtype)
    else:
        raise ZerokitError(f"could not trace {getattr(config, 'model_type', '?')}: " + "; ".join(errors))
    peak_phase = max(phases.values(), key=lambda p: p["peak_bytes"])
    peak_cats = dict(peak_phase["peak_categories"])
    peak_cats.pop("total", None)
    act_peak = max(
        live.max,
        *(phases[k]["peak_categories"]["activations"] + phases[k]["peak_categories"]["temporaries"]
          for k in ("forward", "backward")),
    )
    return {
        "method": "fake_tensor_mem_tracker" if fake else "real_mem_tracker",
        "model_type": getattr(config, "model_type", "unknown"),
        "params": int(n_params),
        "seq_len": seq_len,
        "micro_batch": micro_batch,
        "precision": precision,
        "activation_checkpointing": activation_checkpointing,
        "attn_implementation": attn,
        "attn_fallback_reason": errors[0] if errors else None,
        "optimizer_step": optimizer_step,
        "peak_bytes": int(peak_phase["peak_bytes"]),
        "activation_bytes": after_fw["activations"] - start["activations"],
        "peak_activation_bytes": act_peak,
        "params_bytes": start["parameters"],
        "buffers_bytes": start["buffers"],
        "gradients_bytes": after_bw["gradients"],
        # states held after the step (the step's peak also holds its temporaries, labelled states by MemTracker)
        "optimizer_states_bytes": after_opt["optimizer_states"] if after_opt else 0,
        "peak_categories": peak_cats,
        "phases": phases,
        "wall_s": round(time.perf_counter() - t0, 3),
    }
