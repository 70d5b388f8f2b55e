"""Time model: the standard batch arithmetic (shared/reference/memory-and-time.md, "FLOPs and time")
and the FLOP count of Kaplan et al. / Korthikanti et al. (6·Ψ·tokens, 8·Ψ·tokens with recompute)."""

from dataclasses import replace

import pytest

from specs import LLAMA3_8B
from zerokit.errors import ZerokitError
from zerokit.hardware import Cluster, accelerator
from zerokit.timing import collective_bytes_per_step, estimate_time, flops_per_token, matmul_params
from zerokit.zero_setup import Workload, ZeroSetup, batch_split, steps_per_epoch


def test_worked_example_1000_samples_batch_10():
    # "1000 samples, batch 10 -> 100 steps per epoch; with gradient accumulation 2 the micro batch
    # is 5 and there are still 100 optimizer steps per epoch."
    assert steps_per_epoch(1000, 10) == 100
    one_gpu = Cluster(accelerator=accelerator("a100-80gb"), gpus_per_node=1)
    w = Workload(seq_len=512, global_batch=10, samples=1000, epochs=1)
    assert batch_split(10, one_gpu.world_size, micro_batch=5) == 2
    t_micro10 = estimate_time(LLAMA3_8B, one_gpu, ZeroSetup(micro_batch_size=10, gradient_accumulation_steps=1), w)
    t_micro5 = estimate_time(LLAMA3_8B, one_gpu, ZeroSetup(micro_batch_size=5, gradient_accumulation_steps=2), w)
    assert t_micro10.global_batch == t_micro5.global_batch == 10
    assert t_micro10.steps == t_micro5.steps == 100
    assert t_micro5.total_seconds == pytest.approx(100 * t_micro5.step_seconds)


def test_global_batch_is_micro_x_accum_x_gpus_x_nodes():
    cluster = Cluster(accelerator=accelerator("h100-80gb"), gpus_per_node=8, nodes=4)
    t = estimate_time(LLAMA3_8B, cluster, ZeroSetup(micro_batch_size=2, gradient_accumulation_steps=3),
                      Workload(seq_len=1024, samples=10_000, epochs=2))
    assert t.global_batch == 2 * 3 * 8 * 4
    assert t.steps == 2 * -(-10_000 // 192)  # epochs x ceil(samples / global batch)


def test_partial_last_batch_costs_a_step_and_non_divisible_batches_are_rejected():
    assert steps_per_epoch(1001, 10) == 101
    with pytest.raises(ZerokitError, match="not divisible"):
        batch_split(64, 8, micro_batch=3)


def test_flops_6_psi_tokens_and_8_with_recompute():
    no_attn = replace(LLAMA3_8B, num_layers=0)  # isolate the 6·Ψ term
    assert flops_per_token(no_attn, 4096, False) == 6 * matmul_params(no_attn)
    assert flops_per_token(no_attn, 4096, True) == 8 * matmul_params(no_attn)
    # the input embedding is a lookup: Llama-3-8B does 8.03e9 - 128256 x 4096 = 7.50e9 matmul params per token
    assert matmul_params(LLAMA3_8B) == 8_030_261_248 - 128256 * 4096


def test_zero3_moves_1_5x_the_bytes_of_data_parallel():
    # ZeRO paper section 7: stage 1/2 keep data parallelism's 2Ψ per step, stage 3 moves 3Ψ.
    cluster = Cluster(accelerator=accelerator("a100-80gb"), gpus_per_node=8)
    dp = collective_bytes_per_step(LLAMA3_8B, cluster, ZeroSetup(zero_stage=1))
    z2 = collective_bytes_per_step(LLAMA3_8B, cluster, ZeroSetup(zero_stage=2))
    z3 = collective_bytes_per_step(LLAMA3_8B, cluster, ZeroSetup(zero_stage=3))
    assert z2 == pytest.approx(dp)
    assert z3 == pytest.approx(1.5 * dp)


def test_offload_and_more_nodes_cost_time():
    one = Cluster(accelerator=accelerator("a100-80gb"), gpus_per_node=8)
    two = replace(one, nodes=2)
    w = Workload(seq_len=2048)
    base = estimate_time(LLAMA3_8B, one, ZeroSetup(zero_stage=3), w)
    off = estimate_time(LLAMA3_8B, one, ZeroSetup(zero_stage=3, offload_optimizer="cpu"), w)
    assert off.step_seconds > base.step_seconds and off.offload_seconds > 0
    # inter-node links are slower than NVLink: communication per byte grows
    t2 = estimate_time(LLAMA3_8B, two, ZeroSetup(zero_stage=3), w)
    assert t2.communication_seconds > base.communication_seconds


def test_a100_throughput_lands_in_the_published_range():
    # EleutherAI Transformer Math 101: well-tuned A100 bf16 training reaches 115-150 TFLOP/s of 312.
    cluster = Cluster(accelerator=accelerator("a100-80gb"), gpus_per_node=8)
    t = estimate_time(LLAMA3_8B, cluster, ZeroSetup(zero_stage=2, micro_batch_size=4), Workload(seq_len=2048))
    achieved = t.flops_per_step / t.step_seconds / 8 / 1e12
    assert 100 <= achieved <= 150
