"""Real 2-rank DeepSpeed runs on CPU (gloo): the training entry point, checkpoints, resume, crashes.

Every run trains the bundled tiny random-init Llama (zerokit/data/models/tiny-llama) on a small,
repeated text for a few steps (seq 32, micro batch 2, accumulation 2, 2 ranks: 8 sequences per step).
Runs are cached per module so each configuration is launched once; ~13 launches in all.

Oracles: fp32 losses agree across ZeRO stages 0-3 and offload to float32 rounding (same seed, same data
order; bit-identical on the reference AVX2 machine, see LOSS_REL); a resumed or restarted run
reproduces the uninterrupted run's losses and final weights exactly.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

from zerokit.launching.command import LaunchSpec, build_launch_command
from zerokit.launching.rank_options import RankOptions
from zerokit.launching.runner import run_with_restarts, shm_files
from zerokit.launching.checkpoints import read_latest, stale_checkpoints
from zerokit.measure.ranks import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
STEPS = 8
SEQ = 32




def ds_config(stage: int, precision: str = "fp32", offload_optimizer: str = "none", offload_param: str = "none",
              clipping: float = 0.0) -> dict:
    """Gradient clipping is off by default: the global norm is summed in a stage-dependent order, so a clip
    coefficient differs in the last bit between stages and the cross-stage oracle would be approximate."""
    zero: dict = {"stage": stage}
    if stage:
        zero.update(reduce_bucket_size=128 * 128, allgather_bucket_size=128 * 128, overlap_comm=False,
                    contiguous_gradients=True)
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=int(0.9 * 128 * 128), stage3_param_persistence_threshold=1280,
                    stage3_max_live_parameters=10**6, stage3_max_reuse_distance=10**6)
    if offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": offload_optimizer, "pin_memory": False}
    if offload_param != "none":
        zero["offload_param"] = {"device": offload_param, "pin_memory": False}
    cfg = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                                                  "weight_decay": 0.0,
                                                  # as render does: torch AdamW unless the optimizer is offloaded
                                                  # (then DeepSpeedCPUAdam)
                                                  "torch_adam": offload_optimizer == "none"}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-3,
                                                     "warmup_num_steps": 2, "warmup_type": "linear"}},
        "gradient_clipping": clipping,
        "zero_optimization": zero,
        "steps_per_print": 10**6,
        "wall_clock_breakdown": False,
    }
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("train")
    corpus = (REPO / "zerokit" / "data" / "corpus" / "tiny_corpus.txt").read_text()
    # a short text repeated: the model can memorize it within a few steps, so the loss must fall
    (d / "data.txt").write_text((corpus[:1500] + "\n") * 12)
    return d


def launch(workdir: Path, name: str, cfg: dict, steps: int = STEPS, save_every: int = 0, resume: bool = False,
           max_restarts: int = 0, env: dict | None = None, out: Path | None = None, extra: dict | None = None,
           model: str = "tiny-llama"):
    """Start a 2-rank job through the real launcher + runner; returns (RunResult, output_dir)."""
    out = out or workdir / name
    cfg_path = workdir / f"{name}.ds_config.json"
    cfg_path.write_text(json.dumps(cfg))
    port = free_port()
    job_env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **(env or {})}

    def make(res: bool, attempt: int):
        opts = workdir / f"{name}.rank_options.{attempt}.json"
        RankOptions(model=model, data=str(workdir / "data.txt"), seq_len=SEQ, ds_config=str(cfg_path),
                    output_dir=str(out), steps=steps, save_every=save_every, resume=res, **(extra or {})).save(opts)
        spec = LaunchSpec(num_gpus=2, master_port=port, script_args=[str(opts)], env=job_env,
                          deepspeed_bin=str(Path(sys.executable).parent / "deepspeed"))
        return build_launch_command(spec)

    before = shm_files(port)
    result = run_with_restarts(make, out, max_restarts=max_restarts, resume=resume, shm_port=port, cwd=str(REPO))
    assert shm_files(port) <= before, "the job's /dev/shm buffers were left behind"
    return result, out


def step_records(out: Path, rank: int = 0) -> list[dict]:
    recs = [json.loads(x) for x in (out / "metrics" / f"rank{rank}.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in recs if r.get("event") == "step"]


def losses(out: Path, attempt: int | None = None) -> dict[int, float]:
    """step -> loss (the last record for a step wins: a redone step replaces the first try)."""
    return {r["step"]: r["loss"] for r in step_records(out) if attempt is None or r["attempt"] == attempt}


def final_weights(out: Path) -> dict:
    from safetensors.torch import load_file

    files = sorted((out / "final").glob("*.safetensors"))
    assert files, f"no weights in {out / 'final'}"
    sd = {}
    for f in files:
        sd.update(load_file(str(f)))
    return sd


_RUNS: dict[str, tuple] = {}


def cached(workdir, name, cfg, **kw):
    if name not in _RUNS:
        _RUNS[name] = launch(workdir, name, cfg, **kw)
    return _RUNS[name]


# ----------------------------------------------------------------------------------------------


def test_stage2_fp32_trains_and_writes_everything(workdir):
    res, out = cached(workdir, "z2", ds_config(2), save_every=4)
    assert res.ok and res.restarts == 0
    ls = losses(out)
    assert sorted(ls) == list(range(1, STEPS + 1))
    first, last = sum(ls[s] for s in (1, 2)) / 2, sum(ls[s] for s in (STEPS - 1, STEPS)) / 2
    assert last < first - 0.3, ls
    # every rank logs every step, with step time, throughput and a peak-memory figure
    for rank in (0, 1):
        recs = step_records(out, rank)
        assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
        assert all(r["step_time"] > 0 and r["tokens_per_s"] > 0 for r in recs)
        assert all(r.get("peak_allocated_bytes", 0) > 0 for r in recs), recs[-1]
    # the start record says where the startup went (main's named steps), the parts within the whole
    start = next(json.loads(line) for line in (out / "metrics" / "rank0.jsonl").read_text().splitlines()
                 if json.loads(line).get("event") == "start")
    phases = start["startup_phases_s"]
    assert set(phases) == {"setup", "model", "engine"} and all(v > 0 for v in phases.values()), phases
    assert sum(phases.values()) <= start["startup_s"]
    assert read_latest(out / "checkpoints") == f"step{STEPS}"
    assert (out / "checkpoints" / "step4").is_dir()
    # final/: a save_pretrained directory that transformers loads
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m = AutoModelForCausalLM.from_pretrained(str(out / "final"))
    assert sum(p.numel() for p in m.parameters()) > 10**6
    assert len(AutoTokenizer.from_pretrained(str(out / "final"))) == 2048


# Cross-stage oracle. On the reference machine (AVX2) fp32 losses were bit-identical across stages; on
# this project's current machines (AVX-512) they agree to ~1e-7 relative and the first difference
# appears a few steps in (the flat fp32 partitions of ZeRO-2/3 vs per-parameter tensors take
# different vectorized/tail code paths in the optimizer and matmuls). So: equal to float32 rounding
# noise, and exactly equal within a stage (see the resume and restart tests).
LOSS_REL = 1e-6


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_fp32_losses_equal_across_stages(workdir, stage):
    _, ref = cached(workdir, "z2", ds_config(2), save_every=4)
    res, out = cached(workdir, f"z{stage}", ds_config(stage))
    assert res.ok
    got, want = losses(out), losses(ref)
    assert sorted(got) == sorted(want)
    assert got[1] == want[1]  # the same initial weights and data: the first loss is bit-identical
    for s in want:
        assert got[s] == pytest.approx(want[s], rel=LOSS_REL), (s, got[s], want[s])


def test_stage3_final_weights_match_stage2(workdir):
    """ZeRO-3's export (zero_to_fp32) and ZeRO-2's save_pretrained give the same parameters (fp32)."""
    import torch

    _, ref = cached(workdir, "z2", ds_config(2), save_every=4)
    res, out = cached(workdir, "z3", ds_config(3))
    assert res.ok
    a, b = final_weights(ref), final_weights(out)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype == torch.float32 and a[k].shape == b[k].shape, k
        diff = (a[k] - b[k]).abs()
        # Adam turns a last-bit gradient difference on a near-zero gradient into up to ~lr of update
        assert diff.mean() < 1e-5 and diff.max() < 1e-2, (k, float(diff.mean()), float(diff.max()))


@pytest.mark.parametrize("name,cfg", [
    ("z2_offopt", ds_config(2, offload_optimizer="cpu")),
    ("z3_offall", ds_config(3, offload_optimizer="cpu", offload_param="cpu")),
])
def test_offload_trains_like_no_offload(workdir, name, cfg):
    _, ref = cached(workdir, "z2", ds_config(2), save_every=4)
    res, out = cached(workdir, name, cfg)
    assert res.ok
    got, want = losses(out), losses(ref)
    assert sorted(got) == sorted(want)
    # DeepSpeedCPUAdam vs torch AdamW: same math, possibly different rounding
    for s in want:
        assert got[s] == pytest.approx(want[s], rel=1e-5), (s, got[s], want[s])


def test_bf16_stage3_with_activation_checkpointing_trains(workdir):
    res, out = cached(workdir, "z3_bf16", ds_config(3, precision="bf16", clipping=1.0),
                      extra={"gradient_checkpointing": True})
    assert res.ok
    ls = losses(out)
    assert sum(ls[s] for s in (STEPS - 1, STEPS)) / 2 < sum(ls[s] for s in (1, 2)) / 2 - 0.3
    assert any((out / "final").glob("*.safetensors"))


def test_bf16_stage2_exports_16bit(workdir):
    res, out = cached(workdir, "z2_bf16", ds_config(2, precision="bf16", clipping=1.0))
    assert res.ok
    import torch

    sd = final_weights(out)
    assert {v.dtype for v in sd.values()} == {torch.bfloat16}


def test_resume_reproduces_uninterrupted_run(workdir):
    """ZeRO-3: stop after 4 steps (final checkpoint), resume to 8: steps 5-8 equal the 8-step run exactly."""
    _, ref = cached(workdir, "z3", ds_config(3))
    res1, out = launch(workdir, "z3_resume", ds_config(3), steps=4)
    assert res1.ok and read_latest(out / "checkpoints") == "step4"
    res2, out = launch(workdir, "z3_resume", ds_config(3), steps=STEPS, resume=True, out=out)
    assert res2.ok
    assert res2.attempts[0].start_step == 4
    resumed = losses(out, attempt=0)
    assert resumed == losses(ref)  # 1-4 from the first run, 5-8 from the resumed one (both attempt 0)
    second = [r for r in step_records(out) if r["step"] > 4]
    assert [r["step"] for r in second] == [5, 6, 7, 8]
    a, b = final_weights(ref), final_weights(out)
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_killed_rank_restarts_from_checkpoint(workdir):
    """SIGKILL rank 1 after step 6 (checkpoint at 4): one restart, steps 5-6 redone, same final weights."""
    _, ref = cached(workdir, "z2", ds_config(2), save_every=4)
    res, out = launch(workdir, "z2_crash", ds_config(2), save_every=4, max_restarts=1,
                      env={"ZEROKIT_TEST_CRASH_AT_STEP": "6", "ZEROKIT_TEST_CRASH_RANK": "1"})
    assert res.ok, res
    assert res.restarts == 1
    assert res.redone_steps == 2
    assert [a.start_step for a in res.attempts] == [0, 4]
    assert res.attempts[0].returncode != 0
    assert losses(out) == losses(ref)
    a, b = final_weights(ref), final_weights(out)
    assert all((a[k] == b[k]).all() for k in a)


def test_crash_while_checkpointing_never_marks_it_latest(workdir):
    """Rank 0 dies after writing step 4's checkpoint but before marking it: `latest` stays at step 2,
    and --resume continues from step 2 to the same losses."""
    _, ref = cached(workdir, "z2", ds_config(2), save_every=4)
    res, out = launch(workdir, "z2_ckcrash", ds_config(2), save_every=2, max_restarts=0,
                      env={"ZEROKIT_TEST_CRASH_IN_CHECKPOINT": "4", "ZEROKIT_TEST_CRASH_RANK": "0"})
    assert not res.ok and res.restarts == 0
    ck = out / "checkpoints"
    assert read_latest(ck) == "step2"
    assert (ck / "step4").is_dir()  # written, but not marked complete
    assert [p.name for p in stale_checkpoints(ck)] == ["step4"]
    assert not (out / "final").exists()
    res2, out = launch(workdir, "z2_ckcrash", ds_config(2), save_every=2, resume=True, out=out)
    assert res2.ok and res2.attempts[0].start_step == 2
    assert losses(out) == losses(ref)
    assert read_latest(ck) == f"step{STEPS}"


def test_stage3_export_of_tied_embeddings_loads(workdir):
    """GPT-2 ties lm_head to wte: zero_to_fp32 returns one shared tensor under two names, which safetensors
    refuses. The export keeps one name and from_pretrained ties the other back."""
    import torch
    from transformers import AutoModelForCausalLM

    res, out = launch(workdir, "gpt2-z3", ds_config(3), steps=2, model="tiny-gpt2")
    assert res.ok, "training or export failed"
    saved = final_weights(out)
    m = AutoModelForCausalLM.from_pretrained(str(out / "final"))
    assert m.lm_head.weight.data_ptr() == m.transformer.wte.weight.data_ptr()
    for name, p in m.state_dict().items():
        if name in saved:
            assert torch.equal(p, saved[name]), name
    assert torch.equal(m.lm_head.weight, saved["transformer.wte.weight"])
