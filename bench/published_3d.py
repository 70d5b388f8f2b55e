"""zerokit's pipeline x tensor x data parallel pricing against published 3D-parallel runs (issue 43).

Each run in bench/data/published_3d_runs.yaml (BigScience's BLOOM-176B and its topology tests, GPT-NeoX-20B,
Megatron-LM's weak-scaling table, MT-NLG 530B: source, quote, shape, TP/PP/DP, batch, measured step, TFLOPs and
memory where stated) is priced as published, with the same library functions a plan uses
(estimate/pipeline.py setup_memory / setup_time) on the catalog's figures (no calibration):

- the model: a GPT of the run's shape (4h MLP, LayerNorm, tied embeddings, learned positions), with Megatron's
  vocab-parallel embedding, head and cross-entropy (ModelSpec.vocab_parallel: a TP rank holds vocab / tp rows);
- tensor parallelism: Megatron's column/row-parallel layers, the same all-reduces as AutoTP's for a non-gated MLP
  (estimate/timing.py model_parallel_bytes), inside every micro-batch's pipeline slot;
- stages cut by parameters (DeepSpeed's partition_balanced, as zerokit's adapter cuts them; Megatron-LM cuts by
  layers, BLOOM by 'type:transformer|embedding', which can move a layer between stages);
- ZeRO-1 (or 0) over one stage's data-parallel ranks, activation checkpointing as the run states.

Printed: predicted / measured step time and, where the source states it, per-GPU memory (the largest stage's peak
against the source's figure, mostly nvidia-smi's, which adds the CUDA context and the caching allocator's slack).
This measures the model; it fits nothing.

Usage: python bench/published_3d.py [--out bench/results/published_3d.txt]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "bench" / "data" / "published_3d_runs.yaml"
COMMAND = "python bench/published_3d.py --out bench/results/published_3d.txt"
GIB = 2**30  # nvidia-smi prints MiB; the sources' "GB" are its MiB / 1024
PARTITIONS = ("type:transformer", "type:transformer|embedding", "parameters")  # estimate/pipeline.py PARTITION_METHODS
REQUIRED = ("id", "source", "quote", "gpu", "gpus", "tensor_parallel", "pipeline_parallel", "data_parallel",
            "zero_stage", "micro_batch", "global_batch", "seq_len", "hidden_size", "num_layers", "num_heads",
            "vocab_size", "precision", "activation_checkpointing")


class RunError(Exception):
    """A run entry that cannot be priced: one line naming the run and the fix."""


def load(path: Path = DATA) -> list[dict]:
    import yaml

    runs = yaml.safe_load(path.read_text())["runs"]
    for run in runs:
        missing = [k for k in REQUIRED if run.get(k) in (None, "")]
        if missing:
            raise RunError(f"run {run.get('id', '?')}: missing {', '.join(missing)}: every run states {', '.join(REQUIRED)}")
        if run["tensor_parallel"] * run["pipeline_parallel"] * run["data_parallel"] != run["gpus"]:
            raise RunError(f"run {run['id']}: TP x PP x DP is not the {run['gpus']} GPUs: fix the degrees")
        if run.get("pp_partition", "type:transformer") not in PARTITIONS:
            raise RunError(f"run {run['id']}: pp_partition {run['pp_partition']!r}: use one of {', '.join(PARTITIONS)}")
        if run["global_batch"] % (run["micro_batch"] * run["data_parallel"]):
            raise RunError(f"run {run['id']}: the global batch {run['global_batch']} does not split into micro-batches "
                           f"of {run['micro_batch']} over {run['data_parallel']} replicas")
    return runs


def measured_step(run: dict) -> float | None:
    """The source's step seconds, else derived from its TFLOPs per GPU with Narayanan et al. 2021 eq. 3 (with
    recompute): F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration, over all GPUs."""
    if run.get("measured_step_seconds"):
        return float(run["measured_step_seconds"])
    if run.get("measured_tflops_per_gpu"):
        return megatron_flops(run) / (run["gpus"] * float(run["measured_tflops_per_gpu"]) * 1e12)
    return None


def megatron_flops(run: dict) -> float:
    b, s, n, h, v = run["global_batch"], run["seq_len"], run["num_layers"], run["hidden_size"], run["vocab_size"]
    return 96 * b * s * n * h * h * (1 + s / (6 * h) + v / (16 * n * h))


def gpt_spec(run: dict):
    """A Megatron GPT of the run's shape as zerokit's ModelSpec: per layer 12 h^2 + 13 h parameters (QKV, output,
    4h MLP with biases, two LayerNorms), the tied word embedding, the learned positions and the final LayerNorm."""
    from zerokit.spec.model import spec_from_params

    h, layers, heads, v, s = (run[k] for k in ("hidden_size", "num_layers", "num_heads", "vocab_size", "seq_len"))
    params = layers * (12 * h * h + 13 * h) + v * h + s * h + 2 * h
    base = spec_from_params(params, hidden_size=h, num_layers=layers, vocab_size=v)
    return replace(base, name=run["id"], params=params, num_attention_heads=heads, num_kv_heads=heads,
                   head_dim=h // heads, intermediate_size=4 * h, gated_mlp=False, tied_embeddings=True,
                   embedding_params=v * h, norm="layernorm", mlp_activation="gelu", largest_layer_params=max(v * h, 4 * h * h),
                   vocab_parallel=True)  # model_type stays "params": a shape, as a bare --params count is


def price(run: dict) -> dict:
    from zerokit.estimate.memory import estimate_memory
    from zerokit.estimate.pipeline import pipeline_time, stage_memory, stages
    from zerokit.estimate.timing import estimate_time
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.setup import Workload, ZeroKnobs, ZeroSetup

    model = gpt_spec(run)
    per_node = min(8, run["gpus"])
    cluster = build_cluster(gpu=run["gpu"], gpus_per_node=per_node, nodes=run["gpus"] // per_node,
                            hardware_profile="none")
    accum = run["global_batch"] // (run["micro_batch"] * run["data_parallel"])
    setup = ZeroSetup(zero_stage=run["zero_stage"], precision=run["precision"],
                      activation_checkpointing=run["activation_checkpointing"] != "off",
                      micro_batch_size=run["micro_batch"], gradient_accumulation_steps=accum,
                      tensor_parallel=run["tensor_parallel"], pipeline_parallel=run["pipeline_parallel"])
    workload = Workload(seq_len=run["seq_len"], global_batch=run["global_batch"], attention="eager")
    method = run.get("pp_partition", "type:transformer")
    time = pipeline_time(model, cluster, setup, workload, method=method) if setup.pipeline_parallel > 1 \
        else estimate_time(model, cluster, setup, workload)
    # the sources' memory is nvidia-smi's on the job's first node: pipeline stage 0 (estimate/reserved.py: the
    # context, NCCL's buffers, the allocator's rounding beside the allocated peak)
    # data_types.grad_accum_dtype as the run states it: BigScience's BF16_Optimizer keeps an fp32 accumulation buffer
    # of the stage's whole parameters (estimate/memory.py grad_accum_terms)
    knobs = replace(ZeroKnobs.for_model(model), grad_accum_dtype=run.get("grad_accum_dtype"))
    memory = (stage_memory(model, cluster, setup, workload, stages(model, setup, method)[0], knobs)
              if setup.pipeline_parallel > 1 else estimate_memory(model, cluster, setup, workload, knobs))
    smi = memory.nvidia_smi
    return {"step": time.step_seconds, "bubble": time.pipeline_bubble, "p2p": time.pipeline_p2p_seconds,
            "memory_gb": (smi.nvidia_smi_bytes if smi else memory.per_gpu_total) / GIB,
            "allocated_gb": memory.per_gpu_total / GIB, "micro_batches": accum, "params": model.params}


def table(runs: list[dict], path: Path = DATA) -> str:
    lines = [f"Command: {COMMAND}",
             f"data: {_shown(path)} ({len(runs)} runs); priced with estimate/pipeline.py on the catalog's "
             "figures (zerokit/data/gpus.json, the fitted figures of zerokit/data/time_fit.json), no calibration",
             "ratio = predicted / measured (> 1: predicted slower, or more memory, than measured)", "",
             f"{'run':44} {'gpu':10} {'gpus':>5} {'tp/pp/dp':>9} {'m':>4} {'bubble':>6} {'meas. s':>8} {'pred. s':>8} "
             f"{'ratio':>6} {'meas GB':>7} {'pred GB':>7} {'ratio':>6}"]
    time_ratios, mem_ratios = [], []
    for run in runs:
        got = price(run)
        step = measured_step(run)
        ratio = got["step"] / step if step else None
        mem = run.get("measured_memory_gb_per_gpu")
        mratio = got["memory_gb"] / float(mem) if mem else None
        time_ratios += [ratio] if ratio else []
        mem_ratios += [mratio] if mratio else []
        degrees = f"{run['tensor_parallel']}/{run['pipeline_parallel']}/{run['data_parallel']}"
        lines.append(f"{run['id'][:44]:44} {run['gpu']:10} {run['gpus']:>5} {degrees:>9} {got['micro_batches']:>4} "
                     f"{got['bubble']:>6.1%} {_num(step):>8} {got['step']:>8.3g} {_num(ratio, '.2f'):>6} "
                     f"{_num(mem):>7} {got['memory_gb']:>7.3g} {_num(mratio, '.2f'):>6}")
    lines.append("")
    for name, ratios in (("step time", time_ratios), ("memory per GPU", mem_ratios)):
        if ratios:
            spread = [max(r, 1 / r) for r in ratios]
            lines.append(f"{name}: {len(ratios)} runs, median x{statistics.median(spread):.2f}, worst x{max(spread):.2f}, "
                         f"signed median {statistics.median(ratios):.2f}, within 1.25x: "
                         f"{sum(s <= 1.25 for s in spread)}/{len(ratios)}")
    return "\n".join(lines) + "\n"


def _shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _num(x, fmt: str = ".4g") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(float(x), fmt)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    try:
        runs = load(args.data)
        text = table(runs, args.data)
    except (RunError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
