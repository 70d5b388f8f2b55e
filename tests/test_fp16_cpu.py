"""fp16 on the CPU measurement harness (bench/accuracy/fp16_on_cpu) and zerokit's fp16 memory model.

DeepSpeed trains fp16 on a CPU only where its accelerator says so (cpu_accelerator.py
CPU_Accelerator.is_fp16_supported: oneDNN fp16, AVX512-FP16/AMX); the harness lifts that check so the fp16
code paths V100/T4 users run (loss scaler, overflow checks, fp16 ZeRO optimizers) can be metered here.
Slow: a `zerokit calibrate --quick` under the harness (it must measure fp16, and its profile is what lets
`zerokit launch --gpu cpu` accept fp16) and real 2-rank fp16 jobs at ZeRO 0 and 2 through that CLI.
Fast: without the harness zerokit refuses fp16 on this CPU exactly when DeepSpeed does, in one line; the
published LLaMA-Factory OOM (issue #1221) against the step phase.
"""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "accuracy"))

from accuracy import rel_err, summarize

from zerokit.estimate.memory import estimate_memory
from zerokit.spec.hardware import build_cluster
from zerokit.spec.model import load_model_spec
from zerokit.spec.setup import Workload, ZeroKnobs, ZeroSetup

HARNESS = ROOT / "bench" / "accuracy" / "fp16_on_cpu"
MEMORY_TARGET_MAX = 0.08  # bench/accuracy target: max |error| 8%, median 3%
MEMORY_TARGET_MEDIAN = 0.03
GiB = 2**30


def _cpu_accelerator_fp16(harness: bool) -> tuple[bool, bool]:
    """(DeepSpeed's CPU accelerator, zerokit's precision_supported) on fp16, in a fresh interpreter."""
    code = ("from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator\n"
            "from zerokit.measure.calibrate import precision_supported\n"
            "print(bool(CPU_Accelerator().is_fp16_supported()), precision_supported('fp16', 'cpu')[0])")
    env = dict(os.environ)
    if harness:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HARNESS), env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    ds, zk = out.stdout.split()[-2:]
    return ds == "True", zk == "True"


@pytest.mark.parametrize("harness", [False, True])
def test_precision_supported_follows_deepspeeds_accelerator(harness):
    ds, zk = _cpu_accelerator_fp16(harness)
    assert zk == ds
    if harness:
        assert ds  # the harness is what lets the fp16 rows run on a CPU without AVX512-FP16


def test_plain_cpu_refuses_fp16_in_one_line(tmp_path):
    """No harness, no fp16 profile: `zerokit launch --config fp16.json --gpu cpu` stops before any rank starts."""
    ds, _ = _cpu_accelerator_fp16(harness=False)
    if ds:
        pytest.skip("this CPU trains fp16 in DeepSpeed (AVX512-FP16/AMX)")
    import run as bench

    job = bench.J("tiny-llama", 2, "fp16", 2, 64)
    cpu = build_cluster(gpu="cpu", gpus_per_node=2)
    # rendered for a CPU that trains fp16 (the profile's view); the plain user's launch must still refuse it
    cluster = replace(cpu, accelerator=replace(cpu.accelerator, fp16=True, fp16_tflops=0.001))
    cfg = tmp_path / "fp16.json"
    cfg.write_text(json.dumps(bench.render(job, cluster, 2)))
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "zerokit", "launch", "--model", "tiny-llama", "--config", str(cfg),
                          "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", "64", "--steps", "2",
                          "--output-dir", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and "[WARNING]" not in ln]
    assert res.returncode == 2, res.stderr
    assert len(lines) == 1 and "fp16" in lines[0] and "Traceback" not in res.stderr, res.stderr
    assert not out.exists()


# -- the published case ---------------------------------------------------------------------------------------
def test_llamafactory_1221_zero2_fp16_v100_oom_is_the_step_phase_plus_torch_adamw():
    """https://github.com/hiyouga/LLaMA-Factory/issues/1221: full fine-tuning of LLaMA-7B, 8 x V100-32GB, ZeRO-2
    (the README's ds_z2_config: fp16 auto, reduce/allgather buckets 5e8, overlap_comm false, no optimizer block, so
    the HF Trainer's torch AdamW), per_device_train_batch_size 1 (sequence length not given: LLaMA-Factory's default
    cutoff_len then was 1024). OOM in torch's single-tensor AdamW
    `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`: "Tried to allocate 3.14 GiB ... 28.28 GiB
    already allocated". 3.14 GiB is one fp32 tensor of the rank's flat partition, 4Ψ/8; the 28.28 GiB are zerokit's
    step phase for that optimizer (allocated: without the CUDA context allowance) less the second of its two
    temporaries (the first, exp_avg_sq.sqrt(), was made).
    The second (the division) is what did not fit. FusedAdam (what zerokit renders) makes neither: the miss is the
    client optimizer, not fp16 (docs/memory-model.md, "fp16")."""
    model = load_model_spec("llama-2-7b")  # LLaMA-1 7B's shapes and 6,738,415,616 parameters
    cluster = build_cluster(gpu="v100-32gb", gpus_per_node=8)
    knobs = ZeroKnobs.from_zero_config({"stage": 2, "allgather_bucket_size": 5e8, "reduce_bucket_size": 5e8,
                                        "overlap_comm": False, "contiguous_gradients": True})
    knobs = replace(knobs, optimizer="adamw_torch")  # no optimizer block: the HF Trainer's torch AdamW
    est = estimate_memory(model, cluster, ZeroSetup(zero_stage=2, precision="fp16", micro_batch_size=1),
                          Workload(seq_len=1024), knobs)
    partition_fp32 = 4 * model.params // cluster.world_size
    assert round(partition_fp32 / GiB, 2) == 3.14  # "Tried to allocate 3.14 GiB"
    step = est.phase_terms["step"]
    assert step["optimizer_step_temporaries"] == 2 * partition_fp32
    allocated_at_oom = sum(v for k, v in step.items() if k != "cuda_context") - partition_fp32
    assert abs(rel_err(allocated_at_oom, 28.28 * GiB)) < 0.01


def test_zero0_fp16_fused_adam_counts_the_flatten_copies():
    """FP16_Optimizer.step (runtime/fp16/fused_optimizer.py) flattens per-tensor fp32 copies of the gradients: 4Ψ
    more than bf16's BF16_Optimizer at the step; not with torch AdamW (FP16_UnfusedOptimizer, the CPU rows)."""
    model = load_model_spec("tiny-llama")
    gpu = build_cluster(gpu="a100-80gb", gpus_per_node=2)
    cpu = build_cluster(gpu="cpu", gpus_per_node=2)
    cpu = replace(cpu, accelerator=replace(cpu.accelerator, fp16=True, fp16_tflops=0.001))

    def step(cluster, precision):
        return estimate_memory(model, cluster, ZeroSetup(zero_stage=0, precision=precision, micro_batch_size=1),
                               Workload(seq_len=64)).phase_terms["step"]

    assert step(gpu, "fp16")["fp16_flatten_copies"] == 4 * model.params
    assert "fp16_flatten_copies" not in step(gpu, "bf16") and "fp16_flatten_copies" not in step(cpu, "fp16")


# -- real fp16 runs through the harness ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def fp16_runs(tmp_path_factory):
    """One quick calibration under the harness and 2-rank fp16 tiny-llama jobs at ZeRO 0 and 2, 3 steps each
    (2 metered), through `zerokit launch --gpu cpu --hardware-profile <that profile>` (bench/accuracy/run.py)."""
    import run as bench

    tmp = tmp_path_factory.mktemp("fp16")
    profile = bench.fp16_cpu_profile(None, tmp, model="tiny-llama")  # the jobs below are tiny-llama's
    cluster = bench.make_cluster("cpu", 2, None, None, profile)
    runs = {}
    for stage in (0, 2):
        job = bench.J("tiny-llama", stage, "fp16", 2, 64)
        res = bench.run_job(job, tmp, "cpu", 2, cluster, steps=3, memory_steps=2, timeout=600, profile=profile)
        assert res["returncode"] == 0, (tmp / f"{job.name}.log").read_text()[-3000:]
        cfg = json.loads((tmp / f"{job.name}.ds_config.json").read_text())
        recs = [json.loads(x) for x in (tmp / job.name / "metrics" / "rank0.jsonl").read_text().splitlines()]
        runs[stage] = {"measured": bench.measure(tmp / job.name, warmup=2), "pred": bench.predict(job, cluster, cfg),
                       "records": recs, "config": cfg}
    return {"profile": json.loads(Path(profile).read_text()), "runs": runs}


@pytest.mark.slow
@pytest.mark.timed
def test_calibrate_under_the_harness_measures_fp16(fp16_runs):
    assert fp16_runs["profile"]["matmul_tflops"]["fp16"] > 0


@pytest.mark.slow
@pytest.mark.timed
def test_fp16_runs_train_in_fp16_with_decreasing_loss(fp16_runs):
    for stage, r in fp16_runs["runs"].items():
        assert r["config"]["fp16"]["enabled"] is True
        start = next(x for x in r["records"] if x.get("event") == "start")
        assert start["precision"] == "fp16" and start["zero_stage"] == stage
        losses = [x["loss"] for x in r["records"] if x.get("event") == "step"]
        assert len(losses) == 3 and losses[-1] < losses[0], losses


@pytest.mark.slow
@pytest.mark.timed
def test_fp16_peak_memory_within_the_grid_targets(fp16_runs):
    errors = [rel_err(r["pred"]["per_rank_bytes"], m["peak_bytes"])
              for r in fp16_runs["runs"].values() for m in r["measured"].values()]
    assert len(errors) == 4
    assert max(abs(e) for e in errors) <= MEMORY_TARGET_MAX, errors
    assert summarize(errors)["median_abs"] <= MEMORY_TARGET_MEDIAN, errors


def _check_1221(capsys, *extra):
    """`zerokit check` of LLaMA-Factory's own ds_z2_config (tests/data/user_configs, copied unchanged) for #1221's
    run: LLaMA-7B, 8 x V100-32GB, per_device_train_batch_size 1, fp16, cutoff_len 1024."""
    from zerokit.cli import main as cli_main

    code = cli_main(["check", str(ROOT / "tests/data/user_configs/llamafactory_ds_z2_config.json"), "--model",
                     "llama-2-7b", "--gpu", "v100-32gb", "--gpus-per-node", "8", "--seq-len", "1024",
                     "--micro-batch", "1", "--precision", "fp16", "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def test_llamafactory_1221_does_not_fit_with_its_optimizer(capsys):
    """The config has no optimizer block, so the HF Trainer's --optim updates; in 2023 that was the unfused torch
    AdamW, whose step ran out of memory (#1221). With --client-optimizer adamw_torch zerokit says it does not fit, its
    peak the step with the two temporaries; with the fused kernel (the Trainer's default since torch 2.8) the step
    holds none and the peak is mid-backward instead: ZeRO-2's contiguous gradient partition beside the activations
    (backward_reduce), 105% of zerokit's budget. #1221's own run got through that moment, which zerokit puts below
    what the device held when the step failed (28.28 GiB allocated and a 3.14 GiB request)."""
    unfused_code, unfused = _check_1221(capsys, "--client-optimizer", "adamw_torch")
    fused_code, fused = _check_1221(capsys, "--client-optimizer", "adamw_torch_fused")
    assert (unfused_code, fused_code) == (1, 1)
    temps = unfused["evaluation"]["memory"]["phase_terms"]["step"]["optimizer_step_temporaries"]
    assert temps == 2 * 4 * load_model_spec("llama-2-7b").params // 8  # two fp32 copies of the rank's partition
    assert "optimizer_step_temporaries" not in fused["evaluation"]["memory"]["phase_terms"]["step"]
    assert unfused["evaluation"]["memory"]["peak_phase"] == "step"
    memory = fused["evaluation"]["memory"]
    assert memory["peak_phase"] == "backward_reduce"
    reduce = memory["phase_terms"]["backward_reduce"]
    allocated = sum(v for k, v in reduce.items() if k not in ("cuda_context", "cublas_workspace"))
    assert allocated < (28.28 + 3.14) * 2**30
    assumed = {a["key"]: a for a in unfused["assumed"]}
    assert assumed["optimizer"]["value"] == "adamw_torch" and "--client-optimizer given" in assumed["optimizer"]["why"]
