"""Fine-tuning memory, predicted vs measured: real 2-rank DeepSpeed jobs on CPU (gloo) training LoRA, QLoRA and partly
frozen models, each rank's live tensor bytes metered per phase, against zerokit.planning.planner.evaluate for the same setup.

    python bench/finetune_memory.py                  # all jobs (~10 min on 2 cores), writes bench/results/finetune_memory.{txt,json}
    python bench/finetune_memory.py --only 'lora_z2' # a subset (regex on the job name); results are not written then
    python bench/finetune_memory.py --job NAME       # one job, printed (what tests/test_finetune_model.py's slow test runs)

Each job: `torchrun --nproc_per_node 2` of this file's rank script (OMP_NUM_THREADS=1), modelled on the RANK_SCRIPT of
tests/test_finetune.py and on zerokit/launching/train.py's metering: zerokit.measure.meter.MemoryMeter started before the
model is built (so every tensor counts), MemoryMeter.register_deepspeed_engine, zerokit.measure.step_phases
.StepPhaseMeter around forward / backward / step of the first STEPS optimizer steps. The model: the bundled config,
random init (torch.manual_seed(0)); LoRA with peft's get_peft_model; --freeze with requires_grad_(False) on the
matching names; QLoRA from_pretrained(BitsAndBytesConfig(load_in_4bit, nf4, double quant, compute dtype = the training
dtype), device_map="cpu") of the same model saved first (what was measured to run on CPU: docs/measured-on-cpu.md
"Fine-tuning"). Gradient checkpointing: model.gradient_checkpointing_enable() before peft (transformers' default,
use_reentrant=False). ZeRO config: the knobs zerokit renders (ZeroKnobs.for_hidden_size: reduce bucket h^2, prefetch
0.9 h^2, persistence 10 h), torch AdamW ("torch_adam": true, what render writes for CPU targets).

Measured per rank: the training peak = the highest phase peak over the metered steps (init logged apart).
Predicted: evaluate(with_finetune(spec, trainable_split(config, finetune)), ...).memory.per_gpu_total, and per phase.
Timing is NOT compared here: another tenant shares the 2 cores (the time rules are checked by their FLOP counts in
tests/test_finetune_model.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MICRO, SEQ, STEPS, RANKS, LORA_R = 2, 128, 2, 2, 8
FREEZE = {"tiny-llama": ("embed_tokens", "layers.0."), "tiny-gpt2": ("wte", "wpe", "h.0.")}


@dataclass(frozen=True)
class Job:
    model: str
    mode: str  # lora | qlora | freeze
    stage: int
    precision: str
    ckpt: bool = False
    dropout: float = 0.0

    @property
    def name(self) -> str:
        return (f"{self.model}_{self.mode}_z{self.stage}_{self.precision}" + ("_ckpt" if self.ckpt else "")
                + (f"_drop{self.dropout:g}" if self.dropout else ""))

    def finetune(self):
        from zerokit.spec.finetune import Finetune

        if self.mode == "freeze":
            return Finetune(freeze=FREEZE[self.model])
        return Finetune(mode=self.mode, lora_r=LORA_R, lora_dropout=self.dropout)


JOBS = [
    Job("tiny-llama", "lora", 2, "fp32"), Job("tiny-llama", "lora", 2, "bf16"), Job("tiny-llama", "lora", 3, "fp32"),
    Job("tiny-llama", "lora", 3, "bf16"), Job("tiny-llama", "lora", 2, "bf16", ckpt=True),
    Job("tiny-llama", "lora", 3, "fp32", ckpt=True), Job("tiny-llama", "lora", 2, "fp32", dropout=0.1),
    Job("tiny-llama", "freeze", 2, "bf16"), Job("tiny-llama", "freeze", 3, "fp32"),
    Job("tiny-llama", "qlora", 2, "bf16"), Job("tiny-llama", "qlora", 2, "bf16", ckpt=True),
    Job("tiny-gpt2", "lora", 2, "bf16"), Job("tiny-gpt2", "lora", 3, "fp32"), Job("tiny-gpt2", "lora", 2, "fp32", ckpt=True),
    Job("tiny-gpt2", "freeze", 2, "fp32"), Job("tiny-gpt2", "qlora", 2, "bf16"),
]


def config_path(model: str) -> str:
    from zerokit.spec.resolve import resolve_model

    return str(resolve_model(model).config_file())


def ds_config(job: Job) -> dict:
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.setup import ZeroKnobs

    k = ZeroKnobs.for_hidden_size(load_model_spec(job.model).hidden_size)
    zero = {"stage": job.stage, "reduce_bucket_size": k.reduce_bucket_size, "allgather_bucket_size": k.allgather_bucket_size,
            "overlap_comm": k.overlap_comm, "contiguous_gradients": k.contiguous_gradients}
    if job.stage == 3:
        zero.update(stage3_prefetch_bucket_size=k.stage3_prefetch_bucket_size,
                    stage3_param_persistence_threshold=k.stage3_param_persistence_threshold)
    cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1, "steps_per_print": 1000,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}, "zero_optimization": zero}
    if job.precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


# ------------------------------------------------------------------------------------------------------------------
def rank_main(job_json: str, out_dir: str) -> None:
    """One rank of one job (run by torchrun)."""
    import gc
    import warnings

    warnings.filterwarnings("ignore")
    import deepspeed
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from zerokit.core.process import close_process_groups
    from zerokit.measure.meter import MemoryMeter
    from zerokit.measure.step_phases import StepPhaseMeter

    spec = json.loads(job_json)
    job = Job(**spec["job"])
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    meter = MemoryMeter("cpu")
    meter.start()
    torch.manual_seed(0)
    dtype = torch.bfloat16 if job.precision == "bf16" else torch.float32
    if job.mode == "qlora":
        from transformers import BitsAndBytesConfig

        q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_storage=torch.uint8)
        model = AutoModelForCausalLM.from_pretrained(spec["saved"], quantization_config=q, device_map="cpu", dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(spec["config"]))
    load_peak = meter.peak_bytes()
    model.train()  # from_pretrained returns the model in eval mode: no dropout, and HF checkpoints only in training
    model.config.use_cache = False
    if job.ckpt:
        model.gradient_checkpointing_enable()
    if job.mode in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=LORA_R, lora_dropout=job.dropout, target_modules="all-linear"))
    else:
        for n, p in model.named_parameters():
            p.requires_grad_(not any(k in n for k in FREEZE[job.model]))
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=trainable, config=ds_config(job))
    meter.register_deepspeed_engine(engine)
    phases = StepPhaseMeter(meter, on_cuda=False)
    init_peak = phases.init_peak()
    gen = torch.Generator().manual_seed(1 + rank)
    records = []
    for _ in range(STEPS):
        phases.new_step()
        x = torch.randint(0, model.config.vocab_size, (MICRO, SEQ), generator=gen)
        out = phases.run("forward", lambda: engine(input_ids=x, labels=x))
        phases.run("backward", lambda: engine.backward(out.loss))
        phases.run("step", engine.step)
        records.append({k: v["peak_bytes"] for k, v in phases.step_fields()["phases"].items()})
        gc.collect()
    meter.stop()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"steps": records, "init_peak_bytes": init_peak, "load_peak_bytes": load_peak,
                   "loss": float(out.loss.detach().float())}, f)
    close_process_groups()  # not left to the interpreter's teardown (zerokit.core.process says why)


# ------------------------------------------------------------------------------------------------------------------
def predict(job: Job) -> dict:
    from zerokit.planning.planner import evaluate
    from zerokit.spec.finetune import trainable_split, with_finetune
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.setup import Workload, ZeroKnobs, ZeroSetup

    ft = job.finetune()
    spec = with_finetune(load_model_spec(job.model), trainable_split(config_path(job.model), ft), ft.mode)
    cluster = build_cluster(gpu="cpu", gpus_per_node=RANKS)
    setup = ZeroSetup(zero_stage=job.stage, precision=job.precision, micro_batch_size=MICRO,
                      activation_checkpointing=job.ckpt)
    knobs = ZeroKnobs.from_zero_config(ds_config(job)["zero_optimization"])
    ev = evaluate(spec, cluster, Workload(seq_len=SEQ), setup, knobs)
    host = ev.memory.per_node_cpu
    return {"per_rank_bytes": ev.memory.per_gpu_total, "peak_phase": ev.memory.peak_phase,
            "phases": dict(ev.memory.phases), "terms": dict(ev.memory.per_gpu),
            "model_loading_per_rank": host.get("model_loading", 0) // RANKS}


def run_job(job: Job, workdir: Path) -> dict:
    from zerokit.measure.ranks import free_port

    out = workdir / job.name
    out.mkdir(parents=True, exist_ok=True)
    saved = workdir / f"saved-{job.model}"
    if job.mode == "qlora" and not saved.exists():
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_path(job.model))).save_pretrained(saved)
    payload = json.dumps({"job": job.__dict__, "config": config_path(job.model), "saved": str(saved)})
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(RANKS), "--master_port",
                        str(free_port()), __file__, "--rank-job", payload, str(out)],
                       capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{job.name} failed:\n{r.stderr[-3000:]}")
    ranks = {}
    for i in range(RANKS):
        rec = json.loads((out / f"rank{i}.json").read_text())
        peaks = rec["steps"]
        best = max(((p, name) for step in peaks for name, p in step.items()))
        ranks[i] = {"peak_bytes": best[0], "peak_phase": best[1], "phase_peaks": {n: max(s[n] for s in peaks) for n in peaks[0]},
                    "load_peak_bytes": rec["load_peak_bytes"], "init_peak_bytes": rec["init_peak_bytes"], "loss": rec["loss"]}
    return {"job": job.name, "wall_s": round(time.time() - t0, 1), "ranks": ranks, "predicted": predict(job)}


def table(results: list[dict]) -> tuple[str, dict]:
    head = f"{'job':<36} {'rk':>2} {'pred MiB':>9} {'meas MiB':>9} {'err':>7} {'pred phase':>18} {'meas phase':>10}"
    lines = [head, "-" * len(head)]
    errs = []
    for res in results:
        pred = res["predicted"]
        for rk, m in sorted(res["ranks"].items(), key=lambda kv: int(kv[0])):
            err = (pred["per_rank_bytes"] - m["peak_bytes"]) / m["peak_bytes"]
            errs.append(abs(err))
            lines.append(f"{res['job']:<36} {rk:>2} {pred['per_rank_bytes'] / 2**20:9.3f} {m['peak_bytes'] / 2**20:9.3f} "
                         f"{100 * err:+6.2f}% {pred['peak_phase']:>18} {m['peak_phase']:>10}")
    summary = {"rows": len(errs), "median_abs": statistics.median(errs) if errs else None, "max_abs": max(errs) if errs else None}
    return "\n".join(lines), summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="regex on job names; results are then printed, not written")
    ap.add_argument("--job", help="one job by name, printed as JSON")
    ap.add_argument("--rank-job", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_job:
        rank_main(*args.rank_job)
        return
    jobs = [j for j in JOBS if (not args.only or re.search(args.only, j.name)) and (not args.job or j.name == args.job)]
    if not jobs:
        sys.exit(f"no job matches; jobs: {', '.join(j.name for j in JOBS)}")
    t0 = time.time()
    results = []
    with tempfile.TemporaryDirectory(prefix="zk-ft-mem-") as tmp:
        for job in jobs:
            res = run_job(job, Path(tmp))
            results.append(res)
            print(table([res])[0].splitlines()[-2] if False else "\n".join(table([res])[0].splitlines()[2:]), flush=True)
    text, summary = table(results)
    import importlib.metadata as md

    vers = ", ".join(f"{p} {md.version(p)}" for p in ("torch", "deepspeed", "transformers", "peft", "bitsandbytes"))
    header = [f"zerokit fine-tuning memory: predicted vs measured, {len(jobs)} real {RANKS}-rank DeepSpeed jobs (cpu, gloo)",
              f"command: python bench/finetune_memory.py{' --only ' + repr(args.only) if args.only else ''}",
              f"versions: python {sys.version.split()[0]}; {vers}",
              f"date: {time.strftime('%Y-%m-%d %H:%M:%S')}; wall {time.time() - t0:.0f} s; micro batch {MICRO}, seq {SEQ}, "
              f"LoRA r={LORA_R} on all-linear, {STEPS} optimizer steps metered",
              "memory: live tensor bytes per rank (zerokit.measure.meter), the highest phase peak (forward/backward/step)",
              "err = (predicted - measured) / measured",
              f"summary: |err| median {100 * summary['median_abs']:.2f}%, max {100 * summary['max_abs']:.2f}% over {summary['rows']} rows"]
    loading = [f"{r['job']:<36} rank {rk}: from_pretrained peak {m['load_peak_bytes'] / 2**20:.3f} MiB, predicted "
               f"model_loading per rank {r['predicted']['model_loading_per_rank'] / 2**20:.3f} MiB"
               for r in results if "qlora" in r["job"] for rk, m in sorted(r["ranks"].items())]
    out = "\n".join(header) + "\n\n" + text + ("\n\nQLoRA host RAM while loading (bitsandbytes from_pretrained, live tensor bytes):\n"
                                              + "\n".join(loading) if loading else "") + "\n"
    print(out)
    if args.job:
        print(json.dumps(results, indent=1))
    elif not args.only:
        res_dir = ROOT / "bench" / "results"
        (res_dir / "finetune_memory.txt").write_text(out)
        (res_dir / "finetune_memory.json").write_text(json.dumps({"summary": summary, "results": results}, indent=1))


if __name__ == "__main__":
    main()
