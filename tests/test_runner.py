"""zerokit.launching.runner (restarts, process-group kill, shm cleanup), checkpoint bookkeeping, and the
predicted-vs-measured report, with a fake launcher: fast, no DeepSpeed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from zerokit.report import run_report as zreport
from zerokit.launching.runner import remove_shm, run_with_restarts, shm_files
from zerokit.launching.checkpoints import latest_step, read_latest, stale_checkpoints, write_latest

REPO = Path(__file__).resolve().parents[1]

# A stand-in for `deepspeed ... zerokit.launching.train`: logs steps like the ranks do, marks checkpoints
# complete, and fails on the attempts listed in FAKE_FAIL_ATTEMPTS after step FAKE_CRASH_AT.
FAKE = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    sys.path.insert(0, os.environ["REPO"])
    from zerokit.launching.checkpoints import write_latest, latest_step
    out = Path(sys.argv[1]); resume = "--resume" in sys.argv
    attempt = int(os.environ["ZEROKIT_ATTEMPT"])
    fail = attempt in [int(x) for x in os.environ.get("FAKE_FAIL_ATTEMPTS", "").split(",") if x]
    total, every, crash_at = 8, 4, int(os.environ.get("FAKE_CRASH_AT", "6"))
    ck = out / "checkpoints"; ck.mkdir(parents=True, exist_ok=True); (out / "metrics").mkdir(exist_ok=True)
    start = latest_step(ck) if resume else 0
    with open(out / "args.log", "a") as fh:
        fh.write(json.dumps({"attempt": attempt, "resume": resume, "start": start}) + "\\n")
    with open(out / "metrics" / "rank0.jsonl", "a") as m:
        for step in range(start + 1, total + 1):
            m.write(json.dumps({"event": "step", "step": step, "attempt": attempt, "loss": 1.0,
                                "run_id": os.environ["ZEROKIT_RUN_ID"]}) + "\\n")
            if step % every == 0:
                (ck / f"step{step}").mkdir(exist_ok=True)
                write_latest(ck, f"step{step}")
            if fail and step == crash_at:
                sys.exit(7)
    sys.exit(0)
""")


@pytest.fixture
def fake(tmp_path):
    script = tmp_path / "fake_launcher.py"
    script.write_text(FAKE)
    out = tmp_path / "out"

    def make(resume: bool, attempt: int):
        argv = [sys.executable, str(script), str(out)] + (["--resume"] if resume else [])
        return argv, {"REPO": str(REPO)}

    return make, out


def attempts_log(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "args.log").read_text().splitlines()]


def test_restart_resumes_from_latest_checkpoint(fake, monkeypatch):
    make, out = fake
    monkeypatch.setenv("FAKE_FAIL_ATTEMPTS", "0")
    res = run_with_restarts(make, out, max_restarts=2, log=lambda m: None)
    assert res.ok and res.returncode == 0
    assert res.restarts == 1 and res.redone_steps == 2  # crashed after 6, checkpoint at 4
    assert [(a.start_step, a.reached_step, a.returncode) for a in res.attempts] == [(0, 6, 7), (4, 8, 0)]
    assert attempts_log(out) == [{"attempt": 0, "resume": False, "start": 0},
                                 {"attempt": 1, "resume": True, "start": 4}]
    assert read_latest(out / "checkpoints") == "step8"


def test_redone_steps_ignore_an_earlier_invocations_records(fake, monkeypatch):
    make, out = fake
    (out / "metrics").mkdir(parents=True)
    (out / "metrics" / "rank0.jsonl").write_text(json.dumps({"event": "step", "step": 7, "attempt": 0,
                                                             "run_id": "an-earlier-run"}) + "\n")
    monkeypatch.setenv("FAKE_FAIL_ATTEMPTS", "0")
    res = run_with_restarts(make, out, max_restarts=1, log=lambda m: None)
    assert res.ok and res.redone_steps == 2 and res.attempts[0].reached_step == 6


def test_gives_up_after_max_restarts(fake, monkeypatch):
    make, out = fake
    monkeypatch.setenv("FAKE_FAIL_ATTEMPTS", "0,1,2")
    monkeypatch.setenv("FAKE_CRASH_AT", "5")
    res = run_with_restarts(make, out, max_restarts=1, log=lambda m: None)
    assert not res.ok and res.returncode == 7
    assert res.restarts == 1 and len(res.attempts) == 2
    assert res.redone_steps == 1  # attempt 0 reached 5, checkpoint 4


def test_no_restart_by_default(fake, monkeypatch):
    make, out = fake
    monkeypatch.setenv("FAKE_FAIL_ATTEMPTS", "0")
    res = run_with_restarts(make, out, log=lambda m: None)
    assert res.returncode == 7 and res.restarts == 0 and len(res.attempts) == 1


def test_ctrl_c_kills_the_whole_process_group(tmp_path):
    """SIGINT to the runner: the launcher and a grandchild (a 'rank') both die; exit 130."""
    pidfile = tmp_path / "pids"
    launcher = tmp_path / "launcher.py"
    launcher.write_text(textwrap.dedent(f"""
        import subprocess, sys, time, os
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open({str(pidfile)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(300)
    """))
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from zerokit.launching.runner import run_with_restarts
        r = run_with_restarts(lambda res, a: ([sys.executable, {str(launcher)!r}], {{}}), {str(tmp_path / 'o')!r},
                              max_restarts=3, log=lambda m: None)
        print(r.returncode, r.interrupted, r.restarts)
        sys.exit(r.returncode)
    """))
    p = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (pidfile.exists() and len(pidfile.read_text().split()) == 2):
        assert time.time() < deadline, "launcher did not start"
        time.sleep(0.1)
    pids = [int(x) for x in pidfile.read_text().split()]
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 130
    assert out.split() == ["130", "True", "0"]  # interrupted: no restart
    for pid in pids:
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"process {pid} survived the interrupt")


def test_shm_cleanup_removes_only_this_jobs_new_files(tmp_path):
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    uid, port, other = os.getuid(), 47011, 47012
    pre = Path(f"/dev/shm/deepspeed_allreduce_buffer_{uid}_127.0.0.1_{port}_9")  # existed before: not ours
    mine = [Path(f"/dev/shm/deepspeed_allreduce_buffer_{uid}_127.0.0.1_{port}_{r}") for r in (0, 1)]
    theirs = Path(f"/dev/shm/deepspeed_allreduce_buffer_{uid}_127.0.0.1_{other}_0")
    try:
        pre.write_bytes(b"x")
        theirs.write_bytes(b"x")
        before = shm_files(port)
        assert before == {str(pre)}
        for m in mine:
            m.write_bytes(b"x")
        removed = remove_shm(port, before)
        assert sorted(removed) == sorted(str(m) for m in mine)
        assert pre.exists() and theirs.exists() and not any(m.exists() for m in mine)
    finally:
        for f in [pre, theirs, *mine]:
            f.unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------
# checkpoint bookkeeping


def test_latest_marks_only_complete_checkpoints(tmp_path):
    ck = tmp_path / "checkpoints"
    ck.mkdir()
    assert read_latest(ck) is None and latest_step(ck) == 0
    (ck / "step2").mkdir()
    assert read_latest(ck) is None  # written but never marked
    write_latest(ck, "step2")
    assert read_latest(ck) == "step2" and latest_step(ck) == 2
    (ck / "step4").mkdir()  # a crash after writing step 4, before marking it
    assert read_latest(ck) == "step2"
    assert [p.name for p in stale_checkpoints(ck)] == ["step4"]
    assert not list(ck.glob(".latest*"))  # the temporary file was renamed over `latest`
    (ck / "latest").write_text("step9")  # names a directory that is not there: not loadable
    assert read_latest(ck) is None


# ----------------------------------------------------------------------------------------------
# report


def _metrics():
    def step(rank, s, t, attempt=0, peak=1000):
        return {"event": "step", "step": s, "step_time": t, "tokens_per_s": 100 / t, "global_tokens_per_s": 200 / t,
                "attempt": attempt, "peak_allocated_bytes": peak + rank, "memory_method": "live_tensor_bytes"}

    r0 = [{"event": "start", "memory_method": "live_tensor_bytes"}, step(0, 1, 9.0), step(0, 2, 1.0), step(0, 3, 1.2),
          # crashed after 3; restart from 2: step 3 redone, first step of attempt 1 is warm-up
          step(0, 3, 5.0, attempt=1), step(0, 4, 1.1, attempt=1, peak=3000),
          {"event": "end", "train_s": 12.5, "peak_allocated_bytes": 3000}]
    r1 = [step(1, s, 1.0) for s in (1, 2, 3, 4)]
    return {0: r0, 1: r1}


def test_summarize_metrics_steady_state_and_peaks():
    m = zreport.summarize_metrics(_metrics())
    assert m["world_size"] == 2 and m["steps"] == 4
    assert m["ranks"][0]["peak_memory_bytes"] == 3000 and m["ranks"][1]["peak_memory_bytes"] == 1001
    assert m["peak_memory_bytes_max"] == 3000
    # rank 0 steady steps: 2 (1.0) and 4 (1.1); step 1 and the redone step 3 are warm-ups of their attempts
    assert m["step_seconds"] == pytest.approx(1.05)
    assert m["tokens_per_second"] == pytest.approx((200 / 1.0 + 200 / 1.1) / 2)
    assert m["train_seconds"] == 12.5 and m["memory_method"] == "live_tensor_bytes"


def test_report_rows_and_text(tmp_path):
    pred = {"setup": "ZeRO-2 fp32 mb=2x2", "per_rank_memory_bytes": 2000, "memory_terms": {"params": 1500},
            "step_seconds": 0.5, "tokens_per_second": 400.0, "total_seconds": 2.0, "steps": 4}
    rep = zreport.build_report(pred, zreport.summarize_metrics(_metrics()), {"restarts": 1, "redone_steps": 1,
                                                                             "wall_s": 40.0, "returncode": 0})
    rows = {r["name"]: r for r in rep["rows"]}
    assert rows["peak memory per rank (max over ranks)"]["ratio"] == pytest.approx(1.5)
    assert rows["step time (median, steady state)"]["ratio"] == pytest.approx(2.1)
    assert rows["total wall time (incl. start-up, restarts)"]["measured"] == 40.0
    assert [r["rank"] for r in rep["per_rank"]] == [0, 1]
    text = zreport.format_report(rep)
    assert "ZeRO-2 fp32" in text and "restarts: 1, steps redone: 1" in text and "1.50x" in text
    txt, js = zreport.write_report(tmp_path, rep)
    assert txt.read_text().strip() == text
    assert json.loads(js.read_text())["restarts"] == 1


def test_report_without_prediction():
    rep = zreport.build_report(None, zreport.summarize_metrics({}), None)
    text = zreport.format_report(rep)
    assert "restarts: 0" in text and all(r["ratio"] is None for r in rep["rows"])
