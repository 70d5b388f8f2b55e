"""Learning from a finished run (launching/learn.py, spec.profile.LearnedRun, estimate.timing.learned_run).

The real test: a 2-rank CPU `zerokit launch` planned on a hardware profile (and told --dist-backend gloo, which it
checks reaches torch.distributed on every rank) writes its measured step time into that profile; the next plan of the same setup on that profile predicts the run's measured step time within 10% (issue 27's
target), says which run it used, and `zerokit calibrate --from-run` learns the same figure from the run directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zerokit.spec.profile import LearnedRun, learned_runs, nearest_learned_run

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "bench" / "results" / "accuracy_cpu_profile_20261126.json"


def run(a100=False, **kw) -> LearnedRun:
    base = dict(accelerator="a100-80gb" if a100 else "cpu", precision="bf16", zero_stage=2, params=10**9,
                world_size=8, tokens_per_micro_step=4096, setup="ZeRO-2 bf16 mb=2x1", predicted_step_s=1.0,
                measured_step_s=1.3, run_dir="/runs/a", recorded="2026-11-26T00:00:00")
    return LearnedRun(**{**base, **kw})


def test_the_nearest_run_on_the_same_hardware_precision_and_stage_corrects():
    runs = (run(run_dir="/a", params=10**9), run(run_dir="/b", params=3 * 10**9, measured_step_s=2.0))
    pick = nearest_learned_run(runs, "cpu", "bf16", 2, 12 * 10**8, 8, 4096)  # nearer 1B than 3B (in log)
    assert pick.run_dir == "/a" and pick.ratio == pytest.approx(1.3)
    assert nearest_learned_run(runs, "cpu", "bf16", 2, 3 * 10**9, 8, 4096).run_dir == "/b"
    for other in (("a100-80gb", "bf16", 2), ("cpu", "fp32", 2), ("cpu", "bf16", 3)):
        assert nearest_learned_run(runs, *other, 10**9, 8, 4096) is None
    # beyond LEARNED_REACH (4x over parameters, tokens and world size together) it says nothing
    assert nearest_learned_run(runs, "cpu", "bf16", 2, 10**9, 64, 4096) is None
    assert nearest_learned_run(runs, "cpu", "bf16", 2, 10**9, 16, 4096) is not None
    # equals: the newest (the last recorded) wins
    twins = (run(run_dir="/old"), run(run_dir="/new", measured_step_s=1.1))
    assert nearest_learned_run(twins, "cpu", "bf16", 2, 10**9, 8, 4096).run_dir == "/new"


def test_malformed_entries_are_skipped_not_trusted():
    good = run().to_dict()
    data = {"learned_runs": [good, {**good, "measured_step_s": -1}, {**good, "zero_stage": 7}, {"setup": "x"}, 3]}
    assert learned_runs(data) == (run(),)


@pytest.mark.slow
def test_a_second_plan_after_a_run_predicts_it_within_10_percent(tmp_path):
    prof = tmp_path / "profile.json"
    shutil.copy(PROFILE, prof)
    out = tmp_path / "run"
    hw = ["--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", "64", "--hardware-profile", str(prof)]
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    r = subprocess.run([sys.executable, "-m", "zerokit", "launch", "--model", "tiny-llama", "--plan", *hw,
                        "--global-batch", "8", "--steps", "12", "--dist-backend", "gloo", "--no-save", "--output-dir", str(out)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "learned: " in r.stdout, r.stdout[-2000:]
    # --no-save: learning needs the metrics only; the ranks wrote no checkpoint and no final weights
    assert "nothing saved (--no-save)" in r.stdout and json.loads((out / "rank_options.json").read_text())["no_save"]
    assert not any((out / "checkpoints").glob("*")) and not (out / "final").exists()
    # --dist-backend given reaches the ranks (rank_options.json) and is what torch.distributed runs on every rank
    assert json.loads((out / "launch.json").read_text())["dist_backend"] == "gloo"
    assert json.loads((out / "rank_options.json").read_text())["dist_backend"] == "gloo"
    for rank in (0, 1):
        records = [json.loads(x) for x in (out / "metrics" / f"rank{rank}.jsonl").read_text().splitlines()]
        start = next(x for x in records if x["event"] == "start")
        assert start["dist_backend_requested"] == "gloo" and start["dist_backend"] == "gloo", start
    report = json.loads((out / "report.json").read_text())
    measured = report["measured"]["step_seconds"]
    first = report["prediction"]["step_seconds"]
    learned = learned_runs(json.loads(prof.read_text()))
    assert len(learned) == 1 and learned[0].run_dir == str(out.resolve())
    assert learned[0].measured_step_s == measured and learned[0].predicted_step_s == pytest.approx(first)

    setup = json.loads((out / "launch.json").read_text())["setup"]
    pins = ["--stage", str(setup["zero_stage"]), "--precision", setup["precision"], "--micro-batch",
            str(setup["micro_batch_size"]), "--activation-checkpointing",
            "on" if setup["activation_checkpointing"] else "off"]
    p = subprocess.run([sys.executable, "-m", "zerokit", "plan", "tiny-llama", *hw, "--global-batch", "8", *pins,
                        "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    plan = json.loads(p.stdout)
    again = plan["time"]["step_seconds"]
    assert abs(again / measured - 1) <= 0.10, (again, measured, first)
    assert plan["time"]["learned_from"].startswith(str(out.resolve()))
    assert plan["time"]["learned_factor"] == pytest.approx(measured / first)

    # calibrate --from-run: the same figure from the run directory, into another profile; twice = once
    other = tmp_path / "other.json"
    shutil.copy(PROFILE, other)
    for _ in range(2):
        c = subprocess.run([sys.executable, "-m", "zerokit", "calibrate", "--from-run", str(out), "-o", str(other)],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert c.returncode == 0 and c.stdout.startswith("learned: "), c.stderr
    (again_learned,) = learned_runs(json.loads(other.read_text()))
    assert (again_learned.measured_step_s, again_learned.predicted_step_s) == (learned[0].measured_step_s,
                                                                             learned[0].predicted_step_s)


def test_from_run_bad_input_is_one_line(tmp_path, capsys):
    from zerokit.cli import main

    assert main(["calibrate", "--from-run", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no readable launch.json" in err[0], err
    (tmp_path / "launch.json").write_text(json.dumps({"prediction": {"setup": "x"}}))
    assert main(["calibrate", "--from-run", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lacks accelerator" in err[0], err
