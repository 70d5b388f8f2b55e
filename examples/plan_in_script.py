"""Plan inside your own training script: zerokit's Python API hands the HF Trainer its ds_config.

    zerokit launch --model tiny-llama --gpu cpu --gpus-per-node 2 --seq-len 32 --global-batch 8 --steps 4 -- \
        python examples/plan_in_script.py --seq-len 32 --global-batch 8 --steps 4 --output-dir runs/plan-in-script

Every rank asks `zerokit.plan(...)` for the setup at this job's world size (the same answer `zerokit plan` prints)
and passes `plan.ds_config` (profile hf: "auto" where the Trainer fills values) to
`TrainingArguments(deepspeed=...)`, with the micro batch and accumulation the plan chose. On CPU the Trainer needs
use_cpu and gloo to see the ranks. Rank 0 writes what the plan chose beside what DeepSpeed's engine ran
(plan_in_script.json in --output-dir), which the tests compare.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

import zerokit
from zerokit.integrations.hf import ZerokitCallback


def corpus(tok, seq_len: int) -> list[dict]:
    """zerokit's bundled tiny corpus, cut into seq_len-token blocks (labels = inputs: causal LM)."""
    from zerokit.core.resources import bundled_corpus

    lines = bundled_corpus().read_text(encoding="utf-8").splitlines(keepends=True)
    ids = [i for piece in tok(lines, add_special_tokens=False)["input_ids"] for i in piece]
    return [{"input_ids": ids[i:i + seq_len], "labels": ids[i:i + seq_len]}
            for i in range(0, len(ids) - seq_len + 1, seq_len)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--output-dir", default="runs/plan-in-script")
    args, _ = p.parse_known_args()  # `zerokit launch` appends --deepspeed CONFIG to Trainer scripts: this one plans
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cpu = not torch.cuda.is_available()
    plan = zerokit.plan(args.model, gpu="cpu" if cpu else "auto", gpus_per_node=world, seq_len=args.seq_len,
                        global_batch=args.global_batch, profile="hf")
    if not plan.fits:
        raise SystemExit(f"{args.model} does not fit {world} ranks: {'; '.join(plan.suggestions)}")
    setup = plan.best.setup
    targs = TrainingArguments(
        output_dir=str(Path(args.output_dir) / "trainer"), per_device_train_batch_size=setup.micro_batch_size,
        gradient_accumulation_steps=setup.gradient_accumulation_steps, max_steps=args.steps, logging_steps=1,
        report_to="none", save_strategy="no", deepspeed=plan.ds_config, bf16=setup.precision == "bf16",
        fp16=setup.precision == "fp16", use_cpu=cpu, ddp_backend="gloo" if cpu else None)
    import deepspeed  # the process group before the model: ZeRO-3 builds it under zero.Init

    deepspeed.init_distributed(dist_backend="gloo" if cpu else "nccl")
    from zerokit.spec.resolve import resolve_model

    resolved = resolve_model(args.model)
    torch.manual_seed(targs.seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolved.source))
    tok = AutoTokenizer.from_pretrained(resolved.tokenizer)
    trainer = Trainer(model=model, args=targs, train_dataset=corpus(tok, args.seq_len), callbacks=[ZerokitCallback()])
    trainer.train()
    if int(os.environ.get("RANK", "0")) == 0:
        engine = trainer.model_wrapped
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.output_dir) / "plan_in_script.json").write_text(json.dumps({
            "plan": {"label": setup.label, "zero_stage": setup.zero_stage, "micro_batch": setup.micro_batch_size,
                     "grad_accum": setup.gradient_accumulation_steps, "ds_config": plan.ds_config},
            "engine": {"zero_stage": engine.zero_optimization_stage(),
                       "micro_batch": engine.train_micro_batch_size_per_gpu(),
                       "grad_accum": engine.gradient_accumulation_steps(), "world_size": world},
            "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h]}, indent=2))


if __name__ == "__main__":
    main()
