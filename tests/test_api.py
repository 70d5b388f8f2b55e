"""The Python API (zerokit.api, exported at the package root): the same answers as the command line, from keywords
typed by the same declarations, and an HF Trainer on 2 CPU ranks trained on `zerokit.plan(..., profile="hf")`'s
ds_config."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

import zerokit
from zerokit.core.errors import EXIT_DOES_NOT_FIT, ZerokitError

REPO = Path(__file__).resolve().parent.parent
KW = dict(gpu="cpu", gpus_per_node=2, seq_len=64, global_batch=8, samples=256)
ARGV = ["--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", "64", "--global-batch", "8", "--samples", "256"]


def cli(argv):
    from zerokit.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("model, kw, argv", [
    ("tiny-llama", KW, ARGV),
    ("tiny-llama", {**KW, "stage": 3, "micro_batch_size": 2}, ARGV + ["--stage", "3", "--micro-batch", "2"]),
    ("llama-3-8b", {"gpus_per_node": 8, "seq_len": "max"}, ["--gpus-per-node", "8", "--seq-len", "max"]),
    ("llama-3-70b", {"gpu": "rtx-4090", "offload_optimizer": "none", "offload_param": "none"},
     ["--gpu", "rtx-4090", "--offload-optimizer", "none", "--offload-param", "none"]),  # does not fit: LoRA/QLoRA?
    (None, {"params": "7e9", "gpus_per_node": 8, "deadline": "2d", "global_batch": 64, "samples": 100000},
     ["--params", "7e9", "--gpus-per-node", "8", "--deadline", "2d", "--global-batch", "64", "--samples", "100000"]),
])
def test_a_plan_is_plan_json(model, kw, argv):
    p = zerokit.plan(model, **kw)
    rc, out, _ = cli(["plan", *([model] if model else []), *argv, "--json"])
    assert p.to_dict() == json.loads(out)
    assert rc == (0 if p.fits else EXIT_DOES_NOT_FIT)
    assert str(p) == cli(["plan", *([model] if model else []), *argv])[1].rstrip("\n")
    if p.fits:
        assert p.setups[0]["label"] == p.best.setup.label and p.setups[0]["reason"] == "chosen"
        assert [s["label"] for s in p.setups[1:]] == [r["label"] for r in p.rejected]
        assert "<table>" in p._repr_html_() and "FITS" in p._repr_html_()
    else:
        assert p.suggestions and "DOES NOT FIT" in p._repr_html_()


def test_keywords_are_typed_and_bounded_as_the_command_line():
    with pytest.raises(ZerokitError, match=r"unknown keyword 'gpus_per_nod': did you mean 'gpus_per_node'\?"):
        zerokit.plan("tiny-llama", gpus_per_nod=2)
    with pytest.raises(ZerokitError, match="gpus_per_node: expected a positive integer"):
        zerokit.plan("tiny-llama", gpus_per_node=0)
    with pytest.raises(ZerokitError, match="'steps' is launch's, not plan's"):
        zerokit.plan("tiny-llama", steps=3)
    with pytest.raises(ZerokitError, match="'json' is the command line's only"):
        zerokit.plan("tiny-llama", json=True)
    with pytest.raises(ZerokitError, match="stage: expected one of 0, 1, 2, 3"):
        zerokit.plan("tiny-llama", stage=4)
    # the flag's name and its attribute both work, and on/off switches take booleans as a run file does
    a = zerokit.plan("tiny-llama", micro_batch=2, activation_checkpointing=True, **KW)
    b = zerokit.plan("tiny-llama", micro_batch_size=2, activation_checkpointing="on", **KW)
    assert a.to_dict() == b.to_dict() and a.best.setup.micro_batch_size == 2


def test_a_run_file_sits_under_the_keywords(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("gpu: cpu\ngpus-per-node: 2\nseq-len: 64\nglobal-batch: 8\nsteps: 10\n")  # steps: launch's, skipped
    assert zerokit.plan("tiny-llama", config_file=str(f)).to_dict() == zerokit.plan("tiny-llama", **KW | {
        "samples": None}).to_dict()
    assert zerokit.plan("tiny-llama", config_file=str(f), seq_len=32).workload.seq_len == 32


def test_ds_config_profiles_render_and_check(tmp_path):
    p = zerokit.plan("tiny-llama", **KW)
    hf = zerokit.plan("tiny-llama", profile="hf", **KW).ds_config
    assert p.ds_config == p.ds_config_for("deepspeed") and hf == p.ds_config_for("hf")
    assert hf["train_micro_batch_size_per_gpu"] == "auto" and p.ds_config["train_micro_batch_size_per_gpu"] == 4
    out = tmp_path / "a" / "ds_config.json"
    assert zerokit.render("tiny-llama", output=str(out), **KW) == p.ds_config
    assert cli(["render", "tiny-llama", *ARGV, "-o", tmp_path / "cli.json"])[0] == 0
    assert json.loads(out.read_text()) == json.loads((tmp_path / "cli.json").read_text())
    zerokit.render("tiny-llama", output=str(tmp_path / "acc" / "ds.json"), profile="accelerate", **KW)
    assert (tmp_path / "acc" / "accelerate_config.yaml").is_file()
    with pytest.raises(ZerokitError, match="nothing fits") as e:
        zerokit.render("llama-3-70b", gpu="rtx-4090", offload_optimizer="none", offload_param="none",
                       output=str(tmp_path / "no.json"))
    assert e.value.exit_code == EXIT_DOES_NOT_FIT and not (tmp_path / "no.json").exists()
    # check: a path or a dict, the same answer as `zerokit check --json`
    c = zerokit.check(str(out), model="tiny-llama", gpu="cpu", gpus_per_node=2, seq_len=64)
    rc, text, _ = cli(["check", out, "--model", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len",
                       "64", "--json"])
    assert c.to_dict() == json.loads(text) and c.valid and c.fits and rc == 0
    d = zerokit.check(p.ds_config, model="tiny-llama", gpu="cpu", gpus_per_node=2, seq_len=64)
    assert d.valid and d.fits and d.evaluation.memory.per_gpu_total == c.evaluation.memory.per_gpu_total
    bad = zerokit.check({"zero_optimization": {"stage": 2}}, gpu="cpu")
    assert not bad.valid and "train_batch_size" in bad.problem()  # an invalid config is an answer, not an error


def test_compare_gpus_is_plan_compare_json():
    c = zerokit.compare_gpus(params="7e9", gpus=["a100-80gb", "h100-80gb"], gpus_per_node=8)
    rc, out, _ = cli(["plan", "--params", "7e9", "--gpus-per-node", "8", "--compare-gpus", "a100-80gb,h100-80gb",
                      "--json"])
    assert c.to_dict() == json.loads(out) and c.fits
    with pytest.raises(ZerokitError, match="zerokit.compare_gpus"):
        zerokit.plan(params="7e9", compare_gpus="a100-80gb,h100-80gb")


def test_launch_dry_run_writes_nothing(tmp_path):
    run = tmp_path / "run"
    result = zerokit.launch("tiny-llama", plan=True, dry_run=True, output_dir=str(run), steps=2,
                            **{k: v for k, v in KW.items() if k != "samples"})
    assert result.exit_code is None and "deepspeed" in result.command and not run.exists()
    assert result.ds_config["train_micro_batch_size_per_gpu"] == 4


@pytest.mark.slow
def test_an_hf_trainer_on_two_cpu_ranks_trains_on_the_plans_ds_config(tmp_path):
    """examples/plan_in_script.py calls zerokit.plan(..., profile="hf") on each rank and hands .ds_config to
    TrainingArguments(deepspeed=...); launched here through zerokit.launch with the user's script."""
    out, run = tmp_path / "out", tmp_path / "run"
    result = zerokit.launch("tiny-llama", script=["python", str(REPO / "examples" / "plan_in_script.py"),
                                                  "--seq-len", "32", "--global-batch", "8", "--steps", "4",
                                                  "--output-dir", str(out)],
                            gpu="cpu", gpus_per_node=2, seq_len=32, global_batch=8, steps=4, output_dir=str(run))
    assert result.exit_code == 0
    got = json.loads((out / "plan_in_script.json").read_text())
    planned = zerokit.plan("tiny-llama", gpu="cpu", gpus_per_node=2, seq_len=32, global_batch=8, profile="hf")
    assert got["plan"]["ds_config"] == planned.ds_config and got["plan"]["label"] == planned.best.setup.label
    assert got["engine"] == {"zero_stage": planned.best.setup.zero_stage, "world_size": 2,
                             "micro_batch": planned.best.setup.micro_batch_size,
                             "grad_accum": planned.best.setup.gradient_accumulation_steps}
    assert len(got["losses"]) == 4 and all(0 < x < 20 for x in got["losses"])
