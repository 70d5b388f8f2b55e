"""`zerokit launch [options] -- python train.py ARGS`: the user's own training script under the deepspeed launcher.

Pure parts (parse_command, the placeholders, the --deepspeed rule) are checked directly; the command zerokit
builds is parsed back with DeepSpeed's own runner parser; real 2-rank runs on CPU prove the rest: an HF Trainer
script with ZerokitCallback (metrics and report), TRL's SFTTrainer, and a plain deepspeed.initialize script that
crashes once and is restarted (it resumes from its own checkpoints).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from tests.test_launch_cli import REPO, assert_one_line_error, zk
from zerokit.core.errors import ZerokitError
from zerokit.launching import user_script

EXAMPLE = REPO / "examples" / "train_hf_trainer.py"
PLAIN = REPO / "tests" / "helpers" / "plain_ds_script.py"
BASE = ["--model", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", "32", "--global-batch", "8"]
# the example script's arguments, with the plan's values through placeholders
HF_ARGS = ["--model", "tiny-llama", "--seq_len", "{seq_len}", "--per_device_train_batch_size", "{micro_batch}",
           "--gradient_accumulation_steps", "{grad_accum}", "--max_steps", "{steps}", "--output_dir",
           "{output_dir}/trainer", "--logging_steps", "1", "--report_to", "none", "--save_strategy", "no",
           "--deepspeed", "{ds_config}"]


# ---------------------------------------------------------------------------------------------------------
# the command after `--`


def test_python_prefix_module_and_bare_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("from transformers import TrainingArguments\n")
    for cmd in (["python", str(script), "--x", "1"], ["python3.11", "-u", str(script), "--x", "1"],
                [str(script), "--x", "1"], ["--", "python", str(script), "--x", "1"]):
        parsed = user_script.parse_command(cmd)
        assert (parsed.target, parsed.is_module, parsed.args) == (str(script), False, ("--x", "1")), cmd
        assert parsed.uses_hf_trainer
    mod = user_script.parse_command(["python", "-m", "zerokit.launching.user_script", "--a"])
    assert mod.is_module and mod.target == "zerokit.launching.user_script" and mod.args == ("--a",)
    assert "runpy" in mod.source  # read from the module's file, not imported


@pytest.mark.parametrize("cmd, needle", [
    ([], "nothing follows"),
    (["torchrun", "train.py"], "not `torchrun"),
    (["accelerate", "launch", "train.py"], "not `accelerate"),
    (["python"], "no script after"),
    (["python", "-m"], "needs a module"),
    (["python", "-m", "no_such_module_zk"], "not importable"),
    (["python", "-c", "print(1)"], "not supported"),
    (["python", "missing_train.py"], "does not exist"),
], ids=["empty", "torchrun", "accelerate", "python-only", "dash-m-only", "unknown-module", "dash-c", "missing"])
def test_commands_refused(cmd, needle):
    with pytest.raises(ZerokitError, match=needle.replace("`", "`?")):
        user_script.parse_command(cmd)


def test_placeholders_and_the_config_argument(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import deepspeed  # reads its config path from argv\n")
    values = {"ds_config": "/run/ds_config.json", "output_dir": "/run", "micro_batch": 4, "grad_accum": 2,
              "seq_len": 64, "steps": None, "world_size": 2}
    cmd = user_script.parse_command(["python", str(script), "--cfg={ds_config}", "--mb", "{micro_batch}",
                                     "--json", '{"a": 1}', "--steps", "{steps}", "{other}"])
    user_script.check_config_argument(cmd)
    argv = cmd.runner_args(values)
    # unknown braces and an unknown value stay as written (prepare refuses {steps} without --steps)
    assert argv == [str(script.resolve()), "--cfg=/run/ds_config.json", "--mb", "4", "--json", '{"a": 1}',
                    "--steps", "{steps}", "{other}"]
    # no {ds_config} and no TrainingArguments: the script would never see the config
    bare = user_script.parse_command(["python", str(script), "--lr", "1"])
    with pytest.raises(ZerokitError, match=r"takes no --deepspeed .* write \{ds_config\}"):
        user_script.check_config_argument(bare)
    # a Trainer script without {ds_config}: --deepspeed CONFIG appended
    hf = tmp_path / "hf.py"
    hf.write_text("from transformers import HfArgumentParser\n")
    hf_cmd = user_script.parse_command(["python", str(hf), "--max_steps", "3"])
    user_script.check_config_argument(hf_cmd)
    assert hf_cmd.runner_args(values)[-2:] == ["--deepspeed", "/run/ds_config.json"]
    # a setup in bf16: the Trainer matches bf16.enabled against its --bf16, False unless given (transformers'
    # HfTrainerDeepSpeedConfig.trainer_config_process: a mismatch error), so zerokit adds it; a user's own is kept
    assert hf_cmd.runner_args({**values, "precision": "bf16"})[-3:] == ["--deepspeed", "/run/ds_config.json", "--bf16"]
    assert hf_cmd.runner_args({**values, "precision": "fp32"})[-1] == "/run/ds_config.json"
    own = user_script.parse_command(["python", str(hf), "--fp16=True"])
    assert own.runner_args({**values, "precision": "fp16"}).count("--fp16") == 0
    assert cmd.runner_args({**values, "precision": "bf16"}) == argv  # not a Trainer script: nothing added
    # a config of its own in the arguments: ambiguous, refused with the fix
    with pytest.raises(ZerokitError, match="zerokit launch --config FILE"):
        user_script.check_config_argument(user_script.parse_command(["python", str(hf), "--deepspeed", "mine.json"]))


def test_rank_argv_as_plain_deepspeed_gives_it():
    # DeepSpeed's launch.py puts --local_rank=N before the user's arguments; the wrapper hands it on unchanged
    assert user_script.split_argv(["--local_rank=1", "t.py", "--a"]) == (["--local_rank=1"], "t.py", False, ["--a"])
    assert user_script.split_argv(["-m", "pkg.t", "--a"]) == ([], "pkg.t", True, ["--a"])


# ---------------------------------------------------------------------------------------------------------
# through the CLI: dry run, refusals


def test_dry_run_command_parses_with_deepspeeds_runner(tmp_path):
    out = tmp_path / "run"
    p = zk(*BASE, "--steps", "3", "--output-dir", out, "--dry-run", "--", "python", EXAMPLE, *HF_ARGS)
    assert p.returncode == 0, p.stderr
    assert not out.exists()
    cmd_line = p.stdout.split("# command:\n", 1)[1].splitlines()[0]
    argv = shlex.split(cmd_line)
    from deepspeed.launcher.runner import parse_args

    ds = parse_args(argv[1:])
    assert ds.module and ds.user_script == user_script.MODULE and ds.num_gpus == 2
    args = ds.user_args
    assert args[0] == str(EXAMPLE)
    assert args[args.index("--deepspeed") + 1] == str(out.resolve() / "ds_config.json")
    assert args[args.index("--max_steps") + 1] == "3"
    assert args[args.index("--output_dir") + 1] == f"{out.resolve()}/trainer"
    mb, ga = int(args[args.index("--per_device_train_batch_size") + 1]), int(args[args.index("--gradient_accumulation_steps") + 1])
    assert mb * ga * 2 == 8  # global batch = micro x accumulation x ranks, as planned
    # a Trainer script gets the HF profile: "auto" values the Trainer fills from these arguments
    cfg = json.loads(p.stdout.split("# ds_config", 1)[1].split(":\n", 1)[1].split("\n# dry run")[0])
    assert cfg["train_micro_batch_size_per_gpu"] == "auto"


@pytest.mark.parametrize("extra, script_args, needle", [
    ([], ["python", "nope.py"], "nope.py does not exist"),
    ([], ["python", str(PLAIN), "--steps", "2"], "write {ds_config}"),
    (["--data", "x.txt"], ["python", str(EXAMPLE)], "--data set zerokit's own training loop"),
    (["--resume"], ["python", str(EXAMPLE)], "--resume set zerokit's own training loop"),
    ([], ["python", str(EXAMPLE), "--max_steps", "{steps}"], "{steps} in the script's arguments needs --steps"),
    ([], ["torchrun", str(EXAMPLE)], "give `-- python SCRIPT ARGS`"),
], ids=["missing-script", "no-ds-config", "data-option", "resume-option", "steps-unknown", "torchrun"])
def test_refused_before_anything_is_written(tmp_path, extra, script_args, needle):
    out = tmp_path / "run"
    p = zk(*BASE, *extra, "--output-dir", out, "--", *script_args)
    assert_one_line_error(p, 2, needle)
    assert not out.exists()


def test_a_script_whose_setup_does_not_fit_is_not_started(tmp_path):
    out = tmp_path / "run"
    p = zk(*BASE, "--steps", "2", "--gpu-memory", "1MB", "--output-dir", out, "--", "python", EXAMPLE, *HF_ARGS)
    assert_one_line_error(p, 1, "fits")
    assert not out.exists()


def test_no_plan_no_config_no_script(tmp_path):
    p = zk(*BASE, "--output-dir", tmp_path / "run")
    assert_one_line_error(p, 2, "give --plan")
    p = zk(*BASE, "--plan", "--samples", "10", "--output-dir", tmp_path / "run")
    assert_one_line_error(p, 2, "--samples is for your own script")


# ---------------------------------------------------------------------------------------------------------
# real runs (2 CPU ranks over gloo)


def _metrics(out: Path) -> dict[int, list[dict]]:
    from zerokit.report.run_report import read_metrics

    return read_metrics(out)


@pytest.mark.slow
def test_hf_trainer_script_two_ranks_zero2(tmp_path):
    out = tmp_path / "run"
    p = zk(*BASE, "--stage", "2", "--steps", "4", "--output-dir", out, "--", "python", EXAMPLE, *HF_ARGS)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    metrics = _metrics(out)
    assert sorted(metrics) == [0, 1]
    for recs in metrics.values():
        start = recs[0]
        assert start["event"] == "start" and start["source"] == "ZerokitCallback" and start["world_size"] == 2
        assert start["zero_stage"] == 2 and start["memory_method"] == "live_tensor_bytes"  # meter started by the wrapper
        steps = [r for r in recs if r["event"] == "step"]
        assert [r["step"] for r in steps] == [1, 2, 3, 4]
        assert all(r["loss"] > 0 and r["step_time"] > 0 and r["tokens"] == start["micro_batch"] * start["grad_accum"] * 32
                   for r in steps)
        assert recs[-1]["event"] == "end"
    report = json.loads((out / "report.json").read_text())
    assert report["setup"].startswith("ZeRO-2") and report["world_size"] == 2 and report["steps"] == 4
    peak = report["rows"][0]
    # The callback measures with zerokit's meter from before the model was built, as zerokit's own loop does; the
    # Trainer drops the logits before backward (compute_loss keeps only the loss) where zerokit's loop keeps them,
    # so its peak sits a little under the prediction: measured 0.94x on this setup at ZeRO-0 (2026-11-25).
    assert 0.85 <= peak["ratio"] <= 1.05, peak
    assert "run report: ZeRO-2" in p.stdout
    launch = json.loads((out / "launch.json").read_text())
    assert launch["script"][1] == str(EXAMPLE)


@pytest.mark.slow
def test_trl_sft_trainer_script(tmp_path):
    pytest.importorskip("trl")
    out = tmp_path / "run"
    p = zk(*BASE, "--stage", "3", "--steps", "2", "--output-dir", out, "--", "python", EXAMPLE, "--sft", "true",
           *HF_ARGS)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    metrics = _metrics(out)
    assert sorted(metrics) == [0, 1]
    steps = [r for r in metrics[0] if r["event"] == "step"]
    assert [r["step"] for r in steps] == [1, 2] and all(r["loss"] > 0 for r in steps)
    assert metrics[0][0]["zero_stage"] == 3


@pytest.mark.slow
def test_plain_deepspeed_script_restarted_after_a_crash(tmp_path):
    out = tmp_path / "run"
    own = tmp_path / "own"
    own.mkdir()
    p = zk(*BASE, "--stage", "1", "--profile", "deepspeed", "--max-restarts", "1", "--no-report", "--output-dir", out,
           "--", sys.executable, PLAIN, "--deepspeed_config", "{ds_config}", "--model", REPO / "zerokit/data/models/tiny-llama",
           "--steps", "4", "--seq", "{seq_len}", "--out", own, "--crash-first-attempt-after", "2")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "restart 1/1" in p.stderr
    lines = (own / "steps.txt").read_text().split("\n")
    by_attempt = {a: sorted({int(line.split()[3]) for line in lines if line.endswith(f"attempt {a}")}) for a in (0, 1)}
    # the first attempt got to step 2 (rank 1 died there); the second resumed from the script's own checkpoint
    assert by_attempt == {0: [1, 2], 1: [3, 4]}
    cfg = json.loads((out / "ds_config.json").read_text())
    assert cfg["zero_optimization"]["stage"] == 1 and isinstance(cfg["train_micro_batch_size_per_gpu"], int)


def test_a_shipped_auto_config_for_a_script_is_judged_at_its_largest_fitting_micro_batch(tmp_path):
    # LLaMA-Factory's ZeRO-3 config (tests/data/user_configs, copied as shipped): "auto" batch and precision, which
    # the user's Trainer fills from its own arguments; launch answers as `zerokit check` does (tests/test_check_auto.py)
    cfg = REPO / "tests" / "data" / "user_configs" / "llamafactory_ds_z3_config.json"
    out = tmp_path / "run"
    p = zk("--model", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", "32", "--config", cfg,
           "--output-dir", out, "--dry-run", "--", "python", EXAMPLE, "--deepspeed", "{ds_config}")
    assert p.returncode == 0, p.stderr
    head = p.stdout.splitlines()[0]
    assert head.startswith("# ZeRO-3") and "mb=" in head, head
    args = shlex.split(p.stdout.split("# command:\n", 1)[1].splitlines()[0])
    assert args[args.index("--deepspeed") + 1] == str(out.resolve() / "ds_config.json")


def test_a_finished_script_ends_without_teardown_yet_keeps_its_exit_hooks_and_files(tmp_path):
    """core.process.finish_script_rank: after the script returns, its atexit hooks run and every open file's buffer is
    flushed before os._exit(0) skips the interpreter's teardown (where a native thread pool left joinable aborts a
    finished rank). A script that leaves a file open with buffered text and registers an exit hook, run as the
    launcher runs it on a rank."""
    import subprocess

    for ending in ("", "sys.exit(0)\n"):  # returning, or the script's own sys.exit(0)
        script = tmp_path / "train.py"
        script.write_text(
            "import atexit, sys\n"
            "f = open(sys.argv[-1] + '.log', 'w', buffering=1 << 20)\n"
            "f.write('step 1\\n' * 1000)  # buffered, never closed\n"
            "atexit.register(lambda: open(sys.argv[-1] + '.hook', 'w').write('uploaded'))\n" + ending)
        stem = str(tmp_path / f"out{len(ending)}")
        res = subprocess.run([sys.executable, "-m", "zerokit.launching.user_script", "--local_rank=0", str(script),
                              stem], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert Path(stem + ".log").read_text() == "step 1\n" * 1000
        assert Path(stem + ".hook").read_text() == "uploaded"
