"""`zerokit launch --report-to tensorboard|wandb|csv`: the curves written through DeepSpeed's own monitor, read back by
each tracker's own library.

One real 2-rank CPU launch (tiny-llama, 4 steps, all three trackers, W&B offline) is shared by the read-back tests:
TensorBoard's event files through tensorboard's EventAccumulator, the W&B run's history from its offline .wandb file
(decoded with wandb's own protobuf Record), the CSV files with the csv module; each against the run's own
metrics/rank0.jsonl and report.json. The rest runs in-process (dry runs and refusals, no rank started).
"""

from __future__ import annotations

import csv
import json
import struct
import sys
from pathlib import Path

import pytest

from tests.test_launch_cli import BASE, zk
from zerokit.cli import main
from zerokit.config import trackers
from zerokit.core.errors import ZerokitError
from zerokit.report.run_report import build_report, format_report, report_scalars

STEPS = 4
STEP_TAGS = ("Train/Samples/loss", "Train/Samples/lr", "Train/Samples/step_time_s", "Train/Samples/tokens_per_s",
             "Train/Samples/peak_memory_MiB")
REPORT_TAGS = tuple(f"Report/{kind}_{name}" for kind, name in (
    ("predicted", "peak_memory_MiB"), ("measured", "peak_memory_MiB"), ("ratio", "peak_memory"),
    ("predicted", "step_time_s"), ("measured", "step_time_s"), ("ratio", "step_time"),
    ("predicted", "throughput_tokens_per_s"), ("measured", "throughput_tokens_per_s"), ("ratio", "throughput"),
    ("predicted", "train_loop_s"), ("measured", "train_loop_s"), ("ratio", "train_loop")))


# ---------------------------------------------------------------------------------------------------------
# the real run, shared


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    pytest.importorskip("deepspeed")
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    d = tmp_path_factory.mktemp("tracking")
    out, report_dir = d / "run", d / "curves"
    # W&B offline, and every file it keeps (settings, cache, artifacts) inside the test's directory
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_PROJECT": "", "WANDB_CONFIG_DIR": str(d / "wandb-config"),
           "WANDB_CACHE_DIR": str(d / "wandb-cache"), "WANDB_DATA_DIR": str(d / "wandb-data")}
    p = zk(*BASE[:-4], "--steps", str(STEPS), "--gpu", "cpu", "--plan", "--output-dir", out, "--report-to",
           "tensorboard", "--report-to", "wandb", "--report-to", "csv", "--report-dir", report_dir, env_extra=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    recs = [json.loads(x) for x in (out / "metrics" / "rank0.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in recs if r["event"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    cfg = json.loads((out / "ds_config.json").read_text())
    return {"out": out, "report_dir": report_dir, "stdout": p.stdout, "steps": steps, "cfg": cfg,
            "report": json.loads((out / "report.json").read_text()), "name": out.name,
            # DeepSpeed's monitor x-axis: samples seen (engine.global_samples), train_batch_size per optimizer step
            "at": [cfg["train_batch_size"] * k for k in range(1, STEPS + 1)]}


def _measured(run, name: str) -> float:
    return next(r["measured"] for r in run["report"]["rows"] if r["name"] == name)


def _expected_steps(run) -> dict[str, list[float]]:
    """tag -> the value at each step, from what the run itself wrote (metrics/rank0.jsonl)."""
    s = run["steps"]
    return {"Train/Samples/loss": [r["loss"] for r in s], "Train/Samples/step_time_s": [r["step_time"] for r in s],
            "Train/Samples/tokens_per_s": [r["global_tokens_per_s"] for r in s],
            "Train/Samples/lr": [r["lr"] for r in s]}


@pytest.mark.slow
def test_tensorboard_events_read_back_with_event_accumulator(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tracked_run
    logdir = run["report_dir"] / "tensorboard" / run["name"]
    assert list(logdir.glob("events.out.tfevents.*")), sorted(run["report_dir"].rglob("*"))
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert set(STEP_TAGS) | set(REPORT_TAGS) <= tags, tags
    for tag, values in _expected_steps(run).items():
        events = acc.Scalars(tag)
        assert [e.step for e in events] == run["at"], tag
        # TensorBoard keeps a scalar as float32 (simple_value)
        assert [e.value for e in events] == pytest.approx(values, rel=1e-6), tag
    peak = acc.Scalars("Train/Samples/peak_memory_MiB")
    assert [e.step for e in peak] == run["at"]
    assert peak[-1].value == pytest.approx(_measured(run, "peak memory per rank (max over ranks)") / 2**20, rel=1e-6)
    last = run["at"][-1]
    for tag in REPORT_TAGS:
        assert [e.step for e in acc.Scalars(tag)] == [last], tag
    assert acc.Scalars("Report/measured_step_time_s")[0].value == pytest.approx(
        _measured(run, "step time (median, steady state)"), rel=1e-6)


def _wandb_records(path: Path) -> list:
    """The records of a W&B run file (run-ID.wandb), decoded with wandb's own protobuf Record.

    wandb 0.31 ships no Python reader of its own for these files any more (wandb.sdk.internal.datastore went with the
    Python backend); the framing is what that reader read: a 7-byte header (":W&B", magic 0xBEE1, version 0), then
    LevelDB's log format (32 KiB blocks; each chunk a 7-byte header crc32c(4) length(2) type(1): 1 full, 2 first,
    3 middle, 4 last), each record one serialized wandb_internal_pb2.Record."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), data[:7]
    block, pos, pending, raw = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:  # zero padding to the block's end
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            raw.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            raw.append(pending + chunk)
    records = []
    for r in raw:
        rec = pb.Record()
        rec.ParseFromString(r)
        records.append(rec)
    return records


@pytest.mark.slow
def test_wandb_offline_run_history_read_back(tracked_run):
    run = tracked_run
    files = list((run["report_dir"] / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, sorted(run["report_dir"].rglob("*"))
    records = _wandb_records(files[0])
    kinds = [r.WhichOneof("record_type") for r in records]
    assert "exit" in kinds  # wandb.finish() ran on rank 0 (the rank leaves by os._exit, no atexit hook)
    meta = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (meta.project, meta.run_group) == ("zerokit", run["name"])
    history: dict[int, dict] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
            history.setdefault(row["_step"], {}).update(row)
    assert sorted(history) == run["at"]
    for tag, values in _expected_steps(run).items():
        assert [history[s][tag] for s in run["at"]] == pytest.approx(values, rel=1e-12), tag  # JSON: doubles
    last = history[run["at"][-1]]
    assert set(REPORT_TAGS) <= set(last), sorted(last)
    assert last["Report/measured_peak_memory_MiB"] == pytest.approx(
        _measured(run, "peak memory per rank (max over ranks)") / 2**20)


@pytest.mark.slow
def test_csv_files_parsed(tracked_run):
    run = tracked_run
    d = run["report_dir"] / "csv" / run["name"]
    # DeepSpeed's csvMonitor: one file per tag ("/" -> "_"), a header "step,<last part of the tag>", then step,value
    for tag, values in _expected_steps(run).items():
        with open(d / (tag.replace("/", "_") + ".csv"), newline="") as f:
            rows = list(csv.reader(f))
        assert rows[0] == ["step", tag.rsplit("/", 1)[1]]
        assert [int(r[0]) for r in rows[1:]] == run["at"]
        assert [float(r[1]) for r in rows[1:]] == pytest.approx(values, rel=1e-12), tag
    for tag in REPORT_TAGS:
        with open(d / (tag.replace("/", "_") + ".csv"), newline="") as f:
            rows = list(csv.reader(f))
        assert len(rows) == 2 and int(rows[1][0]) == run["at"][-1], (tag, rows)


@pytest.mark.slow
def test_the_run_report_names_where_the_curves_are(tracked_run):
    run = tracked_run
    where = run["report"]["trackers"]
    assert set(where) == {"tensorboard", "wandb", "csv"}
    assert str(run["report_dir"] / "tensorboard" / run["name"]) in where["tensorboard"]
    assert str(run["report_dir"] / "wandb") in where["wandb"] and "wandb sync" in where["wandb"]
    assert str(run["report_dir"] / "csv" / run["name"]) in where["csv"]
    for tracker in where:
        assert f"curves ({tracker}):" in run["stdout"]
        assert f"curves ({tracker}):" in (run["out"] / "report.txt").read_text()
    # the blocks DeepSpeed's monitor read, as rendered into the run's ds_config
    cfg = run["cfg"]
    assert cfg["tensorboard"] == {"enabled": True, "output_path": str(run["report_dir"] / "tensorboard"),
                                  "job_name": run["name"]}
    assert cfg["csv_monitor"]["output_path"] == str(run["report_dir"] / "csv")
    assert cfg["wandb"] == {"enabled": True, "project": "zerokit", "group": run["name"]}


# ---------------------------------------------------------------------------------------------------------
# in-process: dry runs and refusals


LAUNCH = ["launch", "--model", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", "32", "--steps", "2"]


def _one_line_error(capsys, code, rc, *needles):
    assert rc == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    for n in needles:
        assert n in err[0], err[0]
    return err[0]


@pytest.mark.parametrize("package", ["tensorboard", "wandb"])
def test_a_tracker_not_installed_is_one_line_naming_the_package(package, tmp_path, capsys, monkeypatch):
    # None in sys.modules: `import wandb` raises ImportError and importlib.util.find_spec answers None, as for a
    # package that is not installed
    monkeypatch.setitem(sys.modules, package, None)
    out = tmp_path / "run"
    rc = main(LAUNCH + ["--plan", "--output-dir", str(out), "--report-to", "csv", "--report-to", package])
    _one_line_error(capsys, 2, rc, f"--report-to {package} needs the {package} package", f"pip install {package}")
    assert not out.exists()


@pytest.mark.parametrize("extra, needles", [
    (["--report-to", "none", "--report-to", "csv"], ("--report-to none and csv contradict",)),
    (["--report-dir", "curves"], ("--report-dir says where --report-to", "give --report-to")),
    (["--report-to", "csv", "--report-dir", "a-file"], ("is a file",)),
], ids=["none-and-csv", "dir-without-tracker", "dir-is-a-file"])
def test_bad_tracker_options_are_one_line_and_write_nothing(extra, needles, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("x")
    rc = main(LAUNCH + ["--plan", "--output-dir", "run", *extra])
    _one_line_error(capsys, 2, rc, *needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_dry_run_shows_the_monitor_blocks_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_PROJECT", "mine")
    rc = main(LAUNCH + ["--plan", "--output-dir", "run", "--report-to", "wandb", "--report-to", "csv",
                        "--report-to", "csv", "--dry-run"])
    assert rc == 0
    printed = capsys.readouterr().out
    cfg = json.loads(printed.split("# ds_config", 1)[1].split(":\n", 1)[1].split("\n# dry run")[0])
    run = tmp_path / "run"
    assert cfg["wandb"] == {"enabled": True, "project": "mine", "group": "run"}
    assert cfg["csv_monitor"] == {"enabled": True, "output_path": str(run / "csv"), "job_name": "run"}
    assert "tensorboard" not in cfg
    assert f"export WANDB_DIR={run}" in printed  # wandb.init's directory: DeepSpeed's WandbMonitor passes none
    assert list(tmp_path.iterdir()) == []


def test_a_trainer_script_gets_report_to(tmp_path, capsys, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("from transformers import TrainingArguments\n")
    monkeypatch.chdir(tmp_path)
    base = LAUNCH[:-2] + ["--global-batch", "8", "--output-dir", "run"]
    rc = main(base + ["--report-to", "tensorboard", "--dry-run", "--", "python", str(script), "--output_dir", "o"])
    assert rc == 0
    printed = capsys.readouterr().out
    argv = printed.split("# command:\n", 1)[1].splitlines()[0]
    assert argv.endswith("--report_to tensorboard"), argv
    assert f"export TENSORBOARD_LOGGING_DIR={tmp_path / 'run' / 'tensorboard' / 'run'}" in printed
    cfg = json.loads(printed.split("# ds_config", 1)[1].split(":\n", 1)[1].split("\n# dry run")[0])
    assert "tensorboard" not in cfg  # the Trainer's TensorBoardCallback writes, not a second writer in DeepSpeed
    for extra, needle in ((["--report-to", "csv"], "no CSV reporter"),
                          (["--report-to", "tensorboard", "--report-to", "wandb"], "one --report_to"),
                          (["--report-to", "wandb", "--", "python", str(script), "--report_to", "none"],
                           "already give --report_to")):
        cmd = extra if "--" in extra else extra + ["--", "python", str(script)]
        rc = main(base + ["--dry-run", *cmd])
        _one_line_error(capsys, 2, rc, needle)
    assert list(tmp_path.iterdir()) == [script]


def test_a_deepspeed_script_gets_the_monitor_blocks(tmp_path, capsys, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("import deepspeed\n")
    monkeypatch.chdir(tmp_path)
    rc = main(LAUNCH[:-2] + ["--global-batch", "8", "--output-dir", "run", "--report-to", "tensorboard",
                             "--report-to", "csv", "--dry-run", "--", "python", str(script), "--cfg", "{ds_config}"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "--report_to" not in printed
    cfg = json.loads(printed.split("# ds_config", 1)[1].split(":\n", 1)[1].split("\n# dry run")[0])
    assert cfg["tensorboard"]["output_path"] == str(tmp_path / "run" / "tensorboard")
    assert cfg["csv_monitor"]["job_name"] == "run"


# ---------------------------------------------------------------------------------------------------------
# pure parts


def test_trackers_from():
    assert trackers.trackers_from(None) == ()
    assert trackers.trackers_from(["none"]) == ()
    assert trackers.trackers_from(["csv", "wandb", "csv"]) == ("csv", "wandb")
    with pytest.raises(ZerokitError, match="contradict"):
        trackers.trackers_from(["wandb", "none"])
    with pytest.raises(ZerokitError, match="expected one of"):
        trackers.trackers_from(["mlflow"])


def test_a_configs_own_monitor_blocks_stay():
    cfg = {"train_batch_size": 8, "wandb": {"enabled": True, "project": "theirs"}}
    out = trackers.with_monitor(cfg, ("csv",), Path("/r"), "x", env={})
    assert out["wandb"] == {"enabled": True, "project": "theirs"} and out["csv_monitor"]["output_path"] == "/r/csv"
    assert trackers.with_monitor(cfg, (), Path("/r"), "x") is cfg


def test_report_scalars_and_the_curves_line():
    pred = {"allocated_peak_bytes": 2 * 2**20, "step_seconds": 0.5, "tokens_per_second": 100.0, "total_seconds": 2.0}
    measured = {"peak_memory_bytes_max": 3 * 2**20, "step_seconds": 1.0, "tokens_per_second": None,
                "train_seconds": 4.0, "ranks": {}}
    rep = build_report(pred, measured, trackers={"csv": "/r/csv/x/*.csv"})
    got = dict(report_scalars(rep))
    assert got["Report/predicted_peak_memory_MiB"] == 2.0 and got["Report/measured_peak_memory_MiB"] == 3.0
    assert got["Report/ratio_peak_memory"] == 1.5 and got["Report/ratio_step_time"] == 2.0
    assert got["Report/predicted_throughput_tokens_per_s"] == 100.0
    assert "Report/measured_throughput_tokens_per_s" not in got and "Report/ratio_throughput" not in got
    assert "  curves (csv): /r/csv/x/*.csv" in format_report(rep).splitlines()
    assert report_scalars(build_report(None, measured)) == [
        ("Report/measured_peak_memory_MiB", 3.0), ("Report/measured_step_time_s", 1.0),
        ("Report/measured_train_loop_s", 4.0)]


def test_tracker_env_and_locations():
    env = trackers.rank_env(("wandb", "tensorboard"), Path("/r"), "x", trainer=True, env={"WANDB_PROJECT": "p"})
    assert env == {"WANDB_DIR": "/r", "WANDB_PROJECT": "p", "WANDB_RUN_GROUP": "x",
                   "TENSORBOARD_LOGGING_DIR": "/r/tensorboard/x"}
    assert trackers.rank_env(("wandb",), Path("/r"), "x", env={}) == {"WANDB_DIR": "/r"}
    where = trackers.locations(("wandb",), Path("/r"), "x", env={"WANDB_MODE": "offline"})
    assert "wandb sync /r/wandb/offline-run-*" in where["wandb"]
    assert "wandb sync" not in trackers.locations(("wandb",), Path("/r"), "x", env={})["wandb"]
