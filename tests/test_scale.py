"""`plan --deadline` and `plan --compare-gpus` (planning/scale.py): the total-time formula inverted.

Oracles: every row is the plan `zerokit plan` gives for that --gpu / --gpus-per-node / --nodes (the same setup and
total time), the chosen count meets the deadline and the fewer counts searched before it do not, and the total time is
the formula's steps x step time with steps = samples x epochs / global batch (estimate.timing)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from zerokit.cli import main
from zerokit.core.options import duration
from zerokit.planning.scale import gpu_counts

RUN = ["--params", "7e9", "--seq-len", "4096", "--samples", "500000", "--global-batch", "256"]


def plan_json(capsys, *argv) -> tuple[int, dict]:
    code = main(["plan", *map(str, argv), "--json"])
    return code, json.loads(capsys.readouterr().out)


def exit_code(argv) -> int:
    """main's exit code; argparse's refusals (a bad value for a flag's type) leave by SystemExit"""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("text,seconds", [("36h", 36 * 3600), ("90min", 5400), ("2d", 172800), ("1d12h", 129600),
                                          ("45m30s", 2730), ("36", 36 * 3600), ("1.5 hours", 5400), ("1w", 604800)])
def test_durations_as_people_write_them(text, seconds):
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "-3h", "36x", "0h", "12h-", "11 years"])
def test_bad_durations_are_refused(text):
    with pytest.raises(ValueError):
        duration(text)


def test_counts_fewest_first_with_every_power_of_two():
    counts = [g * n for g, n in itertools.islice(gpu_counts(8), 60)]
    assert counts[:6] == [1, 2, 4, 8, 16, 24] and counts == sorted(set(counts))
    assert all(2**k in counts for k in range(13))
    # past 16 nodes a step is at most an eighth of the count: the answer is at most ~1/8 above the fewest that do
    assert all(b - a <= max(8, a // 8 * 1) for a, b in zip(counts[20:], counts[21:]))


def test_deadline_picks_the_fewest_gpus_that_finish(capsys):
    code, out = plan_json(capsys, *RUN, "--deadline", "24h")
    assert code == 0
    d = out["deadline"]
    choice, searched = d["choice"], d["searched"]
    assert d["met"] and choice["meets_deadline"] and choice["total_seconds"] <= 24 * 3600
    assert searched[-1] == choice and all(not r["fits"] or not r["meets_deadline"] for r in searched[:-1])
    assert [r["gpus"] for r in searched] == sorted(r["gpus"] for r in searched)
    # the plan printed is the plan for that count, and it is `zerokit plan --gpus-per-node G --nodes N`'s
    assert out["hardware"]["world_size"] == choice["gpus"] and out["time"]["total_seconds"] == choice["total_seconds"]
    _, plain = plan_json(capsys, *RUN, "--gpus-per-node", choice["gpus_per_node"], "--nodes", choice["nodes"])
    assert plain["choice"]["label"] == choice["setup"] and plain["time"]["total_seconds"] == choice["total_seconds"]
    # total = steps x step time, steps = samples / global batch (one epoch)
    assert plain["time"]["steps"] == math.ceil(500000 / 256)
    assert choice["total_seconds"] == pytest.approx(plain["time"]["steps"] * choice["step_seconds"])
    # a longer deadline never needs more GPUs
    _, loose = plan_json(capsys, *RUN, "--deadline", "3d")
    assert loose["deadline"]["choice"]["gpus"] <= choice["gpus"]


def test_deadline_in_text_names_the_count_then_prints_its_plan(capsys):
    assert main(["plan", *RUN, "--deadline", "24h"]) == 0
    out = capsys.readouterr().out
    first, second, third = out.splitlines()[:3]
    assert first.startswith("deadline  24.00 h for 500,000 samples") and "the fewest GPUs that do" in first
    # the likely range of the total (time_range.json), and whether its slow end still meets the deadline
    assert second.strip().startswith("likely ") and ("within the deadline at both ends" in second
                                                     or "the slow end misses the deadline" in second)
    assert third.strip().startswith("searched ") and "\nFITS: " in out


def test_a_deadline_no_count_meets_says_the_fastest_and_exits_1(capsys, tmp_path):
    code = main(["plan", *RUN, "--deadline", "10min"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert "cannot be met on a100-80gb: the fastest finish of 500,000 samples" in err[0]
    assert "a global batch of 256 runs on at most 256" in err[0]


def test_compare_rows_are_the_plans_for_each_gpu(capsys):
    gpus = ["a100-80gb", "h100-80gb", "l40s"]
    code, out = plan_json(capsys, *RUN, "--gpus-per-node", "8", "--compare-gpus", ",".join(gpus))
    assert code == 0
    rows = out["compare"]
    assert [r["gpu"] for r in rows] == gpus
    for r in rows:
        _, one = plan_json(capsys, *RUN, "--gpus-per-node", "8", "--gpu", r["gpu"])
        assert r["fits"] == one["fits"] and r["setup"] == one["choice"]["label"]
        assert r["step_seconds"] == one["time"]["step_seconds"] and r["total_seconds"] == one["time"]["total_seconds"]
        assert r["gpu_hours"] == pytest.approx(r["total_seconds"] * 8 / 3600)
    assert main(["plan", *RUN, "--gpus-per-node", "8", "--compare-gpus", ",".join(gpus)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("GPUs compared for 500,000 samples") and len(table) == 2 + len(gpus)
    assert all(line.split()[0] == g for line, g in zip(table[2:], gpus))


def test_compare_with_a_deadline_sizes_each_gpu(capsys):
    code, out = plan_json(capsys, *RUN, "--compare-gpus", "a100-80gb,h100-80gb", "--deadline", "24h")
    assert code == 0
    for r in out["compare"]:
        _, alone = plan_json(capsys, *RUN, "--gpu", r["gpu"], "--deadline", "24h")
        assert r == alone["deadline"]["choice"]
    a100, h100 = out["compare"]
    assert h100["gpus"] <= a100["gpus"]  # the faster GPU never needs more of itself


def test_compare_with_flash3_prices_fa2_where_fa3_does_not_run(capsys):
    """FlashAttention-3 is Hopper-only: compared with an A100, the A100 row is the plan with FlashAttention-2 (what the
    script falls back to) and says so; the H100 row is the FA3 plan. A plan for the A100 alone refuses flash3."""
    run = [*RUN, "--gpus-per-node", "8"]
    code, out = plan_json(capsys, *run, "--attention", "flash3", "--compare-gpus", "a100-80gb,h100-80gb")
    assert code == 0
    a100, h100 = out["compare"]
    _, fa2 = plan_json(capsys, *run, "--attention", "flash", "--gpu", "a100-80gb")
    _, fa3 = plan_json(capsys, *run, "--attention", "flash3", "--gpu", "h100-80gb")
    assert a100["attention"] == "flash" and a100["step_seconds"] == fa2["time"]["step_seconds"]
    assert h100["attention"] is None and h100["step_seconds"] == fa3["time"]["step_seconds"]
    assert main(["plan", *run, "--attention", "flash3", "--compare-gpus", "a100-80gb,h100-80gb"]) == 0
    a100_line, h100_line = capsys.readouterr().out.splitlines()[2:4]
    assert a100_line.endswith("(FlashAttention-2: no FlashAttention-3 on a100-80gb)")
    assert "FlashAttention" not in h100_line
    assert exit_code(["plan", *run, "--attention", "flash3", "--gpu", "a100-80gb"]) == 2


@pytest.mark.parametrize("argv,needle", [
    (["--compare-gpus", "a100-80gb,h100x"], "unknown GPU 'h100x': did you mean"),
    (["--compare-gpus", "a100-80gb,A100-80GB"], "names a100-80gb twice"),
    (["--compare-gpus", "a100-80gb,", ], "expected names separated by commas"),
    (["--compare-gpus", "a100-80gb", "--gpu-memory", "40GB"], "drop --gpu-memory"),
    (["--deadline", "36 parsecs"], "unknown unit"),
    (["--deadline", "24h", "--nodes", "2"], "chooses the number of nodes: drop --nodes"),
])
def test_bad_input_is_one_line(argv, needle, capsys):
    assert exit_code(["plan", *RUN, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err


@pytest.mark.parametrize("drop,needle", [("--samples", "give --samples N"), ("--global-batch", "give --global-batch N")])
def test_deadline_needs_the_runs_length_and_batch(drop, needle, capsys):
    argv = list(RUN)
    i = argv.index(drop)
    del argv[i:i + 2]
    assert main(["plan", *argv, "--deadline", "24h"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_run_file_takes_the_deadline(tmp_path, capsys):
    run = tmp_path / "run.yaml"
    run.write_text("deadline: 24h\ncompare-gpus: a100-80gb,h100-80gb\n")
    code, out = plan_json(capsys, *RUN, "-c", run)
    assert code == 0 and out["deadline_seconds"] == 24 * 3600 and len(out["compare"]) == 2
    assert not any(Path(tmp_path).glob("*.json"))
