"""zerokit's longest sequence (`plan --seq-len max`) against what ALST published (issue 28, item 4).

Each row is a published setup, pinned as far as zerokit plans it, searched with `zerokit plan --seq-len max --json`
on the catalog's figures (`--hardware-profile none`). zerokit's answer and the published length are printed side by
side with the ratio. Three kinds of published length:
- "max": the longest sequence the ALST paper (or its blog, for the HF baseline) reports for the setup (a maximum: within
  15% is the target);
- "full": the `max_length` of one of ArcticTraining's recipes (projects/sequence-parallelism/run-*.yml) whose comment
  puts the GPU or the host at the edge of its memory ("ok 136.15 GB" of an H200's 140 GiB, "close to oom", "at the
  brink of cpu-oom"): a maximum too;
- "ran": a recipe's `max_length` that ran, not shown to be a maximum: zerokit must plan it (ratio >= 1); how far above
  is not a target. The 1 x H100 ALST row is one: the paper's 500K there was bound by a kernel, not memory (the recipe:
  555K failed with a Triton illegal memory access; 524,288 tokens x 4,096 is 2^31 elements, where the 32-bit offsets
  of liger-kernel's RMSNorm and RoPE overflow before 0.6.1: "int64 indexing", ArcticTraining's model/liger_factory.py).
Where zerokit cannot plan a setup, the row says so.

Sources:
- ALST paper, arXiv 2506.13996, abstract: "ALST supports training Meta's Llama 8B model with 500K sequence length on a
  single H100 GPU, 3.7M on a single 8xH100 GPU node, and over 15M on a 4 node cluster, an increase of over 400x
  compared to the 32K baseline for the latter".
- Snowflake's engineering blog, "Arctic Long Sequence Training (ALST): Scalable And Efficient Training For
  Multi-Million Token Sequences": "16x, 116x and 469x improvements in max trainable sequence lengths vs. standard
  Hugging Face pipelines" (500K / 16, 3.7M / 116 and 15M / 469 are each about 32K: the baseline's maximum).
- ArcticTraining's recipes (github.com/snowflakedb/ArcticTraining, projects/sequence-parallelism): each row's pins
  copy its recipe: ZeRO-3, optimizer offloaded to the CPU, parameters offloaded only where the recipe says
  (`offload_param`), `type: liger` (`--liger-kernels on`), `tiled_mlp_compute`, `activation_checkpoint_cpu_offload`,
  `sequence_parallel_size`, micro batch 1. run-h100-sp1-llama-8b.yml: "max_length: 500000 # ok", 555000 failed with
  a Triton illegal memory access (not an out-of-memory); run-h200-sp1-llama-8b-liger-offload-tiled-mlp.yml:
  "1_200_000 # ok 136.15 GB"; run-h100-sp1-qwen3-32b.yml: "230000 # ok"; run-h100-sp8-llama-70b.yml: 200_000, tiled
  MLP, no checkpoint offload ("hurts seqlen as we are already offloading too much at 70b"); the 70B and Qwen3-32B
  recipes over 2-8 nodes and their nvidia-smi notes (MULTI_NODE, PEAKS). The README's environment: H100 nodes with
  "1.9TB CPU memory" (`--cpu-memory 1.9TB`), transformers 4.51.3 (reentrant checkpointing).
- The HF Ulysses blog (huggingface/blog ulysses-sp.md, "Benchmarks"): BLOG_ROWS.

This only measures zerokit's memory model and the limits it applies; no figure here informed a rule, except the HF
blog's optimizer placement, which its table's intercept suggested (docs/long-context.md says how). liger-kernel's 32-bit
cap before 0.6.1 (zerokit/spec/liger.py) was looked for because the Ulysses maxima sat 1.2-1.4x under the memory
model's answers, but its numbers come from Liger's source and PR #804 alone; the 1 x H100 recipe's crash at 555K is the
oracle its test holds. Where the cap binds a row, the same setup with a current liger-kernel (`on`, 64-bit offsets) is
printed beside: the memory model's own answer. The maxima's published / zerokit ratios give a
`--seq-len max` answer its likely range (--write-range), not its value.

Usage: python bench/alst_max_seq.py [--out bench/results/alst_max_seq.txt] [--write-range]
--write-range: the range of published / zerokit over the maxima, with Ulysses and without, into
zerokit/data/seq_len_range.json, which gives a `--seq-len max` answer on a GPU its likely range (planning/search.py
likely_range).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# the recipes' ZeRO-3 with the optimizer on the CPU, micro batch 1, bf16; transformers 4.51.3 (the ALST README's
# environment) checkpoints reentrant by default (gradient_checkpointing_enable: use_reentrant True without kwargs), and
# ArcticTraining's checkpoint offload replaces that reentrant CheckpointFunction (monkey_patches.py); the H100 recipes
# run flash_attention_2, the H200 ones flash_attention_3 (H200 below). Its SFTTrainer.loss returns `outputs.loss` alone,
# so the logits are freed before backward, but the recipes' notes read reserved memory, where the freed 2-byte logits
# cannot hold the backward's 4-byte tensors: priced as zerokit's own loop (outputs held; docs/long-context.md). The
# README's nodes have "1.9TB CPU memory": host RAM is checked against it
ALST = ["--stage", "3", "--offload-optimizer", "cpu", "--micro-batch", "1", "--precision", "bf16",
        "--checkpoint-reentrant", "on", "--attention", "flash", "--cpu-memory", "1.9TB"]
H200 = ["--attention", "flash3"]
PAPER = "arXiv 2506.13996 abstract"
BLOG = "Snowflake ALST blog (x improvement over 32K)"
RECIPE = "ArcticTraining recipe "
# every ALST recipe loads the model as `type: liger` (Liger's RMSNorm, RoPE, fused linear cross-entropy; its SwiGLU
# only without tiled_mlp_compute: model/liger_factory.py); the HF baselines load transformers' own modules. The H100
# recipes were written in June 2025 (ArcticTraining 9d33fd2, 2025-06-03), when its liger_factory.py required
# liger-kernel >= 0.5.9 and 0.5.10 (2025-05-22) was the latest: before 0.6.1 (2025-07-28), Liger's RMSNorm and RoPE
# index in 32 bits, which caps a rank's tokens (zerokit/spec/liger.py). The H200 recipes (5885b9f, 2025-07-18) ran
# 650K-1.2M tokens on one GPU, past that cap: they had the int64 kernels (ArcticTraining f274093: liger-kernel >= 0.6.1,
# "int64 indexing"), priced as "on" (a current release: for Llama, without per-head norms, any from 0.6.1 on)
LIGER_JUNE_2025 = "0.5.10"
LIGER = ["--liger-kernels", LIGER_JUNE_2025]
LIGER_INT64 = ["--liger-kernels", "on"]
HF = ["--liger-kernels", "off", "--tiled-loss", "off", "--tiled-mlp", "off", "--activation-checkpointing", "on"]
OFFLOAD_CKPT = [*LIGER, "--tiled-mlp", "on", "--activation-checkpointing", "offload"]
H200_OFFLOAD_CKPT = [*LIGER_INT64, "--tiled-mlp", "on", "--activation-checkpointing", "offload"]
SP8 = ["--offload-param", "none", "--sequence-parallel", "8"]

# ArcticTraining's recipes for Llama-3.1-70B and Qwen3-32B on 1 to 8 nodes (checkpoint offload, tiled MLP, Liger,
# Ulysses over every GPU): (name, model, nodes, max_length, kind, recipe and its note). Lengths that ran, but for the
# one whose note puts the host at the edge of its memory ("full", as the GPU notes above); four note nvidia-smi.
MULTI_NODE = [
    ("Llama-3.1-70B", "llama-3-70b", 2, 1_200_000, "ran", "run-h100-sp16-llama-70b.yml"),
    ("Llama-3.1-70B", "llama-3-70b", 4, 4_000_000, "full", "run-h100-sp32-llama-70b.yml (\"NV 47.70 GB - but at the "
     "brink of cpu-oom!\")"),
    ("Llama-3.1-70B", "llama-3-70b", 8, 10_000_000, "ran", "run-h100-sp64-llama-70b.yml (\"ok NV 53.83 GB\")"),
    ("Qwen3-32B", "qwen3-32b", 1, 1_550_000, "ran", "run-h100-sp8-qwen3-32b.yml (\"ok\")"),
    ("Qwen3-32B", "qwen3-32b", 2, 4_000_000, "ran", "run-h100-sp16-qwen3-32b.yml"),
    ("Qwen3-32B", "qwen3-32b", 4, 7_000_000, "ran", "run-h100-sp32-qwen3-32b.yml (\"ok NV 71.55 GB w/ pt-2.4\")"),
    ("Qwen3-32B", "qwen3-32b", 8, 15_000_000, "ran", "run-h100-sp64-qwen3-32b.yml (\"NV 71.00 GB\")"),
]

ROWS = [
    # (label, model, gpu, GPUs per node, nodes, pins, published tokens, kind, source)
    ("Llama-3.1-8B, 8 x H100, ALST SP 8 (ckpt offload)", "llama-3.1-8b", "h100-80gb", 8, 1,
     [*SP8, *OFFLOAD_CKPT], 3_700_000, "max", PAPER + "; run-h100-sp8-llama-8b.yml"),
    ("Llama-3.1-8B, 32 x H100 (4 nodes), ALST SP 32", "llama-3.1-8b", "h100-80gb", 8, 4,
     ["--offload-param", "none", "--sequence-parallel", "32", *OFFLOAD_CKPT], 15_000_000, "max",
     PAPER + "; run-h100-sp32-llama-8b.yml"),
    ("Llama-3.1-8B, 8 x H100, HF baseline (ZeRO-3, ckpt)", "llama-3.1-8b", "h100-80gb", 8, 1,
     ["--offload-param", "none", "--sequence-parallel", "1", *HF], 32_768, "max", BLOG),
    ("Llama-3.1-8B, 16 x H100 (2 nodes), ALST SP 16", "llama-3.1-8b", "h100-80gb", 8, 2,
     ["--offload-param", "none", "--sequence-parallel", "16", *OFFLOAD_CKPT], 8_000_000, "full",
     RECIPE + "run-h100-sp16-llama-8b.yml (\"close to oom\")"),
    ("Llama-3.1-8B, 1 x H200, ALST (ckpt offload, tiled MLP)", "llama-3.1-8b", "h200", 1, 1,
     [*H200, "--offload-param", "cpu", *H200_OFFLOAD_CKPT], 1_200_000, "full",
     RECIPE + "run-h200-sp1-llama-8b-liger-offload-tiled-mlp.yml (\"ok 136.15 GB\")"),
    ("Llama-3.1-8B, 1 x H200, Liger + ckpt offload", "llama-3.1-8b", "h200", 1, 1,
     [*H200, "--offload-param", "cpu", *LIGER_INT64, "--tiled-mlp", "off", "--activation-checkpointing", "offload"], 650_000,
     "full", RECIPE + "run-h200-sp1-llama-8b-liger-offload.yml (\"ok 126.81 GB\")"),
    ("Llama-3.1-8B, 1 x H200, Liger", "llama-3.1-8b", "h200", 1, 1,
     [*H200, "--offload-param", "cpu", *LIGER_INT64, "--tiled-mlp", "off", "--activation-checkpointing", "on"], 300_000, "full",
     RECIPE + "run-h200-sp1-llama-8b-liger.yml (\"ok 134.96 GB\")"),
    ("Llama-3.1-8B, 1 x H200, HF baseline", "llama-3.1-8b", "h200", 1, 1,
     [*H200, "--offload-param", "cpu", "--sequence-parallel", "1", *HF], 65_000, "full",
     RECIPE + "run-h200-sp1-llama-8b-baseline.yml (\"ok 137.36 GB\")"),
    ("Llama-3.1-8B, 1 x H100, HF baseline", "llama-3.1-8b", "h100-80gb", 1, 1,
     ["--offload-param", "cpu", "--sequence-parallel", "1", *HF], 36_000, "full",
     RECIPE + "run-h100-sp1-llama-8b-baseline.yml (\"close to oom\")"),
    ("Llama-3.1-8B, 1 x H100, ALST (ckpt offload)", "llama-3.1-8b", "h100-80gb", 1, 1,
     ["--offload-param", "cpu", *OFFLOAD_CKPT], 500_000, "ran",
     PAPER + "; run-h100-sp1-llama-8b.yml (555K: a Triton illegal memory access, not out of memory)"),
    # the ablation series of the SP 8 recipes (each feature added in turn); its first step drops Ulysses: ZeRO-3 over the 8
    # GPUs, each with its own 160K sequence (the recipe as first committed, sequence_parallel_size 1; a later commit, "fix
    # SP size", set 8 without touching max_length)
    ("Llama-3.1-8B, 8 x H100, no SP, Liger", "llama-3.1-8b", "h100-80gb", 8, 1,
     ["--offload-param", "none", "--sequence-parallel", "1", *LIGER, "--tiled-mlp", "off", "--activation-checkpointing",
      "on"], 160_000, "ran", RECIPE + "run-h100-sp8-llama-8b-no-ulysses-yes-liger-no-extras.yml (at sequence_parallel_size 1)"),
    ("Llama-3.1-8B, 8 x H100, SP 8, Liger + ckpt offload", "llama-3.1-8b", "h100-80gb", 8, 1,
     [*SP8, *LIGER, "--tiled-mlp", "off", "--activation-checkpointing", "offload"], 2_400_000, "ran",
     RECIPE + "run-h100-sp8-llama-8b-yes-act-offload.yml"),
    ("Llama-3.1-8B, 8 x H100, SP 8, Liger + tiled MLP", "llama-3.1-8b", "h100-80gb", 8, 1,
     [*SP8, *LIGER, "--tiled-mlp", "on", "--activation-checkpointing", "on", "--attention", "sdpa"], 1_200_000, "ran",
     RECIPE + "run-h100-sp8-llama-8b-yes-mlp.yml (sdpa)"),
    ("Llama-3.1-8B, 8 x H100, SP 8, Liger", "llama-3.1-8b", "h100-80gb", 8, 1,
     [*SP8, *LIGER, "--tiled-mlp", "off", "--activation-checkpointing", "on"], 1_100_000, "ran",
     RECIPE + "run-h100-sp8-llama-8b-no-mlp-no-act-offload.yml"),
    ("Qwen3-32B, 1 x H100, ALST (ckpt offload)", "qwen3-32b", "h100-80gb", 1, 1,
     ["--offload-param", "cpu", *OFFLOAD_CKPT], 230_000, "ran", RECIPE + "run-h100-sp1-qwen3-32b.yml (\"ok\")"),
    ("Llama-3.1-70B, 8 x H100, SP 8 (ckpt, tiled MLP)", "llama-3-70b", "h100-80gb", 8, 1,
     [*SP8, *LIGER, "--tiled-mlp", "on", "--activation-checkpointing", "on"], 200_000, "ran",
     RECIPE + "run-h100-sp8-llama-70b.yml"),
    *[(f"{name}, {8 * nodes} x H100 ({nodes} nodes), ALST SP {8 * nodes}", model, "h100-80gb", 8, nodes,
       ["--offload-param", "none", "--sequence-parallel", str(8 * nodes), *OFFLOAD_CKPT], tokens, kind,
       RECIPE + recipe) for name, model, nodes, tokens, kind, recipe in MULTI_NODE],
]


# The memory the recipes noted at their length (ArcticTraining prints GB as bytes / 2**30: arctic_training/debug/utils.py
# see_memory_usage; "NV" is its nvidia-smi reading, the others do not say which of its readings they quote), against
# zerokit's allocated peak and its nvidia-smi estimate at that length: (label, model, gpu, GPUs per node, nodes, pins,
# tokens, GiB noted, note)
PEAKS = [
    ("Llama-3.1-8B, 1 x H200, ALST (ckpt offload, tiled MLP)", "llama-3.1-8b", "h200", 1, 1,
     [*H200, "--offload-param", "cpu", *H200_OFFLOAD_CKPT], 1_200_000, 136.15, "run-h200-sp1-llama-8b-liger-offload-tiled-mlp.yml"),
    ("Llama-3.1-8B, 1 x H200, Liger + ckpt offload", "llama-3.1-8b", "h200", 1, 1,
     [*H200, "--offload-param", "cpu", *LIGER_INT64, "--tiled-mlp", "off", "--activation-checkpointing", "offload"], 650_000, 126.81,
     "run-h200-sp1-llama-8b-liger-offload.yml"),
    ("Llama-3.1-8B, 1 x H200, Liger", "llama-3.1-8b", "h200", 1, 1,
     [*H200, "--offload-param", "cpu", *LIGER_INT64, "--tiled-mlp", "off", "--activation-checkpointing", "on"], 300_000, 134.96,
     "run-h200-sp1-llama-8b-liger.yml"),
    ("Llama-3.1-8B, 1 x H200, HF baseline", "llama-3.1-8b", "h200", 1, 1,
     [*H200, "--offload-param", "cpu", "--sequence-parallel", "1", *HF], 65_000, 137.36, "run-h200-sp1-llama-8b-baseline.yml"),
    ("Llama-3.1-8B, 1 x H100, HF baseline", "llama-3.1-8b", "h100-80gb", 1, 1,
     ["--offload-param", "cpu", "--sequence-parallel", "1", *HF], 32_000, 71.91,
     "run-h100-sp1-llama-8b-baseline.yml (\"NV 71.91 GB\": nvidia-smi)"),
    # nvidia-smi ("NV") over 4 and 8 nodes, Ulysses over every GPU; the 7M Qwen3-32B run used torch 2.4, which ALST's README
    # found less memory-efficient than the torch 2.8 nightly of the others
    *[(f"{name}, {8 * nodes} x H100, ALST SP {8 * nodes}", model, "h100-80gb", 8, nodes,
       ["--offload-param", "none", "--sequence-parallel", str(8 * nodes), *OFFLOAD_CKPT], tokens, noted, recipe)
      for name, model, nodes, tokens, noted, recipe in [
          ("Llama-3.1-70B", "llama-3-70b", 4, 4_000_000, 47.70, "run-h100-sp32-llama-70b.yml (NV)"),
          ("Llama-3.1-70B", "llama-3-70b", 8, 10_000_000, 53.83, "run-h100-sp64-llama-70b.yml (NV)"),
          ("Qwen3-32B", "qwen3-32b", 4, 7_000_000, 71.55, "run-h100-sp32-qwen3-32b.yml (NV, torch 2.4)"),
          ("Qwen3-32B", "qwen3-32b", 8, 15_000_000, 71.00, "run-h100-sp64-qwen3-32b.yml (NV)")]],
]


# The HF Ulysses blog (huggingface/blog ulysses-sp.md, "Benchmarks"): Qwen3-4B with TRL's SFTTrainer on H100 80GB, ZeRO-3,
# "CPU optimizer offloading", gradient checkpointing (transformers >= 5: non-reentrant), flash_attention_2, micro batch
# 1 x 8 accumulation steps, HF's own loss (no Liger, no tiling), zerokit's own loop's accounting as for the recipes. Its
# peak memory per rank, "GB", read as DeepSpeed's and ArcticTraining's see_memory_usage print it (bytes / 2**30); 128K
# out of memory ("requires ~81 GB"): (label, GPUs = SP degree, sequence length, GiB).
HF_BLOG = ["--stage", "3", "--offload-param", "none", "--micro-batch", "1", "--grad-accum", "8", "--precision", "bf16",
           "--activation-checkpointing", "on", "--attention", "flash", "--tiled-loss", "off", "--tiled-mlp", "off"]
BLOG_ROWS = [
    ("Qwen3-4B, 1 x H100, no SP (baseline)", 1, 8_192, 76.4),
    ("Qwen3-4B, 4 x H100, SP 4", 4, 8_192, 23.4),
    ("Qwen3-4B, 4 x H100, SP 4", 4, 32_768, 35.0),
    ("Qwen3-4B, 4 x H100, SP 4", 4, 65_536, 50.5),
    ("Qwen3-4B, 4 x H100, SP 4", 4, 98_304, 66.0),
    ("Qwen3-4B, 4 x H100, SP 4 (out of memory)", 4, 131_072, 81.0),
]


def blog_peak(gpus: int, seq: int, optimizer_on: str = "none") -> tuple[float, bool, float]:
    """zerokit's nvidia-smi estimate in GiB for a blog row, whether the plan fits (in the planner's 95% of the GPU) and
    its allocated peak in GiB. optimizer_on "none" (the
    default): the optimizer on the GPUs, as the only YAML the blog shows runs it (its nested `offload_optimizer:` is not
    a key accelerate reads: config/accelerate_yaml.py ignored_plugin_keys); "cpu": the offload the blog states."""
    d, why = plan_json("qwen3-4b", "h100-80gb", gpus, 1, str(seq),
                       [*HF_BLOG, "--sequence-parallel", str(gpus), "--offload-optimizer", optimizer_on])
    if d is None:
        raise RuntimeError(why)
    m = d["memory"]["per_gpu"]
    return m["nvidia_smi_bytes"] / 2**30, bool(d["fits"]), m["total_bytes"] / 2**30


def plan_json(model: str, gpu: str, gpn: int, nodes: int, seq_len: str, extra: list[str]) -> tuple[dict | None, str]:
    """`zerokit plan --json` of a setup on the catalog's figures: (its JSON, "") or (None, its error line)."""
    argv = [sys.executable, "-m", "zerokit", "plan", model, "--gpu", gpu, "--gpus-per-node", str(gpn), "--nodes",
            str(nodes), "--seq-len", seq_len, "--hardware-profile", "none", *ALST, *extra, "--json"]
    p = subprocess.run(argv, capture_output=True, text=True, cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO)))
    if p.returncode not in (0, 1) or not p.stdout.strip():  # 1: does not fit, its JSON printed all the same
        return None, (p.stderr.strip().splitlines() or ["?"])[-1]
    return json.loads(p.stdout), ""


def peak_at(model: str, gpu: str, extra: list[str], tokens: int, gpn: int = 1, nodes: int = 1) -> tuple[float, float]:
    """(allocated peak, nvidia-smi estimate) in GiB of `zerokit plan` at `tokens` on `gpn` GPUs (of a plan that does not
    fit too: its least-memory setup)."""
    d, why = plan_json(model, gpu, gpn, nodes, str(tokens), extra)
    if d is None:
        raise RuntimeError(why)
    m = d["memory"]["per_gpu"]
    return m["total_bytes"] / 2**30, m["nvidia_smi_bytes"] / 2**30


def longest(model: str, gpu: str, gpn: int, nodes: int, extra: list[str]) -> tuple[int | None, str, str]:
    """`zerokit plan --seq-len max`: (the longest sequence, the setup's label, what binds one granule longer) or (None,
    the error line, "")."""
    d, why = plan_json(model, gpu, gpn, nodes, "max", extra)
    if d is None:
        return None, why, ""
    # the memory model's own longest: what this table checks (the answer plan gives, cut with the sequence's memory at
    # the factor fitted on published long runs, is bench/long_context.py's)
    search = d["workload"]["max_seq_len_search"]
    return search["memory_bound_seq_len"], d["choice"]["label"], search["binds"]


def liger_bound(binds: str) -> bool:
    """Whether a search stopped at Liger's 32-bit offsets (zerokit/spec/liger.py liger_limit_problem), not memory."""
    return binds.startswith("liger-kernel ")


def memory_alone(model: str, gpu: str, gpn: int, nodes: int, extra: list[str], got: int | None,
                 binds: str) -> int | None:
    """Where a row's Liger release capped its longest sequence `got` (`binds`: what bound it), the same setup with a
    current release (--liger-kernels on), whose kernels index in 64 bits: what the memory model alone gives. None where
    the cap did not bind, or binds on the current release too."""
    if not got or not liger_bound(binds):
        return None
    pins = ["on" if a == LIGER_JUNE_2025 and i and extra[i - 1] == "--liger-kernels" else a for i, a in enumerate(extra)]
    alone = longest(model, gpu, gpn, nodes, pins)[0]
    return None if alone == got else alone


RANGE_FILE = REPO / "zerokit" / "data" / "seq_len_range.json"
RANGE_COMMAND = "python bench/alst_max_seq.py --out bench/results/alst_max_seq.txt --write-range"


def sequence_parallel(pins: list[str]) -> int:
    """A row's pinned Ulysses degree (1 where it pins none: the one-GPU rows)."""
    return int(pins[pins.index("--sequence-parallel") + 1]) if "--sequence-parallel" in pins else 1


def seq_len_ranges(results: list[tuple[tuple, int | None, int | None]]) -> dict:
    """zerokit/data/seq_len_range.json from (row, zerokit's longest, the memory model's alone where Liger's 32-bit cap
    bound the first, else None) of every row: the lowest and highest published / zerokit over the published maxima
    ("max" and "full" rows), with Ulysses (SP > 1) and without. Where the cap bound zerokit's answer, the maximum is
    compared with the memory model's answer too: which of the two stopped the published run is not published, so the
    range spans both. planning/search.py likely_range turns them into a likely range of a `--seq-len max` answer on a GPU."""
    groups: dict[str, list[float]] = {"ulysses": [], "one_sequence_per_rank": []}
    maxima = dict.fromkeys(groups, 0)
    for row, got, alone in results:
        _, _, _, _, _, pins, published, kind, _ = row
        if kind != "ran" and got:
            key = "ulysses" if sequence_parallel(pins) > 1 else "one_sequence_per_rank"
            groups[key] += [published / n for n in (got, alone) if n]
            maxima[key] += 1
    what = {"ulysses": "with Ulysses over 8-32 H100s", "one_sequence_per_rank": "without sequence parallelism, on "
            "H100s and H200s"}
    out = {"_about": "published / zerokit's longest sequence over the published maxima of ALST's setups (arXiv "
                     "2506.13996 and ArcticTraining's recipes; Llama-3.1-8B and 70B), and / the memory model's alone "
                     "where liger-kernel's 32-bit cap bound zerokit's answer: a --seq-len max answer's likely range on "
                     "a GPU is [answer x ratio_low, answer x ratio_high] (planning/search.py likely_range). Written by "
                     + RANGE_COMMAND + "; tests/test_long_context.py recomputes it."}
    for key, ratios in groups.items():
        n = maxima[key]
        out[key] = {"ratio_low": round(min(ratios), 4), "ratio_high": round(max(ratios), 4), "maxima": n,
                    "basis": f"{n} published maxima {what[key]} (ALST; bench/results/alst_max_seq.txt)"}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--write-range", action="store_true",
                    help="write the published / zerokit range of the maxima to zerokit/data/seq_len_range.json")
    args = ap.parse_args()
    lines = [f"{'setup':52} {'published':>10} {'kind':>4} {'zerokit':>10} {'ratio':>7} {'current':>10} {'ratio':>7}  "
             "source / zerokit's choice",
             f"{'':52} {'':>10} {'':>4} {'':>10} {'':>7} {'liger':>10}"]
    maxima, ran, results, alone_maxima = [], [], [], []
    for row in ROWS:
        label, model, gpu, gpn, nodes, extra, published, kind, source = row
        got, why, binds = longest(model, gpu, gpn, nodes, extra)
        capped = bool(got) and liger_bound(binds)
        alone = memory_alone(model, gpu, gpn, nodes, extra, got, binds)
        results.append((row, got, alone))
        if got is None:
            lines.append(f"{label:52} {published:>10,} {kind:>4} {'-':>10} {'-':>7} {'':>10} {'':>7}  {source}; "
                         f"not planned: {why}")
            continue
        mem = f"{alone:>10,} {alone / published:>6.2f}x" if alone else f"{'':>10} {'':>7}"
        bound = f"; bound by liger-kernel {LIGER_JUNE_2025}'s 32-bit offsets" if capped else ""
        lines.append(f"{label:52} {published:>10,} {kind:>4} {got:>10,} {got / published:>6.2f}x {mem}  {source}; "
                     f"{why}{bound}")
        (ran if kind == "ran" else maxima).append(got / published)
        if kind != "ran":
            alone_maxima.append((alone or got) / published)
    within = sum(1 for r in maxima if abs(r - 1) <= 0.15)
    lines.append("")
    lines.append(f"maxima (max, full) within 15%: {within} of {len(maxima)} (with a current liger-kernel: "
                 f"{sum(1 for r in alone_maxima if abs(r - 1) <= 0.15)} of {len(alone_maxima)}); lengths that ran, "
                 f"planned at their length by zerokit: {sum(1 for r in ran if r >= 1)} of {len(ran)}")
    lines += ["", "memory at a recipe's length: what its comment noted (GiB) against zerokit's allocated peak and nvidia-smi "
              "estimate", f"{'setup':52} {'tokens':>10} {'noted':>7} {'alloc':>7} {'ratio':>6} {'smi':>7} {'ratio':>6}  "
              "recipe"]
    for label, model, gpu, gpn, nodes, extra, tokens, noted, source in PEAKS:
        alloc, smi = peak_at(model, gpu, extra, tokens, gpn, nodes)
        lines.append(f"{label:52} {tokens:>10,} {noted:>7.2f} {alloc:>7.2f} {alloc / noted:>5.2f}x {smi:>7.2f} "
                     f"{smi / noted:>5.2f}x  {source}")
    lines += ["", "peak memory per rank in the HF Ulysses blog (huggingface/blog ulysses-sp.md: Qwen3-4B, TRL SFTTrainer, "
              "ZeRO-3, checkpointing, flash_attention_2, micro batch 1 x 8; GiB) against zerokit's nvidia-smi estimate "
              "with the optimizer on the GPUs (as the YAML the blog shows runs) and on the CPU (as the blog states)",
              f"{'setup':52} {'seq':>10} {'blog':>6} {'opt GPU':>8} {'ratio':>6}  {'plan':12} {'opt CPU':>8} {'ratio':>6}"]
    for label, gpus, seq, gib in BLOG_ROWS:
        on_gpu, fits, _ = blog_peak(gpus, seq)
        on_cpu, _, _ = blog_peak(gpus, seq, "cpu")
        lines.append(f"{label:52} {seq:>10,} {gib:>6.1f} {on_gpu:>8.2f} {on_gpu / gib:>5.2f}x  "
                     f"{'fits' if fits else 'does not fit':12} {on_cpu:>8.2f} {on_cpu / gib:>5.2f}x")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text("python bench/alst_max_seq.py --out " + args.out + "\n\n" + text)
    if args.write_range:
        RANGE_FILE.write_text(json.dumps(seq_len_ranges(results), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
