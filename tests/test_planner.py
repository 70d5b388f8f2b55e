"""Planner behaviour: fastest setup that fits, simpler on ties, exact batch arithmetic, pins, advice."""

from dataclasses import replace

import pytest

from specs import LLAMA3_8B
from zerokit.core.errors import ZerokitError
from zerokit.spec.hardware import Cluster, accelerator, build_cluster
from zerokit.planning.planner import evaluate, make_plan, simplicity
from zerokit.spec.setup import Workload, ZeroSetup

A100x8 = Cluster(accelerator=accelerator("a100-80gb"), gpus_per_node=8, cpu_memory_bytes=10**12)


def test_chosen_setup_fits_and_is_the_fastest_that_does():
    plan = make_plan(LLAMA3_8B, A100x8, Workload(seq_len=4096, global_batch=64))
    assert plan.fits
    best = plan.best
    assert best.memory.per_gpu_total <= 0.95 * A100x8.accelerator.memory_bytes
    for r in plan.rejected:
        if r["reason"].startswith("fits"):
            assert r["tokens_per_second"] <= best.time.tokens_per_second * 1.01


def test_never_offloads_when_a_setup_without_offload_fits():
    plan = make_plan(LLAMA3_8B, A100x8, Workload(seq_len=2048, global_batch=64))
    assert plan.choice.offload_optimizer == "none" and plan.choice.offload_param == "none"
    offloaded = [r for r in plan.rejected if r["setup"]["offload_optimizer"] != "none" and r["reason"].startswith("fits")]
    assert offloaded and all("slower" in r["reason"] for r in offloaded)


def test_offload_is_chosen_when_nothing_else_fits():
    one = Cluster(accelerator=accelerator("a100-80gb"), gpus_per_node=1, cpu_memory_bytes=2 * 10**12)
    plan = make_plan(LLAMA3_8B, one, Workload(seq_len=2048, global_batch=16))
    assert plan.fits and plan.choice.offload_optimizer != "none"


def test_tie_goes_to_the_simpler_setup():
    # One GPU: stages 0, 1, 2 cost the same time (no communication); the plan takes stage 0, bf16 over fp16.
    one = Cluster(accelerator=accelerator("h200"), gpus_per_node=1)
    small = replace(LLAMA3_8B, params=1_000_000_000, num_layers=8, vocab_size=32000,
                    largest_layer_params=32000 * 4096)
    plan = make_plan(small, one, Workload(seq_len=1024, global_batch=8))
    assert plan.choice.zero_stage == 0 and plan.choice.precision == "bf16"
    assert simplicity(ZeroSetup(zero_stage=0)) < simplicity(ZeroSetup(zero_stage=2))
    assert simplicity(ZeroSetup(zero_stage=3)) < simplicity(ZeroSetup(zero_stage=2, offload_optimizer="cpu"))


def test_global_batch_derives_micro_and_accumulation_exactly():
    plan = make_plan(LLAMA3_8B, A100x8, Workload(seq_len=4096, global_batch=96))
    c = plan.choice
    assert c.micro_batch_size * c.gradient_accumulation_steps * 8 == 96
    with pytest.raises(ZerokitError, match="divisible"):
        make_plan(LLAMA3_8B, A100x8, Workload(seq_len=4096, global_batch=100))
    with pytest.raises(ZerokitError, match="divisible"):
        make_plan(LLAMA3_8B, A100x8, Workload(seq_len=4096, global_batch=64), {"micro_batch_size": 3})
    with pytest.raises(ZerokitError, match="accumulation"):
        make_plan(LLAMA3_8B, A100x8, Workload(seq_len=4096, global_batch=64),
                  {"micro_batch_size": 2, "gradient_accumulation_steps": 3})


def test_pins_are_respected_and_reported():
    pins = {"zero_stage": 3, "offload_optimizer": "cpu", "precision": "bf16", "micro_batch_size": 2,
            "activation_checkpointing": True}
    plan = make_plan(LLAMA3_8B, A100x8, Workload(seq_len=4096, global_batch=64), pins)
    c = plan.choice
    assert (c.zero_stage, c.offload_optimizer, c.micro_batch_size, c.activation_checkpointing) == (3, "cpu", 2, True)
    assert c.gradient_accumulation_steps == 4


def test_cpu_hardware_never_gets_fp16():
    cpu = build_cluster(gpu="cpu", gpus_per_node=2)
    plan = make_plan(replace(LLAMA3_8B, params=10**6, num_layers=2, hidden_size=64, intermediate_size=128,
                             num_attention_heads=4, num_kv_heads=2, head_dim=16, vocab_size=1000,
                             largest_layer_params=64000),
                     cpu, Workload(seq_len=64, global_batch=8))
    assert plan.choice.precision != "fp16"
    assert all(r["setup"]["precision"] != "fp16" for r in plan.rejected)
    with pytest.raises(ZerokitError, match="fp16 is not supported"):
        make_plan(LLAMA3_8B, cpu, Workload(seq_len=64), {"precision": "fp16"})


def test_nothing_fits_names_what_would_make_it_fit():
    tiny = Cluster(accelerator=accelerator("rtx4090"), gpus_per_node=1, cpu_memory_bytes=64 * 10**9)
    plan = make_plan(LLAMA3_8B, tiny, Workload(seq_len=4096, global_batch=8))
    assert not plan.fits and plan.best is not None
    text = " ".join(plan.suggestions)
    assert "NVMe" in text and "host RAM" in text
    # following the advice works: with enough NVMe the same model fits through ZeRO-Infinity
    infinity = replace(tiny, nvme_path="/nvme", nvme_bytes=2 * 10**12)
    assert make_plan(LLAMA3_8B, infinity, Workload(seq_len=4096, global_batch=8)).fits


def test_suggested_sequence_length_fits():
    small_gpu = Cluster(accelerator=replace(accelerator("a10g"), memory_bytes=12 * 2**30), gpus_per_node=1,
                        cpu_memory_bytes=10**13)
    w = Workload(seq_len=32768, global_batch=1)
    # without checkpoint offload (issue 28: with it, the layer inputs move to the 10 TB host and 32k fits)
    plan = make_plan(LLAMA3_8B, small_gpu, w, {"checkpoint_offload": False})
    assert not plan.fits
    seq_hint = [s for s in plan.suggestions if "shorten the sequence" in s]
    assert seq_hint
    seq = int(seq_hint[0].split("to ")[1].split(" ")[0])
    assert evaluate(LLAMA3_8B, small_gpu, replace(w, seq_len=seq), plan.best.setup).fits
    assert not evaluate(LLAMA3_8B, small_gpu, replace(w, seq_len=seq + 1), plan.best.setup).fits


# -- --memory-fraction is kept by the plan (it was dropped: to_dict, the "% of" column and --trace re-decided fit
# at the default 0.95) ---------------------------------------------------------------------------------------


def _plan_between(fraction_low=0.5):
    """A pinned 8B setup whose per-GPU total lies between 0.5 and 0.95 of an 80 GB A100, planned at 0.5."""
    cl = Cluster(accelerator("a100-80gb"), gpus_per_node=8)
    w = Workload(seq_len=4096, global_batch=64)
    pins = dict(zero_stage=3, precision="bf16", micro_batch_size=1, activation_checkpointing=False,
                offload_optimizer="none", offload_param="none", tensor_parallel=1, sequence_parallel=1,
                tiled_loss=False, tiled_mlp=False)
    total = make_plan(LLAMA3_8B, cl, w, pins).best.memory.per_gpu_total
    mem = cl.accelerator.memory_bytes
    assert fraction_low * mem < total < 0.95 * mem, "the oracle setup must sit between the two budgets"
    return make_plan(LLAMA3_8B, cl, w, pins, memory_fraction=fraction_low), total, mem


def test_the_plan_keeps_its_memory_fraction_everywhere():
    from zerokit.report.plan_text import format_plan

    plan, total, mem = _plan_between()
    assert not plan.fits  # judged at 0.5
    assert plan.to_dict()["budget"]["per_gpu_bytes"] == int(mem * 0.5)
    assert f"({total / int(mem * 0.5):.0%})" in format_plan(plan)  # the "% of" column against the same budget


def test_a_traced_plan_is_judged_against_its_own_memory_fraction():
    from zerokit.planning.refine import ANALYTIC_ACTIVATION_TERMS, apply_activation_trace

    plan, _total, _mem = _plan_between()
    terms = plan.best.memory.phase_terms[plan.best.memory.peak_phase]
    analytic = sum(terms.get(k, 0) for k in ANALYTIC_ACTIVATION_TERMS)
    # a trace that measures exactly the analytic activations: nothing changes, so the verdict must not either
    apply_activation_trace(plan, {"peak_activation_bytes": analytic, "activation_bytes": analytic,
                                  "attn_implementation": "sdpa", "wall_s": 0.0})
    assert not plan.fits and plan.best.reasons
