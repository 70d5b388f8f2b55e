"""Ranks for tests/test_pipeline_adapter.py: a tiny HF model trained as a DeepSpeed pipeline on CPU over gloo, and the
same model trained in one process with plain PyTorch, on the same data in the same order.

    deepspeed --num_gpus N --module tests.helpers.pipeline_ranks --model DIR --stages P [--zero Z] [--ckpt K] --out DIR
    python -m tests.helpers.pipeline_ranks --reference --model DIR --dp D --out FILE

Pipeline: zerokit.launching.pipeline.pipeline_module over P stages (data parallel N / P; --ckpt: its
activation_checkpoint_interval), DeepSpeed's AdamW with torch_adam (no JIT op), fp32; each rank writes
OUT/rank{R}.json with its stage, data-parallel rank, layers, which blocks are checkpointed, the loss train_batch
returns per step, the eval loss of step 0's batch after training, and for a tied model the largest difference between
the ranks' copies of the tied embedding. Reference: the same global batches (micro x accumulation
x data parallel, each micro-batch's HF loss scaled by 1 / their count), torch.optim.AdamW with the same settings.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MICRO, SEQ, GAS, STEPS = 2, 64, 4, 3
ADAMW = {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
# DeepSpeed clips at 1.0 unless told (runtime/constants.py GRADIENT_CLIPPING_DEFAULT); the tiny model's gradients
# have norm ~1.3-1.5, so both sides clip on every step: the pipeline's norm must span all stages (under ZeRO-0 it
# does only with pipeline._count_every_stage_in_the_clip_norm)
CLIP = 1.0


def build_model(model_dir: str):
    """The HF model from its config under a fixed seed: every rank and the reference start from the same weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    model.train()
    return model


def micro_batches(vocab: int, count: int) -> list:
    """(input_ids, labels) micro-batches of fixed shape; the even ones ignore their first sample's first tokens (-100)."""
    import torch

    g = torch.Generator().manual_seed(1234)
    out = []
    for i in range(count):
        ids = torch.randint(0, vocab, (MICRO, SEQ), generator=g)
        labels = ids.clone()
        if i % 2 == 0:
            labels[0, :5] = -100
        out.append((ids, labels))
    return out


def reference(model_dir: str, dp: int) -> dict:
    """Per-step losses of plain PyTorch training on the global batch (GAS * dp micro-batches a step), then the eval
    loss of step 0's batch."""
    import torch

    model = build_model(model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=ADAMW["lr"], betas=tuple(ADAMW["betas"]), eps=ADAMW["eps"],
                            weight_decay=ADAMW["weight_decay"])
    per_step = GAS * dp
    batches = micro_batches(model.config.vocab_size, STEPS * per_step)
    losses = []
    for step in range(STEPS):
        step_losses = []
        for ids, labels in batches[step * per_step:(step + 1) * per_step]:
            loss = model(input_ids=ids, labels=labels).loss
            (loss / per_step).backward()
            step_losses.append(loss.item())
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        losses.append(sum(step_losses) / per_step)
    model.eval()
    with torch.no_grad():
        evals = [model(input_ids=ids, labels=labels).loss.item() for ids, labels in batches[:per_step]]
    return {"losses": losses, "eval": sum(evals) / per_step}


def _tied_max_diff(pipe) -> float | None:
    """Largest |difference| between the tied embedding copies of all ranks (every rank holds one at P=2), else None."""
    import torch
    import torch.distributed as dist

    from zerokit.launching.pipeline import TIED_KEY

    if TIED_KEY not in pipe.tied_modules:
        return None
    w = pipe.tied_modules[TIED_KEY].embed.weight.detach()
    copies = [torch.empty_like(w) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, w)
    return max(float((c - copies[0]).abs().max()) for c in copies)


def pipeline(model_dir: str, stages: int, zero: int, ckpt: int, out: Path) -> None:
    import deepspeed
    import torch.distributed as dist

    from zerokit.core.process import finish_rank
    from zerokit.launching.pipeline import pipeline_module

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    model = build_model(model_dir)
    pipe = pipeline_module(model, num_stages=stages, activation_checkpoint_interval=ckpt)
    dp = dist.get_world_size() // stages
    cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
           "train_batch_size": MICRO * GAS * dp, "zero_optimization": {"stage": zero}, "gradient_clipping": CLIP,
           "optimizer": {"type": "AdamW", "params": {**ADAMW, "torch_adam": True}}, "steps_per_print": 10**9}
    engine, *_ = deepspeed.initialize(model=pipe, config=cfg,
                                      model_parameters=[p for p in pipe.parameters() if p.requires_grad])
    dp_rank = engine.grid.get_data_parallel_id()
    batches = micro_batches(model.config.vocab_size, STEPS * GAS * dp)
    losses = []
    for step in range(STEPS):
        # this data-parallel rank's share of the step's global batch, in the reference's order
        start = (step * dp + dp_rank) * GAS
        losses.append(float(engine.train_batch(iter(batches[start:start + GAS]))))
    final = float(engine.eval_batch(iter(batches[dp_rank * GAS:(dp_rank + 1) * GAS])))
    tied = _tied_max_diff(pipe)
    names = [f.func.__name__ if hasattr(f, "func") else type(f).__name__ for f in pipe.forward_funcs]  # func: a partial
    rank = dist.get_rank()
    (out / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "stage": engine.stage_id, "dp_rank": dp_rank, "parts": [int(x) for x in pipe.parts],
        "layers": names, "checkpointed": list(map(bool, pipe.is_checkpointable_results)),
        "losses": losses, "eval": final, "tied_max_diff": tied}))
    dist.barrier()
    finish_rank(0)  # groups closed, then out without the interpreter's teardown (zerokit.core.process says why)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--zero", type=int, default=0)
    ap.add_argument("--ckpt", type=int, default=0)
    ap.add_argument("--local_rank", type=int, default=None)  # DeepSpeed may pass it
    args, _ = ap.parse_known_args()
    if args.reference:
        Path(args.out).write_text(json.dumps(reference(args.model, args.dp)))
    else:
        pipeline(args.model, args.stages, args.zero, args.ckpt, Path(args.out))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
