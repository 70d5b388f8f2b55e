"""Time model: the standard batch arithmetic (DeepSpeed's config docs: train_batch_size =
train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel GPUs)
and the FLOP count of Kaplan et al. / Korthikanti et al. (6·Ψ·tokens, 8·Ψ·tokens with recompute)."""

from dataclasses import replace

import pytest

from specs import LLAMA3_8B
from zerokit.core.errors import ZerokitError
from zerokit.spec.hardware import Cluster, accelerator
from zerokit.estimate.timing import collective_bytes_per_step, estimate_time, flops_per_token, matmul_params
from zerokit.spec.setup import Workload, ZeroSetup, batch_split, steps_per_epoch


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
    # a second node: each rank's ring carries (N-1)/N of the data, more of it, and across the nodes' NICs
    # (timing.link_bandwidth); all of it priced, hidden behind compute or not
    t2 = estimate_time(LLAMA3_8B, two, ZeroSetup(zero_stage=3), w)
    assert (t2.communication_seconds + t2.communication_hidden_seconds
            > base.communication_seconds + base.communication_hidden_seconds)


def test_a100_throughput_lands_in_the_published_range():
    # EleutherAI Transformer Math 101: well-tuned A100 bf16 training reaches 115-150 TFLOP/s of 312; FlashAttention-2
    # (Dao 2023, Table 1): GPT-style 1.3B-2.7B models train at 196-225 TFLOP/s per A100 with it, counting attention.
    cluster = Cluster(accelerator=accelerator("a100-80gb"), gpus_per_node=8)
    t = estimate_time(LLAMA3_8B, cluster, ZeroSetup(zero_stage=2, micro_batch_size=4), Workload(seq_len=2048))
    achieved = t.flops_per_step / t.step_seconds / 8 / 1e12
    assert 115 <= achieved <= 225


# -- collective calls: counted in real DeepSpeed steps ------------------------------------------------------
def test_bucketing_rule_on_hand_made_sizes():
    from zerokit.estimate.timing import reduce_bucket_calls

    # DeepSpeed reduces the bucket before a gradient that would overflow it; a large gradient is alone
    assert reduce_bucket_calls([10, 10, 10], 30) == 1
    assert reduce_bucket_calls([10, 10, 11], 30) == 2
    assert reduce_bucket_calls([100, 1, 100], 30) == 3
    assert reduce_bucket_calls([], 30) == 0


@pytest.mark.slow
def test_collective_calls_match_a_real_deepspeed_step(tmp_path):
    """Oracle: the calls a real 2-rank DeepSpeed step makes (torch.distributed wrapped and counted,
    tests/helpers/collective_count.py) against timing.collective_calls_per_step, for ZeRO-1 fp32 and
    ZeRO-2 bf16 with the rendered hidden-size buckets (tiny-llama: 35 gradient buckets)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("deepspeed")
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.model import load_model_spec
    from zerokit.config.render import render_ds_config
    from zerokit.estimate.timing import collective_calls_per_step
    from zerokit.spec.setup import ZeroKnobs

    repo = Path(__file__).resolve().parents[1]
    spec = load_model_spec("tiny-llama")
    cluster = build_cluster(gpu="cpu", gpus_per_node=2)
    setups = {"z1_fp32": ZeroSetup(zero_stage=1, precision="fp32", micro_batch_size=1),
              "z2_bf16": ZeroSetup(zero_stage=2, precision="bf16", micro_batch_size=1)}
    paths, expected = [], {}
    for name, setup in setups.items():
        cfg = render_ds_config(setup, cluster, spec, Workload(seq_len=32), lr=1e-3, warmup_steps=1, total_steps=3)
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps(cfg))
        paths.append(str(p))
        expected[str(p)] = collective_calls_per_step(spec, cluster, setup, ZeroKnobs.from_zero_config(cfg["zero_optimization"]))
    bindir = Path(sys.executable).parent
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=str(repo))
    env.setdefault("TORCH_EXTENSIONS_DIR", str(repo / ".cache" / "torch_extensions"))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    argv = [str(bindir / "deepspeed"), "--num_gpus", "2", "--master_port", str(29500 + os.getpid() % 2000),
            "--module", "tests.helpers.collective_count", "--model", str(repo / "zerokit/data/models/tiny-llama"),
            "--seq-len", "32", *paths]
    r = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    counted = {d["config"]: d for d in (json.loads(line[6:]) for line in r.stdout.splitlines() if line.startswith("COUNT "))}
    assert set(counted) == set(paths), out[-3000:]
    for path, calls in expected.items():
        got = counted[path]
        assert got.get("all_reduce", 0) == calls.reduces, (path, got, calls)
        assert got.get("all_gather_into_tensor", 0) + got.get("all_gather", 0) == calls.gathers, (path, got, calls)


@pytest.mark.slow
def test_tensor_parallel_collective_calls_match_a_real_deepspeed_step(tmp_path):
    """Oracle: a real 2-rank AutoTP step (autotp_size 2, ZeRO-1 fp32, reduce buckets of 16,384 elements; torch.distributed
    counted by tests/helpers/collective_count.py) makes ZeRO's bucketed reduces over the TP shard plus
    timing.model_parallel_calls' all-reduces (per layer two forward, five backward; the LM head's input gradient; the
    gradient norm over the TP group), and one all_gather_into_tensor, the LM head's logits: ZeRO-1 skips its parameter
    gather in a data-parallel group of one rank."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("deepspeed")
    from zerokit.estimate.timing import collective_calls_per_step, model_parallel_calls
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.setup import ZeroKnobs

    repo = Path(__file__).resolve().parents[1]
    spec = load_model_spec("tiny-llama")
    cluster = build_cluster(gpu="cpu", gpus_per_node=2)
    zero = {"stage": 1, "reduce_bucket_size": 16384, "allgather_bucket_size": 16384}
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": zero,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
           "tensor_parallel": {"autotp_size": 2}}
    path = tmp_path / "tp.json"
    path.write_text(json.dumps(cfg))
    setup = ZeroSetup(zero_stage=1, precision="fp32", micro_batch_size=1, tensor_parallel=2)
    zero_calls = collective_calls_per_step(spec.tensor_parallel_shard(2), cluster, setup, ZeroKnobs.from_zero_config(zero))
    tp_calls = model_parallel_calls(spec, setup)
    bindir = Path(sys.executable).parent
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=str(repo))
    env.setdefault("TORCH_EXTENSIONS_DIR", str(repo / ".cache" / "torch_extensions"))
    argv = [str(bindir / "deepspeed"), "--num_gpus", "2", "--master_port", str(31500 + os.getpid() % 2000),
            "--module", "tests.helpers.collective_count", "--model", str(repo / "zerokit/data/models/tiny-llama"),
            "--seq-len", "32", str(path)]
    r = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    (got,) = [json.loads(line[6:]) for line in r.stdout.splitlines() if line.startswith("COUNT ")]
    assert tp_calls.reduces == 4 * (2 + 5) + 1 + 1
    assert got["all_reduce"] == zero_calls.reduces + tp_calls.reduces, (got, zero_calls, tp_calls)
    assert got.get("all_gather_into_tensor", 0) + got.get("all_gather", 0) == zero_calls.gathers + tp_calls.gathers == 1
