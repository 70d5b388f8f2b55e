"""launching/train.py's steps in process, on the CPU, with no ranks launched (issue 26): `main` is configure ->
setup_process -> build_model_for -> make_engine -> make_data -> resume_position -> start_metrics -> train_loop ->
export -> finish, and the steps that need no process group are called here directly (the bundled tiny-llama and
corpus). tests/test_train.py runs them all for real, in 2-rank DeepSpeed jobs."""

from __future__ import annotations

import json

import pytest

from zerokit.launching.rank_options import RankOptions
from zerokit.spec.finetune import Finetune

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")


def options(tmp_path, **kw) -> RankOptions:
    cfg = tmp_path / "ds_config.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                               "zero_optimization": {"stage": 2}, "bf16": {"enabled": False}}))
    return RankOptions(model="tiny-llama", ds_config=str(cfg), output_dir=str(tmp_path / "run"), **kw)


def test_configure_reads_the_config_and_run_defaults_to_one_cpu_rank(tmp_path):
    from zerokit.launching.train import configure

    run = configure(options(tmp_path), 0.0)
    assert (run.stage, run.bf16, run.fp16, run.precision) == (2, False, False, "fp32")
    assert run.ckpt_dir == tmp_path / "run" / "checkpoints"
    assert (run.rank, run.world, run.engine, run.base_src, run.keep_alive) == (0, 1, None, None, [])


def test_data_step_yields_batches_of_the_sequence_length(tmp_path):
    from zerokit.launching.train import data_stream, make_data
    from zerokit.spec.setup import optimizer_steps

    args = options(tmp_path, seq_len=32, steps=3)
    parts = [make_data(args, dp=2, data_rank=r, mb=4, ga=2) for r in (0, 1)]
    data = parts[0]
    n = len(data.dataset)
    assert n >= 16 and data.dataset[0]["input_ids"].shape == (32,)
    assert (data.mb, data.ga, data.total_steps) == (4, 2, 3) == (4, 2, optimizer_steps(n, 2, 4, 2, 3, None))
    assert data.micro_per_epoch == -(-data.sampler.num_samples // 4)

    batches = [b for _, b in zip(range(3), data.loader)]
    for batch in batches:
        assert set(batch) == {"input_ids", "labels"}
        assert batch["input_ids"].shape == batch["labels"].shape == (4, 32) and batch["input_ids"].dtype == torch.int64
        assert torch.equal(batch["labels"], batch["input_ids"])  # plain text: every token is a target

    # the two data-parallel replicas read disjoint rows of the same seeded permutation
    data.sampler.set_epoch(0)
    parts[1].sampler.set_epoch(0)
    rows = [set(p.sampler) for p in parts]
    assert not rows[0] & rows[1] and len(rows[0] | rows[1]) == n

    # the stream from a saved position (epoch 0, 2 micro batches read) continues where the whole stream is then
    whole = [(e, b, batch["input_ids"]) for (e, b, batch), _ in zip(data_stream(data, 0, 0), range(4))]
    resumed = [(e, b, batch["input_ids"]) for (e, b, batch), _ in zip(data_stream(data, 0, 2), range(2))]
    assert [(e, b) for e, b, _ in whole] == [(0, 1), (0, 2), (0, 3), (0, 4)]
    assert [(e, b) for e, b, _ in resumed] == [(0, 3), (0, 4)]
    assert all(torch.equal(x[2], y[2]) for x, y in zip(whole[2:], resumed))
    # and runs on across the epoch boundary
    last = data.micro_per_epoch
    e, b, _ = next(iter(data_stream(data, 0, last)))
    assert (e, b) == (1, 1)


def test_model_step_with_lora_trains_only_the_adapters(tmp_path):
    from zerokit.launching.train import build_model, build_model_for, configure, trainable_count

    ft = Finetune(mode="lora", lora_r=4, lora_targets="q_proj,v_proj")
    run = configure(options(tmp_path, finetune=ft), 0.0)
    model = build_model_for(run)  # run.base_src None: the random-init model itself (base_source saves the same)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any(".q_proj.lora_A." in n for n in trainable) and any(".v_proj.lora_B." in n for n in trainable)
    assert not any(".k_proj." in n for n in trainable)
    assert trainable_count(model) == model.get_nb_trainable_parameters()[0]
    assert model.config.use_cache is False and run.keep_alive == []  # stage 2: no HfDeepSpeedConfig

    # the base under the adapters is the deterministic initial model, untouched
    base = dict(build_model("tiny-llama", {}, run.args.seed).named_parameters())
    wrapped = {n.removeprefix("base_model.model.").replace(".base_layer", ""): p for n, p in model.named_parameters()
               if "lora_" not in n}
    assert wrapped.keys() == base.keys()
    assert all(torch.equal(wrapped[n], base[n]) for n in base)


def test_model_step_with_freeze_trains_the_rest(tmp_path):
    from zerokit.launching.train import build_model_for, configure
    from zerokit.spec.finetune import is_frozen

    ft = Finetune(freeze=("embed_tokens", "layers.0."))
    run = configure(options(tmp_path, finetune=ft, gradient_checkpointing=True), 0.0)
    model = build_model_for(run)
    names = [n for n, _ in model.named_parameters()]
    frozen = [n for n in names if is_frozen(n, ft.freeze)]
    assert frozen and len(frozen) < len(names)
    assert all(p.requires_grad == (n not in frozen) for n, p in model.named_parameters())
    assert model.is_activation_checkpointing
