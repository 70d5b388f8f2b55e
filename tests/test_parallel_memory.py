"""Issue 11's memory and time models, planner dimensions and render, in pure Python (the real runs that check them are
tests/test_parallel_launch.py and the grid's parallel rows, bench/results/accuracy_cpu_parallel.txt).

Oracles: the measured per-rank counts in docs/measured-on-cpu.md "Model parallelism" (AutoTP at TP=2 holds
2,238,720 of the reference Llama's 3,950,848 parameters per rank; hpZ adds fp32 params / 2 on 4 ranks at hpz 2),
DeepSpeed's own config classes for what render writes, and the issue's own figure for the 64k example (Llama-3-8B
on 8 x H100 "shorten the sequence to 37431 tokens" without SP or tiling, now 37055 with the measured CUDA context).
ZeRO++ qwZ/qgZ: DeepSpeed's source (they need CUDA; qgZ several nodes) and the ZeRO++ paper's volumes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from zerokit.core.errors import ZerokitError
from zerokit.estimate.memory import estimate_memory, phase_terms, tiled_loss_shards
from zerokit.estimate.timing import estimate_time, model_parallel_bytes
from zerokit.planning.planner import make_plan, parallel_options
from zerokit.spec.hardware import Cluster, accelerator
from zerokit.spec.model import load_model_spec
from zerokit.spec.setup import Workload, ZeroKnobs, ZeroSetup

CPU2 = Cluster(accelerator("cpu"), gpus_per_node=2)
H100x8 = Cluster(accelerator("h100-80gb"), gpus_per_node=8)

# the model measured in docs/measured-on-cpu.md:
# hidden 256, 4 layers, 8 heads / 4 KV heads, vocab 2048 (3,950,848 parameters)
REFERENCE_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
                   "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 8,
                   "num_key_value_heads": 4, "vocab_size": 2048, "max_position_embeddings": 512,
                   "tie_word_embeddings": False, "hidden_act": "silu", "rms_norm_eps": 1e-6}


@pytest.fixture(scope="module")
def reference_llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref-llama")
    (d / "config.json").write_text(json.dumps(REFERENCE_LLAMA))
    return load_model_spec(str(d))


def test_autotp_shard_holds_the_measured_parameters(reference_llama):
    """Measured (docs/measured-on-cpu.md): 2,238,720 of 3,950,848 parameters per rank at autotp_size 2, every
    Linear split (lm_head included), embeddings and norms whole."""
    assert reference_llama.params == 3_950_848
    assert reference_llama.tensor_parallel_shard(2).params == 2_238_720
    assert reference_llama.tensor_parallel_shard(1) is reference_llama


def test_autotp_model_states_are_the_shard_partitioned_over_data_parallel(reference_llama):
    """ZeRO partitions over world / TP (utils/groups.py _init_tp_mesh_device): at TP 2 on 4 ranks the fp32 master
    weights are the 2,238,720-parameter shard over 2 data-parallel ranks."""
    cluster = Cluster(accelerator("cpu"), gpus_per_node=4)
    setup = ZeroSetup(zero_stage=2, precision="bf16", tensor_parallel=2)
    terms = phase_terms(reference_llama, cluster, setup, Workload(seq_len=64), ZeroKnobs())["step"]
    assert terms["master_weights"] == 4 * 2_238_720 // 2
    assert terms["parameters"] == 2 * 2_238_720


def test_hpz_adds_one_secondary_partition_until_the_step(reference_llama):
    """The secondary partition is fp32 params / hpz (docs/measured-on-cpu.md: +7.5 MiB on 4 ranks at hpz 2; measured
    again here: 2,525,440 B on tiny-llama, alive after init and the first forward, dropped by the step's
    invalidate_secondary_tensor). A model inside ZeRO-3's live window is released, and its copies made, at the end of
    backward: they count at backward_end and the step, not at the start of backward; a model beyond the window is
    released layer by layer in forward and holds them through backward (the head's reduction too)."""
    cluster = Cluster(accelerator("cpu"), gpus_per_node=4)
    base = ZeroSetup(zero_stage=3, precision="fp32")
    wl = Workload(seq_len=64)
    sec = 4 * 3_950_848 // 2  # 7.54 MiB
    for knobs, phases_with in ((ZeroKnobs(), {"backward_end", "step"}),
                               (replace(ZeroKnobs(), stage3_max_live_parameters=10**5),
                                {"backward", "backward_reduce", "backward_end", "step"})):
        with_hpz = phase_terms(reference_llama, cluster, replace(base, hpz_partition_size=2), wl, knobs)
        without = phase_terms(reference_llama, cluster, base, wl, knobs)
        for phase in with_hpz:
            extra = sum(with_hpz[phase].values()) - sum(without[phase].values())
            assert extra == (sec if phase in phases_with else 0), (phase, knobs.stage3_max_live_parameters)
    with pytest.raises(ZerokitError, match="ZeRO-3"):
        ZeroSetup(zero_stage=2, hpz_partition_size=2)


def test_sequence_parallel_splits_activations_and_logits():
    """Each Ulysses rank holds seq / sp tokens of activations and logits; ZeRO partitions over data x sequence ranks
    (utils/groups.py _get_sequence_data_parallel_group), so the model states do not change with sp."""
    model = load_model_spec("llama-3.1-8b")
    wl = Workload(seq_len=8192)
    one = estimate_memory(model, H100x8, ZeroSetup(zero_stage=3), wl)
    four = estimate_memory(model, H100x8, ZeroSetup(zero_stage=3, sequence_parallel=4), wl)
    b1, b4 = one.phase_terms["backward"], four.phase_terms["backward"]
    assert b4["logits_and_loss"] * 4 == b1["logits_and_loss"]
    assert b4["master_weights"] == b1["master_weights"]
    assert b4["activations"] < b1["activations"] / 3  # a quarter, plus the all-to-all's o_proj copy and KV repeat
    assert b4["sp_all_to_all_buffers"] > 0


def test_tiled_loss_holds_one_slice_of_logits():
    model = load_model_spec("llama-3.1-8b")
    wl = Workload(seq_len=16384)
    plain = estimate_memory(model, H100x8, ZeroSetup(zero_stage=3), wl).phase_terms["backward"]
    tiled = estimate_memory(model, H100x8, ZeroSetup(zero_stage=3, tiled_loss=True), wl).phase_terms["backward"]
    shards = tiled_loss_shards(16384, model.vocab_size)
    assert shards == 8  # 16384 x 128256 fp32 logits = 7.8 GiB: 8 slices of at most 1 GiB
    # the slice's log-softmax output (fp32); its 16-bit logits are gone with the slice's loss_fn
    assert tiled["logits_and_loss"] == -(-16384 // shards) * model.vocab_size * 4
    assert tiled["tiled_loss_input_grad"] == 16384 * model.hidden_size * 2
    assert "logits_output" not in estimate_memory(model, H100x8, ZeroSetup(zero_stage=3, tiled_loss=True),
                                                  wl).phase_terms["step"]
    assert sum(tiled.values()) < sum(plain.values())


def test_the_64k_example_fits_only_with_sequence_parallelism_and_tiling():
    """The issue's example: Llama-3-8B (3.1's 128k positions) at 64k tokens on 8 x H100 does not fit with data
    parallelism alone; planned with SP and a tiled loss it fits. The issue quotes "shorten the sequence to 37431
    tokens", planned with a 0.8 GiB CUDA-context allowance; with the context measured on an H200 (1.5 GiB) and the
    cuBLAS workspace (estimate/memory.py CUDA_CONTEXT_BYTES, CUBLAS_WORKSPACE_BYTES) the same search stops at 37055."""
    model = load_model_spec("llama-3.1-8b")
    wl = Workload(seq_len=65536)
    plain = make_plan(model, H100x8, wl, {"sequence_parallel": 1, "tensor_parallel": 1, "tiled_loss": False,
                                           "tiled_mlp": False, "checkpoint_offload": False})
    assert not plain.fits
    assert any("shorten the sequence to 37055 tokens" in s for s in plain.suggestions)
    assert any("pipeline parallelism is not planned" in n for n in plain.notes)  # and why
    plan = make_plan(model, H100x8, wl)
    assert plan.fits
    choice = plan.to_dict()["choice"]
    assert choice["sequence_parallel"] > 1 and choice["tensor_parallel"] == 1 and choice["hpz_partition_size"] == 1
    assert choice["tiled_loss"] in (True, False) and choice["tiled_mlp"] in (True, False)
    assert choice["global_batch"] == choice["micro_batch_size"] * choice["gradient_accumulation_steps"] * 8 // choice["sequence_parallel"]


def test_a_plan_that_fits_with_data_parallelism_proposes_nothing_more():
    """SP, TP and tiling change the training script: searched only when data parallelism alone fits nothing."""
    plan = make_plan(load_model_spec("llama-3-8b"), H100x8, Workload(seq_len=4096))
    s = plan.best.setup
    assert plan.fits and (s.tensor_parallel, s.sequence_parallel, s.tiled_loss, s.tiled_mlp) == (1, 1, False, False)


def test_parallel_options_follow_the_heads_and_the_node():
    """TP degrees divide the node's GPUs, heads and KV heads; SP degrees the heads (KV heads divide it or it them) and
    the sequence; hpZ is one node's GPUs when there are several nodes."""
    model = load_model_spec("llama-3-8b")  # 32 heads, 8 KV heads
    opts = parallel_options(model, H100x8, Workload(seq_len=4096), {})
    assert {o["tensor_parallel"] for o in opts} == {1, 2, 4, 8}
    assert {o["sequence_parallel"] for o in opts} == {1, 2, 4, 8}
    assert {o["hpz_partition_size"] for o in opts} == {1}
    two_nodes = replace(H100x8, nodes=2)
    assert {o["hpz_partition_size"] for o in parallel_options(model, two_nodes, Workload(seq_len=4096), {})} == {1, 8}
    odd = parallel_options(model, H100x8, Workload(seq_len=4100), {})
    assert {o["sequence_parallel"] for o in odd} == {1, 2, 4}  # 4100 % 8 != 0


@pytest.mark.parametrize("pins,fragment", [
    ({"sequence_parallel": 3}, "does not divide the 8 GPUs"),
    ({"tensor_parallel": 16}, "does not divide the 8 GPUs"),
    ({"sequence_parallel": 2, "tensor_parallel": 2}, "not both"),
    ({"hpz_partition_size": 3}, "does not divide the 8 ranks"),
], ids=["sp3", "tp16", "tp-and-sp", "hpz3"])
def test_bad_pins_are_one_line(pins, fragment):
    with pytest.raises(ZerokitError, match=fragment) as e:
        make_plan(load_model_spec("llama-3-8b"), H100x8, Workload(seq_len=4096), pins)
    assert "\n" not in str(e.value)


def test_tensor_parallel_is_refused_for_a_lora_model():
    model = load_model_spec("llama-3-8b").with_trained(trainable_params=10**6)
    with pytest.raises(ZerokitError, match="full fine-tunes"):
        make_plan(model, H100x8, Workload(seq_len=4096), {"tensor_parallel": 2})


def test_sequence_parallel_needs_sdpa():
    with pytest.raises(ZerokitError, match="sdpa"):
        make_plan(load_model_spec("llama-3-8b"), H100x8, Workload(seq_len=4096, attention="eager"),
                  {"sequence_parallel": 2})


def test_model_parallel_traffic_counts_each_collective():
    """AutoTP moves, per layer and micro step, two forward all-reduces (o_proj, down_proj) and five backward ones (q, k,
    v, gate, up input gradients) of tokens x h, ring 2 (tp-1)/tp, plus the LM head's gather and input all-reduce;
    Ulysses four all-to-alls each way."""
    model = load_model_spec("tiny-llama")  # h 128, 4 layers, 4 heads / 2 KV, d 32, vocab 2048
    tokens, e = 2 * 64, 2
    ar = 2 * (1 / 2) * tokens * 128 * e
    tp = model_parallel_bytes(model, ZeroSetup(micro_batch_size=2, tensor_parallel=2), 64)
    assert tp == 4 * (2 + 5) * ar + (1 / 2) * tokens * 2048 * e + ar
    sp = model_parallel_bytes(model, ZeroSetup(micro_batch_size=2, sequence_parallel=2), 64)
    assert sp == 4 * 2 * (1 / 2) * (tokens / 2) * (2 * 4 + 2 * 2) * 32 * e
    assert model_parallel_bytes(model, ZeroSetup(micro_batch_size=2), 64) == 0


def test_global_batch_counts_data_parallel_replicas():
    model = load_model_spec("tiny-llama")
    t = estimate_time(model, CPU2, ZeroSetup(zero_stage=2, micro_batch_size=4, sequence_parallel=2), Workload(seq_len=64))
    assert t.global_batch == 4 and t.tokens_per_step == 4 * 64


@pytest.mark.parametrize("setup", [
    ZeroSetup(zero_stage=2, micro_batch_size=2, sequence_parallel=2),
    ZeroSetup(zero_stage=1, micro_batch_size=2, tensor_parallel=2),
    ZeroSetup(zero_stage=3, micro_batch_size=2, hpz_partition_size=2),
], ids=["sp2", "tp2", "hpz2"])
def test_render_writes_the_keys_deepspeed_reads(setup):
    """What render writes passes DeepSpeed's own DeepSpeedConfig for the world (runtime/config.py: the batch check
    counts world / sequence_parallel_size; TPTrainingConfig reads autotp_size; DeepSpeedZeroConfig
    zero_hpz_partition_size) and carries each degree where DeepSpeed reads it."""
    pytest.importorskip("deepspeed")
    from zerokit.config.render import render_ds_config
    from zerokit.config.read import parallelism_from_config
    from zerokit.config.validate import validate_with_deepspeed

    model = load_model_spec("tiny-llama")
    cfg = render_ds_config(setup, CPU2, model, Workload(seq_len=64))
    validate_with_deepspeed(cfg, CPU2.world_size)
    assert parallelism_from_config(cfg) == setup.parallelism
    assert cfg["train_batch_size"] == 2 * (2 // setup.sequence_parallel)


def test_check_prices_the_parallelism_a_config_asks_for(tmp_path, capsys):
    """`zerokit check` reads sequence_parallel_size and prices it: per-rank activations and logits split."""
    from zerokit.cli import main

    base = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
            "zero_optimization": {"stage": 2}}
    out = {}
    for name, extra in (("plain", {}), ("sp", {"sequence_parallel_size": 2})):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({**base, **extra}))
        assert main(["check", str(path), "--model", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2",
                     "--seq-len", "64", "--json"]) == 0
        out[name] = json.loads(capsys.readouterr().out)
    plain = out["plain"]["evaluation"]["memory"]["phase_terms"]["backward"]
    sp = out["sp"]["evaluation"]["memory"]["phase_terms"]["backward"]
    assert sp["logits_and_loss"] * 2 == plain["logits_and_loss"]
    assert out["sp"]["parallelism"]["sequence_parallel"] == 2


def test_profile_latencies_and_cpu_sharing():
    """The committed profile (2 cores, 1 thread per rank; all-to-all timed by bench/calibrate_all_to_all.py): an older
    profile without the all-to-all latency prices one as an all-reduce; 4 CPU ranks on its 2 cores run at half speed."""
    import copy
    from pathlib import Path

    from zerokit.spec.profile import HardwareProfile, TimingTerms

    path = Path(__file__).resolve().parents[1] / "bench" / "results" / "accuracy_cpu_profile.json"
    prof = HardwareProfile.from_file(path)
    assert prof.timing.all_to_all_latency_s == prof.data["all_to_all_latency_s"] > 0
    older = copy.deepcopy(prof.data)
    del older["all_to_all_latency_s"]
    assert TimingTerms.from_profile(older).all_to_all_latency_s == prof.timing.all_reduce_latency_s
    assert prof.cpu_oversubscription(2) == 1.0 and prof.cpu_oversubscription(4) == 2.0


def test_all_to_all_script_refuses_a_missing_profile_in_one_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "bench" / "calibrate_all_to_all.py"
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "none.json")], capture_output=True, text=True)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "error:" in r.stderr


# ------------------------------------------------------------------------------------------ ZeRO++ qwZ / qgZ
H100x16 = Cluster(accelerator("h100-80gb"), gpus_per_node=8, nodes=2)


def test_qwz_and_qgz_bytes_follow_the_zeropp_papers_volumes():
    """ZeRO++ (Wang et al. 2023, sections 3.1 and 3.3): qwZ halves the fp16 parameter all-gather (int8, plus one fp32
    scale per ~8000 elements: CUDAQuantizer.target_group_size); qgZ sends each node's gradients across nodes as int4,
    1/4 of the fp16 reduce-scatter's volume, after an int4 all-to-all inside the node. Only on GPUs, at ZeRO-3, and qgZ
    only across nodes (stage3.py __avg_scatter_grads: num_nodes > 1)."""
    from zerokit.estimate.timing import collective_bytes

    model = load_model_spec("llama-3-8b")
    setup = ZeroSetup(zero_stage=3, precision="bf16", micro_batch_size=1)
    plain = collective_bytes(model, H100x16, setup, ZeroKnobs())
    qwz = collective_bytes(model, H100x16, setup, ZeroKnobs(zero_quantized_weights=True))
    assert qwz.parameters / plain.parameters == pytest.approx((1 + 4 / 8000) / 2)
    assert qwz.gradients == plain.gradients
    qgz = collective_bytes(model, H100x16, setup, ZeroKnobs(zero_quantized_gradients=True))
    per_node_fp16 = 2 * model.trainable * (2 - 1) / 2  # the node's share of an fp16 reduce-scatter across 2 nodes
    assert 8 * qgz.gradients / per_node_fp16 == pytest.approx(0.25)
    assert qgz.intra_node == pytest.approx(0.5 * model.trainable * 7 / 8)
    assert qgz.parameters == plain.parameters
    one_node = collective_bytes(model, H100x8, setup, ZeroKnobs(zero_quantized_gradients=True))
    assert one_node == collective_bytes(model, H100x8, setup, ZeroKnobs())
    assert collective_bytes(model, CPU2, setup, ZeroKnobs(zero_quantized_weights=True)) == collective_bytes(
        model, CPU2, setup, ZeroKnobs())


def test_qwz_and_qgz_buffers_as_deepspeeds_source_allocates_them():
    """qwZ: each gather in flight holds an int8 copy of its full bucket (+ scales) and the largest module is dequantized
    to fp16 before the parameters get their tensors (partition_parameters.py _all_gather_coalesced, AllGatherCoalesced-
    Handle.wait); zero_quantized_nontrainable_weights stores a frozen weight's partition int8 (_partition_param). qgZ:
    per gradient tensor an int4 copy and the all-to-all's output, then 1/L of it reduced and dequantized
    (all_to_all_quant_reduce). Derived from the source, not measured (CUDA; one GPU runs none of them)."""
    model = load_model_spec("llama-3-8b")
    setup = ZeroSetup(zero_stage=3, precision="bf16", micro_batch_size=1)
    wl = Workload(seq_len=4096)
    knobs = ZeroKnobs.for_model(model)
    plain = phase_terms(model, H100x16, setup, wl, knobs)["backward"]
    q = phase_terms(model, H100x16, setup, wl, replace(knobs, zero_quantized_weights=True,
                                                       zero_quantized_gradients=True))["backward"]
    largest = model.largest_layer_params  # the embedding / LM head, 128256 x 4096
    in_flight = knobs.stage3_prefetch_bucket_size + largest
    assert q["qwz_gather_buffers"] == int((1 + 4 / 8000) * in_flight) + 2 * largest
    assert q["qgz_reduce_buffers"] == int((1 + 3 / 8) * largest)
    assert {k: v for k, v in q.items() if not k.startswith(("qwz", "qgz"))} == plain
    # one node: no qgZ; one rank or a CPU: neither
    assert "qgz_reduce_buffers" not in phase_terms(model, H100x8, setup, wl, replace(
        knobs, zero_quantized_gradients=True))["backward"]
    assert "qwz_gather_buffers" not in phase_terms(model, Cluster(accelerator("h100-80gb"), gpus_per_node=1), setup, wl,
                                                   replace(knobs, zero_quantized_weights=True))["backward"]


def test_quantized_frozen_partitions_replace_their_16bit_bytes(reference_llama):
    """zero_quantized_nontrainable_weights with LoRA at ZeRO-3: the frozen base's partition at 1 byte (+ scales) per
    element instead of 2; the adapters stay bf16."""
    lora = reference_llama.with_trained(trainable_params=100_000, finetune_mode="lora")  # adapters' count, frozen base
    setup = ZeroSetup(zero_stage=3, precision="bf16", micro_batch_size=1)
    wl = Workload(seq_len=128)
    knobs = ZeroKnobs.for_model(lora)
    plain = phase_terms(lora, H100x8, setup, wl, knobs)["step"]
    q = phase_terms(lora, H100x8, setup, wl, replace(knobs, zero_quantized_nontrainable_weights=True))["step"]
    frozen = lora.params - lora.trainable
    assert plain["parameters"] - q["parameters"] == 2 * frozen // 8
    assert q["parameters_frozen_int8"] == int((1 + 4 / 8000) * frozen) // 8
    # with hpZ its secondary partition is quantized as well (partition_parameters.py _partition_param_sec)
    hpz = replace(setup, hpz_partition_size=4)
    plain = phase_terms(lora, H100x8, hpz, wl, knobs)["step"]["hpz_secondary_partition"]
    q = phase_terms(lora, H100x8, hpz, wl, replace(knobs, zero_quantized_nontrainable_weights=True))["step"]
    assert plain - q["hpz_secondary_partition"] == int((2 - 1 - 4 / 8000) * frozen) // 4


def test_tiled_mlp_holds_the_mlp_weight_gradients_at_zero_2_and_3():
    """TiledMLP.backward defers ZeRO's gradient hook to its last slice (ds_grad_is_ready), so the layer's MLP weight
    gradients accumulate beside it: tiny-llama (h 128, i 352, gated) in fp32, 3 x 352 x 128 x 4 = 540,672 B, the bytes
    the meter's explain mode found at the peak of a ZeRO-2 run (tests/test_parallel_launch.py). ZeRO-0/1 keep every
    gradient already; a LoRA run's MLP weights are frozen."""
    from zerokit.estimate.memory import tiled_mlp_weight_grads

    spec = load_model_spec("tiny-llama")
    tiled = ZeroSetup(zero_stage=2, precision="fp32", tiled_mlp=True, gradient_accumulation_steps=2)
    assert tiled_mlp_weight_grads(spec, tiled) == 3 * spec.intermediate_size * spec.hidden_size * 4 == 540_672
    assert tiled_mlp_weight_grads(spec, replace(tiled, zero_stage=1)) == 0
    assert tiled_mlp_weight_grads(spec, replace(tiled, tiled_mlp=False)) == 0
    adapters = replace(spec, trained=replace(spec.trained, trainable_params=10_000))  # what with_finetune sets for LoRA
    assert tiled_mlp_weight_grads(adapters, tiled) == 0
    terms = phase_terms(spec, Cluster(accelerator("cpu"), gpus_per_node=1), replace(tiled, tiled_loss=True),
                        Workload(seq_len=256), ZeroKnobs())
    assert terms["backward_reduce"]["tiled_mlp_weight_grads"] == 540_672
