"""report/run_dir.py: the one reader of a launch folder's records. A record that is missing, cut short or not an object
reads as none (resume and learn decide what that means); the metrics files come back by rank, a stray name skipped;
what MetricsLog writes is what read_metrics reads."""

from __future__ import annotations

from zerokit.launching.checkpoints import MetricsLog
from zerokit.report.run_dir import LAUNCH_RECORD, launch_record, metrics_files
from zerokit.report.run_report import read_metrics


def test_a_launch_record_reads_or_is_none(tmp_path):
    assert launch_record(tmp_path) is None
    (tmp_path / LAUNCH_RECORD).write_text('{"setup": {"zero_stage": 2}, "prediction"')  # cut short by a kill
    assert launch_record(tmp_path) is None
    (tmp_path / LAUNCH_RECORD).write_text("[1, 2]")
    assert launch_record(tmp_path) is None
    (tmp_path / LAUNCH_RECORD).write_text('{"setup": {"zero_stage": 2}}')
    assert launch_record(tmp_path) == {"setup": {"zero_stage": 2}}


def test_metrics_files_by_rank_as_metrics_log_writes_them(tmp_path):
    for rank in (10, 2, 0):
        log = MetricsLog(tmp_path, rank)
        log.write({"event": "step", "step": 1, "rank": rank})
        log.close()
    (tmp_path / "metrics" / "rankx.jsonl").write_text("{}\n")
    assert [r for r, _ in metrics_files(tmp_path)] == [0, 2, 10]
    assert {r: recs[0]["rank"] for r, recs in read_metrics(tmp_path).items()} == {0: 0, 2: 2, 10: 10}
