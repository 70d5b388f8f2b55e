"""The benchmarks' pure helpers (bench/planner_pick.py, bench/loop_vs_trainer.py) on inputs small enough to work out by
hand. The benchmarks themselves launch real jobs and are not tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import loop_vs_trainer as lvt
import planner_pick as pp


def test_ranks_average_ties():
    assert pp.ranks_of([30.0, 10.0, 20.0]) == [3, 1, 2]
    assert pp.ranks_of([5.0, 1.0, 5.0, 2.0]) == [3.5, 1, 3.5, 2]  # the two 5s share ranks 3 and 4


def test_spearman_against_the_textbook_formula():
    # no ties: rho = 1 - 6 sum d^2 / (n (n^2 - 1)); ranks x 1..5, y 2,1,4,3,5: d^2 = 1+1+1+1+0 = 4 -> 1 - 24/120 = 0.8
    assert pp.spearman([1, 2, 3, 4, 5], [20, 10, 40, 30, 50]) == pytest.approx(0.8)
    assert pp.spearman([1, 2, 3], [9, 8, 7]) == pytest.approx(-1.0)
    # monotone but not linear: ranks agree perfectly
    assert pp.spearman([0.1, 0.2, 0.3, 0.4], [1, 4, 9, 100]) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        pp.spearman([1], [1])


def test_choose_indices_head_then_spread_to_the_slowest():
    assert pp.choose_indices(20, 6) == [0, 1, 2, 8, 14, 19]  # 3 head; 3 more at 3 + 16 x (1/3, 2/3, 1), rounded
    assert pp.choose_indices(7, 6) == [0, 1, 2, 4, 5, 6]
    assert pp.choose_indices(5, 6) == [0, 1, 2, 3, 4]  # fewer setups than asked: all
    for n, k in ((128, 8), (9, 8), (40, 7)):
        idx = pp.choose_indices(n, k)
        assert len(set(idx)) == k and idx[-1] == n - 1 and idx == sorted(idx)


def test_verdict_within_five_percent():
    v = pp.verdict(["a", "b", "c"], [1.04, 1.0, 2.0], "a")
    assert v == {"fastest": "b", "ratio": pytest.approx(1.04), "within": True}
    assert pp.verdict(["a", "b"], [1.06, 1.0], "a")["within"] is False
    assert pp.verdict(["a", "b"], [0.9, 1.0], "a") == {"fastest": "a", "ratio": 1.0, "within": True}


def test_planner_pick_arguments():
    ap = pp.build_parser()
    args = ap.parse_args([])
    assert (args.model, args.top, args.repeat) == ("small-llama", 8, 2)
    for bad in (["--top", "5"], ["--repeat", "0"], ["--steps", "4"]):
        with pytest.raises(SystemExit):
            pp.check_args(ap, ap.parse_args(bad))


def _steps(times, step_times, tokens=100, metered=2):
    return [{"event": "start"}] + [
        {"event": "step", "step": i + 1, "time": t, "step_time": st, "tokens": tokens, "metered": i < metered}
        for i, (t, st) in enumerate(zip(times, step_times))]


def test_steady_throughput_slowest_rank_after_warmup_and_meter():
    # steps 1-2 metered and warm-up, 3 the first after them: steady 4, 5. Rank 0 step times 0.4, 0.6 -> median 0.5;
    # rank 1: 0.9, 1.1 -> 1.0
    r0 = _steps([1, 3, 4.0, 4.5, 5.1], [9, 9, 0.5, 0.4, 0.6])
    r1 = _steps([1, 3, 4.0, 5.0, 6.0], [9, 9, 1.0, 0.9, 1.1])
    tp = lvt.steady_throughput({0: r0, 1: r1}, warmup=2)
    assert tp["tokens_per_step"] == 200  # 100 per rank, 2 ranks
    assert tp["step_s"] == pytest.approx(1.0) and tp["step_tok_s"] == pytest.approx(200.0)
    # intervals of steps 4, 5: rank 0 (4.5-4.0, 5.1-4.5) -> median 0.55; rank 1 (1.0, 1.0) -> 1.0
    assert tp["wall_s"] == pytest.approx(1.0) and tp["wall_tok_s"] == pytest.approx(200.0)
    assert lvt.steady_throughput({0: _steps([1, 2], [1, 1])}, warmup=2) is None
    assert lvt.steady_throughput({0: _steps([1, 2, 3], [1, 1, 1])}, warmup=2) is None  # step 3 has no steady step before
    uneven = _steps([1, 2, 3, 4], [1, 1, 1, 1])
    uneven[-1]["tokens"] = 50
    with pytest.raises(ValueError, match="differ"):
        lvt.steady_throughput({0: uneven}, warmup=2)


def test_best_of_rounds_and_arguments():
    assert lvt.best_of_rounds([{"k": 3.0}, None, {"k": 5.0}, {"k": None}], "k") == 5.0
    assert lvt.best_of_rounds([None], "k") is None
    args = lvt.build_parser().parse_args([])
    assert (args.model, args.rounds, args.stage) == ("small-llama", 3, 2)


def test_repredict_gpu_reads_the_long_rows_and_refuses_a_file_it_cannot_read(tmp_path, capsys):
    """bench/repredict_gpu.py: the LONG grid's H200 rows are its jobs too (they were skipped, and an empty table
    ended in statistics' traceback); a file that is not run.py's results, or names none of its jobs, is one line, 2."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("repredict_gpu", BENCH / "repredict_gpu.py")
    rp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rp)
    assert rp.main(["--results", str(BENCH / "results" / "accuracy_gpu_long_20261128_1816.json")]) == 0
    out = capsys.readouterr().out
    assert "gpu-1b_z3_bf16_mb1_s131072_ckptoff_tloss_tmlp_r1" in out and "3 jobs:" in out
    (tmp_path / "none.json").write_text('{"rows": [{"job": "not-a-job", "meas_time": 1.0}]}')
    (tmp_path / "list.json").write_text("[1]")
    for name, needle in (("none.json", "none of the 1 measured jobs"), ("list.json", "not a results file"),
                         ("missing.json", "not a results file")):
        assert rp.main(["--results", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err, err
