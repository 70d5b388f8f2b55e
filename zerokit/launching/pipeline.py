"""A HuggingFace decoder as a DeepSpeed `PipelineModule`: embedding, one layer per decoder layer, final norm + LM head.

Why each rule (the DeepSpeed or transformers code it copies; deepspeed/runtime/pipe/ unless named):
- Only the hidden states cross a stage boundary. p2p.py's send/recv are blocking, and engine.py's
  _exec_send_grads/_exec_recv_grads send back the .grad of every floating-point tensor a stage received (asserted
  non-None): a float tensor without a grad (cos/sin, a float mask) deadlocks (DeepSpeed PR #5518); integer tensors
  hang at 3+ stages because _allocate_or_extend_buffers reuses a grad buffer by index whatever its dtype
  (diffusion-pipe PR #544); bool tensors are cast to half (_exec_send_activations). So each decoder-layer wrapper
  computes its own positions 0..s-1 and cos/sin with the model's rotary_emb, and passes no attention mask.
- No mask is causal only for sdpa and flash attention: transformers' sdpa_attention_forward sets is_causal when the
  mask is None, and create_causal_mask itself returns None there (masking_utils._ignore_causal_mask_sdpa); eager
  attention would see every token, so it is refused. A sliding window makes HF build a real mask once the sequence
  reaches the window (same function), so such a sequence is refused at run time.
- Fixed shapes: the engine sends a buffer's shape once (_send_tensor_meta, dynamic_shape=False) and reuses it.
- Tied embeddings: TiedLayerSpec shares one module between the first and last stage; PipelineModule
  _synchronize_tied_weights broadcasts it at build and the engine's _exec_reduce_tied_grads all-reduces its grads,
  the sum HF's single shared Parameter gets.
- The model's own weights: the wrappers hold HF's modules (TiedLayerSpec builds a wrapper around HF's embedding),
  nothing is re-initialised, so a pipeline starts from the HF model's parameters and its losses can equal HF's.
- causal_lm_loss is transformers' ForCausalLMLoss (loss/loss_utils.py): fp32 logits, labels padded with -100 and
  shifted by one, mean over tokens whose label is not -100.
- ZeRO-2/3 are refused by PipelineEngine.__init__ (stage < gradients): configs for it use ZeRO-0 or 1.
- Gradient clipping (DeepSpeed clips at 1.0 unless told) under ZeRO-0 would take the first stage's norm only:
  _count_every_stage_in_the_clip_norm says why and marks the parameters so the norm spans every stage.
"""

from __future__ import annotations

from functools import lru_cache

from zerokit.core.errors import ZerokitError

# the causal LMs of the model types the planner prices with stages (one list: estimate/pipeline.py)
SUPPORTED_ARCHITECTURES = tuple(f"{n}ForCausalLM" for n in ("Llama", "Mistral", "Qwen2", "Qwen3", "Gemma"))
# attention implementations that treat a None mask as causal (transformers/integrations/sdpa_attention.py,
# flash_attention.py); eager and flex would attend to future tokens
CAUSAL_WITHOUT_MASK = ("sdpa", "flash_attention_2", "flash_attention_3")
PARTITION_METHODS = ("parameters", "uniform", "type:<regex>")
TIED_KEY = "embed_tokens"
IGNORE_INDEX = -100  # transformers' ForCausalLMLoss ignore_index


@lru_cache(maxsize=1)
def _layer_classes():
    """The nn.Module wrappers, built on first use so importing this module does not import torch. Their class names
    are what partition_method="type:..." and checkpointable_layers match."""
    import torch
    from torch import nn

    class EmbeddingPipe(nn.Module):
        """First stage: token ids -> hidden states (Gemma's embedding scales by sqrt(hidden) inside its forward)."""

        def __init__(self, embed):
            super().__init__()
            self.embed = embed

        def forward(self, input_ids):
            hidden_states = self.embed(input_ids)
            if torch.is_grad_enabled() and not hidden_states.requires_grad:
                # a frozen embedding (LoRA): under reentrant activation checkpointing the first checkpointed
                # block then outputs no grad_fn and _exec_backward_pass fails ("element 0 of tensors does not
                # require grad"; measured here); HF's enable_input_require_grads does the same
                hidden_states.requires_grad_()
            return hidden_states

    class TiedEmbeddingPipe(EmbeddingPipe):
        """The embedding as TiedLayerSpec's module: the first stage embeds with it, the last projects with its weight."""

    class DecoderLayerPipe(nn.Module):
        """One HF decoder layer; positions and cos/sin recomputed here from the sequence length (module docstring)."""

        def __init__(self, layer, rotary_emb, sliding_window):
            super().__init__()
            self.layer = layer
            self.rotary_emb = rotary_emb  # shared by every wrapper: buffers only (inv_freq), no parameters
            self.sliding_window = sliding_window

        def forward(self, hidden_states):
            seq = hidden_states.shape[1]
            if self.sliding_window is not None and seq >= self.sliding_window:
                raise ZerokitError(f"sequence length {seq} reaches the model's sliding window {self.sliding_window}: "
                                   "pipeline stages pass no attention mask; train with a shorter sequence")
            position_ids = torch.arange(seq, device=hidden_states.device).unsqueeze(0)
            position_embeddings = self.rotary_emb(hidden_states, position_ids)
            return self.layer(hidden_states, attention_mask=None, position_ids=position_ids,
                              position_embeddings=position_embeddings, use_cache=False)

    class FinalNormPipe(nn.Module):
        """The final norm, before a tied head (the norm is not tied, so it is a layer of its own)."""

        def __init__(self, norm):
            super().__init__()
            self.norm = norm

        def forward(self, hidden_states):
            return self.norm(hidden_states)

    class LMHeadPipe(nn.Module):
        """Last stage of an untied model: final norm + LM head -> logits."""

        def __init__(self, norm, lm_head):
            super().__init__()
            self.norm = norm
            self.lm_head = lm_head

        def forward(self, hidden_states):
            return self.lm_head(self.norm(hidden_states))

    return EmbeddingPipe, TiedEmbeddingPipe, DecoderLayerPipe, FinalNormPipe, LMHeadPipe


def _tied_head(module, hidden_states):
    """TiedLayerSpec forward_fn on the last stage: logits with the shared embedding weight (HF's tied lm_head has no
    bias)."""
    import torch.nn.functional as F

    return F.linear(hidden_states, module.embed.weight)


def causal_lm_loss(logits, labels):
    """The PipelineModule's loss_fn: transformers' ForCausalLMLoss without num_items_in_batch (module docstring)."""
    import torch.nn.functional as F

    logits = logits.float()
    shift_labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].contiguous()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), shift_labels.reshape(-1).to(logits.device),
                           ignore_index=IGNORE_INDEX)


def _check_supported(model) -> None:
    from zerokit.estimate.pipeline import PIPELINE_MODEL_TYPES

    name = type(model).__name__
    if name not in SUPPORTED_ARCHITECTURES or getattr(model.config, "model_type", None) not in PIPELINE_MODEL_TYPES:
        raise ZerokitError(f"pipeline stages support {', '.join(SUPPORTED_ARCHITECTURES)}, not {name}: "
                           "train it with ZeRO data parallelism instead of pipeline stages")
    attn = getattr(model.config, "_attn_implementation", None)
    if attn not in CAUSAL_WITHOUT_MASK:
        raise ZerokitError(f"pipeline stages pass no attention mask, which only {', '.join(CAUSAL_WITHOUT_MASK)} "
                           f"treat as causal, not {attn}: load the model with attn_implementation='sdpa'")


def _sliding_window(config, layer):
    """The window HF masks this layer with: Qwen2/3 set it per layer on the attention module (None on full-attention
    layers), Mistral reads config.sliding_window."""
    attn = layer.self_attn
    if hasattr(attn, "sliding_window"):
        return attn.sliding_window
    return getattr(config, "sliding_window", None)


def is_tied(model) -> bool:
    """True when the LM head is the embedding's own Parameter, as HF ties it (config.tie_word_embeddings)."""
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    return head is not None and head.weight is embed.weight


def pipeline_layers(model) -> list:
    """The PipelineModule layers of a supported HF causal LM, holding the model's own modules: [embedding, one per
    decoder layer, final norm + LM head]; a tied model's embedding and head are TiedLayerSpec(TIED_KEY) with the final
    norm as a layer of its own. ZerokitError for any other architecture or a non-causal-without-mask attention."""
    from deepspeed.pipe import TiedLayerSpec

    _check_supported(model)
    embedding, tied_embedding, decoder, final_norm, lm_head = _layer_classes()
    base, config = model.model, model.config
    decoders = [decoder(layer, base.rotary_emb, _sliding_window(config, layer))
                for layer in base.layers[: config.num_hidden_layers]]
    if is_tied(model):
        return [TiedLayerSpec(TIED_KEY, tied_embedding, base.embed_tokens, tied_weight_attr="embed.weight"),
                *decoders, final_norm(base.norm),
                TiedLayerSpec(TIED_KEY, tied_embedding, base.embed_tokens, forward_fn=_tied_head,
                              tied_weight_attr="embed.weight")]
    return [embedding(base.embed_tokens), *decoders, lm_head(base.norm, model.lm_head)]


def pipeline_module(model, num_stages: int, partition_method: str = "parameters",
                    activation_checkpoint_interval: int = 0, seed: int | None = None):
    """deepspeed.pipe.PipelineModule of `model` over num_stages stages (data parallel over world size / num_stages),
    loss_fn causal_lm_loss. Call it on every rank after torch.distributed is initialised; each rank keeps only its
    stage's layers registered. partition_method: "parameters", "uniform" or "type:<regex>" (DeepSpeed's); activation
    checkpointing covers the decoder layers only (the embedding's integer input takes no grad). seed: reseed torch per
    layer and micro-batch (PipelineModule seed_layers/base_seed), so dropout is reproducible; None leaves the RNG."""
    from deepspeed.pipe import PipelineModule

    layers = pipeline_layers(model)
    if not isinstance(num_stages, int) or not 1 <= num_stages <= len(layers):
        raise ZerokitError(f"pipeline stages must be 1..{len(layers)} for this model ({len(layers)} layers), "
                           f"not {num_stages}")
    method = partition_method.lower()
    if method not in ("parameters", "uniform") and not (method.startswith("type:") and len(method) > 5):
        raise ZerokitError(f"partition method {partition_method!r} is not one of {', '.join(PARTITION_METHODS)}")
    decoder_class = _layer_classes()[2].__name__
    module = PipelineModule(layers=layers, num_stages=num_stages, loss_fn=causal_lm_loss,
                            partition_method=partition_method,
                            activation_checkpoint_interval=activation_checkpoint_interval,
                            checkpointable_layers=[decoder_class], seed_layers=seed is not None,
                            base_seed=1234 if seed is None else seed)
    _count_every_stage_in_the_clip_norm(module)
    return module


def _count_every_stage_in_the_clip_norm(module) -> None:
    """ZeRO-0's gradient clipping (engine.clip_fp32_gradients -> runtime/utils.clip_grad_norm_) counts a parameter
    only where grid.get_model_parallel_rank() == 0 unless it is marked model_parallel, and a pipeline grid's
    model-parallel rank is the stage (topology.PipelineParallelGrid ds_model_rank): the global norm would be the first
    stage's alone. Mark each stage's own parameters; the last stage's copy of a tied weight (ds_pipe_replicated,
    PipelineModule._index_tied_modules) stays unmarked, counted once by the first stage. ZeRO-1 and the other norms
    read the tensor-parallel rank (0 here), so the mark changes nothing there."""
    for p in module.parameters():
        p.model_parallel = not getattr(p, "ds_pipe_replicated", False)


def release_other_stages(model, module) -> None:
    """Free the weights of the layers other stages train: every rank built the whole HF model (on the host, before the
    PipelineModule moved its own stage to the accelerator), and the PipelineModule registers only this stage's layers.
    Measured on 2 CPU ranks of tiny-llama: the other stage's fp32 weights were the 21-24% a rank's peak exceeded the
    plan by (tests/test_pipeline_launch.py)."""
    import torch

    local = {id(p) for p in module.parameters()}
    for p in model.parameters():
        if id(p) not in local:
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)


def export_pipeline(engine, model, final, writes: bool, rank: int, copy_tokenizer) -> None:
    """out/final as one HF model directory, atomically (final.tmp -> final). The PipelineModule holds the HF model's
    own modules, so each stage's trained weights are the HF model's parameters of that stage: every stage's first
    data-parallel rank (`writes`) saves them by their HF names, rank 0 loads them all into its HF model and
    save_pretrained writes it (a tied head once, as transformers saves it). Every rank meets at the barriers."""
    import os
    import shutil

    import torch

    from deepspeed import comm as dist

    tmp = final.parent / f".{final.name}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    if writes:
        local = {id(p) for p in engine.module.parameters()}
        state = {n: p.detach().cpu() for n, p in model.named_parameters() if id(p) in local}
        torch.save(state, tmp / f"stage_{engine.stage_id}.pt")
    dist.barrier()
    if rank != 0:
        return
    merged: dict = {}
    for stage in range(engine.num_stages):
        part = tmp / f"stage_{stage}.pt"
        merged.update(torch.load(part, map_location="cpu"))
        os.remove(part)
    missing = sorted(set(dict(model.named_parameters())) - set(merged))
    if missing:  # a stage that saved nothing: never written as a whole model
        raise ZerokitError(f"pipeline export: no stage saved {missing[0]} ({len(missing)} parameters missing)")
    # a fresh model of the same config and dtype takes the stages' weights (this rank freed the other stages' own:
    # release_other_stages); a tied head follows its embedding (tie_weights)
    from transformers import AutoModelForCausalLM

    whole = AutoModelForCausalLM.from_config(model.config, torch_dtype=next(iter(merged.values())).dtype)
    whole.load_state_dict(merged, strict=False)
    whole.tie_weights()
    whole.save_pretrained(str(tmp), safe_serialization=True)
    copy_tokenizer(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
