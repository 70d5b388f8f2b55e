"""A user's own script without the HF Trainer: deepspeed.initialize on the config path it is given.

    python plain_ds_script.py --deepspeed_config PATH --model DIR --steps N --out DIR [--crash-first-attempt-after K]

It keeps its own checkpoints in --out and resumes from them, as `zerokit launch ... --max-restarts` expects of a
user's script. --crash-first-attempt-after K: rank 1 exits with code 3 after step K on zerokit's first attempt
(ZEROKIT_ATTEMPT=0), so the restart path runs for real. Each rank appends "rank R step S loss L attempt A" lines
to OUT/steps.txt.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import deepspeed
import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepspeed_config", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--out", required=True)
    ap.add_argument("--crash-first-attempt-after", type=int, default=0)
    ap.add_argument("--local_rank", type=int, default=0)  # the deepspeed launcher passes it
    args = ap.parse_args()

    deepspeed.init_distributed()
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model))
    cfg = json.loads(Path(args.deepspeed_config).read_text())
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    ckpt = Path(args.out) / "ckpt"
    if (ckpt / "latest").is_file():
        engine.load_checkpoint(str(ckpt))
    attempt = int(os.environ.get("ZEROKIT_ATTEMPT", "0"))
    g = torch.Generator().manual_seed(1234)
    mb = engine.train_micro_batch_size_per_gpu()
    vocab = model.config.vocab_size
    batches = [torch.randint(0, vocab, (mb, args.seq), generator=g) for _ in range(args.steps * engine.gradient_accumulation_steps())]
    while engine.global_steps < args.steps:
        for _ in range(engine.gradient_accumulation_steps()):
            batch = batches[engine.global_samples // (mb * engine.world_size) % len(batches)]
            loss = engine(input_ids=batch, labels=batch).loss
            engine.backward(loss)
            engine.step()
        with open(Path(args.out) / "steps.txt", "a") as fh:
            fh.write(f"rank {rank} step {engine.global_steps} loss {float(loss):.6f} attempt {attempt}\n")
        engine.save_checkpoint(str(ckpt))
        if attempt == 0 and rank == 1 and engine.global_steps == args.crash_first_attempt_after:
            os._exit(3)


if __name__ == "__main__":
    main()
