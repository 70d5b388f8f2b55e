"""Issue 28, in pure Python: sequences past the model's positions, `--seq-len max`, activation-checkpoint offload
priced and planned. (The offload mechanism itself and its real 2-rank run: tests/test_ckpt_offload.py.)

Oracles: transformers' modeling code for which positions are a learned table (GPT-2's wpe, OPT's embed_positions:
an index error past them) and which are computed (rotary); DeepSpeed 0.19.8's CheckpointHiddenStatesOffload
defaults for what stays on the GPU (keep_last_count=1, one restored input at a time); a brute-force scan of the
memory model for the longest sequence."""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from zerokit.cli import main
from helpers import run_cli as run
from zerokit.core.errors import ZerokitError
from zerokit.core.resources import bundled_data
from zerokit.estimate.memory import checkpoint_offload_bytes, estimate_memory
from zerokit.estimate.gpu_time import time_fit
from zerokit.estimate.timing import estimate_time
from zerokit.planning.planner import evaluate, make_plan
from zerokit.planning.search import longest_fitting
from zerokit.spec.hardware import Cluster, accelerator
from zerokit.spec.model import load_model_spec
from zerokit.spec.setup import Workload, ZeroSetup

H100x8 = Cluster(accelerator("h100-80gb"), gpus_per_node=8)


# ------------------------------------------------------------------------------------------- past the positions


def test_rotary_model_past_its_positions_plans_with_one_warning(capsys):
    # the refused command: now planned, with one warning line and a JSON warnings entry
    argv = ["plan", "llama-3.1-8b", "--gpu", "h100-80gb", "--gpus-per-node", "8", "--seq-len", "500000", "--stage",
            "3", "--offload-optimizer", "cpu", "--sequence-parallel", "8", "--tiled-loss", "on", "--tiled-mlp", "on",
            "--activation-checkpointing", "on", "--json"]
    rc, out, err = run(argv, capsys)
    assert rc == 0
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "131072 positions" in warnings[0] and "rope_scaling" in warnings[0]
    d = json.loads(out)
    assert d["fits"] and len(d["warnings"]) == 1 and "131072" in d["warnings"][0]
    assert d["workload"]["seq_len"] == 500000


def test_within_the_positions_no_warning(capsys):
    rc, out, err = run(["plan", "llama-3.1-8b", "--gpu", "h100-80gb", "--seq-len", "4096", "--json"], capsys)
    assert "warning" not in err and json.loads(out)["warnings"] == []


@pytest.mark.parametrize("model, learned", [("gpt2", True), ("tiny-gpt2", True), ("opt-1.3b", True),
                                            ("tiny-llama", False), ("llama-3.1-8b", False), ("falcon-7b", False),
                                            ("phi-2", False), ("bloom-560m", False)])
def test_learned_position_tables_are_a_hard_limit(model, learned):
    spec = load_model_spec(model)
    assert spec.learned_positions is learned
    if spec.max_positions is None:  # BLOOM: ALiBi, no table and no maximum
        assert spec.check_seq_len(10**6) is None
        return
    assert spec.check_seq_len(spec.max_positions) is None
    if learned:
        with pytest.raises(ZerokitError, match="learned position table"):
            spec.check_seq_len(spec.max_positions + 1)
    else:
        assert "rope scaling" in spec.check_seq_len(spec.max_positions + 1)


def test_a_learned_table_past_its_rows_is_an_index_error_in_transformers():
    """The oracle for the refusal: GPT-2 past n_positions fails in its position embedding."""
    torch = pytest.importorskip("torch")
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=16))
    model(torch.zeros(1, 16, dtype=torch.long))
    with pytest.raises(IndexError):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_rope_scaling_raises_the_limit_silently(tmp_path, capsys):
    from pathlib import Path

    bundled = Path(__file__).resolve().parents[1] / "zerokit" / "data" / "models" / "tiny-llama" / "config.json"
    cfg = json.loads(bundled.read_text())
    # Qwen2.5's YaRN recipe, at tiny-llama's size: factor 4 x the original 512 positions
    cfg = {**cfg, "max_position_embeddings": 512,
           "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = load_model_spec(str(tmp_path))
    assert spec.max_positions == 2048
    rc, out, err = run(["plan", str(tmp_path), "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", "2048", "--json"],
                       capsys)
    assert rc == 0 and "warning" not in err and json.loads(out)["warnings"] == []
    # the scaled limit is where the warning starts
    assert "2048 positions" in spec.check_seq_len(4096)


# ------------------------------------------------------------------------------------------------ --seq-len max


def test_longest_fitting_equals_a_scan():
    for limit in (1, 7, 100, 1000):
        for answer in (0, 1, 5, 99, 999):
            class J:
                def __init__(self, s):
                    self.fits = s <= answer
            n, _, beyond = longest_fitting(J, 1, limit)
            assert n == min(answer, limit)
            assert (beyond is None) == (answer >= limit)


def test_seq_len_max_is_the_longest_that_fits_the_pinned_setup(capsys):
    argv = ["plan", "llama-3.1-8b", "--gpu", "h100-80gb", "--gpus-per-node", "8", "--seq-len", "max", "--stage",
            "3", "--offload-optimizer", "cpu", "--sequence-parallel", "8", "--tiled-loss", "on", "--tiled-mlp", "on",
            "--activation-checkpointing", "on", "--micro-batch", "1", "--json"]
    rc, out, err = run(argv, capsys)
    assert rc == 0
    d = json.loads(out)
    longest, search = d["workload"]["max_seq_len"], d["workload"]["max_seq_len_search"]
    bound = search["memory_bound_seq_len"]
    assert d["workload"]["seq_len"] == longest and longest % 8 == 0 and d["fits"] and longest < bound
    assert "per GPU" in search["binds"]
    # the oracle: the memory model itself, one granule on either side of its bound
    model = load_model_spec("llama-3.1-8b")
    setup = ZeroSetup(**{k: d["choice"][k] for k in ZeroSetup.__dataclass_fields__})
    assert evaluate(model, H100x8, Workload(seq_len=bound), setup).fits
    assert not evaluate(model, H100x8, Workload(seq_len=bound + 8), setup).fits
    # the answer a user copies: with what grows with the sequence at the fitted factor (zerokit/data/
    # long_context_fit.json, fitted on published long-sequence runs), the budget holds there and not one granule on;
    # in each phase of the step the terms whose bytes differ from the shortest sequence's grow (search.edge_bytes)
    factor = json.loads(bundled_data("long_context_fit.json").read_text())["seq_memory_factor"]
    assert search["seq_memory_factor"] == factor > 1
    fixed = evaluate(model, H100x8, Workload(seq_len=8), setup).memory.phase_terms
    budget = evaluate(model, H100x8, Workload(seq_len=8), setup).budget.gpu_bytes

    def at(n: int) -> float:
        phases = evaluate(model, H100x8, Workload(seq_len=n), setup).memory.phase_terms
        return max(sum(t.values()) + (factor - 1) * sum(v for k, v in t.items() if v != fixed[p].get(k))
                   for p, t in phases.items())

    assert at(longest) <= budget < at(longest + 8)
    rc, out, err = run([a for a in argv if a != "--json"], capsys)
    assert rc == 0 and f"longest sequence that fits: {longest} tokens" in out and f"the memory model alone: {bound}" in out
    # its likely range: the Ulysses maxima's published / the memory model's longest (zerokit/data/seq_len_range.json)
    ulysses = _seq_len_ranges()["ulysses"]
    assert (search["likely_low"], search["likely_high"]) == tuple(
        int(bound * ulysses[k]) // 8 * 8 for k in ("ratio_low", "ratio_high"))
    assert search["likely_low"] < search["likely_high"] < bound and ulysses["basis"] in search["range_basis"]
    assert f"likely {search['likely_low']} to {search['likely_high']} tokens: " in out


@functools.cache
def _bench(name: str):
    """A script of bench/, imported once."""
    import importlib
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    return importlib.import_module(name)


def _seq_len_ranges() -> dict:
    return json.loads(bundled_data("seq_len_range.json").read_text())


def test_seq_len_max_range_rests_on_the_setups_kind(capsys):
    """Without Ulysses the range is the one-GPU maxima's; on CPU ranks none (no published maximum was measured there)."""
    rc, out, _ = run(["plan", "llama-3.1-8b", "--gpu", "h200", "--seq-len", "max", "--sequence-parallel", "1",
                      "--json"], capsys)
    search = json.loads(out)["workload"]["max_seq_len_search"]
    one = _seq_len_ranges()["one_sequence_per_rank"]
    assert rc == 0 and one["basis"] in search["range_basis"] and search["likely_high"] < search["memory_bound_seq_len"]
    rc, out, _ = run(["plan", "tiny-llama", "--gpu", "cpu", "--seq-len", "max", "--json"], capsys)
    assert rc == 0 and "likely_low" not in json.loads(out)["workload"]["max_seq_len_search"]
    rc, out, _ = run(["plan", "tiny-llama", "--gpu", "cpu", "--seq-len", "max"], capsys)
    assert rc == 0 and "longest sequence that fits" in out and "likely" not in out


def test_seq_len_max_in_check(tmp_path, capsys):
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
           "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}, "sequence_parallel_size": 8}
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    argv = ["check", str(tmp_path / "ds.json"), "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--gpus-per-node",
            "8", "--seq-len", "max", "--tiled-loss", "on", "--activation-checkpointing", "on", "--json"]
    rc, out, err = run(argv, capsys)
    assert rc == 0, err
    d = json.loads(out)
    longest = d["workload"]["max_seq_len"]
    assert d["fits"] and longest == d["workload"]["seq_len"] and longest % 8 == 0
    assert "per GPU" in d["workload"]["max_seq_len_search"]["binds"]
    bound = d["workload"]["max_seq_len_search"]["memory_bound_seq_len"]
    assert longest < bound and d["verdict"] == "fits"  # the answer with the sequence's memory at the fitted factor
    assert d["workload"]["max_seq_len_search"]["likely_high"] < bound  # the Ulysses maxima's range, as plan's
    rc, out, err = run([a for a in argv if a != "--json"], capsys)
    assert rc == 0 and f"longest sequence that fits: {longest} tokens" in out


def test_seq_len_max_nothing_fits_says_what_binds(capsys):
    rc, out, err = run(["plan", "llama-3-70b", "--gpu", "t4", "--seq-len", "max", "--stage", "0"], capsys)
    assert rc == 1 and len(err.strip().splitlines()) == 1
    assert "nothing fits even at 1 token" in err and "optimizer_states" in err


# ------------------------------------------------------------------------------------ activation-checkpoint offload


def test_offload_moves_the_checkpoints_from_gpu_to_host_and_adds_pcie_time():
    model = load_model_spec("llama-3.1-8b")
    w = Workload(seq_len=262144)
    on = ZeroSetup(zero_stage=3, offload_optimizer="cpu", activation_checkpointing=True, sequence_parallel=8,
                   tiled_loss=True, tiled_mlp=True)
    off = replace(on, checkpoint_offload=True)
    tokens = w.seq_len // 8
    layer_input = tokens * model.hidden_size * 2  # bf16 hidden states of one rank's slice
    a, b = estimate_memory(model, H100x8, on, w), estimate_memory(model, H100x8, off, w)
    assert a.phase_terms["backward"]["activations_checkpoints"] == model.num_layers * layer_input
    # DeepSpeed keeps the newest input (keep_last_count=1) beside the one restored for the recompute
    assert b.phase_terms["backward"]["activations_checkpoints"] == 2 * layer_input
    assert b.per_node_cpu["activation_checkpoints_offloaded"] == 8 * (model.num_layers - 1) * layer_input
    assert "activation_checkpoints_offloaded" not in a.per_node_cpu
    ta, tb = estimate_time(model, H100x8, on, w), estimate_time(model, H100x8, off, w)
    pcie = H100x8.accelerator.pcie_bw * 1e9 * time_fit().pcie_efficiency  # the fitted share of the datasheet's PCIe
    assert tb.offload_seconds - ta.offload_seconds == pytest.approx(2 * (model.num_layers - 1) * layer_input / pcie)


def test_offload_on_cpu_ranks_changes_no_memory():
    model = load_model_spec("tiny-llama")
    cpu2 = Cluster(accelerator("cpu"), gpus_per_node=2)
    w = Workload(seq_len=128)
    on = ZeroSetup(activation_checkpointing=True)
    a, b = estimate_memory(model, cpu2, on, w), estimate_memory(model, cpu2, replace(on, checkpoint_offload=True), w)
    assert a.per_gpu_total == b.per_gpu_total and a.per_node_cpu == b.per_node_cpu


def test_offload_needs_checkpointing():
    with pytest.raises(ZerokitError, match="activation checkpointing"):
        ZeroSetup(checkpoint_offload=True)


# ALST's 8 x H100 setup, the rest left to the planner (fewer families: the test stays fast)
ALST_PINS = {"zero_stage": 3, "offload_optimizer": "cpu", "sequence_parallel": 8, "tiled_loss": True, "tiled_mlp": True}


def test_planner_reaches_for_offload_only_when_nothing_else_fits():
    model = load_model_spec("llama-3.1-8b")
    assert not make_plan(model, H100x8, Workload(seq_len=1_048_576), ALST_PINS).choice.checkpoint_offload
    plan = make_plan(model, H100x8, Workload(seq_len=3_000_000), ALST_PINS)
    assert plan.fits and plan.choice.checkpoint_offload and plan.choice.activation_checkpointing
    # the same length without offload fits nothing
    assert not make_plan(model, H100x8, Workload(seq_len=3_000_000), {**ALST_PINS, "checkpoint_offload": False}).fits


def test_offload_rendered_where_deepspeed_reads_it_and_checked_back(tmp_path, capsys):
    argv = ["render", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", "128",
            "--activation-checkpointing", "offload", "-o", str(tmp_path / "ds.json")]
    rc, out, err = run(argv, capsys)
    assert rc == 0, err
    cfg = json.loads((tmp_path / "ds.json").read_text())
    assert cfg["activation_checkpointing"]["cpu_checkpointing"] is True
    rc, out, err = run(["check", str(tmp_path / "ds.json"), "--model", "tiny-llama", "--gpu", "cpu",
                        "--gpus-per-node", "2", "--seq-len", "128", "--json"], capsys)
    assert rc == 0, err
    setup = json.loads(out)["evaluation"]["setup"]
    assert setup["activation_checkpointing"] and setup["checkpoint_offload"]
    # DeepSpeed's own config class reads the key
    from deepspeed.runtime.activation_checkpointing.config import DeepSpeedActivationCheckpointingConfig

    assert DeepSpeedActivationCheckpointingConfig(cfg).cpu_checkpointing is True


def test_offload_without_host_ram_does_not_fit_and_says_how_much(capsys):
    rc, out, err = run(["plan", "llama-3.1-8b", "--gpu", "h100-80gb", "--gpus-per-node", "8", "--cpu-memory", "256GB",
                        "--seq-len", "1048576", "--activation-checkpointing", "offload", "--stage", "3",
                        "--offload-optimizer", "none", "--sequence-parallel", "8", "--tiled-loss", "on", "--json"],
                       capsys)
    d = json.loads(out)
    assert rc == 1 and not d["fits"]
    assert any("host RAM per node" in r for r in d["reasons"])


def test_the_recomputed_layers_backward_is_priced_in_its_phase():
    """FlashAttention-2's (and -3's) mha_bwd buffers (GPU), the residual stream's two gradients, TiledMLP's slice, the
    second norm's own backward: the largest moment, less the second norm's saved bytes where they are gone by then
    (memory.recompute_backward_terms). With TiledMLP the norm's backward is the largest at 128K."""
    from zerokit.estimate.memory import RMSNORM_BACKWARD_PEAK_BYTES, _norm_bytes_per_token

    model = load_model_spec("llama-3.1-8b")
    w = Workload(seq_len=131072)
    setup = ZeroSetup(zero_stage=3, offload_optimizer="cpu", activation_checkpointing=True, tiled_loss=True,
                      tiled_mlp=True)
    gpu = estimate_memory(model, Cluster(accelerator("h100-80gb"), gpus_per_node=1), setup, w)
    phase = gpu.phase_terms["backward_recompute"]
    tokens, h, e = w.seq_len, model.hidden_size, 2
    a, d = model.num_attention_heads, model.head_dim
    assert model.num_kv_heads < a
    assert phase["hidden_state_grads"] == 2 * tokens * h * e
    flash = tokens * (2 * e * a * d + 2 * e * a * d + 4 * a * d + 4 * a)  # GQA: dk, dv expanded to every head
    norm2 = tokens * _norm_bytes_per_token(model, "bf16")
    norm_backward = tokens * (RMSNORM_BACKWARD_PEAK_BYTES - e) * h - norm2
    tiled = gpu.phase_terms["backward"]["tiled_mlp_backward"]
    assert phase["recompute_layer_backward"] == max(flash - norm2, tiled, norm_backward) == norm_backward
    assert gpu.peak_phase == "backward_recompute"
    untiled = estimate_memory(model, Cluster(accelerator("h100-80gb"), gpus_per_node=1), replace(setup, tiled_mlp=False), w)
    assert untiled.phase_terms["backward_recompute"]["recompute_layer_backward"] == flash - norm2  # its MLP's freed
    # FlashAttention-3's mha_bwd (hopper/flash_api.cpp): dk, dv at the KV heads with fp32 dk_accum/dv_accum, and
    # softmax_lse_log2 beside softmax_d
    k = model.num_kv_heads
    fa3 = estimate_memory(model, Cluster(accelerator("h100-80gb"), gpus_per_node=1), setup,
                          Workload(seq_len=131072, attention="flash3"))
    flash3 = tokens * (2 * e * a * d + 2 * e * k * d + 4 * a * d + 8 * k * d + 8 * a)
    assert fa3.phase_terms["backward_recompute"]["recompute_layer_backward"] == max(flash3 - norm2, tiled, norm_backward)
    assert flash3 < flash  # GQA: 8 KV heads in fp32 hold less than 32 expanded in bf16
    # on CPU ranks the flash moment is not added (torch's CPU kernel differs; the measured CPU rows are the oracle)
    cpu = estimate_memory(model, Cluster(accelerator("cpu"), gpus_per_node=1), setup, w)
    assert cpu.phase_terms["backward_recompute"].get("recompute_layer_backward", 0) == max(
        cpu.phase_terms["backward"].get("tiled_mlp_backward", 0), norm_backward)


@pytest.mark.parametrize("norm", ["LlamaRMSNorm", "GemmaRMSNorm"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_an_rmsnorms_backward_peaks_at_the_bytes_the_model_prices(norm, dtype):
    """memory.RMSNORM_BACKWARD_PEAK_BYTES, measured: transformers' RMSNorm on 4096 x 2048 elements, its backward's peak
    of live tensor bytes (its saved tensors, its output, the incoming gradient, autograd's fp32 temporaries) per
    element, counted by zerokit's meter; the input is the caller's."""
    import torch
    from transformers.models.gemma import modeling_gemma
    from transformers.models.llama import modeling_llama

    from zerokit.estimate.memory import RMSNORM_BACKWARD_PEAK_BYTES
    from zerokit.measure.meter import MemoryMeter

    cls = getattr(modeling_llama if norm.startswith("Llama") else modeling_gemma, norm)
    rows, h = 4096, 2048
    layer = cls(h).to(getattr(torch, dtype))
    x = torch.randn(1, rows, h, dtype=getattr(torch, dtype), requires_grad=True)
    meter = MemoryMeter("cpu").start()
    y = layer(x)
    with meter.phase("backward"):
        y.backward(torch.ones_like(y))
    meter.stop()
    peak = meter.summary()["phases"]["backward"]["peak_bytes"]
    assert abs(peak / (rows * h) - RMSNORM_BACKWARD_PEAK_BYTES) < 0.01


def _measured_steps(cfg, seq: int, steps: dict) -> tuple[dict, dict]:
    """For each of `steps` (name -> step(model, ids), which runs forward and backward and returns the loss): a fresh
    transformers Llama from `cfg` (seed 0) on one sequence of `seq` random tokens, fp32 on CPU, its peak live tensor bytes
    (zerokit.measure.meter) and its loss."""
    import torch
    from transformers import LlamaForCausalLM

    from zerokit.measure.meter import MemoryMeter

    peaks, losses = {}, {}
    for name, step in steps.items():
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg)
        ids = torch.randint(0, cfg.vocab_size, (1, seq), generator=torch.Generator().manual_seed(1))
        with MemoryMeter("cpu") as meter:
            loss = step(model, ids)
        peaks[name], losses[name] = meter.peak_bytes(), loss.item()
    return peaks, losses


def test_reentrant_checkpointing_holds_the_recomputed_output_measured(tmp_path):
    """transformers' own Llama layers, checkpointed with use_reentrant=True and False, fp32 on CPU: the measured peak
    (live tensor bytes, zerokit.measure.meter) is one tokens x h tensor higher reentrant, at the recomputed layer, and
    zerokit's recompute phase is higher by exactly that (memory.recompute_backward_terms); nothing else moves."""
    from transformers import LlamaConfig

    seq, h = 2048, 128
    # a small vocabulary, so that the recomputed layer (not the logits) is the peak
    cfg = LlamaConfig(hidden_size=h, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=32, max_position_embeddings=seq)

    def step(model, ids, reentrant):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss

    peaks, losses = _measured_steps(cfg, seq, {r: functools.partial(step, reentrant=r) for r in (False, True)})
    assert losses[True] == losses[False]
    one_hidden = seq * h * 4
    measured = peaks[True] - peaks[False]
    assert abs(measured - one_hidden) <= 0.01 * one_hidden, (measured, one_hidden)

    cfg.save_pretrained(tmp_path)
    spec = load_model_spec(str(tmp_path))
    setup = ZeroSetup(zero_stage=0, precision="fp32", activation_checkpointing=True)
    cpu = Cluster(accelerator("cpu"), gpus_per_node=1)
    est = {r: estimate_memory(spec, cpu, setup, Workload(seq_len=seq, checkpoint_reentrant=r)) for r in (False, True)}
    assert est[True].peak_phase == est[False].peak_phase == "backward_recompute"
    assert est[True].per_gpu_total - est[False].per_gpu_total == one_hidden
    assert {k: v for k, v in est[True].per_gpu.items() if k != "reentrant_recompute_output"} == est[False].per_gpu


def test_a_loop_that_keeps_only_the_loss_frees_the_logits_measured(tmp_path):
    """transformers' Llama, fp32 on CPU, one forward and backward kept as zerokit's loop keeps it (`out`, then
    out.loss.backward()) and as the HF Trainer does (Trainer.training_step: compute_loss returns the loss alone, the
    outputs gone before backward): the measured peak (live tensor bytes) differs by the logits, tokens x vocab x 4
    bytes, and so does zerokit's estimate with Workload.outputs_held off (`--training-loop trainer`)."""
    from transformers import LlamaConfig

    seq, vocab = 512, 2048
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=seq)

    def held(model, ids):  # zerokit's loop: the outputs alive through backward
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.loss

    def loss_only(model, ids):  # the Trainer's: the outputs gone before backward
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss

    peaks, losses = _measured_steps(cfg, seq, {True: held, False: loss_only})
    assert losses[True] == losses[False]
    logits = seq * vocab * 4
    measured = peaks[True] - peaks[False]
    assert abs(measured - logits) <= 0.01 * logits, (measured, logits)

    cfg.save_pretrained(tmp_path)
    spec = load_model_spec(str(tmp_path))
    setup = ZeroSetup(zero_stage=0, precision="fp32")
    cpu = Cluster(accelerator("cpu"), gpus_per_node=1)
    est = {h: estimate_memory(spec, cpu, setup, Workload(seq_len=seq, outputs_held=h)) for h in (True, False)}
    assert est[True].peak_phase == est[False].peak_phase == "backward"
    assert est[True].per_gpu_total - est[False].per_gpu_total == logits
    assert "logits_output" not in est[False].phase_terms["step"]


def test_the_ulysses_attention_probe_runs_and_prices_what_the_kernel_keeps():
    """bench/ulysses_attention_probe.py (run on a lent GPU by bench/gpu_lend.sh) on CPU at 1,024 tokens: one rank's
    attention after the all-to-all, forward and backward through transformers' sdpa integration. With one query and one
    KV head (so that HF's transpose of the output copies nothing) the forward keeps what zerokit prices, the output and
    a fp32 log-sum-exp, to the byte; the backward's buffers are FlashAttention's on a GPU only, so on CPU the probe only
    has to measure them."""
    r = _bench("ulysses_attention_probe").probe(1024, 1, 1, d=64, device="cpu")
    assert r["kept_bytes"] == r["kept_priced_bytes"] == 1024 * (4 * 64 + 4)
    assert r["peak_bytes"] > r["kept_bytes"] and r["peak_priced_bytes"] > r["kept_priced_bytes"]


def test_reentrant_checkpointing_in_plan_text_and_json(capsys):
    base = ["plan", "llama-3.1-8b", "--gpu", "h100-80gb", "--seq-len", "65536", "--stage", "3", "--offload-optimizer",
            "cpu", "--offload-param", "cpu", "--activation-checkpointing", "on", "--micro-batch", "1", "--tiled-loss", "on"]
    rc, out, _ = run([*base, "--checkpoint-reentrant", "on"], capsys)
    assert "reentrant checkpointing" in out and "recomputed layer's output (reentrant)" in out
    rc, out, _ = run([*base, "--checkpoint-reentrant", "on", "--json"], capsys)
    d = json.loads(out)
    assert d["workload"]["checkpoint_reentrant"] is True
    assert d["memory"]["peak_phase"] == "backward_recompute"
    assert d["memory"]["per_gpu"]["terms"]["reentrant_recompute_output"] == 65536 * 4096 * 2
    rc, out, _ = run([*base, "--json"], capsys)
    assert json.loads(out)["workload"]["checkpoint_reentrant"] is False
    assert json.loads(out)["workload"]["outputs_held"] is True
    # --training-loop trainer: the loop keeps only the loss (the tiled loss holds no logits anyway: priced the same)
    rc, out, _ = run([*base, "--training-loop", "trainer"], capsys)
    assert "a loop that keeps only the loss (HF Trainer)" in out
    rc, out, _ = run([*base, "--training-loop", "trainer", "--json"], capsys)
    assert json.loads(out)["workload"]["outputs_held"] is False


def test_reentrant_offload_sends_every_layer_input_to_the_host():
    """ArcticTraining's CheckpointFunctionWithCPUOffload (reentrant): every layer's input goes to the host in forward, the
    last one too, and one comes back for its recompute; DeepSpeed's CheckpointHiddenStatesOffload (non-reentrant) keeps
    the newest on the GPU beside the restored one. The reentrant one adds the recomputed output instead."""

    model = load_model_spec("llama-3.1-8b")
    setup = ZeroSetup(zero_stage=3, offload_optimizer="cpu", activation_checkpointing=True, checkpoint_offload=True,
                      tiled_mlp=True, sequence_parallel=8)
    est, moved = {}, {}
    for r in (False, True):
        w = Workload(seq_len=1 << 20, checkpoint_reentrant=r)
        est[r] = estimate_memory(model, H100x8, setup, w).phase_terms["backward_recompute"]
        moved[r] = checkpoint_offload_bytes(model, setup, w)
    layer_input = (1 << 20) // 8 * model.hidden_size * 2
    assert est[False]["activations_checkpoints"] == 2 * layer_input
    assert est[True]["activations_checkpoints"] == layer_input
    assert est[True]["reentrant_recompute_output"] == layer_input and "reentrant_recompute_output" not in est[False]
    assert (moved[False], moved[True]) == ((model.num_layers - 1) * layer_input, model.num_layers * layer_input)


# ------------------------------------------------------------------------------ accelerate / TRL ALST configs in check

# TRL's examples/accelerate_configs/alst_ulysses_4gpu.yaml (its documentation, "Ulysses" section)
TRL_ALST_YAML = """compute_environment: LOCAL_MACHINE
debug: false
deepspeed_config:
  zero_stage: 3
  seq_parallel_communication_data_type: bf16
distributed_type: DEEPSPEED
mixed_precision: bf16
num_machines: 1
num_processes: 4
parallelism_config:
  parallelism_config_dp_replicate_size: 1
  parallelism_config_dp_shard_size: 2
  parallelism_config_tp_size: 1
  parallelism_config_sp_size: 2
  parallelism_config_sp_backend: deepspeed
  parallelism_config_sp_seq_length_is_variable: true
  parallelism_config_sp_attn_implementation: flash_attention_2
"""


def test_check_reads_trls_alst_accelerate_config(tmp_path, capsys):
    (tmp_path / "alst.yaml").write_text(TRL_ALST_YAML)
    rc, out, err = run(["check", str(tmp_path / "alst.yaml"), "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                        "--seq-len", "32768", "--activation-checkpointing", "on", "--micro-batch", "1", "--json"],
                       capsys)
    assert rc == 0, err
    d = json.loads(out)
    assert d["world_size"] == 4  # num_processes
    assert d["parallelism"] == {"data_parallel": 2, "tensor_parallel": 1, "sequence_parallel": 2,
                                "hpz_partition_size": 1, "pipeline_parallel": 1}
    setup = d["evaluation"]["setup"]
    assert setup["zero_stage"] == 3 and setup["precision"] == "bf16" and setup["sequence_parallel"] == 2
    assert not any(f["key"] == "sequence_parallel_size" for f in d["findings"])  # accelerate registers Ulysses

    # its seq_parallel_communication_data_type is not an option of `accelerate launch`: dropped, and said so
    ignored = [f for f in d["findings"] if f["key"].startswith("deepspeed_config.")]
    assert [f["key"] for f in ignored] == ["deepspeed_config.seq_parallel_communication_data_type"]
    assert ignored[0]["level"] == "warning" and "not an option accelerate reads" in ignored[0]["message"]


def test_nested_offload_in_an_accelerate_config_keeps_the_optimizer_on_the_gpu(tmp_path, capsys):
    """The HF Ulysses blog's "Best Practices" YAML nests DeepSpeed's `offload_optimizer: {device: cpu}` under
    deepspeed_config; accelerate reads `offload_optimizer_device` only (accelerate launch copies each key onto its
    parsed arguments and reads its own options): the optimizer stays on the GPU. check says so and prices it so."""
    base = TRL_ALST_YAML.replace("  seq_parallel_communication_data_type: bf16\n", "")
    nested = base.replace("  zero_stage: 3\n", "  zero_stage: 3\n  offload_optimizer:\n    device: cpu\n")
    flat = base.replace("  zero_stage: 3\n", "  zero_stage: 3\n  offload_optimizer_device: cpu\n")
    got = {}
    for name, text in (("nested", nested), ("flat", flat)):
        (tmp_path / f"{name}.yaml").write_text(text)
        rc, out, err = run(["check", str(tmp_path / f"{name}.yaml"), "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                            "--seq-len", "8192", "--activation-checkpointing", "on", "--micro-batch", "1", "--json"],
                           capsys)
        assert rc in (0, 1), err
        got[name] = json.loads(out)
    warned = [f for f in got["nested"]["findings"] if f["key"] == "deepspeed_config.offload_optimizer"]
    assert len(warned) == 1 and "offload_optimizer_device: cpu" in warned[0]["message"]
    assert not any(f["key"].startswith("deepspeed_config.") for f in got["flat"]["findings"])
    assert got["nested"]["evaluation"]["setup"]["offload_optimizer"] == "none"
    assert got["flat"]["evaluation"]["setup"]["offload_optimizer"] == "cpu"
    on_gpu = {k: got[k]["evaluation"]["memory"]["per_gpu"]["terms"].get("optimizer_states", 0) for k in got}
    assert on_gpu["nested"] > 0 and on_gpu["flat"] == 0, on_gpu


def test_check_reads_the_ds_config_file_an_accelerate_config_names(tmp_path, capsys):
    (tmp_path / "ds.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                                                  "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}))
    (tmp_path / "acc.yaml").write_text("distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n"
                                       "num_machines: 1\nnum_processes: 8\nparallelism_config:\n"
                                       "  parallelism_config_sp_size: 8\n  parallelism_config_sp_backend: deepspeed\n")
    rc, out, err = run(["check", str(tmp_path / "acc.yaml"), "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                        "--seq-len", "max", "--activation-checkpointing", "on", "--tiled-loss", "on", "--json"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    assert d["world_size"] == 8 and d["parallelism"]["sequence_parallel"] == 8
    assert d["evaluation"]["setup"]["zero_stage"] == 2 and d["workload"]["max_seq_len"] % 8 == 0


@pytest.mark.parametrize("yaml_text, needle", [
    (TRL_ALST_YAML.replace("sp_backend: deepspeed", "sp_backend: torch"), "sp_backend: deepspeed"),
    (TRL_ALST_YAML.replace("dp_shard_size: 2", "dp_shard_size: 3"), "num_processes is 4"),
    (TRL_ALST_YAML.replace("DEEPSPEED", "FSDP"), "distributed_type"),
    ("deepspeed_config: [1]\ndistributed_type: DEEPSPEED\n", "not a mapping"),
])
def test_bad_accelerate_configs_are_one_line(tmp_path, capsys, yaml_text, needle):
    (tmp_path / "a.yaml").write_text(yaml_text)
    rc, out, err = run(["check", str(tmp_path / "a.yaml"), "--model", "llama-3.1-8b", "--gpu", "h100-80gb"], capsys)
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1 and out == ""


def test_ulysses_across_whole_nodes_is_planned_over_the_nodes_links(capsys):
    # ALST (arXiv 2506.13996) trains Llama-3.1-8B with SP 32 over 4 nodes of 8 H100: a pinned SP degree that spans
    # whole nodes is planned; its all-to-alls are priced at the link between nodes, not NVLink
    from zerokit.estimate.timing import link_bandwidth, model_parallel_bytes

    spec = load_model_spec("llama-3.1-8b")
    four = Cluster(accelerator=accelerator("h100-80gb"), gpus_per_node=8, nodes=4)
    w = Workload(seq_len=32768 * 32)
    setup = ZeroSetup(zero_stage=3, sequence_parallel=32, activation_checkpointing=True, tiled_loss=True,
                      tiled_mlp=True, offload_optimizer="cpu")
    one_node = ZeroSetup(**{**setup.__dict__, "sequence_parallel": 8})
    across = estimate_time(spec, four, setup, w)
    inside = estimate_time(spec, four, one_node, w)
    mp = model_parallel_bytes(spec, setup, w.seq_len)
    # an all-to-all across nodes: every rank sends off-node at the catalog's H100 share of a node's NICs
    assert link_bandwidth(four, ring=False) == 50e9
    assert across.communication_seconds >= mp / link_bandwidth(four, ring=False)
    assert across.communication_seconds > inside.communication_seconds
    base = ["plan", "llama-3.1-8b", "--gpu", "h100-80gb", "--gpus-per-node", "8", "--nodes", "4", "--seq-len",
            "1048576", "--stage", "3", "--micro-batch", "1", "--json"]
    assert main([*base, "--sequence-parallel", "32"]) in (0, 1)
    assert json.loads(capsys.readouterr().out)["choice"]["sequence_parallel"] == 32
    # neither a divisor of a node nor whole nodes: one line naming both fixes
    assert main([*base, "--sequence-parallel", "12"]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("warning:")]
    assert len(err) == 1 and "--sequence-parallel 12 neither divides the 8 GPUs of a node nor spans whole nodes" in err[0]


# ------------------------------------------------------------------------------------------ ALST's published lengths
def _alst_rows():
    """bench/alst_max_seq.py (its ROWS parametrize the tests below and its `longest` runs them)."""
    return _bench("alst_max_seq")


def _alst_params():
    return [pytest.param(i, id=r[0]) for i, r in enumerate(_alst_rows().ROWS)]


@functools.cache
def _alst_longest(row: int) -> tuple[int | None, str, str]:
    label, model, gpu, gpn, nodes, pins, *_ = _alst_rows().ROWS[row]
    return _alst_rows().longest(model, gpu, gpn, nodes, pins)


@functools.cache
def _alst_memory_alone(row: int) -> int | None:
    """The memory model's own answer where the row's liger-kernel release capped zerokit's, else None."""
    label, model, gpu, gpn, nodes, pins, *_ = _alst_rows().ROWS[row]
    got, _, binds = _alst_longest(row)
    return _alst_rows().memory_alone(model, gpu, gpn, nodes, pins, got, binds)


@pytest.mark.parametrize("row", _alst_params())
def test_alst_setups_plan_and_their_maxima_are_within_15_percent(row):
    """Every setup bench/alst_max_seq.py copies from the ALST paper and ArcticTraining's recipes plans without a refusal
    (`plan --seq-len max`, its pins); where the paper gives a maximum (arXiv 2506.13996's abstract, the blog's 32K
    baseline) or a recipe's note puts the GPU at the edge of its memory ("ok 136.15 GB" on an H200, "close to oom"),
    zerokit's longest sequence is within 15% of it (issue 28's target); a length that only ran is planned (ratio >= 1).
    bench/results/alst_max_seq.txt reports them all."""
    bench = _alst_rows()
    label, model, gpu, gpn, nodes, pins, published, kind, _ = bench.ROWS[row]
    got, why, _ = _alst_longest(row)
    assert got is not None, why
    if kind == "ran":
        assert got >= published, (label, got, published)
    else:
        assert abs(got / published - 1) <= 0.15, (label, got, published)


# The Ulysses maxima of Llama-3.1-8B (arXiv 2506.13996: 3.7M on 8 H100s, 15M on 32; the SP 16 recipe's 8M "close to
# oom") sit 5-12% under the cap of the liger-kernel they ran (0.5.x: 524,288 tokens a rank), where zerokit's answer
# stops. The memory model alone answers 1.24-1.37x of them, while the same setups without Ulysses are within 11%: either
# the runs stopped at the cap, or something Ulysses holds on a GPU is not priced (on CPU ranks zerokit prices what
# Ulysses adds within 2 hidden sizes per token, bench/results/accuracy_cpu_long_sp.txt). Nothing published says which
# (docs/long-context.md). Strict: the test fails when a change brings one within 15%, so that this list is cut then.
MEMORY_ALONE_MISSES = {"Llama-3.1-8B, 8 x H100, ALST SP 8 (ckpt offload)", "Llama-3.1-8B, 16 x H100 (2 nodes), ALST SP 16",
                       "Llama-3.1-8B, 32 x H100 (4 nodes), ALST SP 32"}


@pytest.mark.parametrize("row", [
    pytest.param(i, id=r[0], marks=[pytest.mark.xfail(strict=True, reason="unpriced Ulysses memory, or Liger's cap")]
                 if r[0] in MEMORY_ALONE_MISSES else [])
    for i, r in enumerate(_alst_rows().ROWS) if r[7] != "ran" and "--sequence-parallel" in r[5]])
def test_the_memory_model_alone_at_the_published_maxima(row):
    """Where the row's liger-kernel release caps zerokit's answer, the memory model's own answer (the int64 kernels)
    against the published maximum: within 15% but for MEMORY_ALONE_MISSES."""
    label, *_, published, kind, _ = _alst_rows().ROWS[row]
    got = _alst_memory_alone(row) or _alst_longest(row)[0]
    assert abs(got / published - 1) <= 0.15, (label, got, published)


def test_the_likely_range_is_what_the_published_maxima_give():
    """zerokit/data/seq_len_range.json, which gives a `--seq-len max` answer on a GPU its likely range, is what
    bench/alst_max_seq.py --write-range computes from zerokit's longest sequences today: a change to the memory model
    that moves them fails here until the range is written again."""
    bench = _alst_rows()
    results = [(row, _alst_longest(i)[0], _alst_memory_alone(i)) for i, row in enumerate(bench.ROWS)]
    want, committed = bench.seq_len_ranges(results), _seq_len_ranges()
    for key in ("ulysses", "one_sequence_per_rank"):
        assert committed[key] == want[key], (key, committed[key], want[key], bench.RANGE_COMMAND)
    assert want["ulysses"]["maxima"] >= 4 and want["one_sequence_per_rank"]["maxima"] >= 6


# measured with torch 2.4, which ALST's README found less memory-efficient than the torch 2.8 nightly of the other runs
OLD_TORCH = {"Qwen3-32B, 32 x H100, ALST SP 32"}


@pytest.mark.parametrize("row", [pytest.param(i, id=r[0], marks=[pytest.mark.xfail(strict=True, reason="torch 2.4")]
                                              if r[0] in OLD_TORCH else [])
                                 for i, r in enumerate(_alst_rows().PEAKS)])
def test_memory_at_the_recipes_lengths_is_what_they_noted(row):
    """ArcticTraining's recipes note the memory a run took at their length (GB = bytes / 2**30, its see_memory_usage;
    "NV": nvidia-smi's): zerokit's nvidia-smi estimate at that length is within 10% of it, on one GPU with Liger's
    kernels and without, and over 32 and 64 GPUs with Ulysses (bench/results/alst_max_seq.txt)."""
    bench = _alst_rows()
    label, model, gpu, gpn, nodes, pins, tokens, noted, _ = bench.PEAKS[row]
    _, smi = bench.peak_at(model, gpu, pins, tokens, gpn, nodes)
    assert abs(smi / noted - 1) <= 0.10, (label, smi, noted)


# The HF Ulysses blog (huggingface/blog ulysses-sp.md), planned as its text states the setup, with the optimizer where the
# only YAML it shows leaves it (on the GPUs: accelerate does not read its nested offload_optimizer key); its "GB" read as
# DeepSpeed's see_memory_usage prints GB (bytes / 2**30). docs/long-context.md, "The HF Ulysses blog's peak memory",
# says which figure informed which reading.


@functools.cache
def _blog_peak(gpus: int, seq: int) -> tuple[float, bool, float]:
    return _alst_rows().blog_peak(gpus, seq)


def test_hf_ulysses_blog_lengths_fit_and_128k_does_not():
    """Every SP 4 length the blog ran fits in zerokit's plan and 128K, out of memory in the blog, does not; the one-GPU
    baseline ("76.4 GB, near H100 limit") is priced inside the GPU's memory, past the planner's 95% budget."""
    bench = _alst_rows()
    for _, gpus, seq, _ in bench.BLOG_ROWS:
        smi, fits, alloc = _blog_peak(gpus, seq)
        if gpus == 1:
            assert not fits and alloc <= accelerator("h100-80gb").memory_bytes / 2**30, (smi, alloc)
        else:
            assert fits is (seq < 131_072), (gpus, seq)


@pytest.mark.parametrize("row", range(len(_alst_rows().BLOG_ROWS)), ids=[f"{r[0]} {r[2]}" for r in _alst_rows().BLOG_ROWS])
def test_hf_ulysses_blog_peak_memory_within_15_percent(row):
    """The same table's peak memory per rank (and the "~81 GB" 128K would need): zerokit's nvidia-smi estimate is
    within 15% of it."""
    _, gpus, seq, gib = _alst_rows().BLOG_ROWS[row]
    smi, _, _ = _blog_peak(gpus, seq)
    assert abs(smi / gib - 1) <= 0.15, (gpus, seq, smi, gib)


def _zero3_launch(tmp_path, ranks: int, seq: int, flags: list[str], explain: bool = False):
    """A real ZeRO-3 bf16 launch on `ranks` CPU ranks of 2 Llama layers (h 1024, 8/2 heads) at `seq` tokens with
    `flags`. Returns (the second step's record on rank 0, the plan's memory estimate of the setup the launch ran, that
    setup)."""
    import os
    import subprocess
    import sys

    from zerokit.report.run_dir import launch_record
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.model import load_model_spec

    repo = Path(__file__).resolve().parents[1]
    cfg = json.loads((repo / "bench" / "accuracy" / "models" / "gpu-1b" / "config.json").read_text())
    cfg.update(num_hidden_layers=2, hidden_size=1024, intermediate_size=2816, num_attention_heads=8,
               num_key_value_heads=2, max_position_embeddings=seq)
    (tmp_path / "model").mkdir(parents=True)
    (tmp_path / "model" / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "data.txt").write_text((repo / "zerokit" / "data" / "corpus" / "tiny_corpus.txt").read_text() * 3)
    flags = ["--stage", "3", "--precision", "bf16", "--micro-batch", "1", "--grad-accum", "1", *flags]
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, 2 // ranks)), ZEROKIT_MEMORY_STEPS="2",
               ZEROKIT_METER_EXPLAIN="1" if explain else "",
               PYTHONPATH=os.pathsep.join(x for x in (str(repo), os.environ.get("PYTHONPATH", "")) if x))
    p = subprocess.run([sys.executable, "-m", "zerokit", "launch", "--model", str(tmp_path / "model"), "--gpu", "cpu",
                        "--gpus-per-node", str(ranks), "--plan", "--seq-len", str(seq), *flags, "--steps", "2",
                        "--data", str(tmp_path / "data.txt"), "--output-dir", str(tmp_path / "run"), "--no-save",
                        "--no-report"], capture_output=True, text=True, cwd=str(repo), env=env, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics" / "rank0.jsonl").read_text().splitlines() if x.strip()]
    step = [r for r in recs if r.get("event") == "step"][-1]
    setup = ZeroSetup(**launch_record(tmp_path / "run")["setup"])  # what the launch planned and ran
    est = estimate_memory(load_model_spec(str(tmp_path / "model")), build_cluster(gpu="cpu", gpus_per_node=ranks),
                          setup, Workload(seq_len=seq))
    return step, est, setup


def _tiled_zero3_launch(tmp_path, ranks: int, seq: int, flags: tuple[str, ...] = (), explain: bool = False):
    """_zero3_launch of ALST's recipe (Ulysses SP = ranks, checkpoint offload, tiled loss, TiledMLP). Returns (the
    meter's per-phase peaks of the second step on rank 0, the plan's memory estimate, that step's record)."""
    step, est, setup = _zero3_launch(tmp_path, ranks, seq, ["--activation-checkpointing", "offload", "--tiled-loss",
                                                            "on", "--tiled-mlp", "on", "--sequence-parallel", str(ranks),
                                                            *flags], explain)
    assert setup.zero_stage == 3 and setup.checkpoint_offload and setup.tiled_mlp and setup.tiled_loss
    assert setup.sequence_parallel == ranks
    phases = {k: v["peak_bytes"] for k, v in step["phases"].items()}
    return phases, est, step


@pytest.mark.slow
def test_a_zero3_launch_with_tiled_mlp_peaks_in_backward_where_the_plan_says(tmp_path):
    """One rank at 8K tokens, where the recomputed layer's backward sets the backward peak. The meter's backward
    peak of the second step (the optimizer states exist) is within 4% over the plan's recompute phase; the plan
    without the second norm's backward (memory.RMSNORM_BACKWARD_PEAK_BYTES) was 4% and more under. The step's peak
    (the tiled loss's slices, in forward) is within 3% over the plan's peak; with the slice's 16-bit logits counted
    as held (memory.activation_terms) it was 9% over."""
    phases, est, _ = _tiled_zero3_launch(tmp_path, 1, 8192)
    measured = phases["backward"]
    phase = est.phase_terms["backward_recompute"]
    planned = sum(phase.values())
    without = planned - phase["recompute_layer_backward"] + est.phase_terms["backward"].get("tiled_mlp_backward", 0)
    assert 0 <= (planned - measured) / measured <= 0.04, (planned, measured)
    assert (without - measured) / measured <= -0.04, (without, measured)
    assert 0 <= (est.per_gpu_total - max(phases.values())) / max(phases.values()) <= 0.03, (est.per_gpu_total, phases)


@pytest.mark.slow
def test_ulysses_with_checkpoint_offload_and_tiling_peaks_where_the_plan_says(tmp_path):
    """ALST's recipe on 2 CPU ranks: Ulysses SP 2 at 16K tokens (8K a rank), checkpoint offload, tiled loss, TiledMLP,
    ZeRO-3. The step's peak per rank (the tiled loss's slices) is within 3% over the plan's; the backward phase (the
    recomputed layer, Ulysses' all-to-all) within 3% either way (measured 1.7% over the plan's recompute phase)."""
    phases, est, _ = _tiled_zero3_launch(tmp_path, 2, 16384)
    assert 0 <= (est.per_gpu_total - max(phases.values())) / max(phases.values()) <= 0.03, (est.per_gpu_total, phases)
    recompute = sum(est.phase_terms["backward_recompute"].values())
    assert abs(recompute - phases["backward"]) / phases["backward"] <= 0.03, (recompute, phases)


@pytest.mark.slow
def test_ulysses_reduces_the_head_in_fp32_where_the_plan_says(tmp_path):
    """Under Ulysses the engine reduces in seq_parallel_communication_data_type (fp32 by default), so ZeRO-3 casts the
    untied head's gradient (32,000 x 1,024, made in forward by the tiled loss) to an fp32 copy when backward's first
    hook reduces it, and on CPU ranks gloo's reduce_scatter copies that again. SP 2 at 2,048 tokens, where that moment
    is backward's peak: the meter's explain mode names both copies (stage3.py __avg_scatter_grads, reduce_scatter);
    the plan's backward_reduce phase is within 1% of the measured peak (measured 1,169.1 MiB, planned 1,168.4),
    without the copies 20% under. With --seq-parallel-comm-dtype bf16 the rendered config keeps the gradient in bf16:
    the measured peak falls by what the plan drops (the cast, and half of gloo's copy: 187.5 MiB), within 5%."""
    vh = 32000 * 1024
    phases, est, step = _tiled_zero3_launch(tmp_path / "fp32", 2, 2048, explain=True)
    planned = est.phase_terms["backward_reduce"]
    assert planned["reduce_comm_cast"] == 4 * vh and planned["reduce_scatter_gloo_copy"] == 4 * vh
    assert abs(sum(planned.values()) - phases["backward"]) / phases["backward"] <= 0.01, (planned, phases)
    without = sum(planned.values()) - planned["reduce_comm_cast"] - planned["reduce_scatter_gloo_copy"]
    assert (without - phases["backward"]) / phases["backward"] <= -0.15
    live = step["phases"]["backward"]["peak_tensors"]
    assert any(t["bytes"] == 4 * vh and "__avg_scatter_grads" in t["origin"] for t in live), live
    assert any(t["bytes"] == 4 * vh and "reduce_scatter" in t["origin"] for t in live), live

    phases16, est16, _ = _tiled_zero3_launch(tmp_path / "bf16", 2, 2048, ("--seq-parallel-comm-dtype", "bf16"))
    assert json.loads((tmp_path / "bf16" / "run" / "ds_config.json").read_text())[
        "seq_parallel_communication_data_type"] == "bf16"
    drop = phases["backward"] - phases16["backward"]
    planned_drop = est.phases["backward_reduce"] - est16.phases["backward_reduce"]
    assert planned_drop == 4 * vh + 2 * vh
    assert abs(drop - planned_drop) / planned_drop <= 0.05, (drop, planned_drop)


@pytest.mark.slow
def test_without_sequence_parallelism_the_head_reduces_after_its_weight_is_released(tmp_path):
    """Data parallelism on 2 CPU ranks, 64 tokens, checkpointing, the HF loss (no tiling): the head's gradient is made
    in backward, after the logits' gradient, and reduced once the head's module has released its gathered weight; in
    bf16, so no cast, and gloo's copy of it. The plan's backward_reduce is within 1% of the measured backward peak; the
    start of backward alone was 4.5% under it (measured 913.3 MiB, planned 871.9)."""
    step, est, _ = _zero3_launch(tmp_path, 2, 64, ["--activation-checkpointing", "on"])
    measured = step["phases"]["backward"]["peak_bytes"]
    planned = est.phase_terms["backward_reduce"]
    assert "reduce_comm_cast" not in planned and planned["reduce_scatter_gloo_copy"] == 2 * 32000 * 1024
    assert abs(sum(planned.values()) - measured) / measured <= 0.01, (planned, measured)
    assert (est.phases["backward"] - measured) / measured <= -0.03
