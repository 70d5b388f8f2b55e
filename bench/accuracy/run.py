"""Predicted vs measured: run a grid of real DeepSpeed jobs and compare zerokit's memory and time predictions.

    python bench/accuracy/run.py --quick                 # ~21 jobs, writes bench/results/accuracy_<device>.{txt,json}
    python bench/accuracy/run.py --full --limit 200      # the whole grid (large)
    python bench/accuracy/run.py --quick --reuse         # re-predict against the runs already on disk (no jobs)
    python bench/accuracy/run.py --quick --hardware-profile prof.json   # time predicted from a calibration
    python bench/accuracy/run.py --only fp16 --steps 3   # the fp16 rows (on CPU through bench/accuracy/fp16_on_cpu)

Every job is a real 2-rank run through the CLI a user would type:
    python -m zerokit launch --model M --config <render_ds_config(setup)> [--gpu cpu] --gpus-per-node 2
        --seq-len S --steps 6 [--activation-checkpointing on] --output-dir RUNS/<job>
with ZEROKIT_MEMORY_STEPS=2 and OMP_NUM_THREADS=cores/ranks on CPU (see rank_threads): the live-tensor-byte meter (zerokit.measure.meter) runs for the first 2
optimizer steps (step 1 creates the optimizer states lazily, step 2 is the steady state) and is then
stopped, so the step times that follow carry none of its overhead. On CUDA the allocator's counters cost
nothing and every step is measured (--gpu is left to launch's auto-detection).

Measured per rank: peak memory = the highest per-phase peak (forward, backward, step) over the metered
steps (the training peak: model build and deepspeed.initialize are logged apart as init_peak_bytes);
step time = median of the steps after the warm-up (first 2) and after the meter stopped.
Predicted: zerokit.planning.planner.evaluate for the same setup, with the knobs read back from the rendered config
(what `zerokit check` and `zerokit launch --config` do).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from accuracy import (MEASURED_GROUPS, TERM_GROUPS, format_table, format_terms, group_terms,
                      rel_err, summary_of_rows)

from zerokit.report.run_dir import metrics_file, metrics_files  # light: no torch, no DeepSpeed

MODELS = {
    "tiny-llama": "tiny-llama",  # bundled: Llama with GQA (4 heads, 2 KV heads), 1.3M params
    "tiny-gpt2": "tiny-gpt2",  # bundled: GPT-2 (gelu_new, dropout), 1.1M params
    "small-llama": str(HERE / "models" / "small-llama"),  # h 384, 6 layers, GQA 6/2: 11.0M params
    "small-gpt2": str(HERE / "models" / "small-gpt2"),  # h 384, 6 layers: 11.6M params
    # the one-GPU rows (ONE_GPU): models whose terms dwarf CUDA's fixed costs (cuBLAS workspaces, allocator rounding)
    "gpu-llama": str(HERE / "models" / "gpu-llama"),  # h 1024, 16 layers, GQA 16/4, vocab 32000: 245.9M params
    "gpt2": "gpt2",  # bundled: GPT-2 small, 124.4M params (tied head, vocab 50257)
    # the lend rows (LEND): sizes people fine-tune, big enough that the GPU, not the host, sets the step time
    "gpu-1b": str(HERE / "models" / "gpu-1b"),  # Llama shape h 2048, 22 layers, GQA 16/4, vocab 32000: ~1.1B params
    "gpu-3b": str(HERE / "models" / "gpu-3b"),  # Llama shape h 3072, 28 layers, GQA 24/8, vocab 32000: ~3.0B params
}


@dataclass(frozen=True)
class Job:
    model: str
    stage: int
    precision: str
    micro_batch: int
    seq_len: int
    offload_optimizer: str = "none"
    offload_param: str = "none"
    ckpt: bool = False
    accum: int = 1  # gradient accumulation steps
    finetune: str = "full"  # full | lora | qlora | freeze (FREEZE_PATTERNS); zerokit launch --finetune / --freeze
    # beyond data parallelism (issue 11): AutoTP and Ulysses degrees, the hpZ partition, ALST's tiling; ranks = the job's
    # ranks on its one node (4 for TP x DP and hpZ, which need more ranks than a group)
    tp: int = 1
    sp: int = 1
    hpz: int = 1
    tiled_loss: bool = False
    tiled_mlp: bool = False
    ranks: int = 2
    ckpt_offload: bool = False  # checkpointed layer inputs to host memory (launch --activation-checkpointing offload)

    @property
    def name(self) -> str:
        parts = [self.model, f"z{self.stage}", self.precision, f"mb{self.micro_batch}", f"s{self.seq_len}"]
        if self.offload_optimizer != "none":
            parts.append(f"oo-{self.offload_optimizer}")
        if self.offload_param != "none":
            parts.append(f"op-{self.offload_param}")
        if self.ckpt:
            parts.append("ckptoff" if self.ckpt_offload else "ckpt")
        if self.accum > 1:
            parts.append(f"ga{self.accum}")
        for tag, v in (("tp", self.tp), ("sp", self.sp), ("hpz", self.hpz)):
            if v > 1:
                parts.append(f"{tag}{v}")
        if self.tiled_loss:
            parts.append("tloss")
        if self.tiled_mlp:
            parts.append("tmlp")
        if self.ranks != 2:
            parts.append(f"r{self.ranks}")
        if self.finetune != "full":
            parts.append(self.finetune)
        return "_".join(parts)

    def finetune_obj(self):
        from zerokit.spec.finetune import Finetune

        if self.finetune == "freeze":
            return Finetune(freeze=FREEZE_PATTERNS[self.model.split("-")[-1]])
        return Finetune(mode=self.finetune)

    def finetune_args(self) -> list[str]:
        """The launch options that train this job's way (the Finetune defaults: r 16, alpha 8, all-linear)."""
        if self.finetune == "freeze":
            return [a for p in FREEZE_PATTERNS[self.model.split("-")[-1]] for a in ("--freeze", p)]
        return [] if self.finetune == "full" else ["--finetune", self.finetune]

    def spec(self):
        """The model as this job trains it: spec.finetune.with_finetune over the counts from its modules."""
        from zerokit.spec.finetune import finetuned_spec
        from zerokit.spec.model import load_model_spec
        from zerokit.spec.resolve import resolve_model

        spec = load_model_spec(MODELS[self.model])
        finetune = self.finetune_obj()
        if finetune.is_full:
            return spec
        return finetuned_spec(spec, str(resolve_model(MODELS[self.model]).config_file()), finetune)

    def setup(self):
        from zerokit.spec.setup import ZeroSetup

        return ZeroSetup(zero_stage=self.stage, offload_optimizer=self.offload_optimizer,
                         offload_param=self.offload_param, precision=self.precision,
                         micro_batch_size=self.micro_batch, gradient_accumulation_steps=self.accum,
                         activation_checkpointing=self.ckpt, tensor_parallel=self.tp, sequence_parallel=self.sp,
                         hpz_partition_size=self.hpz, tiled_loss=self.tiled_loss, tiled_mlp=self.tiled_mlp,
                         checkpoint_offload=self.ckpt and self.ckpt_offload)

    def tiled_args(self) -> list[str]:
        """ALST's tiling is how zerokit's loop runs, not a config key: launch --config takes it as an option."""
        return ((["--tiled-loss", "on"] if self.tiled_loss else []) + (["--tiled-mlp", "on"] if self.tiled_mlp else []))


def J(model, stage, precision, mb, seq, oo="none", op="none", ckpt=False, ga=1, ft="full", tp=1, sp=1, hpz=1,
      tl=False, tm=False, ranks=2) -> Job:
    return Job(model, stage, precision, mb, seq, oo, op, ckpt, ga, ft, tp, sp, hpz, tl, tm, ranks)


# --freeze for the "freeze" rows, by architecture: the input embedding and the first layer, the usual partial
# fine-tune (no gradient flows below the first trainable layer)
FREEZE_PATTERNS = {"llama": ("embed_tokens", "layers.0."), "gpt2": ("wte", "h.0.")}


# A representative subset: every stage, both precisions, optimizer offload at stages 1-3, parameter offload
# at stage 3, checkpointing on/off, micro batch 1..8, sequence 64..256, gradient accumulation 1 and 2, two
# architectures at two sizes.
QUICK = [
    J("tiny-llama", 0, "fp32", 2, 128),
    J("tiny-llama", 0, "bf16", 2, 128),
    J("tiny-llama", 1, "fp32", 4, 128),
    J("tiny-llama", 1, "bf16", 2, 128, oo="cpu"),
    J("tiny-llama", 2, "bf16", 1, 256),
    J("tiny-llama", 2, "fp32", 8, 128, ckpt=True),
    J("tiny-llama", 2, "bf16", 4, 64, oo="cpu"),
    J("tiny-llama", 3, "fp32", 2, 256),
    J("tiny-llama", 3, "bf16", 4, 128, ckpt=True),
    J("tiny-llama", 3, "bf16", 2, 128, oo="cpu", op="cpu"),
    J("tiny-llama", 3, "fp32", 1, 64, oo="cpu"),
    J("tiny-gpt2", 0, "fp32", 4, 128),
    J("tiny-gpt2", 1, "bf16", 2, 256),
    J("tiny-gpt2", 2, "fp32", 2, 128, oo="cpu"),
    J("tiny-gpt2", 2, "bf16", 8, 64, ckpt=True),
    J("tiny-gpt2", 3, "bf16", 4, 128),
    J("tiny-gpt2", 3, "fp32", 2, 128, oo="cpu", op="cpu", ckpt=True),
    J("small-llama", 2, "bf16", 2, 256),
    J("small-llama", 3, "fp32", 4, 128, oo="cpu"),
    J("small-gpt2", 1, "fp32", 2, 256),
    J("small-gpt2", 3, "bf16", 4, 128, ckpt=True),
    # gradient accumulation: earlier micro steps' gradients are alive during the next backward
    J("tiny-llama", 1, "fp32", 4, 128, ga=2),
    J("tiny-gpt2", 2, "bf16", 2, 128, ga=2),
    J("small-llama", 0, "bf16", 2, 128, ga=2),
]
# fp16 (V100/T4/RTX 20xx users' precision): DeepSpeed's fp16 paths (FP16_Optimizer at ZeRO-0, the loss scaler,
# overflow checks) at every stage, with and without offload. On CPU they run through bench/accuracy/fp16_on_cpu
# (DeepSpeed's accelerator check lifted, torch's slow half kernels: small shapes).
FP16 = [J(m, stage, "fp16", 2, 64, oo, op) for m in ("tiny-llama", "tiny-gpt2")
        for stage, oo, op in ((0, "none", "none"), (1, "none", "none"), (2, "none", "none"), (3, "none", "none"),
                              (1, "cpu", "none"), (2, "cpu", "none"), (3, "cpu", "none"), (3, "cpu", "cpu"))]
QUICK += FP16
# Fine-tuning (issue 10): LoRA (peft, all-linear, r 16) at ZeRO-1/2/3, fp32 and bf16, checkpointing on and off; a
# frozen embedding + first layer; QLoRA (bitsandbytes NF4 base) at ZeRO-2/3; Llama and GPT-2 architectures.
FINETUNE = [
    J("tiny-llama", 1, "fp32", 4, 128, ft="lora"),
    J("tiny-llama", 2, "fp32", 2, 128, ft="lora"),
    J("tiny-llama", 2, "bf16", 2, 128, ckpt=True, ft="lora"),
    J("tiny-llama", 3, "bf16", 2, 128, ft="lora"),
    J("tiny-llama", 3, "fp32", 2, 128, ckpt=True, ft="lora"),
    J("tiny-gpt2", 2, "bf16", 2, 128, ft="lora"),
    J("tiny-gpt2", 3, "fp32", 2, 128, ft="lora"),
    J("small-llama", 2, "bf16", 2, 128, ft="lora"),
    J("tiny-llama", 2, "fp32", 2, 128, ft="freeze"),
    J("tiny-gpt2", 3, "bf16", 2, 128, ft="freeze"),
    J("tiny-llama", 2, "bf16", 2, 128, ft="qlora"),
    J("tiny-llama", 3, "bf16", 2, 128, ft="qlora"),
    J("tiny-llama", 2, "fp32", 2, 128, ckpt=True, ft="qlora"),
    # held out: added after the ZeRO-3 module-hook and checkpoint-replay terms (estimate/timing.py) were derived from
    # the rows above, to check them on setups they were not read from
    J("tiny-gpt2", 2, "bf16", 4, 64, ckpt=True, ft="lora"),
    J("tiny-llama", 3, "bf16", 4, 64, ckpt=True, ft="lora"),
    J("small-llama", 3, "bf16", 2, 128, ft="lora"),
    J("tiny-gpt2", 3, "bf16", 2, 128, ft="qlora"),
    # ZeRO-0 (what the planner picks for a small LoRA job on 2 CPU ranks: the README's launch example)
    J("tiny-llama", 0, "bf16", 8, 64, ft="lora"),
    J("tiny-llama", 0, "fp32", 4, 128, ft="lora"),
]
QUICK += FINETUNE
# Beyond data parallelism (issue 11): Ulysses SP at ZeRO-2/3, AutoTP at ZeRO-1/2 (and TP 2 x DP 2 on 4 ranks), ZeRO++
# hpZ on 4 ranks, ALST's tiled loss and tiled MLP (seq 512 > hidden 128: 4 MLP slices), SP with a tiled loss.
PARALLEL = [
    J("tiny-llama", 2, "fp32", 2, 128, sp=2),
    J("tiny-llama", 3, "bf16", 2, 128, sp=2),
    J("small-llama", 2, "bf16", 2, 128, sp=2),
    J("tiny-llama", 1, "fp32", 2, 128, tp=2),
    J("tiny-llama", 2, "bf16", 2, 128, tp=2),
    J("small-llama", 2, "bf16", 2, 128, tp=2, ranks=4),
    J("tiny-llama", 3, "fp32", 2, 128, hpz=2, ranks=4),
    J("small-llama", 3, "bf16", 2, 128, hpz=2, ranks=4),
    J("tiny-llama", 2, "bf16", 2, 256, tl=True),
    J("tiny-llama", 2, "fp32", 1, 512, tm=True),
    J("tiny-llama", 3, "bf16", 1, 256, sp=2, tl=True),
]
QUICK += PARALLEL
# Ulysses against data parallelism at the same tokens per rank (--long-sp; issue 28): ALST's SP rows on GPUs come out
# 1.2-1.4x too long, one-GPU rows within 9%. What the Ulysses wrapper adds per rank at 4,096 tokens, with and without
# checkpointing, on CPU ranks.
# SP 2 gives each rank 2 query heads over 1 KV head (tiny-llama's 4 over 2), as SP 8 does Llama-3.1-8B's; SP 4 on 4 ranks
# replicates the KV heads (2 over 4 ranks: each holds 1 repeated), as SP 16-64 do, against data parallelism on 4.
LONG_SP = [
    J("tiny-llama", 3, "bf16", 1, 8192, ckpt=True, sp=2, tl=True),
    J("tiny-llama", 3, "bf16", 1, 4096, ckpt=True, sp=1, tl=True),
    J("tiny-llama", 3, "bf16", 1, 8192, sp=2, tl=True),
    J("tiny-llama", 3, "bf16", 1, 4096, sp=1, tl=True),
    J("tiny-llama", 3, "bf16", 1, 16384, ckpt=True, sp=4, tl=True, ranks=4),
    J("tiny-llama", 3, "bf16", 1, 4096, ckpt=True, sp=1, tl=True, ranks=4),
    J("tiny-llama", 3, "bf16", 1, 16384, sp=4, tl=True, ranks=4),
    J("tiny-llama", 3, "bf16", 1, 4096, sp=1, tl=True, ranks=4),
]
# One GPU (--one-gpu): the rows a single CUDA device runs, at sizes where the model's own terms, not the allocator's
# fixed costs, make the peak. Every stage, bf16 and fp32, checkpointing, LoRA, QLoRA, Llama and GPT-2.
ONE_GPU = [
    J("gpu-llama", 0, "bf16", 4, 2048, ranks=1),
    J("gpu-llama", 1, "fp32", 2, 1024, ranks=1),
    J("gpu-llama", 2, "bf16", 8, 2048, ckpt=True, ranks=1),
    J("gpu-llama", 3, "bf16", 4, 2048, ranks=1),
    J("gpu-llama", 2, "bf16", 4, 2048, ft="lora", ranks=1),
    J("gpu-llama", 3, "bf16", 4, 2048, ckpt=True, ft="lora", ranks=1),
    J("gpu-llama", 2, "bf16", 4, 2048, ft="qlora", ranks=1),
    J("gpu-llama", 3, "bf16", 4, 2048, ckpt=True, ft="qlora", ranks=1),
    J("gpt2", 2, "bf16", 8, 1024, ranks=1),
    J("gpt2", 3, "fp32", 4, 1024, ckpt=True, ranks=1),
]
# bench/gpu_lend.sh's rows, one GPU: 1B-3B at seq 2048-4096, ZeRO-0..3, bf16, checkpointing on and off (issue 27:
# tiny models measure the host, not the GPU). In the order the script runs them until its time is spent. First one
# ZeRO-3 model at three lengths, the same host work over 2K-16K tokens of device work: the 2026-11-27 lends priced 16K
# at +65-79% by adding the host to a GPU-bound step (docs/time-model.md), so where the host stops adding is the next
# thing to measure; then the rows no lend has measured.
LEND = [
    J("gpu-1b", 3, "bf16", 1, 2048, ckpt=True, ranks=1),
    J("gpu-1b", 3, "bf16", 1, 8192, ckpt=True, ranks=1),
    J("gpu-1b", 3, "bf16", 1, 16384, ckpt=True, ranks=1),  # a long sequence: attention and the loss grow, weights do not
    J("gpu-1b", 2, "bf16", 4, 2048, ckpt=True, ranks=1),
    J("gpu-3b", 0, "bf16", 1, 2048, ranks=1),
    J("gpu-1b", 3, "bf16", 2, 4096, ranks=1),
    J("gpu-3b", 3, "bf16", 1, 4096, ckpt=True, ranks=1),
    J("gpu-1b", 1, "bf16", 8, 2048, ckpt=True, ranks=1),
    J("gpu-3b", 3, "bf16", 2, 2048, ranks=1),
    J("gpu-1b", 0, "bf16", 4, 2048, ranks=1),
    J("gpu-3b", 2, "bf16", 2, 2048, ckpt=True, ranks=1),
    J("gpu-3b", 2, "bf16", 4, 2048, ft="lora", ranks=1),  # the H200 lend's worst re-prediction was LoRA at ZeRO-2
]
# issue 45: one model at three long lengths on one GPU, ALST's single-GPU recipe (checkpoint offload, tiled MLP; no
# Ulysses on one GPU), each measured allocated, reserved and nvidia-smi against the plan at its length (bench/gpu_lend.sh
# with LEND_SET=long: 4 steps each, 74-127 s a job on an H200), then 256K where the budget leaves time (~3 min at 2
# steps: bench/results/accuracy_gpu_long_20261128_1826.txt)
LONG = [
    Job("gpu-1b", 3, "bf16", 1, 32768, ckpt=True, tiled_loss=True, tiled_mlp=True, ranks=1, ckpt_offload=True),
    Job("gpu-1b", 3, "bf16", 1, 65536, ckpt=True, tiled_loss=True, tiled_mlp=True, ranks=1, ckpt_offload=True),
    Job("gpu-1b", 3, "bf16", 1, 131072, ckpt=True, tiled_loss=True, tiled_mlp=True, ranks=1, ckpt_offload=True),
    Job("gpu-1b", 3, "bf16", 1, 262144, ckpt=True, tiled_loss=True, tiled_mlp=True, ranks=1, ckpt_offload=True),
]
FP16_HARNESS = HERE / "fp16_on_cpu"  # sitecustomize.py: CPU_Accelerator.is_fp16_supported -> True


def fp16_cpu_profile(given: str | None, runs: Path, model: str | None = None) -> str:
    """A hardware profile with fp16 for the fp16 jobs on CPU: `zerokit launch` (check) refuses fp16 on an
    accelerator that does not support it, and a profile measured under the harness says it does (calibrate's
    precision_supported asks DeepSpeed's accelerator). The given profile if it has fp16, else one
    `zerokit calibrate --quick --precision fp16 --finetune full` under the harness (fp16 and fp32, the fp16 jobs'
    full fine-tunes; no bf16 or LoRA models), made once per runs directory; with `model`, only what a plan of that
    model prices (calibrate --model)."""
    if given and (json.loads(Path(given).read_text()).get("matmul_tflops") or {}).get("fp16"):
        return given
    path = runs / "fp16_cpu_profile.json"
    if not path.is_file():
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(FP16_HARNESS), os.environ.get("PYTHONPATH")])))
        scope = ["--model", model] if model else []
        subprocess.run([sys.executable, "-m", "zerokit", "calibrate", "--quick", "--precision", "fp16", "--finetune",
                        "full", *scope, "-o", str(path)], cwd=ROOT, env=env, check=True)
    return str(path)


def full_grid() -> list[Job]:
    jobs = []
    variants = [(0, "none", "none"), (1, "none", "none"), (1, "cpu", "none"), (2, "none", "none"), (2, "cpu", "none"),
                (3, "none", "none"), (3, "cpu", "none"), (3, "cpu", "cpu")]
    for model, (stage, oo, op), prec, ckpt, mb, seq in itertools.product(
            MODELS, variants, ("bf16", "fp32"), (False, True), (1, 2, 4, 8), (64, 256)):
        jobs.append(Job(model, stage, prec, mb, seq, oo, op, ckpt))
    return jobs


# ----------------------------------------------------------------------------------------------------------
def detect_device() -> tuple[str, int, int | None]:
    """('cpu'|'cuda', ranks, GPU MiB) the way `zerokit launch` sees the machine (nvidia-smi, no torch)."""
    from zerokit.launching.probes import cuda_devices as _cuda_devices

    n, mib = _cuda_devices()
    if n:
        return "cuda", min(2, n), mib
    return "cpu", 2, None


def rank_threads(ranks: int) -> int:
    """CPU: torch threads per rank = cores / ranks (what DeepSpeed's --bind_cores_to_rank sets, and what
    `zerokit calibrate` measures with). torch's default gives every rank all cores: on this project's
    2-core machines the two ranks' OpenMP pools then fight and a ZeRO-0 bf16 tiny-llama step takes 5.8 s
    instead of 0.05 s (measured)."""
    return max(1, (os.cpu_count() or 1) // ranks)


def make_cluster(device: str, ranks: int, gpu: str | None, gpu_mib: int | None, profile: str | None,
                 gpu_name: str | None = None):
    from zerokit.spec.hardware import build_cluster

    if device == "cpu":
        return build_cluster(gpu=gpu or "cpu", gpus_per_node=ranks, hardware_profile=profile)
    if gpu is None and gpu_name:  # what `zerokit launch` does without --gpu: the GPU's catalog entry when it has one
        from zerokit.core.errors import ZerokitError
        from zerokit.spec.hardware import resolve_gpu_name

        try:
            gpu = resolve_gpu_name(gpu_name)[0]
        except ZerokitError:
            gpu = None
    return build_cluster(gpu=gpu, gpu_memory=f"{gpu_mib}MiB" if gpu_mib else None,
                         gpus_per_node=ranks, hardware_profile=profile)


def render(job: Job, cluster, steps: int) -> dict:
    from zerokit.config.render import render_ds_config
    from zerokit.spec.setup import Workload

    spec = job.spec()
    return render_ds_config(job.setup(), cluster, spec, Workload(seq_len=job.seq_len), lr=1e-3, warmup_steps=1,
                            total_steps=steps)


def launch_command(job: Job, cfg: Path, out: Path, device: str, ranks: int, steps: int,
                   profile: str | None = None, no_save: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "zerokit", "launch", "--model", MODELS[job.model], "--config", str(cfg)]
    if device == "cpu":
        cmd += ["--gpu", "cpu"]
    if profile:  # fp16 on CPU: the profile that says the (harnessed) CPU trains fp16
        cmd += ["--hardware-profile", profile]
    cmd += ["--gpus-per-node", str(job.ranks if device == "cpu" else ranks), "--seq-len", str(job.seq_len), "--steps", str(steps),
            "--output-dir", str(out)]
    if job.ckpt:
        cmd += ["--activation-checkpointing", "offload" if job.ckpt_offload else "on"]
    if no_save:  # nothing of it is measured: a 3B model's checkpoint is 48 GB written, its export another 12
        cmd += ["--no-save"]
    return cmd + job.finetune_args() + job.tiled_args()


BUNDLED_CORPUS = ROOT / "zerokit" / "data" / "corpus" / "tiny_corpus.txt"  # launch's default data: ~31K Llama tokens


def long_data(job: Job, runs: Path) -> list[str]:
    """`--data` for a sequence longer than the bundled corpus holds (the LONG rows, 32K-256K tokens): the corpus
    repeated into one document of at least two sequences (~31K tokens a copy; 16K counted, for tokenizers that pack
    it tighter). Random weights train on it as on any text: only the step's time and memory are measured."""
    if job.seq_len <= 16384:
        return []
    copies = -(-2 * job.seq_len // 16384)
    path = runs / f"corpus_x{copies}.txt"
    if not path.is_file():
        path.write_text(BUNDLED_CORPUS.read_text() * copies)
    return ["--data", str(path)]


def run_job(job: Job, runs: Path, device: str, ranks: int, cluster, steps: int, memory_steps: int,
            timeout: int, profile: str | None = None, no_save: bool = False) -> dict:
    import shutil

    out = runs / job.name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cfg = runs / f"{job.name}.ds_config.json"
    cfg.write_text(json.dumps(render(job, cluster, steps), indent=2) + "\n")
    cmd = launch_command(job, cfg, out, device, ranks, steps, profile, no_save) + long_data(job, runs)
    env = dict(os.environ, ZEROKIT_MEMORY_STEPS=str(memory_steps) if device == "cpu" else "0")
    if device == "cpu":
        env["OMP_NUM_THREADS"] = str(rank_threads(job.ranks))
    if device == "cpu" and job.precision == "fp16":  # every process of the job: launcher, deepspeed, ranks
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FP16_HARNESS), env.get("PYTHONPATH")]))
    t0 = time.perf_counter()
    with open(runs / f"{job.name}.log", "w") as log:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return {"returncode": rc, "wall_s": time.perf_counter() - t0, "command": shlex.join(cmd)}


# ----------------------------------------------------------------------------------------------------------
def measure(out: Path, warmup: int) -> dict[int, dict]:
    """Per rank: training peak (max phase peak over metered steps), the phase and category mix at it, and
    the median step time over the unmetered steps after the warm-up."""
    from zerokit.report.run_report import read_metrics

    res = {}
    for rank, recs in read_metrics(out).items():
        steps = [r for r in recs if r.get("event") == "step"]
        start = next((r for r in recs if r.get("event") == "start"), {})
        best, phase, cats, phases_at = None, None, {}, {}
        for r in steps:
            for name, ph in (r.get("phases") or {}).items():
                if best is None or ph["peak_bytes"] > best:
                    best, phase, cats = ph["peak_bytes"], name, ph.get("categories") or {}
                    phases_at = {k: v["peak_bytes"] for k, v in r["phases"].items()}
        used = [r["device_used_bytes"] for r in steps if r.get("device_used_bytes")]
        outside = [r["outside_allocator_bytes"] for r in steps if r.get("outside_allocator_bytes") is not None]
        reserved = [r["peak_reserved_bytes"] for r in steps if r.get("peak_reserved_bytes")]
        timed = [r["step_time"] for r in steps if r["step"] > warmup and not r.get("metered")]
        if not timed:  # everything metered (CUDA: free counters): all steps after the warm-up
            timed = [r["step_time"] for r in steps if r["step"] > warmup]
        res[rank] = {"peak_bytes": best, "peak_phase": phase, "categories": cats, "phase_peaks": phases_at,
                     "init_peak_bytes": start.get("init_peak_bytes"), "memory_method": start.get("memory_method"),
                     # CUDA: the allocator's reserve, the GPU's used memory (nvidia-smi) and the part outside torch
                     "reserved_peak_bytes": max(reserved) if reserved else None,
                     "device_used_bytes": max(used) if used else None,
                     "outside_allocator_bytes": max(outside) if outside else None,
                     "step_seconds": statistics.median(timed) if timed else None, "timed_steps": len(timed),
                     "step_times": [r["step_time"] for r in steps]}
    return res


def fastest_of_repeats(first: dict[int, dict], others: list[dict[int, dict]]) -> dict[int, dict]:
    """Memory from the first run (it repeats to the byte); per rank the fastest median step time over the
    repeats, with every repeat's median kept as step_seconds_by_repeat."""
    out = {}
    for rank, m in first.items():
        times = [m["step_seconds"]] + [o[rank]["step_seconds"] for o in others if rank in o]
        times = [t for t in times if t is not None]
        out[rank] = dict(m, step_seconds=min(times) if times else None, step_seconds_by_repeat=times)
    return out


def predict(job: Job, cluster, cfg: dict) -> dict:
    from zerokit.planning.planner import evaluate
    from zerokit.spec.setup import Workload, ZeroKnobs

    spec = job.spec()
    from dataclasses import replace

    from zerokit.config.read import grad_accum_dtype_of

    knobs = replace(ZeroKnobs.from_zero_config(cfg.get("zero_optimization") or {}), grad_accum_dtype=grad_accum_dtype_of(cfg))
    ev = evaluate(spec, cluster, Workload(seq_len=job.seq_len), job.setup(), knobs)
    smi = ev.memory.nvidia_smi
    # what max_memory_allocated can show: the fit's CUDA-context allowance is priced in nvidia-smi's figure instead
    allocated = ev.memory.per_gpu_total - ev.memory.per_gpu.get("cuda_context", 0)
    terms = {k: v for k, v in ev.memory.per_gpu.items() if k != "cuda_context"}
    return {"per_rank_bytes": allocated, "terms": terms, "nvidia_smi": smi.to_dict() if smi else None,
            "phases": dict(getattr(ev.memory, "phases", {}) or {}), "step_seconds": ev.time.step_seconds,
            "time": ev.time.to_dict(), "params": spec.params}


def gpu_name() -> str | None:
    """nvidia-smi's name of GPU 0 (None without one)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import importlib.metadata as md

    vers = []
    for pkg in ("torch", "deepspeed", "transformers"):
        try:
            vers.append(f"{pkg} {md.version(pkg)}")
        except md.PackageNotFoundError:
            pass
    gpu = gpu_name()
    return (f"{platform.node()}: {os.cpu_count()} cores ({cpu}); " + (f"GPU {gpu}; " if gpu else "")
            + f"python {platform.python_version()}; " + ", ".join(vers))


def cuda_section(jobs_out: list[dict]) -> str:
    """CUDA: what nvidia-smi shows beside the allocated peak (estimate/reserved.py), per job: the allocator's reserve,
    the GPU's used memory at step ends, and the part of it outside torch's allocator (context, NCCL, libraries)."""
    lines = ["beyond the allocated peak (estimate/reserved.py; measured: max_memory_reserved, cudaMemGetInfo at step "
             "ends), MiB predicted / measured (err):"]
    for j in jobs_out:
        smi = j["prediction"].get("nvidia_smi")
        for rank, m in sorted(j["measured"].items()):
            if not smi or not m.get("device_used_bytes"):
                continue
            t = smi["nvidia_smi_terms"]
            outside = t["cuda_context_bytes"] + t["nccl_buffers_bytes"]
            cells = []
            for what, p, meas in (("reserved", smi["allocator_reserved_bytes"], m.get("reserved_peak_bytes")),
                                  ("nvidia-smi", smi["nvidia_smi_bytes"], m.get("device_used_bytes")),
                                  ("outside torch", outside, m.get("outside_allocator_bytes"))):
                err = rel_err(p, meas)
                cells.append(f"{what} {p / 2**20:,.0f} / {meas / 2**20:,.0f} ({err:+.1%})" if meas and err is not None
                             else f"{what} {p / 2**20:,.0f} / -")
            lines.append(f"  {j['name']} r{rank}: " + "; ".join(cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="the representative subset (default)")
    g.add_argument("--full", action="store_true", help="the whole grid")
    g.add_argument("--one-gpu", action="store_true", help="the rows sized for one CUDA device (ONE_GPU)")
    g.add_argument("--lend", action="store_true", help="bench/gpu_lend.sh's 1B-3B rows for one GPU (LEND)")
    g.add_argument("--long", action="store_true", help="bench/gpu_lend.sh LEND_SET=long: one model at three long "
                                                       "lengths with checkpoint offload and tiled MLP (LONG)")
    g.add_argument("--long-sp", action="store_true", help="Ulysses SP 2 against data parallelism at 4,096 tokens per "
                                                           "rank (LONG_SP)")
    ap.add_argument("--only", help="regex on job names")
    ap.add_argument("--limit", type=int, help="at most this many jobs")
    ap.add_argument("--steps", type=int, default=12, help="optimizer steps per job (the first metered, then warm-up, then timed)")
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the step-time median")
    ap.add_argument("--memory-steps", type=int, default=2, help="CPU: metered steps (then the meter stops)")
    ap.add_argument("--runs", default="/tmp/zerokit-accuracy", help="where the job output directories go")
    ap.add_argument("--results", default=None, help="output prefix (default bench/results/accuracy_<device>)")
    ap.add_argument("--hardware-profile", help="predict time with this `zerokit calibrate` profile")
    ap.add_argument("--gpu", help="catalog accelerator for the prediction (CUDA; default: detected memory)")
    ap.add_argument("--reuse", action="store_true", help="do not run jobs whose metrics exist; re-predict only (on the "
                                                         "device the runs recorded, also from another machine)")
    ap.add_argument("--no-save", action="store_true", help="launch each job with --no-save: no checkpoint, no final "
                                                           "weights (large models fill the disk and the time)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per job")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the grid this many times, round-robin, and keep each job's fastest median step time "
                         "(a shared machine's interference only adds time); the spread is reported")
    args = ap.parse_args(argv)

    jobs = (full_grid() if args.full else list(ONE_GPU) if args.one_gpu else list(LEND) if args.lend
            else list(LONG) if args.long else list(LONG_SP) if args.long_sp else list(QUICK))
    if args.only:
        jobs = [j for j in jobs if re.search(args.only, j.name)]
    if args.limit:
        jobs = jobs[: args.limit]
    runs = Path(args.runs) / ("full" if args.full else "one-gpu" if args.one_gpu else "lend" if args.lend
                              else "long" if args.long else "long-sp" if args.long_sp else "quick")
    runs.mkdir(parents=True, exist_ok=True)
    # the device the jobs ran on, so that --reuse re-predicts GPU runs on a machine without one
    device_file = runs / "device.json"
    if args.reuse and device_file.is_file():
        d = json.loads(device_file.read_text())
        device, ranks, gpu_mib, machine_text = d["device"], d["ranks"], d["gpu_mib"], d.get("machine")
        gpu_model = d.get("gpu_model")
        # runs from another kind of device (a GPU's, re-predicted here): never run a missing job on this one
        foreign = device != detect_device()[0]
    else:
        foreign = False
        from zerokit.spec.hardware import local_gpus

        device, ranks, gpu_mib = detect_device()
        machine_text = machine()
        gpu_model = local_gpus()[0][0] if device == "cuda" else None
        device_file.write_text(json.dumps({"device": device, "ranks": ranks, "gpu_mib": gpu_mib,
                                           "machine": machine_text, "gpu_model": gpu_model}) + "\n")
    cluster = make_cluster(device, ranks, args.gpu, gpu_mib, args.hardware_profile, gpu_model)
    fp16_cpu = device == "cpu" and any(j.precision == "fp16" for j in jobs)
    results = Path(args.results) if args.results else ROOT / "bench" / "results" / f"accuracy_{device}"
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    # repeat 1 in runs/, repeat r in runs/rep<r>/ (so --reuse finds runs made before --repeat existed)
    rep_dirs = [runs] + [runs / f"rep{r}" for r in range(2, args.repeat + 1)]
    fp16_profile = fp16_cpu_profile(args.hardware_profile, runs) if fp16_cpu else None
    fp16_cluster = make_cluster(device, ranks, args.gpu, gpu_mib, fp16_profile, gpu_model) if fp16_cpu else None

    by_ranks = {}

    def cluster_of(job):
        if fp16_cpu and job.precision == "fp16":
            return fp16_cluster
        if device == "cpu" and job.ranks != ranks:  # the 4-rank jobs (TP x DP, hpZ): a node of 4 CPU ranks
            if job.ranks not in by_ranks:
                by_ranks[job.ranks] = make_cluster(device, job.ranks, args.gpu, gpu_mib, args.hardware_profile,
                                                   gpu_model)
            return by_ranks[job.ranks]
        return cluster
    t_all = time.perf_counter()
    run_of = {}
    for r, rdir in enumerate(rep_dirs, 1):
        for i, job in enumerate(jobs, 1):
            have = metrics_file(rdir / job.name, 0).is_file()
            if not (args.reuse and have) and not foreign:
                tag = f" (repeat {r}/{args.repeat})" if args.repeat > 1 else ""
                print(f"[{i}/{len(jobs)}] {job.name}{tag} ...", file=sys.stderr, flush=True)
                run = run_job(job, rdir, device, ranks, cluster_of(job), args.steps, args.memory_steps, args.timeout,
                              fp16_profile if cluster_of(job) is fp16_cluster else None, args.no_save)
                print(f"    rc={run['returncode']} {run['wall_s']:.1f} s", file=sys.stderr, flush=True)
                run_of.setdefault(job.name, run)
    from zerokit.config.read import load_config_file

    rows, jobs_out = [], []
    for job in jobs:
        out = runs / job.name
        run = run_of.get(job.name)
        cfg_path = runs / f"{job.name}.ds_config.json"
        cfg = load_config_file(cfg_path) if cfg_path.is_file() else render(job, cluster_of(job), args.steps)
        pred = predict(job, cluster_of(job), cfg)
        meas = measure(out, args.warmup) if metrics_files(out) else {}
        if meas and args.repeat > 1:
            meas = fastest_of_repeats(meas, [measure(d / job.name, args.warmup) for d in rep_dirs[1:]
                                             if metrics_files(d / job.name)])
        jobs_out.append({"job": asdict(job), "name": job.name, "run": run, "prediction": pred, "measured": meas})
        if not meas:
            rows.append({"job": job.name, "rank": "-", "pred_mem": pred["per_rank_bytes"],
                         "pred_time": pred["step_seconds"], "failed": True})
            continue
        for rank, m in sorted(meas.items()):
            rows.append({
                "job": job.name, "rank": rank,
                "pred_mem": pred["per_rank_bytes"], "meas_mem": m["peak_bytes"],
                "mem_err": rel_err(pred["per_rank_bytes"], m["peak_bytes"]), "peak_phase": m["peak_phase"],
                "pred_time": pred["step_seconds"], "meas_time": m["step_seconds"],
                # fp16 on CPU runs torch's emulated half kernels: like no GPU, kept out of the time summary
                "time_err": None if fp16_cpu and job.precision == "fp16" else rel_err(pred["step_seconds"], m["step_seconds"]),
                "pred_groups": group_terms(pred["terms"], TERM_GROUPS),
                "meas_groups": group_terms(m["categories"], MEASURED_GROUPS) if m["categories"] else {},
            })
    wall = time.perf_counter() - t_all
    summary = summary_of_rows(rows)
    spreads = [(max(m["step_seconds_by_repeat"]) - min(m["step_seconds_by_repeat"])) / min(m["step_seconds_by_repeat"])
               for j in jobs_out for m in j["measured"].values() if len(m.get("step_seconds_by_repeat") or []) > 1]
    if spreads:
        summary["repeat_spread_median"] = statistics.median(spreads)
        summary["repeat_spread_max"] = max(spreads)
    grid = ("--full" if args.full else "--one-gpu" if args.one_gpu else "--lend" if args.lend
            else "--long" if args.long else "--long-sp" if args.long_sp else "--quick")
    cmd = f"python bench/accuracy/run.py {grid}" + (f" --only '{args.only}'" if args.only else "") + (
        f" --steps {args.steps}" if args.steps != 12 else "") + (f" --warmup {args.warmup}" if args.warmup != 2 else "") + (
        f" --limit {args.limit}" if args.limit else "") + (f" --repeat {args.repeat}" if args.repeat > 1 else "") + (
        f" --hardware-profile {args.hardware_profile}" if args.hardware_profile else "")
    method = next((m["memory_method"] for j in jobs_out for m in j["measured"].values()), None)
    failed = [r["job"] for r in rows if r.get("failed")]
    header = [
        f"zerokit accuracy: predicted vs measured, {len(jobs)} real {ranks}-rank DeepSpeed jobs ({device})"
        + (f" ({sum(j.ranks != ranks for j in jobs)} of them on the ranks their name says: _r4 = 4)"
           if device == "cpu" and any(j.ranks != ranks for j in jobs) else ""),
        f"command: {cmd}" + ("   (re-predicted against existing runs: --reuse)" if args.reuse else ""),
        f"machine: {machine_text}",
        f"date: {time.strftime('%Y-%m-%d %H:%M:%S')}; wall {wall:.0f} s; {args.steps} steps per job, "
        f"first {args.warmup} left out of the time median"
        + (f"; each job run {args.repeat} times round-robin, the fastest median kept (a shared machine's "
           f"interference only adds time): the repeats' spread (max - min) / min is median "
           f"{summary['repeat_spread_median']:.1%}, max {summary['repeat_spread_max']:.1%}" if spreads else ""),
        f"memory: {method} (peak over the phases forward/backward/step of the first {args.memory_steps} steps"
        + ("; the meter then stops, so step times carry none of its overhead)" if device == "cpu" else ")"),
        "time: " + (f"hardware profile {args.hardware_profile}" if args.hardware_profile else
                    f"catalog figures for {cluster.accelerator.name} (no profile)"),
        "err = (predicted - measured) / measured. Device-neutral: on a CUDA machine the same command auto-detects "
        "the GPUs (launch without --gpu) and measures torch.cuda.max_memory_allocated per phase.",
    ]
    if device == "cpu":
        header.insert(5, f"threads: OMP_NUM_THREADS={rank_threads(ranks)} per rank (cores / ranks; torch's default "
                         "oversubscribes the cores, see docs/memory-model.md \"Time\"); not run on a GPU for this table")
    if fp16_cpu:
        header.append(f"fp16 rows: DeepSpeed's fp16 accelerator check lifted (bench/accuracy/fp16_on_cpu), profile "
                      f"{fp16_profile}; their step times (torch's emulated CPU half kernels) compare with no GPU "
                      "and are left out of the time error and summary")
    if failed:
        header.append(f"FAILED jobs (no metrics): {', '.join(failed)}")
    nonzero = [j["name"] for j in jobs_out if j["run"] and j["run"]["returncode"] != 0 and j["measured"]]
    if nonzero:
        header.append(f"exited non-zero after training (metrics complete; see <runs>/<job>.log): {', '.join(nonzero)}")
    text = "\n".join(header) + "\n\n" + format_table(rows, summary) + "\n\nterms (CPU meter categories at the peak phase; " \
        "pred/meas MiB):\n" + format_terms(rows) + "\n"
    if device == "cuda":
        text += "\n" + cuda_section(jobs_out) + "\n"
    results.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{results}.txt").write_text(text)
    Path(f"{results}.json").write_text(json.dumps({
        "command": cmd, "machine": machine_text, "device": device, "ranks": ranks, "wall_s": wall, "steps": args.steps,
        "warmup": args.warmup, "memory_steps": args.memory_steps, "hardware_profile": args.hardware_profile,
        "summary": summary, "rows": rows, "jobs": jobs_out}, indent=1, default=str) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
