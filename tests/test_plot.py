"""`zerokit plan --plot FILE.svg|png`: real plans drawn by real matplotlib, read back from the files and the Figure.

The oracle for every bar is the plan's own --json (memory.per_gpu for the chosen setup, rejected[].per_gpu_bytes for
the others): the picture must show exactly the numbers the table and the JSON give.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from zerokit.cli import request
from helpers import run_cli as run
from zerokit.api import build_plan
from zerokit.report.plan_text import TERM_LABELS

pytest.importorskip("matplotlib")

REPO = Path(__file__).resolve().parent.parent
GiB = 2**30
PLAN_7B = ["plan", "--params", "7e9", "--gpu", "a100-80gb", "--gpus-per-node", "8"]
PLAN_TINY = ["plan", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", "64"]
# 70B on one 24 GB card fits only by offloading everything to 1.7 TiB of host RAM: not with 64 GB
PLAN_TOO_BIG = ["plan", "llama-3-70b", "--gpu", "rtx4090", "--gpus-per-node", "1", "--cpu-memory", "64GB"]


def variants(plan_json: dict) -> set:
    """The (stage, optimizer offload, param offload) variants among the setups the plan evaluated."""
    setups = [plan_json["choice"]] + [r["setup"] for r in plan_json["rejected"]]
    return {(s["zero_stage"], s["offload_optimizer"], s["offload_param"]) for s in setups}


def bars_of(fig) -> list[tuple[str, str, float]]:
    """(setup label, note, total GiB) per bar, top to bottom, read back from the drawn axes."""
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    totals = [sum(c.patches[i].get_width() for c in ax.containers) for i in range(len(labels))]
    return [(lab.split("\n", 1)[0], lab.split("\n", 1)[1].replace("\n", " "), tot) for lab, tot in zip(labels, totals)]


def plot_of(argv, path):
    from zerokit.report.plot import plot_memory

    plan = build_plan(request(argv))
    return plan, plot_memory(plan, path)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"  # PNG spec: signature, then IHDR
    return struct.unpack(">II", data[16:24])


def test_svg_with_json_holds_the_setups_and_the_budget(tmp_path, capsys):
    svg = tmp_path / "mem.svg"
    rc, plain_out, _ = run([*PLAN_7B, "--json"], capsys)
    rc_plot, out, err = run([*PLAN_7B, "--json", "--plot", svg], capsys)
    assert rc == rc_plot == 0
    assert out == plain_out  # JSON on stdout untouched by --plot
    assert f"wrote {svg}" in err and len(err.strip().splitlines()) == 1, err
    plan = json.loads(out)
    text = svg.read_text()
    root = ET.fromstring(text)  # valid XML
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    drawn = ["".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")]  # one per line
    assert plan["choice"]["label"] in drawn
    assert any(f"budget {plan['budget']['per_gpu_bytes'] / GiB:.1f} GiB per GPU" in t for t in drawn)
    assert any("params-7B" in t and "a100-80gb" in t and "world size 8" in t for t in drawn)
    for key in variants(plan) - {(plan["choice"]["zero_stage"], plan["choice"]["offload_optimizer"],
                                  plan["choice"]["offload_param"])}:  # one label per other variant
        labels = [r["label"] for r in plan["rejected"]
                  if (r["setup"]["zero_stage"], r["setup"]["offload_optimizer"], r["setup"]["offload_param"]) == key]
        assert sum(lab in drawn for lab in labels) == 1, (key, labels)
    assert [p.name for p in tmp_path.iterdir()] == ["mem.svg"]  # no temporary file left beside it


def test_bars_equal_the_plans_per_gpu_memory(tmp_path):
    plan, fig = plot_of(PLAN_7B, tmp_path / "mem.png")
    want = plan.to_dict()
    expected = {r["label"]: (r["per_gpu_bytes"], r["reason"]) for r in want["rejected"]}
    expected[want["choice"]["label"]] = (want["memory"]["per_gpu"]["total_bytes"], "chosen")
    bars = bars_of(fig)
    assert len(bars) == len(variants(want)) == 10  # the chosen + the best of every other stage/offload variant
    assert bars[0][0] == want["choice"]["label"] and bars[0][1] == "chosen"
    for label, note, total_gib in bars:
        assert total_gib == pytest.approx(expected[label][0] / GiB, rel=1e-12), label
        assert expected[label][1].startswith(note.removesuffix(" ...")), (note, expected[label][1])
    assert any(note.startswith("does not fit") for _, note, _ in bars)
    assert any(note.startswith("fits, but") for _, note, _ in bars)
    # the chosen bar's segments are the text plan's terms, under its names
    ax = fig.axes[0]
    segments = {c.get_label(): c.patches[0].get_width() for c in ax.containers}
    for term, nbytes in want["memory"]["per_gpu"]["terms"].items():
        if nbytes:
            assert segments[TERM_LABELS[term]] == pytest.approx(nbytes / GiB, rel=1e-12), term
    budget = [line for line in ax.get_lines() if line.get_label().startswith("budget")]
    assert len(budget) == 1 and budget[0].get_xdata()[0] == pytest.approx(want["budget"]["per_gpu_bytes"] / GiB)


def test_png_of_a_bundled_model_and_term_colours_agree_across_plots(tmp_path, capsys):
    png = tmp_path / "tiny.png"
    rc, out, err = run([*PLAN_TINY, "--plot", png], capsys)
    assert rc == 0 and err == "" and out.rstrip().splitlines()[-1].startswith(f"plot      wrote {png}")
    width, height = png_size(png.read_bytes())
    assert 800 <= width <= 4000 and 300 <= height <= 4000, (width, height)
    _, tiny = plot_of(PLAN_TINY, tmp_path / "t.svg")
    _, big = plot_of(PLAN_7B, tmp_path / "b.svg")
    colour = [{c.get_label(): c.patches[0].get_facecolor() for c in f.axes[0].containers} for f in (tiny, big)]
    shared = set(colour[0]) & set(colour[1])
    assert "parameters" in shared and all(colour[0][k] == colour[1][k] for k in shared)
    assert len({colour[1][k] for k in colour[1]}) == len(colour[1])  # no two terms alike in one picture


def test_nothing_fits_still_draws_the_least_memory_setup(tmp_path, capsys):
    png = tmp_path / "no.png"
    rc, out, _ = run([*PLAN_TOO_BIG, "--plot", png], capsys)
    assert rc == 1 and "DOES NOT FIT" in out and png.stat().st_size > 0
    _, fig = plot_of(PLAN_TOO_BIG, tmp_path / "no.svg")
    label, note, total = bars_of(fig)[0]
    assert note.startswith("least memory, does not fit") and label in out


@pytest.mark.parametrize("name,needle", [("m.pdf", ".svg or .png"), ("m.txt", ".svg or .png"),
                                         ("m", "without an extension"), ("f/nope/m.svg", "cannot create")])
def test_bad_plot_paths_are_one_line_and_write_nothing(name, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f").write_text("x")  # a file: nothing can be created under it
    rc, out, err = run([*PLAN_7B, "--plot", name], capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and needle in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_plot_path_is_refused_before_planning(tmp_path, monkeypatch, capsys):
    """An impossible --hidden-size fails in planning: the --plot refusal comes first."""
    monkeypatch.chdir(tmp_path)
    rc, _, err = run([*PLAN_7B, "--hidden-size", "3", "--plot", "m.pdf"], capsys)
    assert rc == 2 and "--plot m.pdf" in err and "--hidden-size" not in err, err


def test_without_matplotlib_one_line_names_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an install without the extra looks like to import
    rc, out, err = run([*PLAN_7B, "--plot", "m.svg"], capsys)
    assert rc == 2 and out == "" and "pip install 'zerokit[plot]'" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_matplotlib_is_imported_only_with_plot(tmp_path):
    code = ("import sys, contextlib, io\n"
            "from zerokit.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    rc = main(sys.argv[1:])\n"
            "print(rc, 'matplotlib' in sys.modules)\n")
    base = [sys.executable, "-c", code, *PLAN_7B]
    without = subprocess.run(base, capture_output=True, text=True, cwd=REPO)
    with_plot = subprocess.run([*base, "--plot", str(tmp_path / "m.svg")], capture_output=True, text=True, cwd=REPO)
    assert without.stdout.split() == ["0", "False"], without.stderr
    assert with_plot.stdout.split() == ["0", "True"], with_plot.stderr  # the check above can fail


def test_every_memory_term_the_plan_can_print_has_a_label():
    """report.plan_text.TERM_LABELS names each term estimate_memory makes, over stages, checkpointing, tiling,
    accumulation, optimizer offload and Ulysses on CPU and a GPU: a new term without a label printed its key."""
    import itertools

    from zerokit.estimate.memory import estimate_memory
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.setup import Workload, ZeroSetup

    keys = set()
    for name, gpu in itertools.product(("tiny-llama", "gpt2"), ("cpu", "h100-80gb")):
        spec, cluster = load_model_spec(name), build_cluster(gpu=gpu, gpus_per_node=2)
        for stage, ckpt, tiled, ga, oo, sp in itertools.product((0, 1, 2, 3), (False, True), (False, True), (1, 2),
                                                                  ("none", "cpu"), (1, 2)):
            if stage == 0 and oo != "none":
                continue
            setup = ZeroSetup(zero_stage=stage, activation_checkpointing=ckpt, tiled_loss=tiled, tiled_mlp=tiled,
                              gradient_accumulation_steps=ga, offload_optimizer=oo, sequence_parallel=sp)
            est = estimate_memory(spec, cluster, setup, Workload(seq_len=256))
            keys |= set(est.per_gpu).union(*est.phase_terms.values())
    assert {"gradient_partition_buffer", "sp_all_to_all_buffers", "tiled_mlp_backward"} <= keys
    assert keys <= set(TERM_LABELS), sorted(keys - set(TERM_LABELS))
