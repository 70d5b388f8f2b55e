"""zerokit's longest sequence (`plan --seq-len max`) against the maxima ALST published (issue 28, item 4).

Each row is the published setup, pinned as far as zerokit plans it, searched with `zerokit plan --seq-len max --json`
on the catalog's figures (`--hardware-profile none`). zerokit's answer and the published maximum are printed side by
side with the ratio. Where zerokit cannot plan a setup, the row says so (Ulysses across whole nodes is planned: its
all-to-alls priced over the nodes' links).

Sources:
- ALST paper, arXiv 2506.13996, abstract: "ALST supports training Meta's Llama 8B model with 500K sequence length on a
  single H100 GPU, 3.7M on a single 8xH100 GPU node, and over 15M on a 4 node cluster, an increase of over 400x
  compared to the 32K baseline for the latter". Setup: ZeRO-3 with optimizer states offloaded to CPU, tiled loss,
  tiled MLP, activation-checkpoint offload, Ulysses SP over the GPUs.
- Snowflake's engineering blog, "Arctic Long Sequence Training (ALST): Scalable And Efficient Training For
  Multi-Million Token Sequences": "16x, 116x and 469x improvements in max trainable sequence lengths vs. standard
  Hugging Face pipelines" (500K / 16, 3.7M / 116 and 15M / 469 are each about 32K: the baseline's maximum, as the
  largest power of two it ran).

This only measures zerokit's memory model; no figure here informed a rule.

Usage: python bench/alst_max_seq.py [--out bench/results/alst_max_seq.txt]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ALST = ["--stage", "3", "--offload-optimizer", "cpu", "--tiled-loss", "on", "--tiled-mlp", "on", "--micro-batch", "1"]
PAPER = "arXiv 2506.13996 abstract"
BLOG = "Snowflake ALST blog (x improvement over 32K)"

ROWS = [
    # (label, GPUs per node, nodes, extra pins, published tokens, source)
    ("Llama-3.1-8B, 1 x H100, ALST (ckpt offload)", 1, 1, ["--activation-checkpointing", "offload"], 500_000, PAPER),
    ("Llama-3.1-8B, 8 x H100, ALST SP 8 (ckpt offload)", 8, 1,
     ["--sequence-parallel", "8", "--activation-checkpointing", "offload"], 3_700_000, PAPER),
    ("Llama-3.1-8B, 32 x H100 (4 nodes), ALST SP 32", 8, 4, ["--sequence-parallel", "32", "--activation-checkpointing",
                                                             "offload"], 15_000_000, PAPER),
    ("Llama-3.1-8B, 8 x H100, HF baseline (ZeRO-3, ckpt)", 8, 1,
     ["--sequence-parallel", "1", "--tiled-loss", "off", "--tiled-mlp", "off", "--activation-checkpointing", "on"],
     32_768, BLOG),
]


def longest(gpn: int, nodes: int, extra: list[str]) -> tuple[int | None, str]:
    argv = [sys.executable, "-m", "zerokit", "plan", "llama-3.1-8b", "--gpu", "h100-80gb", "--gpus-per-node", str(gpn),
            "--nodes", str(nodes), "--seq-len", "max", "--hardware-profile", "none", *ALST, *extra, "--json"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run(argv, capture_output=True, text=True, cwd=str(REPO), env=env)
    if p.returncode != 0:
        return None, (p.stderr.strip().splitlines() or ["?"])[-1]
    d = json.loads(p.stdout)
    return d["workload"]["max_seq_len"], d["choice"]["label"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lines = [f"{'setup':52} {'published':>10} {'zerokit':>10} {'ratio':>7}  source / zerokit's choice"]
    for label, gpn, nodes, extra, published, source in ROWS:
        got, why = longest(gpn, nodes, extra)
        if got is None:
            lines.append(f"{label:52} {published:>10,} {'-':>10} {'-':>7}  {source}; not planned: {why}")
        else:
            lines.append(f"{label:52} {published:>10,} {got:>10,} {got / published:>6.2f}x  {source}; {why}")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text("python bench/alst_max_seq.py --out " + args.out + "\n\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
