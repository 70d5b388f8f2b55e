"""Issue 11 for real: `zerokit launch` runs Ulysses sequence parallelism, AutoTP, ZeRO++ hpZ and ALST's tiled loss and
MLP through its own loop (launching/train.py, launching/parallel.py), 2 or 4 CPU ranks over gloo, the bundled tiny
random-init Llama (hidden 128, 4 heads / 2 KV heads), seq 256, fp32.

Oracle: the losses of a single-process run on the same samples (launching/parallel.py: every rank of a TP or SP group
reads its replica's samples, so an SP or TP job of one replica trains on what one process would). The first step's
fp32 loss agrees to 4 decimals (as measured for DeepSpeed's own Ulysses SP, docs/measured-on-cpu.md: its
first-step loss equals the single-process one), later ones to float noise; an SP run restarted after a crash equals
the uninterrupted run exactly; AutoTP's exported weights are gathered whole and match the single process's; tiling lowers the measured
peak by what the memory model predicts. Eight real jobs (~3 min).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STEPS = 4
LR = 1e-3
SEQ = 256  # > hidden 128: TiledMLP runs 2 slices on a TP rank (ceil(256 / 128))


def ds_config(stage: int, micro: int = 1, ga: int = 2, **top) -> dict:
    """fp32, no clipping, constant LR, small buckets; train_batch_size left for DeepSpeed to derive (it counts
    world / sequence_parallel_size)."""
    zero: dict = {"stage": stage, "reduce_bucket_size": 128 * 128, "allgather_bucket_size": 128 * 128,
                  "overlap_comm": False, "contiguous_gradients": True}
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=int(0.9 * 128 * 128), stage3_param_persistence_threshold=1280)
    return {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": ga,
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.999], "eps": 1e-8,
                                                      "weight_decay": 0.0, "torch_adam": True}},
            "gradient_clipping": 0.0, "zero_optimization": zero, "steps_per_print": 10**6, **top}


CONFIGS = {
    "z2": ds_config(2),
    "z2_ga1": ds_config(2, ga=1),
    "z2_mb4": ds_config(2, micro=4),
    "z2_sp2": ds_config(2, sequence_parallel_size=2),
    "z3_sp2": ds_config(3, sequence_parallel_size=2),
    "z1_tp2": ds_config(1, tensor_parallel={"autotp_size": 2}),
    "z3_hpz2": {**ds_config(3), "zero_optimization": {**ds_config(3)["zero_optimization"], "zero_hpz_partition_size": 2}},
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("parallel_launch")
    corpus = (REPO / "zerokit" / "data" / "corpus" / "tiny_corpus.txt").read_text()
    (d / "data.txt").write_text((corpus[:3000] + "\n") * 12)
    for name, cfg in CONFIGS.items():
        (d / f"{name}.json").write_text(json.dumps(cfg))
    return d


def zk(*args, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO), env.get("PYTHONPATH", "")) if x)
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run([sys.executable, "-m", "zerokit", "launch", *map(str, args)], capture_output=True, text=True,
                          cwd=str(REPO), env=env, timeout=900)


_RUNS: dict[str, Path] = {}


def run(workdir: Path, name: str, config: str, ranks: int, *extra, env_extra: dict | None = None) -> Path:
    if name not in _RUNS:
        out = workdir / name
        p = zk("--model", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", ranks, "--seq-len", SEQ, "--steps", STEPS,
               "--data", workdir / "data.txt", "--config", workdir / f"{config}.json", "--output-dir", out,
               "--no-report", *extra, env_extra=env_extra)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        _RUNS[name] = out
    return _RUNS[name]


def records(out: Path, rank: int = 0) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics" / f"rank{rank}.jsonl").read_text().splitlines() if x.strip()]


def losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(out) if r.get("event") == "step"}


def assert_same_losses(a: Path, b: Path) -> None:
    """The first step's loss equal to 4 decimals (same weights, same samples: the issue's oracle); the later ones
    within 1e-3 relative: a different reduction order's float noise, which Adam turns into updates of up to lr where a
    gradient is near zero (measured at lr 1e-2: SP 2 against one process 7.633100 / 7.633181 at step 2, hpZ on 4 ranks
    5.6936 / 5.6881 at step 4)."""
    la, lb = losses(a), losses(b)
    assert sorted(la) == sorted(lb) == list(range(1, STEPS + 1)), (la, lb)
    assert round(la[1], 4) == round(lb[1], 4), (la, lb)
    assert all(abs(la[s] - lb[s]) <= 1e-3 * abs(lb[s]) for s in la), (la, lb)


def single(workdir):  # one process, micro batch 1 x accumulation 2: the samples one TP or SP replica reads
    return run(workdir, "single", "z2", 1)


@pytest.mark.slow
def test_sequence_parallel_trains_like_one_process_and_resumes_exactly(workdir):
    """Ulysses SP 2 at ZeRO-2: every step's loss equals the single process's to 4 decimals; with rank 1 SIGKILLed after
    step 3 and a restart from the step-2 checkpoint, the same losses as the uninterrupted SP run, exactly."""
    ref = single(workdir)
    sp = run(workdir, "sp2", "z2_sp2", 2, "--save-every", "2")
    assert_same_losses(sp, ref)
    crashed = run(workdir, "sp2_crash", "z2_sp2", 2, "--save-every", "2", "--max-restarts", "1",
                  env_extra={"ZEROKIT_TEST_CRASH_AT_STEP": "3", "ZEROKIT_TEST_CRASH_RANK": "1"})
    assert [s["resumed_from"] for s in records(crashed) if s["event"] == "start"] == [0, 2]
    assert losses(crashed) == losses(sp)


@pytest.mark.slow
def test_sequence_parallel_with_a_tiled_loss_at_zero3(workdir):
    """SP 2 at ZeRO-3 with TiledFusedLogitsLoss: the single process's losses (ZeRO-3 and ZeRO-2 agree in fp32)."""
    assert_same_losses(run(workdir, "sp2_z3_tloss", "z3_sp2", 2, "--tiled-loss", "on"), single(workdir))


@pytest.mark.slow
def test_tensor_parallel_with_tiled_mlp_and_loss_exports_whole_weights(workdir):
    """AutoTP 2 at ZeRO-1, every MLP through TiledMLP (2 slices) and the loss tiled: the single process's losses, and
    final/ holds whole tensors (gathered from both ranks) equal to the single process's final weights."""
    from safetensors.torch import load_file

    ref = single(workdir)
    tp = run(workdir, "tp2_tiled", "z1_tp2", 2, "--tiled-loss", "on", "--tiled-mlp", "on")
    assert_same_losses(tp, ref)
    a, b = load_file(str(ref / "final" / "model.safetensors")), load_file(str(tp / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].shape == b[k].shape, k
        diff = (b[k] - a[k]).abs()
        # Adam moves an element by at most ~lr a step, so float noise bounds the difference by 2 lr x steps; a slice
        # gathered into the wrong place would differ by the weights themselves (init std 0.02) nearly everywhere
        assert float(diff.max()) <= 2 * LR * STEPS, (k, float(diff.max()))
        assert float(diff.median()) < 1e-6, (k, float(diff.median()))


@pytest.mark.slow
def test_hpz_on_four_ranks_trains_like_one_process(workdir):
    """ZeRO++ hpZ (partition 2) on 4 ranks, micro batch 1 x accumulation 2: the samples of one process at micro batch
    4 x accumulation 2 (DistributedSampler deals rank r the r-th of every 4)."""
    ref = run(workdir, "single_mb4", "z2_mb4", 1)
    assert_same_losses(run(workdir, "hpz2", "z3_hpz2", 4), ref)


def test_launch_refuses_parallel_pins_with_a_config(workdir):
    """--config decides the parallelism (its keys); a pin beside it is one line, exit 2, nothing written."""
    out = workdir / "refused"
    p = zk("--model", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", SEQ, "--steps", 1,
           "--data", workdir / "data.txt", "--config", workdir / "z2.json", "--output-dir", out,
           "--sequence-parallel", "2")
    assert p.returncode == 2 and "with --config the config decides" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not out.exists()


def _tiling(workdir, config: str, ga: int) -> tuple[list[int], list[int]]:
    """One process, ZeRO-2 fp32, seq 256, micro batch 1 x accumulation `ga`, without and with the tiled loss and MLP
    (2 slices each): the same losses; returns the measured per-rank peaks (live tensor bytes) and the plan's."""
    from zerokit.planning.planner import evaluate
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.setup import Workload, ZeroKnobs, ZeroSetup

    ref = single(workdir) if config == "z2" else run(workdir, f"single_{config}", config, 1)
    tiled = run(workdir, f"single_tiled_{config}", config, 1, "--tiled-loss", "on", "--tiled-mlp", "on")
    assert_same_losses(tiled, ref)

    def peak(out):
        return max(r["peak_allocated_bytes"] for r in records(out) if r.get("event") == "end")

    spec, cluster = load_model_spec("tiny-llama"), build_cluster(gpu="cpu", gpus_per_node=1)
    knobs = ZeroKnobs.from_zero_config(CONFIGS[config]["zero_optimization"])
    base = ZeroSetup(zero_stage=2, precision="fp32", micro_batch_size=1, gradient_accumulation_steps=ga)
    predicted = [evaluate(spec, cluster, Workload(seq_len=SEQ), s, knobs).memory.per_gpu_total
                 for s in (base, ZeroSetup(**{**base.to_dict(), "tiled_loss": True, "tiled_mlp": True}))]
    return [peak(ref), peak(tiled)], predicted


@pytest.mark.slow
def test_tiling_drops_the_predicted_memory_and_keeps_the_loss(workdir):
    """Without accumulation the measured peak falls by what the memory model predicts, within 10% (4.08 MB measured,
    4.14 predicted), and each peak is within 3% of the plan's."""
    measured, predicted = _tiling(workdir, "z2_ga1", 1)
    drop_predicted, drop_measured = predicted[0] - predicted[1], measured[0] - measured[1]
    assert drop_predicted > 0 and abs(drop_measured - drop_predicted) <= 0.1 * drop_predicted, (drop_measured, drop_predicted)
    for m, p in zip(measured, predicted):
        assert abs(p - m) <= 0.03 * m, (measured, predicted)


@pytest.mark.slow
def test_tiling_with_accumulation_keeps_the_loss(workdir):
    """Micro batch 1 x accumulation 2, with and without the tiled loss and MLP: the same losses (the peaks: below)."""
    ref = single(workdir)
    assert_same_losses(run(workdir, "single_tiled_z2", "z2", 1, "--tiled-loss", "on", "--tiled-mlp", "on"), ref)


@pytest.mark.slow
def test_tiling_with_accumulation_peaks_where_the_plan_says(workdir):
    """Micro batch 1 x accumulation 2, tiled: the peak is mid-backward, where ZeRO-2's new contiguous gradient buffer
    (stage_1_and_2.py copy_grads_in_partition) sits beside the accumulated one with the activations alive (the plan's
    backward_reduce phase) and TiledMLP's accumulating weight gradients (memory.tiled_mlp_weight_grads): within 1.5% of
    the plan's (37.26 MB measured, 37.03 planned; without the weight gradients 36.49, without that phase 35.57)."""
    measured, predicted = _tiling(workdir, "z2", 2)
    assert abs(predicted[1] - measured[1]) <= 0.015 * measured[1], (measured, predicted)


@pytest.mark.slow
def test_tensor_parallel_resumes_on_more_ranks_like_the_uninterrupted_run(workdir):
    """AutoTP 2 stopped at step 2 and resumed on 4 ranks (TP 2 x DP 2) through DeepSpeed's universal checkpoint: the
    global batch held (2 replicas of micro 1, accumulation re-derived to 1) and the uninterrupted TP 2 run's losses
    (launching/checkpoints.py: the held batch deals the same samples to every step)."""
    ref = run(workdir, "tp2_ref", "z1_tp2", 2)
    out = workdir / "tp2_resized"
    p = zk("--model", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", 2, "--seq-len", SEQ, "--steps", 2,
           "--data", workdir / "data.txt", "--config", workdir / "z1_tp2.json", "--output-dir", out, "--no-report",
           "--save-every", 2)
    assert p.returncode == 0, p.stderr[-3000:]
    p = zk("--model", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", 4, "--seq-len", SEQ, "--steps", STEPS,
           "--data", workdir / "data.txt", "--config", workdir / "z1_tp2.json", "--output-dir", out, "--no-report",
           "--resume")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert ("converted to a universal checkpoint for 4 ranks; global batch 2 held: micro 1 x accumulation 1 x 2 "
            "data-parallel replicas (TP 2 on 4 ranks)") in p.stdout
    got, want = losses(out), losses(ref)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert all(got[s] == pytest.approx(want[s], rel=1e-5) for s in got), (got, want)


@pytest.mark.slow
def test_a_sequence_parallel_checkpoint_is_not_resumed_on_other_ranks(workdir):
    """DeepSpeed 0.19.8 cannot reload an SP checkpoint on another number of ranks (checkpoints.check_resize_parallelism:
    seen failing in ds_to_universal, then in the universal load): one line, exit 2, the checkpoint left as it was."""
    sp = run(workdir, "sp2", "z2_sp2", 2, "--save-every", "2")
    before = sorted(p.name for p in (sp / "checkpoints").iterdir())
    p = zk("--model", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", 4, "--seq-len", SEQ, "--steps", STEPS + 2,
           "--data", workdir / "data.txt", "--config", workdir / "z2_sp2.json", "--output-dir", sp, "--no-report",
           "--resume")
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and "sequence-parallel run (SP 2 on 2 ranks)" in err[0], p.stderr
    assert "resume on 2 ranks" in err[0]
    assert sorted(p.name for p in (sp / "checkpoints").iterdir()) == before
