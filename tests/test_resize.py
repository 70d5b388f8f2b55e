"""Resume on another number of ranks (`zerokit launch --resume` with another --gpus-per-node): detection from the
checkpoint's files, the global batch held, the report of the current world only, and real runs through DeepSpeed's
universal checkpoint (deepspeed/checkpoint/ds_to_universal.py, `checkpoint.load_universal`).

The oracle of the real runs: with the global batch held, DistributedSampler's one seeded permutation dealt
round-robin puts the same samples in every optimizer step whatever the world size, so an fp32 run stopped at step
2 and resumed on another world size reproduces the losses of steps 3-4 of the uninterrupted 2-rank run to float32
rounding (1e-5 relative; measured ~5e-8: only the order of the gradient sums differs), and its Adam state at step 4
(step count, |exp_avg|^2, |exp_avg_sq|^2 summed over the shards) equals the uninterrupted run's: an optimizer that
started afresh at step 3 would count 2 steps, not 4, and hold other moments.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zerokit.core.errors import ZerokitError
from zerokit.launching.checkpoints import (
    CKPT_SUBDIR,
    convert_to_universal,
    detect_resize,
    held_accumulation,
    read_shape,
    write_latest,
    write_shape,
)
from zerokit.report.run_report import summarize_metrics

REPO = Path(__file__).resolve().parents[1]
LOSS_REL = 1e-5


def fake_checkpoint(out: Path, world: int, micro: int | None = 2, accum: int | None = 2, stage: int = 2,
                    shards: int | None = None, tag: str = "step2") -> Path:
    """A run directory whose latest checkpoint has zerokit's shape file (micro given) and/or DeepSpeed's per-rank
    optimizer shard names (empty files: detection reads names, never contents)."""
    d = out / CKPT_SUBDIR / tag
    d.mkdir(parents=True)
    if micro is not None:
        write_shape(d, world, micro, accum, stage, "fp32")
    for r in range(world if shards is None else shards):
        (d / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt").write_bytes(b"")
    write_latest(out / CKPT_SUBDIR, tag)
    return d


# ----------------------------------------------------------------------------------------------
# detection and the batch arithmetic (pure)


def test_same_world_resumes_as_today(tmp_path):
    fake_checkpoint(tmp_path, world=2)
    assert detect_resize(tmp_path / CKPT_SUBDIR, 2) is None


def test_other_world_is_detected_with_its_global_batch(tmp_path):
    fake_checkpoint(tmp_path, world=2, micro=3, accum=2)
    rs = detect_resize(tmp_path / CKPT_SUBDIR, 1)
    assert rs is not None and rs.old.world_size == 2 and rs.new_world_size == 1
    assert rs.old.global_batch == 3 * 2 * 2 and rs.old.step == 2 and rs.needs_conversion
    assert rs.universal_tag == "step2_universal"


def test_world_from_deepspeed_shards_without_shape_file(tmp_path):
    fake_checkpoint(tmp_path, world=4, micro=None)
    shape = read_shape(tmp_path / CKPT_SUBDIR)
    assert shape.world_size == 4 and shape.global_batch is None  # prepare.held_global_batch reads launch.json


def test_zero0_loads_without_conversion(tmp_path):
    fake_checkpoint(tmp_path, world=2, stage=0, shards=0)
    rs = detect_resize(tmp_path / CKPT_SUBDIR, 1)
    assert rs is not None and not rs.needs_conversion


@pytest.mark.parametrize("global_batch,micro,world", [(8, 4, 1), (8, 2, 2), (24, 3, 4), (8, 1, 8)])
def test_held_accumulation_keeps_the_global_batch(global_batch, micro, world):
    assert micro * held_accumulation(global_batch, micro, world) * world == global_batch


def test_unsplittable_global_batch_names_the_world_sizes_that_work():
    with pytest.raises(ZerokitError) as e:
        held_accumulation(6, 2, 2)
    msg = str(e.value)
    assert "\n" not in msg and "global batch 6" in msg and "1, 3 ranks" in msg


def _start(rank, world, run_id, t):
    return {"event": "start", "rank": rank, "world_size": world, "run_id": run_id, "attempt": 0, "time": t}


def _step(step, run_id, peak, t):
    return {"event": "step", "step": step, "run_id": run_id, "attempt": 0, "step_time": 0.1, "tokens_per_s": 10.0,
            "global_tokens_per_s": 20.0, "peak_allocated_bytes": peak, "time": t}


def test_report_keeps_only_the_current_world():
    """The issue's bug: a 2-rank run resumed on 1 rank reported rank 1 of the earlier run next to the new one."""
    metrics = {
        0: [_start(0, 2, "old", 1), _step(1, "old", 100, 2), _step(2, "old", 100, 3),
            _start(0, 1, "new", 10), _step(3, "new", 200, 11), _step(4, "new", 200, 12)],
        1: [_start(1, 2, "old", 1), _step(1, "old", 100, 2), _step(2, "old", 100, 3)],
    }
    m = summarize_metrics(metrics)
    assert m["world_size"] == 1 and list(m["ranks"]) == [0]
    assert m["peak_memory_bytes_max"] == 200  # the old run's records are left out, not merged
    # a resume on the same world size still reports both runs' steps, as before
    same = {r: [dict(x, world_size=2) if x["event"] == "start" else x for x in recs] for r, recs in metrics.items()}
    same[1] += [_start(1, 2, "new", 10), _step(3, "new", 200, 11)]
    assert summarize_metrics(same)["world_size"] == 2


# ----------------------------------------------------------------------------------------------
# planning a resized resume (real prepare_launch: tokenizes, plans, writes nothing)


def test_prepare_holds_the_global_batch_with_config(tmp_path):
    from zerokit.launching.prepare import LaunchRequest, prepare_launch
    from zerokit.spec.hardware import HardwareOptions

    fake_checkpoint(tmp_path / "run", world=2, micro=2, accum=2)
    cfg = ds_config(2)
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    req = LaunchRequest(model="tiny-llama", hardware=HardwareOptions(gpu="cpu", gpus_per_node=1), seq_len=32,
                        steps=4, config=str(tmp_path / "ds.json"), resume=True, output_dir=str(tmp_path / "run"))
    plan = prepare_launch(req)
    c = plan.ds_config
    assert plan.resize.old.world_size == 2 and plan.cluster.world_size == 1
    assert c["train_micro_batch_size_per_gpu"] == cfg["train_micro_batch_size_per_gpu"]  # the user's micro stays
    assert c["gradient_accumulation_steps"] * c["train_micro_batch_size_per_gpu"] * 1 == 2 * 2 * 2
    assert c["checkpoint"]["load_universal"] is True


def test_prepare_replans_with_the_global_batch_pinned(tmp_path):
    from zerokit.launching.prepare import LaunchRequest, prepare_launch
    from zerokit.spec.hardware import HardwareOptions

    fake_checkpoint(tmp_path / "run", world=1, micro=4, accum=2, stage=3)
    req = LaunchRequest(model="tiny-llama", hardware=HardwareOptions(gpu="cpu", gpus_per_node=2), seq_len=32,
                        steps=4, resume=True, output_dir=str(tmp_path / "run"))
    s = prepare_launch(req).setup
    assert s.micro_batch_size * s.gradient_accumulation_steps * 2 == 4 * 2 * 1
    assert s.zero_stage == 3 and s.precision == "fp32"  # the checkpoint's optimizer only loads into its own kind


@pytest.mark.parametrize("written,asked", [(2, 1), (1, 2), (2, 4)])
def test_a_resume_at_another_stage_count_is_one_line(tmp_path, written, asked):
    """A checkpoint's zerokit.json records its pipeline stages (each stage's layer files and ZeRO-1 partitions are its
    own): a resume with other stages, at the same GPU count, is refused before anything runs."""
    from zerokit.launching.prepare import LaunchRequest, prepare_launch
    from zerokit.spec.hardware import HardwareOptions

    d = tmp_path / "run" / CKPT_SUBDIR / "step2"
    d.mkdir(parents=True)
    write_shape(d, 4, 1, 8, 1, "fp32", pipeline_parallel=written)
    write_latest(tmp_path / "run" / CKPT_SUBDIR, "step2")
    assert read_shape(tmp_path / "run" / CKPT_SUBDIR).pipeline_parallel == written
    req = LaunchRequest(model="tiny-llama", hardware=HardwareOptions(gpu="cpu", gpus_per_node=4), seq_len=32,
                        steps=4, resume=True, output_dir=str(tmp_path / "run"), global_batch=32,
                        pins={"pipeline_parallel": asked} if asked > 1 else {})
    with pytest.raises(ZerokitError) as e:
        prepare_launch(req)
    assert f"written with {written} pipeline stage(s) and this run has {asked}" in str(e.value)
    assert "\n" not in str(e.value)


def test_unconvertible_checkpoint_is_one_line_and_left_untouched(tmp_path):
    """DeepSpeed's converter refuses shard files that are not checkpoints: ZerokitError, no *_universal folder, the
    checkpoint byte for byte as it was."""
    d = fake_checkpoint(tmp_path, world=2)
    (d / "mp_rank_00_model_states.pt").write_bytes(b"not a checkpoint")
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    rs = detect_resize(tmp_path / CKPT_SUBDIR, 1)
    with pytest.raises(ZerokitError) as e:
        convert_to_universal(tmp_path / CKPT_SUBDIR, rs)
    assert "\n" not in str(e.value) and "resume on 2 ranks" in str(e.value)
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    assert sorted(p.name for p in (tmp_path / CKPT_SUBDIR).iterdir()) == ["latest", "step2"]


# ----------------------------------------------------------------------------------------------
# real runs through `zerokit launch` (2 CPU ranks over gloo; tiny-llama, seq 32, 4 steps)


def ds_config(stage: int, ranks: int = 2) -> dict:
    """fp32, no clipping (a clip coefficient sums norms in a world-dependent order), global batch 8: micro 2 x
    accumulation 4 // ranks x ranks. The schedule counts optimizer steps, which the held global batch keeps."""
    zero: dict = {"stage": stage, "reduce_bucket_size": 128 * 128, "allgather_bucket_size": 128 * 128,
                  "overlap_comm": False, "contiguous_gradients": True}
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=int(0.9 * 128 * 128), stage3_param_persistence_threshold=1280)
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4 // ranks,
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                                                      "weight_decay": 0.0, "torch_adam": True}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-3,
                                                         "warmup_num_steps": 2, "warmup_type": "linear"}},
            "gradient_clipping": 0.0, "zero_optimization": zero, "steps_per_print": 10**6}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("resize")
    corpus = (REPO / "zerokit" / "data" / "corpus" / "tiny_corpus.txt").read_text()
    (d / "data.txt").write_text((corpus[:1500] + "\n") * 12)
    for stage in (2, 3):
        for ranks in (1, 2):
            (d / f"z{stage}_{ranks}.json").write_text(json.dumps(ds_config(stage, ranks)))
    return d


def zk_launch(workdir: Path, out: Path, stage: int, ranks: int, steps: int, resume: bool = False,
              config_ranks: int | None = None):
    """`zerokit launch --config` of the global-batch-8 config written for `config_ranks` (default: `ranks`); a
    resume passes the first run's config again, as a user would, and zerokit re-derives the accumulation."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    args = ["--model", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", str(ranks), "--seq-len", "32", "--steps",
            str(steps), "--data", str(workdir / "data.txt"), "--config",
            str(workdir / f"z{stage}_{config_ranks or ranks}.json"),
            "--output-dir", str(out), *(["--resume"] if resume else [])]
    p = subprocess.run([sys.executable, "-m", "zerokit", "launch", *args], capture_output=True, text=True, env=env,
                       cwd=str(REPO), timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def losses(out: Path) -> dict[int, float]:
    recs = [json.loads(x) for x in (out / "metrics" / "rank0.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: r["loss"] for r in recs if r.get("event") == "step"}


def adam_state(tag_dir: Path) -> dict:
    """Adam's step count and the squared norms of exp_avg / exp_avg_sq summed over every rank's shard file (the
    shards' padding is zeros): the same numbers for any world size."""
    import torch

    tot = {"exp_avg": 0.0, "exp_avg_sq": 0.0, "step": set()}

    def walk(o):
        if isinstance(o, dict):
            for k, v in o.items():
                if k in ("exp_avg", "exp_avg_sq") and torch.is_tensor(v):
                    tot[k] += float(v.double().pow(2).sum())
                elif k == "step" and (torch.is_tensor(v) or isinstance(v, (int, float))):
                    tot["step"].add(float(v))
                else:
                    walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)

    files = sorted(tag_dir.glob("*optim_states.pt"))
    assert files, tag_dir
    for f in files:
        walk(torch.load(f, map_location="cpu", weights_only=False))
    return tot


_RUNS: dict = {}


def reference(workdir: Path) -> Path:
    """The uninterrupted run: 2 ranks, ZeRO-2, 4 steps (fp32 losses agree across ZeRO stages to ~1e-7: test_train)."""
    if "ref" not in _RUNS:
        zk_launch(workdir, workdir / "ref", 2, ranks=2, steps=4)
        _RUNS["ref"] = workdir / "ref"
    return _RUNS["ref"]


@pytest.mark.slow
# each stage once and each direction once: ZeRO-2 grows 1 -> 2 ranks, ZeRO-3 shrinks 2 -> 1 (the mirrored pairs ran
# the same universal-checkpoint conversion on the same stage again: 67 s of the suite's time)
@pytest.mark.parametrize("stage,before,after", [(2, 1, 2), (3, 2, 1)])
def test_resume_on_another_world_size_equals_the_uninterrupted_run(workdir, stage, before, after):
    ref = reference(workdir)
    out = workdir / f"z{stage}_{before}to{after}"
    zk_launch(workdir, out, stage, ranks=before, steps=2)
    p = zk_launch(workdir, out, stage, ranks=after, steps=4, resume=True, config_ranks=before)
    rank_word = "rank" if after == 1 else "ranks"
    assert (f"checkpoint step 2 was written by {before} rank{'s' * (before > 1)}; converted to a universal checkpoint "
            f"for {after} {rank_word}; global batch 8 held: micro 2 x accumulation {4 // after} x {after} {rank_word}"
            ) in p.stdout
    assert (out / CKPT_SUBDIR / "step2_universal").is_dir() and (out / CKPT_SUBDIR / "step2").is_dir()
    got, want = losses(out), losses(ref)
    assert sorted(got) == [1, 2, 3, 4]
    for s in (1, 2, 3, 4):  # 1-2: the first run, on its own world size; 3-4: the resumed one
        assert got[s] == pytest.approx(want[s], rel=LOSS_REL), (s, got[s], want[s])
    mine, theirs = adam_state(out / CKPT_SUBDIR / "step4"), adam_state(ref / CKPT_SUBDIR / "step4")
    assert mine["step"] == theirs["step"] == {4.0}
    for k in ("exp_avg", "exp_avg_sq"):
        assert mine[k] == pytest.approx(theirs[k], rel=LOSS_REL), k
    report = json.loads((out / "report.json").read_text())
    assert report["world_size"] == after and [r["rank"] for r in report["per_rank"]] == list(range(after))


def test_tp_and_sp_checkpoints_hold_their_replicas_batch_and_refuse_what_deepspeed_cannot_reload(tmp_path):
    """The shape file records the AutoTP and SP degrees: the global batch counts data-parallel replicas (ranks of one
    TP or SP group read the same samples), a resume may change only the data-parallel degree, and an SP checkpoint is
    not re-cut (DeepSpeed 0.19.8: check_resize_parallelism)."""
    from zerokit.launching.checkpoints import check_resize_parallelism

    tag = tmp_path / CKPT_SUBDIR / "step2"
    tag.mkdir(parents=True)
    write_shape(tag, world_size=4, micro_batch=2, grad_accum=2, zero_stage=1, precision="fp32", tensor_parallel=2)
    write_latest(tmp_path / CKPT_SUBDIR, "step2")
    rs = detect_resize(tmp_path / CKPT_SUBDIR, 8)
    assert rs.old.tensor_parallel == 2 and rs.old.data_parallel == 2 and rs.old.global_batch == 8
    assert held_accumulation(rs.old.global_batch, 2, 8 // 2, 2) == 1
    check_resize_parallelism(rs, 2, 1)  # same degree: fine
    with pytest.raises(ZerokitError, match="keep tensor_parallel.autotp_size 2"):
        check_resize_parallelism(rs, 1, 1)
    with pytest.raises(ZerokitError) as e:
        held_accumulation(8, 2, 3, 2)
    assert "3 data-parallel replicas" in str(e.value) and "resume on 2, 4, 8 ranks" in str(e.value)
    write_shape(tag, world_size=2, micro_batch=1, grad_accum=2, zero_stage=2, precision="fp32", sequence_parallel=2)
    rs = detect_resize(tmp_path / CKPT_SUBDIR, 4)
    with pytest.raises(ZerokitError) as e:
        check_resize_parallelism(rs, 1, 2)
    assert "sequence-parallel run (SP 2 on 2 ranks)" in str(e.value) and "\n" not in str(e.value)
