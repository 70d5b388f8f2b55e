"""Activation-checkpoint offload (`--activation-checkpointing offload`, issue 28): the mechanism, the plan and the
real run.

Oracles: DeepSpeed's CheckpointHiddenStatesOffload stats (every checkpointed layer input but the newest one goes
through the pack hook's copy to a host buffer and comes back through the unpack hook), and the losses and gradients of
the same step without offload (the copies are exact, so equal to the bit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _tiny_llama(seed: int = 0):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = AutoConfig.from_pretrained(str(REPO / "zerokit" / "data" / "models" / "tiny-llama"))
    model = AutoModelForCausalLM.from_config(cfg)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model, cfg


def _stock_on_cpu():
    """DeepSpeed 0.19.8's own CheckpointHiddenStatesOffload on a CPU rank: only its CPU skip dropped (as zerokit's CPU
    rank drops it), no pinning, no streams; its id()-keyed marks and cached restores as they ship."""
    import torch
    from deepspeed.runtime.activation_checkpointing.offload_activations import CheckpointHiddenStatesOffload

    class StockOnCpu(CheckpointHiddenStatesOffload):
        def _should_skip(self, tensor):
            return self._num_bytes(tensor) < self.min_offload_bytes or isinstance(tensor, torch.nn.Parameter)

    return StockOnCpu(use_pin_memory=False, use_streams=False)


def _step(model, ids, ctx):
    with ctx:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


def test_offload_moves_the_layer_inputs_out_and_back_with_equal_losses():
    pytest.importorskip("deepspeed")
    import contextlib

    import torch

    from zerokit.launching.ckpt_offload import offload_context

    model, cfg = _tiny_llama()
    ids = torch.randint(0, cfg.vocab_size, (2, 64))
    plain_loss, plain_grads = _step(model, ids, contextlib.nullcontext())
    ctx = offload_context(on_accelerator=False)
    layers = cfg.num_hidden_layers
    per_layer = 2 * 64 * cfg.hidden_size * 4  # batch x seq x hidden, fp32
    for _ in range(2):  # one context for the run, entered per micro batch (the loop's use): the same every time
        loss, grads = _step(model, ids, ctx)
        assert ctx.stats.marked_tensors == layers  # each decoder layer's input hidden states
        assert ctx.stats.offloaded_tensors == layers - 1  # the newest stays (keep_last_count=1)
        assert ctx.stats.restored_tensors == layers - 1  # ... and every offloaded one came back for its recompute
        assert ctx.stats.offloaded_bytes == ctx.stats.restored_bytes == (layers - 1) * per_layer
        assert ctx._cpu_buffer_pool_count == layers - 1  # the host buffers wait in the pool for the next micro batch
        assert loss == plain_loss
        assert grads.keys() == plain_grads.keys()
        for name, g in grads.items():
            assert torch.equal(g, plain_grads[name]), name


def test_each_input_comes_back_once_so_backward_does_not_hold_them_all():
    """DeepSpeed 0.19.8's unpack hook restores with cache=True: every restored layer input stays alive until the
    context exits, so by the end of backward all of them are back (on an H200, gpu-1b's 22 layers at 64K-256K tokens
    peaked at the plan plus 20 layer inputs: bench/results/accuracy_gpu_long_20261128_1816.txt). zerokit's context
    restores each for one use. Measured here with zerokit's live-tensor meter on a CPU rank, 8 layers: DeepSpeed's
    stock hook (only its CPU skip dropped, as zerokit's CPU rank drops it) peaks in backward 7 layer inputs above
    zerokit's, to the byte, and the losses and gradients are equal."""
    pytest.importorskip("deepspeed")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from zerokit.launching.ckpt_offload import offload_context
    from zerokit.measure.meter import MemoryMeter

    layers, hidden, seq = 8, 256, 1024
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                                         num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
                                         max_position_embeddings=seq))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids = torch.randint(0, 128, (1, seq))
    peaks, results = {}, {}
    for name, ctx in (("stock", _stock_on_cpu()),
                      ("zerokit", offload_context(on_accelerator=False))):
        meter = MemoryMeter("cpu").start()
        with ctx:
            with meter.phase("forward"):
                loss = model(input_ids=ids, labels=ids).loss
            with meter.phase("backward"):
                loss.backward()
            held = len(ctx._restored)  # restored inputs still referenced when backward has finished
        meter.stop()
        peaks[name] = meter.summary()["phases"]["backward"]["peak_bytes"]
        results[name] = (float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters()}, held)
        model.zero_grad(set_to_none=True)
    per_layer = seq * hidden * 4  # one layer input, fp32
    assert peaks["stock"] - peaks["zerokit"] == (layers - 1) * per_layer
    assert results["stock"][2] == layers and results["zerokit"][2] == 0
    assert results["stock"][0] == results["zerokit"][0]
    for n, g in results["stock"][1].items():
        assert torch.equal(g, results["zerokit"][1][n]), n


def test_a_hook_that_hands_forward_a_new_tensor_keeps_the_offload():
    """transformers 5.23 checkpoints a layer's forward, after its module hooks; ZeRO-3's forward pre-hook hands forward
    a new tensor object over the same memory (PostBackwardFunctionModule). DeepSpeed's marks are keyed by id(), so its
    stock context offloads nothing there (a real ZeRO-3 CPU launch: 2 marked, 0 offloaded); zerokit's marks follow
    the memory. Here a pre-hook on every decoder layer does what ZeRO-3's does (a view of its input)."""
    pytest.importorskip("deepspeed")
    import contextlib

    import torch

    from zerokit.launching.ckpt_offload import offload_context

    model, cfg = _tiny_llama()
    for layer in model.model.layers:
        layer.register_forward_pre_hook(lambda mod, args: (args[0].view_as(args[0]),) + tuple(args[1:]))
    ids = torch.randint(0, cfg.vocab_size, (2, 64))
    plain_loss, plain_grads = _step(model, ids, contextlib.nullcontext())
    stock, ours = _stock_on_cpu(), offload_context(on_accelerator=False)
    _step(model, ids, stock)
    loss, grads = _step(model, ids, ours)
    layers = cfg.num_hidden_layers
    assert stock.stats.marked_tensors == ours.stats.marked_tensors == layers
    assert stock.stats.offloaded_tensors == 0  # DeepSpeed 0.19.8: the saved tensor is not the object it marked
    assert ours.stats.offloaded_tensors == ours.stats.restored_tensors == layers - 1
    assert loss == plain_loss
    for name, g in grads.items():
        assert torch.equal(g, plain_grads[name]), name


def _launch(tmp: Path, name: str, checkpointing: str, stage: int = 2, extra: tuple[str, ...] = ()) -> Path:
    import os
    import subprocess
    import sys

    out = tmp / name
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO), env.get("PYTHONPATH", "")) if x)
    p = subprocess.run([sys.executable, "-m", "zerokit", "launch", "--model", "tiny-llama", "--plan", "--gpu", "cpu",
                        "--gpus-per-node", "2", "--seq-len", "64", "--steps", "3", "--stage", str(stage), "--precision",
                        "fp32", "--micro-batch", "2", "--grad-accum", "1", "--activation-checkpointing", checkpointing,
                        "--data", str(tmp / "data.txt"), "--output-dir", str(out), "--no-report", *extra],
                       capture_output=True, text=True, cwd=str(REPO), env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out


def _steps(out: Path, rank: int) -> list[dict]:
    recs = [json.loads(x) for x in (out / "metrics" / f"rank{rank}.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in recs if r.get("event") == "step"]


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_offload_launched_on_cpu_ranks_moves_the_inputs_every_step(tmp_path, stage):
    """`zerokit launch --plan --activation-checkpointing offload` on 2 CPU ranks: the plan's setup reaches the ranks
    (rank options, the rendered ds_config's cpu_checkpointing), and every step moves each micro batch's checkpointed
    layer inputs but the newest out and back, on both ranks; the loss falls. At ZeRO-2 and at ZeRO-3, whose module
    hooks hand each layer a new tensor object (before zerokit's marks followed the memory, ZeRO-3 offloaded nothing).
    (Equal losses with and without offload: the in-process tests above, to the bit.)"""
    corpus = (REPO / "zerokit" / "data" / "corpus" / "tiny_corpus.txt").read_text()
    (tmp_path / "data.txt").write_text((corpus[:1500] + "\n") * 12)
    out = _launch(tmp_path, "offload", "offload", stage)
    assert json.loads((out / "ds_config.json").read_text())["activation_checkpointing"]["cpu_checkpointing"]
    opts = json.loads((out / "rank_options.json").read_text())
    assert opts["gradient_checkpointing"] and opts["checkpoint_offload"]
    cfg = json.loads((REPO / "zerokit" / "data" / "models" / "tiny-llama" / "config.json").read_text())
    layers, per_layer = cfg["num_hidden_layers"], 2 * 64 * cfg["hidden_size"] * 4  # micro 2 x seq 64 x hidden, fp32
    for rank in (0, 1):
        steps = _steps(out, rank)
        assert len(steps) == 3
        for r in steps:
            stats = r["checkpoint_offload"]
            assert stats["marked_tensors"] == layers
            assert stats["offloaded_tensors"] == stats["restored_tensors"] == layers - 1
            assert stats["offloaded_bytes"] == stats["restored_bytes"] == (layers - 1) * per_layer
        assert steps[-1]["loss"] < steps[0]["loss"]


@pytest.mark.slow
def test_offload_with_ulysses_and_tiling_on_cpu_ranks_moves_each_ranks_shard(tmp_path):
    """ALST's recipe on 2 CPU ranks: Ulysses SP 2, checkpoint offload, TiledMLP and the tiled loss at ZeRO-3 run
    together, and each rank moves the inputs of its own half of the sequence (seq 64 / SP 2 tokens a layer input), all
    layers but the newest, every step."""
    corpus = (REPO / "zerokit" / "data" / "corpus" / "tiny_corpus.txt").read_text()
    (tmp_path / "data.txt").write_text((corpus[:1500] + "\n") * 12)
    out = _launch(tmp_path, "ulysses", "offload", 3,
                  ("--sequence-parallel", "2", "--tiled-mlp", "on", "--tiled-loss", "on"))
    opts = json.loads((out / "rank_options.json").read_text())
    assert opts["checkpoint_offload"] and opts["tiled_mlp"] and opts["tiled_loss"]
    assert json.loads((out / "ds_config.json").read_text())["sequence_parallel_size"] == 2
    cfg = json.loads((REPO / "zerokit" / "data" / "models" / "tiny-llama" / "config.json").read_text())
    layers, per_layer = cfg["num_hidden_layers"], 2 * (64 // 2) * cfg["hidden_size"] * 4  # micro 2 x seq/SP x h, fp32
    for rank in (0, 1):
        steps = _steps(out, rank)
        assert len(steps) == 3
        for r in steps:
            stats = r["checkpoint_offload"]
            assert stats["offloaded_tensors"] == stats["restored_tensors"] == layers - 1
            assert stats["offloaded_bytes"] == stats["restored_bytes"] == (layers - 1) * per_layer
