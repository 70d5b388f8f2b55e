"""Hand-written ModelSpecs for tests of the arithmetic (no transformers needed)."""

from zerokit.spec.model import ModelSpec

# Llama-3-8B as its HF config.json gives it (meta-llama/Meta-Llama-3-8B): h 4096, 32 layers,
# 32 heads, 8 KV heads, intermediate 14336, vocab 128256, untied. 8,030,261,248 parameters.
LLAMA3_8B = ModelSpec(
    name="llama-3-8b", params=8_030_261_248, largest_layer_params=128256 * 4096, hidden_size=4096, num_layers=32,
    num_attention_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=14336, vocab_size=128256,
    tied_embeddings=False, gated_mlp=True, embedding_params=2 * 128256 * 4096, model_type="llama",
)
