"""Pipeline stages planned, rendered and checked (estimate/pipeline.py): DeepSpeed's own partition, the 1F1B bubble
of Narayanan et al. 2021, what stage 0 holds in flight, DeepSpeed's refusals in one line, and the rendered config
accepted by DeepSpeed's config classes as the pipeline engine builds them (with the PipelineModule's grid)."""

from __future__ import annotations

import json
import random

import pytest

from zerokit.api import build_plan, request
from zerokit.core.errors import ZerokitError
from zerokit.estimate import pipeline as pp
from zerokit.spec.model import load_model_spec
from zerokit.spec.setup import ZeroSetup, Workload

PLAN = dict(model="llama-3-8b", gpu="a100-80gb", gpus_per_node=8, nodes=2, seq_len=4096, global_batch=256)


def _plan(**options):
    return build_plan(request("plan", {**PLAN, **options}))


@pytest.mark.parametrize("seed", range(6))
def test_partition_is_deepspeeds_own(seed):
    """partition_balanced / partition_uniform equal deepspeed.runtime.utils' on random weights and on the layer lists
    of real models (the embedding and the head weigh as much as several decoder layers)."""
    from deepspeed.runtime.utils import partition_balanced, partition_uniform

    rng = random.Random(seed)
    for _ in range(20):
        weights = [rng.randint(0, 1000) for _ in range(rng.randint(1, 40))]
        parts = rng.randint(1, 9)
        assert pp.partition_balanced(weights, parts) == partition_balanced(weights, parts), (weights, parts)
        assert pp.partition_uniform(len(weights), parts) == partition_uniform(len(weights), parts)
    for name in ("llama-3-8b", "llama-3-70b", "qwen3-4b", "tiny-llama"):
        weights = pp.layer_weights(load_model_spec(name))
        for parts in (2, 3, 4, 8):
            assert pp.partition_balanced(weights, parts) == partition_balanced(weights, parts), (name, parts)


def test_layer_weights_add_up_to_the_model():
    """The PipelineModule's layers hold every parameter once, a tied head's copy of the embedding once more."""
    for name in ("llama-3-8b", "qwen3-4b", "tiny-llama"):
        m = load_model_spec(name)
        vh = m.vocab_size * m.hidden_size
        assert sum(pp.layer_weights(m)) == m.params + (vh if m.tied_embeddings else 0)


def test_bubble_and_step_follow_the_1f1b_schedule():
    """Narayanan et al. 2021, section 2.2.1: the bubble is (p - 1) / (m + p - 1) of the slots; the step is
    (m + p - 1) slots of the slowest stage, plus the sends, plus the stage's reduction and optimizer step."""
    plan = _plan(pipeline_parallel=4, micro_batch=1)
    t, s = plan.best.time, plan.best.setup
    p, m = s.pipeline_parallel, s.gradient_accumulation_steps
    assert m == 256 // (1 * 4)  # global 256 = micro 1 x m x 4 data-parallel ranks (16 GPUs / 4 stages)
    assert t.pipeline_bubble == pytest.approx((p - 1) / (m + p - 1))
    assert t.global_batch == 256 and t.tokens_per_step == 256 * 4096
    fewer = _plan(pipeline_parallel=4, micro_batch=4).best.time  # m = 16: a larger share of the slots idle
    assert fewer.pipeline_bubble == pytest.approx(3 / 19)
    assert t.pipeline_p2p_seconds > 0 and t.step_seconds > t.compute_seconds


def test_stage_zero_holds_the_micro_batches_in_flight():
    """TrainSchedule.num_pipe_buffers: stage s keeps min(p - s, m) forward passes; only one micro-batch's worth when
    m = 1, p's worth when m >= p (Korthikanti et al. 2022, section 4.2.3)."""
    model = load_model_spec("llama-3-8b")
    cluster = build_plan(request("plan", {**PLAN, "nodes": 1, "global_batch": 64})).cluster
    work = Workload(seq_len=2048, global_batch=None)
    one = ZeroSetup(zero_stage=1, precision="bf16", pipeline_parallel=4, gradient_accumulation_steps=1)
    many = ZeroSetup(zero_stage=1, precision="bf16", pipeline_parallel=4, gradient_accumulation_steps=8)
    stages = pp.stages(model, many)
    assert [st.in_flight for st in stages] == [4, 3, 2, 1]
    assert [st.in_flight for st in pp.stages(model, one)] == [1, 1, 1, 1]
    assert sum(st.layers for st in stages) == model.num_layers
    assert stages[0].has_embedding and stages[-1].has_head
    m1 = pp.stage_memory(model, cluster, one, work, pp.stages(model, one)[0])
    m8 = pp.stage_memory(model, cluster, many, work, stages[0])
    back1, back8 = m1.phase_terms["backward"], m8.phase_terms["backward"]
    held = back8["pipeline_in_flight"] - back1["pipeline_in_flight"]
    acts = back8["activations"]  # one micro-batch of stage 0's layers
    assert "pipeline_in_flight" not in m8.phase_terms["step"]  # the last backward ended them
    tokens_h = 2048 * model.hidden_size * 2
    assert held == 3 * acts + 3 * tokens_h  # three more micro-batches, each with its output kept to send


def test_a_bf16_pipeline_without_zero_shards_master_and_moments():
    """bf16 at stage 0 with stages is BF16_Optimizer (engine._do_optimizer_sanity_check): fp32 master and Adam's
    moments over the stage's 4 data-parallel ranks (bf16_optimizer.py fp32_groups_flat_partition), one unsharded bf16
    gradient buffer (fp32_groups_gradients_flat in grad_acc_dtype); the step's fp32 copy of the gradient partition.
    Without stages the same config is FP16_Optimizer: every fp32 copy whole. Measured: tests/test_pipeline_launch.py."""
    model = load_model_spec("llama-3-8b")
    cluster = build_plan(request("plan", {**PLAN, "nodes": 1, "global_batch": 64})).cluster
    work = Workload(seq_len=2048, global_batch=None)
    piped = ZeroSetup(zero_stage=0, precision="bf16", pipeline_parallel=2, gradient_accumulation_steps=8)
    stage = pp.stages(model, piped)[1]
    terms = pp.stage_memory(model, cluster, piped, work, stage).phase_terms
    shard = pp.stage_view(model, stage)
    n = piped.zero_ranks(cluster.world_size)
    assert n == cluster.world_size // 2 > 1
    step = terms["step"]
    assert step["master_weights"] == 4 * shard.trainable // n
    assert step["optimizer_states"] == 8 * shard.trainable // n
    assert step["bf16_optimizer_grad_accum"] == 2 * shard.trainable
    assert step["fp32_gradients"] == 4 * shard.trainable // n
    assert terms["backward_end"]["bf16_optimizer_grad_accum"] == 2 * shard.trainable
    fp16 = pp.stage_memory(model, cluster, ZeroSetup(zero_stage=0, precision="fp16", pipeline_parallel=2,
                                                     gradient_accumulation_steps=8), work, stage).phase_terms["step"]
    assert fp16["master_weights"] == 4 * shard.trainable and "bf16_optimizer_grad_accum" not in fp16


@pytest.mark.parametrize("options,fragment", [
    (dict(zero_stage=3), "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"),
    (dict(sequence_parallel=2), "without Ulysses"),
    (dict(tensor_parallel=2), "data parallelism only"),
    (dict(model="gpt2", seq_len=1024), "adapter covers llama"),
    (dict(pipeline_parallel=3), "does not divide the 16 GPUs"),
    (dict(global_batch=None), "give --global-batch or --grad-accum"),
    (dict(pipeline_parallel=64, nodes=8), "more stages than the model has layers"),
])
def test_refusals_are_one_line(options, fragment):
    options = {"pipeline_parallel": 4, **options}
    with pytest.raises(ZerokitError) as e:
        _plan(**options)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_cli_refusal_exits_2_and_writes_nothing(tmp_path):
    from zerokit.cli import main

    out = tmp_path / "ds.json"
    rc = main(["render", "llama-3-8b", "--gpu", "a100-80gb", "--gpus-per-node", "8", "--global-batch", "64",
               "--pipeline-parallel", "4", "--stage", "2", "-o", str(out)])
    assert rc == 2 and not out.exists()


def test_rendered_pipeline_config_is_deepspeeds_and_checks(tmp_path, capsys):
    """render writes the pipeline block and train_batch_size over one stage's data-parallel ranks; DeepSpeed's config
    classes accept it with the PipelineModule's grid (its mpu), and check prices it as plan does."""
    from zerokit.cli import main

    out = tmp_path / "ds.json"
    argv = ["--gpu", "a100-80gb", "--gpus-per-node", "8", "--nodes", "2", "--seq-len", "4096"]
    assert main(["render", "llama-3-8b", *argv, "--global-batch", "256", "--pipeline-parallel", "4", "-o", str(out)]) == 0
    argv = ["--model", "llama-3-8b", *argv]
    cfg = json.loads(out.read_text())
    assert cfg["pipeline"] == {"stages": 4, "partition": "parameters", "activation_checkpoint_interval": 0}
    assert cfg["zero_optimization"]["stage"] <= 1
    assert cfg["train_batch_size"] == 256 == (cfg["train_micro_batch_size_per_gpu"]
                                              * cfg["gradient_accumulation_steps"] * 4)
    capsys.readouterr()
    assert main(["check", str(out), *argv, "--json"]) == 0
    checked = json.loads(capsys.readouterr().out)
    assert checked["deepspeed_error"] is None and checked["parallelism"]["pipeline_parallel"] == 4
    plan = _plan(pipeline_parallel=4)
    assert checked["evaluation"]["time"]["step_seconds"] == pytest.approx(plan.best.time.step_seconds, rel=1e-9)
    # the same config at ZeRO-2: DeepSpeed's engine would assert; check says so as an error
    cfg["zero_optimization"]["stage"] = 2
    out.write_text(json.dumps(cfg))
    main(["check", str(out), *argv, "--json"])
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert any(f["level"] == "error" and "incompatible with pipeline parallelism" in f["message"] for f in findings)


def test_across_nodes_the_plan_compares_pipeline_stages():
    """On several nodes the plan says what stages would do instead, each row the pinned pipeline plan's own best
    (same setup, same step), first among the other rows; not chosen by itself (it needs the pipeline adapter)."""
    options = dict(model="llama-3-8b", gpu="a100-80gb", gpus_per_node=8, nodes=4, seq_len=4096, global_batch=512)
    plan = build_plan(request("plan", options))
    assert plan.best.setup.pipeline_parallel == 1
    rows = [r for r in plan.rejected if r["setup"]["pipeline_parallel"] > 1]
    assert {r["setup"]["pipeline_parallel"] for r in rows} == {2, 4}
    assert plan.rejected[:len(rows)] == rows
    for row in rows:
        pinned = build_plan(request("plan", {**options, "pipeline_parallel": row["setup"]["pipeline_parallel"]}))
        assert row["setup"] == pinned.best.setup.to_dict()
        assert row["step_seconds"] == pytest.approx(pinned.best.time.step_seconds, rel=1e-12)
        assert "slower" in row["reason"] or "faster" in row["reason"] or "as fast" in row["reason"]
    one_node = build_plan(request("plan", {**options, "nodes": 1, "global_batch": 128}))
    assert not any(r["setup"]["pipeline_parallel"] > 1 for r in one_node.rejected)


@pytest.mark.parametrize("tied", [False, True])
def test_priced_layers_are_the_adapters_layers(tmp_path, tied):
    """What the plan cuts into stages (layer_weights) is what launching/pipeline.py hands DeepSpeed, counted as
    PipelineModule._count_layer_params counts it (each layer built, its trainable parameters), so the stages priced
    are the stages DeepSpeed makes (its partition function is held equal above)."""
    import torch
    from deepspeed.pipe import LayerSpec
    from transformers import AutoConfig, AutoModelForCausalLM

    from zerokit.core.resources import bundled_data
    from zerokit.launching.pipeline import pipeline_layers

    cfg = json.loads(bundled_data("models/tiny-llama/config.json").read_text())
    cfg["tie_word_embeddings"] = tied
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path), attn_implementation="sdpa")
    counts = [sum(p.numel() for p in (layer.build() if isinstance(layer, LayerSpec) else layer).parameters()
                  if p.requires_grad) for layer in pipeline_layers(model)]
    spec = load_model_spec(str(tmp_path))
    assert spec.tied_embeddings is tied
    assert counts == pp.layer_weights(spec)


def _megatron_run(**changes):
    """BLOOM-176B as BigScience trained it (train/tr11-176B-ml/README.md: TP 4, PP 12, DP 8 on 384 A100-80GB, micro
    batch 2, global batch 2048, seq 2048)."""
    run = dict(id="bloom", source="-", quote="-", gpu="a100-80gb", gpus=384, tensor_parallel=4, pipeline_parallel=12,
               data_parallel=8, zero_stage=1, micro_batch=2, global_batch=2048, seq_len=2048, hidden_size=14336,
               num_layers=70, num_heads=112, vocab_size=250880, precision="bf16", activation_checkpointing="full")
    return {**run, **changes}


def _bench_3d():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / "published_3d.py"
    spec = importlib.util.spec_from_file_location("published_3d", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_vocab_parallel_shard_holds_its_rows():
    """Megatron's VocabParallelEmbedding and vocab-parallel head: a TP rank holds vocab / tp rows of the tied
    embedding beside its 1/tp of every layer's matrices; the biases and LayerNorms it keeps whole. Counted here from
    the shape, independently of tensor_parallel_shard."""
    bench = _bench_3d()
    run = _megatron_run()
    model = bench.gpt_spec(run)
    h, layers, v, s, tp = 14336, 70, 250880, 2048, 4
    assert model.params == layers * (12 * h * h + 13 * h) + v * h + s * h + 2 * h  # the GPT's count, per layer 12h^2+13h
    shard = model.tensor_parallel_shard(tp)
    matrices = layers * 12 * h * h  # QKV 3h^2, output h^2, MLP 8h^2
    assert shard.vocab_size == v // tp and shard.embedding_params == v * h // tp
    assert shard.params == model.params - matrices + matrices // tp - (v * h - v * h // tp)


def test_a_first_stage_splits_no_head_it_does_not_hold():
    """The first stage holds the input embedding and decoder layers, no LM head: AutoTP splits its layers' Linears
    only (tensor_parallel_params), so its priced matmuls are those layers' at 1/tp."""
    model = load_model_spec("llama-3-8b")
    setup = ZeroSetup(zero_stage=1, precision="bf16", micro_batch_size=1, gradient_accumulation_steps=8,
                      pipeline_parallel=4)
    first = pp.stages(model, setup)[0]
    view = pp.stage_view(model, first, for_time=True)
    per_layer = (model.params - 2 * model.vocab_size * model.hidden_size - model.hidden_size) // model.num_layers
    linears = model.hidden_size * (model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim \
        + model.num_attention_heads * model.head_dim * model.hidden_size + 3 * model.hidden_size * model.intermediate_size
    assert view.tensor_parallel_params() == first.layers * linears
    assert linears < per_layer  # the norms stay whole


def test_tensor_parallel_all_reduces_sit_in_every_slot():
    """Narayanan et al. 2021, section 3.3: tensor parallelism all-reduces inside each layer's forward and backward of
    every micro-batch (on the critical path), so the pipeline's slot carries them: the step grows by (m + p - 1) x
    one micro-batch's TP traffic, not by one micro-batch's."""
    from dataclasses import replace

    from zerokit.estimate.timing import intra_node_bandwidth, model_parallel_bytes

    bench = _bench_3d()
    run = _megatron_run(gpus=96, data_parallel=2, global_batch=64, micro_batch=1)
    model = bench.gpt_spec(run)
    from zerokit.spec.hardware import build_cluster

    cluster = build_cluster(gpu="a100-80gb", gpus_per_node=8, nodes=12, hardware_profile="none")
    setup = ZeroSetup(zero_stage=1, precision="bf16", activation_checkpointing=True, micro_batch_size=1,
                      gradient_accumulation_steps=32, tensor_parallel=4, pipeline_parallel=12)
    work = Workload(seq_len=2048, global_batch=64, attention="eager")
    timed = pp.pipeline_time(model, cluster, setup, work)
    slots = 32 + 12 - 1
    views = [pp.stage_view(model, st, for_time=True) for st in pp.stages(model, setup)]
    one = replace(setup, gradient_accumulation_steps=1)
    from zerokit.estimate.timing import estimate_time

    per_slot = max(estimate_time(v, cluster, one, work).compute_seconds
                   + model_parallel_bytes(v, one, 2048) / intra_node_bandwidth(cluster) for v in views)
    assert timed.compute_seconds == pytest.approx(slots * per_slot, rel=1e-12)
    # each slot's TP traffic: per layer 2 all-reduces forward, 2 more in the recompute, 2 backward (GPT's fused QKV and
    # first MLP Linear take the backward ones), each b s h elements in bf16, a ring's 2 (t - 1) / t of them
    layers = max(st.layers for st in pp.stages(model, setup))
    middle = next(v for v in views if v.num_layers == layers and v.vocab_size == 0)
    ring = 2 * 3 / 4 * 2048 * 14336 * 2
    assert model_parallel_bytes(middle, one, 2048) == pytest.approx(layers * 6 * ring, rel=1e-12)


def test_tensor_parallel_with_stages_is_priced_not_planned():
    with pytest.raises(ZerokitError) as e:
        _plan(pipeline_parallel=4, tensor_parallel=2)
    assert "AutoTP inside it is untried" in str(e.value)


def test_published_3d_runs_are_priced_within_their_tolerance():
    """The committed benchmark's runs (bench/data/published_3d_runs.yaml, each with its source and quote): the step
    priced within 1.5x of the published one for every run with a measured step or TFLOPs (BLOOM-176B, GPT-NeoX-20B,
    Megatron-LM's table, MT-NLG 530B; the table's own figures are in bench/results/published_3d.txt)."""
    bench = _bench_3d()
    runs = bench.load()
    assert len(runs) >= 5
    for run in runs:
        measured = bench.measured_step(run)
        if measured:
            ratio = bench.price(run)["step"] / measured
            assert 1 / 1.5 <= ratio <= 1.5, (run["id"], ratio)


def test_published_3d_bad_entry_is_one_line(tmp_path):
    bad = tmp_path / "runs.yaml"
    import yaml

    bad.write_text(yaml.safe_dump({"runs": [_megatron_run(gpus=100)]}))
    bench = _bench_3d()
    assert bench.main(["--data", str(bad)]) == 2


def test_blooms_partition_is_the_one_its_readme_describes():
    """BLOOM-176B (70 layers, tied embedding) in 12 stages with --pp-partition-method 'type:transformer|embedding':
    "pp rank 0 holds [embed | 5 blocks], rank 11 [5 blocks | embed], the rest 6 blocks" (bigscience
    train/tr11-176B-ml/README.md). Megatron-DeepSpeed's default 'type:transformer' spreads the 70 blocks alone."""
    bench = _bench_3d()
    model = bench.gpt_spec(_megatron_run())
    setup = ZeroSetup(zero_stage=1, precision="bf16", micro_batch_size=2, gradient_accumulation_steps=128,
                      tensor_parallel=4, pipeline_parallel=12)
    bloom = pp.stages(model, setup, "type:transformer|embedding")
    assert [st.layers for st in bloom] == [5] + [6] * 10 + [5]
    assert bloom[0].has_embedding and bloom[-1].has_head
    plain = pp.stages(model, setup, "type:transformer")
    assert sum(st.layers for st in plain) == 70 and max(st.layers for st in plain) - min(st.layers for st in plain) == 1
    with pytest.raises(ZerokitError):
        pp.stages(model, setup, "type:mlp")
