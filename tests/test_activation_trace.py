"""The analytic activation terms against a measured oracle: the same HF modules traced under
FakeTensorMode with torch's MemTracker (zerokit/trace.py), which records every tensor autograd keeps.

"after forward" = activations + logits kept for backward (zerokit: activations + logits_and_loss);
"peak" adds what the start of backward allocates (zerokit: + logits_grad). Tolerance 3%: the trace
also holds small tensors zerokit does not model (rotary tables, labels, the loss scalar).
"""

import pytest

from zerokit.hardware import Cluster, accelerator
from zerokit.memory import activation_terms
from zerokit.model_spec import load_model_spec
from zerokit.zero_setup import Workload, ZeroSetup

SEQ, MICRO = 256, 2


def llama(**kw):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=2, num_attention_heads=8,
                       num_key_value_heads=2, vocab_size=4096, tie_word_embeddings=False, **kw)


def gpt2(**kw):
    from transformers import GPT2Config

    return GPT2Config(n_embd=512, n_layer=2, n_head=8, vocab_size=4096, n_positions=1024, bos_token_id=0,
                      eos_token_id=0, **kw)


CASES = {
    "llama-bf16": (llama, {}, "bf16", "sdpa"),
    "llama-fp32": (llama, {}, "fp32", "sdpa"),
    "llama-bf16-eager": (llama, {}, "bf16", "eager"),
    "gpt2-gelu_new-bf16": (gpt2, dict(attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0), "bf16", "sdpa"),
    "gpt2-tanh-bf16": (gpt2, dict(activation_function="gelu_pytorch_tanh", attn_pdrop=0.0, resid_pdrop=0.0,
                                  embd_pdrop=0.0), "bf16", "sdpa"),
    "gpt2-dropout-bf16": (gpt2, {}, "bf16", "sdpa"),  # GPT-2's defaults: dropout 0.1 everywhere
}


@pytest.mark.parametrize("case", list(CASES))
def test_analytic_activations_match_the_traced_modules(case, tmp_path):
    from zerokit.trace import trace_activation_memory

    make, kw, precision, attention = CASES[case]
    config = make(**kw)
    config.save_pretrained(tmp_path)
    spec = load_model_spec(str(tmp_path))
    traced = trace_activation_memory(config, seq_len=SEQ, micro_batch=MICRO, precision=precision,
                                     attn_implementation=attention)
    assert traced["attn_implementation"] == attention
    cpu = Cluster(accelerator=accelerator("cpu"), gpus_per_node=1)
    terms = activation_terms(spec, ZeroSetup(precision=precision, micro_batch_size=MICRO),
                             Workload(seq_len=SEQ, attention=attention), on_cpu=cpu.accelerator.is_cpu)
    after_forward = terms["activations"] + terms["logits_and_loss"]
    peak = after_forward + terms["logits_grad"]
    assert after_forward == pytest.approx(traced["activation_bytes"], rel=0.03)
    assert peak == pytest.approx(traced["peak_activation_bytes"], rel=0.03)
