"""What a fine-tune trains, held beside the model's shapes: ``ModelSpec.trained`` (spec/model.py).

``ModelSpec`` describes the model as built (shapes, counts, the architecture's activation traits); a fine-tune
changes which of its parameters train and how they are stored: the trainable count, QLoRA's 4-bit base weights,
the LoRA adapters' rank and where they sit, which Linear inputs and norms are frozen, where the gradient starts.
``Trained`` holds exactly that, read by spec/finetune.py (module_layout, with_finetune) from the real module tree of
the model as fine-tuned; its defaults (``FULL``) are a full fine-tune: every weight trains in the training dtype.
The memory and time models read it as ``model.trained.<field>`` (docs/memory-model.md "Fine-tuning").

A spec's JSON (``ModelSpec.to_dict``) keeps these fields flat beside the model's, as before the split.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Trained:
    """What a fine-tune trains and how the weights are held (every field's default: a full fine-tune)."""

    # parameters the optimizer updates; None: all (a full fine-tune)
    trainable_params: int | None = None
    finetune_mode: str = "full"  # full | lora | qlora (spec/finetune.py Finetune.mode)
    quantized_params: int = 0  # qlora: base weight elements bitsandbytes stores as 4-bit NF4
    # What a fine-tune changes beyond the counts, read by spec/finetune.py from the real module tree (the defaults are a
    # full fine-tune; docs/memory-model.md "Fine-tuning"):
    quantized_bytes: int = 0  # qlora: stored bytes of the packed 4-bit weights (bitsandbytes quantize_4bit's out tensors)
    quant_state_bytes: int = 0  # qlora: their QuantState tensors (absmax, code, nested absmax/code/offset), never partitioned
    lora_r: int = 0  # adapter rank (0: no adapters)
    lora_dropout: float = 0.0
    # per decoder layer, the adapted Linears reading each of the four Linear inputs: attention input (the first norm's
    # output), attention output (o_proj's input), MLP input (the second norm's output), MLP middle (down_proj's input)
    lora_slots: tuple[int, int, int, int] = (0, 0, 0, 0)
    # per decoder layer, whether every base Linear reading that input has a frozen weight (so autograd does not save it)
    frozen_slots: tuple[bool, bool, bool, bool] = (False, False, False, False)
    frozen_norms: bool = False  # the decoder layers' norm weights are frozen
    frozen_final_norm: bool = False
    frozen_head: bool = False  # the LM head's weight (a tied input embedding included) is frozen and not adapted
    grad_start_layer: int = 0  # first decoder layer whose input needs a gradient (layers before it save nothing)
    grad_start_partial: bool = False  # that layer's input has no gradient (frozen embeddings): it saves only what
    # runs after its first trainable parameter
    grad_start_attention: bool = True  # that layer's attention (or its first norm) has something trainable
    # every parameter tensor as stored: (elements, bytes per element or 0 for the training dtype, how many); () = the
    # spec's shapes (model.gradient_sizes_in_backward_order). ZeRO-3's persistence threshold reads it.
    param_tensors: tuple[tuple[int, int, int], ...] = ()
    # the trainable parameter tensors' elements, last registered first (the order their gradients become ready and
    # fill DeepSpeed's reduce buckets); () = every tensor (model.gradient_sizes_in_backward_order)
    trainable_tensors: tuple[int, ...] = ()
    # submodules peft adds to each decoder layer (an adapted Linear becomes its LoRA wrapper plus base_layer and the
    # lora_A/lora_B/lora_dropout ModuleDicts with their members: tiny-llama all-linear 13 -> 83); ZeRO-3 hooks each one
    extra_modules_per_layer: int = 0
    lora_io_per_layer: int = 0  # in + out features summed over a decoder layer's adapted Linears (0: no adapters)
    quantized_tensors: int = 0  # QLoRA: the 4-bit weights (each a bitsandbytes Linear4bit, dequantized per use)
    no_backward_params: int = 0  # parameters of modules no gradient reaches (training-dtype elements)
    no_backward_quantized_bytes: int = 0  # and the packed 4-bit bytes among them
    trainable_matmul_params: int | None = None  # matmul weights with a gradient (their weight-gradient GEMM runs)
    backward_matmul_params: int | None = None  # matmul weights a gradient flows through (their input-gradient GEMM runs)
    # LoRA on fused MoE experts (peft's ParamWrapper): elements of a decoder layer's expert parameters it adapts. Each
    # forward folds the adapter into a new copy of them (W + scaling B A, one baddbmm: lora/layer.py _activate_lora),
    # in the training dtype, which the experts' matmuls save for backward (measured: tests/test_moe.py)
    merged_params_per_layer: int = 0


FULL = Trained()  # a full fine-tune: ModelSpec.trained's default
