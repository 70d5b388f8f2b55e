"""A bare `--params` count fine-tuned with LoRA or QLoRA: peft counts the adapters on the Llama the count is priced
as (spec/model.py spec_from_params), and they are added to the stated count.

Kept apart from spec/finetune.py, whose bytes key the bundled and cached splits (a change there is a recount)."""

from __future__ import annotations

from dataclasses import replace

from zerokit.spec.finetune import Finetune, trainable_split, with_finetune
from zerokit.spec.model import ModelSpec


def shape_config(model: ModelSpec) -> dict:
    """The transformers LlamaConfig of a bare count's guessed shape (spec_from_params: SwiGLU, RMSNorm, rotary; tied
    where the count says so), for peft to wrap on the meta device: the shapes the memory and time models price."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": model.hidden_size,
            "intermediate_size": model.intermediate_size, "num_hidden_layers": model.num_layers,
            "num_attention_heads": model.num_attention_heads, "num_key_value_heads": model.num_kv_heads,
            "head_dim": model.head_dim, "vocab_size": model.vocab_size, "tie_word_embeddings": model.tied_embeddings,
            "hidden_act": "silu", "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}


def shape_finetuned_spec(model: ModelSpec, finetune: Finetune) -> ModelSpec:
    """A bare count fine-tuned with LoRA or QLoRA: peft's adapters counted on shape_config's Llama (written once to
    the cache, keyed by its bytes), added to the stated count, which stays the base model's; --freeze names modules a
    bare count has none of, so it is refused where it is parsed (api.finetuned_model)."""
    import hashlib
    import json
    import tempfile
    from pathlib import Path

    from zerokit.core.fsutil import atomic_write_text, cache_dir
    from zerokit.core.quiet import library_output

    text = json.dumps(shape_config(model), sort_keys=True)
    name = f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    path = cache_dir("shape_configs") / name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            atomic_write_text(path, text, mode=0o644)
    except OSError:  # an unwritable cache: a private temporary copy, counted each time
        path = Path(tempfile.mkdtemp(prefix="zerokit-shape-")) / name
        path.write_text(text)
    with library_output():
        split = trainable_split(str(path), finetune)
    return with_finetune(model, replace(split, total_params=model.params + split.adapter_params), finetune.mode)
