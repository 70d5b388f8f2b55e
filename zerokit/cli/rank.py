"""The rank entrypoint's command line: `python -m zerokit.launch.train ...` (what `zerokit launch` starts under
the deepspeed launcher on every rank) parsed into zerokit.launch.train.RankOptions.

    deepspeed --num_gpus 2 --module zerokit.launch.train --model DIR --tokens tokens.npy \
        --ds-config ds_config.json --output-dir OUT --steps 20 [--save-every K] [--resume] \
        [--finetune-json '{"mode": "lora", "lora_r": 16, ...}' [--merge]]
"""

from __future__ import annotations

import argparse
import json
import os


def parse_rank_args(argv: list[str] | None = None):
    from zerokit.launch.train import RankOptions

    ap = argparse.ArgumentParser(prog="python -m zerokit.launch.train", description="zerokit per-rank training")
    ap.add_argument("--model", required=True, help="HF id, model directory, or config-only directory")
    ap.add_argument("--tokens", help="packed tokens.npy written by `zerokit launch` (int32 [n, seq_len])")
    ap.add_argument("--data", help="instead of --tokens: .txt/.jsonl file or directory, tokenized on every rank")
    ap.add_argument("--tokenizer", help="tokenizer dir or id (default: the model's, else the bundled one)")
    ap.add_argument("--seq-len", type=int, default=None, help="with --data: sequence length (default 64)")
    ap.add_argument("--ds-config", "--deepspeed_config", dest="ds_config", required=True)
    ap.add_argument("--output-dir", required=True)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--steps", type=int, default=None, help="optimizer steps in total")
    g.add_argument("--epochs", type=float, default=None, help="passes over the data (default 1)")
    ap.add_argument("--save-every", type=int, default=0, help="checkpoint every K optimizer steps (0: only at the end)")
    ap.add_argument("--resume", action="store_true", help="continue from checkpoints/latest if there is one")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--gradient-checkpointing", action="store_true", help="model.gradient_checkpointing_enable()")
    ap.add_argument("--lr", type=float, default=1e-3, help="only when the config has no optimizer block")
    ap.add_argument("--no-export", action="store_true", help="skip writing final/ weights")
    ap.add_argument("--no-memory-meter", action="store_true", help="CPU: skip the live-tensor-byte meter")
    from zerokit.measure.step_phases import DEFAULT_MEMORY_STEPS, memory_steps_from_env

    ap.add_argument("--memory-steps", type=int, default=memory_steps_from_env(),
                    help="CPU: stop the live-tensor-byte meter after this many optimizer steps of this run, so later "
                         f"step times carry none of its overhead (default {DEFAULT_MEMORY_STEPS}; 0: meter every step; "
                         "env ZEROKIT_MEMORY_STEPS)")
    ap.add_argument("--check-config", action="store_true",
                    help="put the ds_config to DeepSpeed's config classes first (zerokit.config.rules."
                         "validate_with_deepspeed); refused: rank 0 writes the reason to OUT/config_rejected.txt, "
                         "every rank exits 2")
    from zerokit.spec.hardware import DIST_BACKENDS

    ap.add_argument("--dist-backend", choices=DIST_BACKENDS, default=None,
                    help="deepspeed.init_distributed(dist_backend=...) (default: DeepSpeed's for the accelerator)")
    ap.add_argument("--finetune-json", default=None, metavar="JSON",
                    help="what trains, as spec.finetune.Finetune.to_dict() (`zerokit launch --finetune/--lora-*/"
                         "--freeze` writes it); default: every weight")
    ap.add_argument("--merge", action="store_true",
                    help="LoRA/QLoRA: also write final/merged, the adapter merged into the base weights")
    ap.add_argument("--tiled-loss", action="store_true", help="LM head and loss through TiledFusedLogitsLoss")
    ap.add_argument("--tiled-mlp", action="store_true", help="every decoder MLP through TiledMLP")
    ap.add_argument("--log-every", type=int, default=1)
    ap.add_argument("--local_rank", "--local-rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    args = ap.parse_args(argv)
    if not args.tokens and not args.data:
        args.data = ""  # the bundled corpus
    if args.steps is not None and args.steps < 1:
        ap.error("--steps must be at least 1")
    if args.epochs is not None and not args.epochs > 0:
        ap.error("--epochs must be positive")
    from zerokit.core.errors import ZerokitError
    from zerokit.spec.finetune import Finetune

    opts = vars(args)
    try:
        opts["finetune"] = Finetune.from_dict(json.loads(opts.pop("finetune_json") or "{}"))
    except (ValueError, TypeError, AttributeError, ZerokitError) as exc:  # bad JSON, not an object, or a value Finetune refuses
        ap.error(f"--finetune-json: {exc}")
    if args.merge and not opts["finetune"].uses_lora:
        ap.error("--merge needs a LoRA or QLoRA --finetune-json")
    return RankOptions(**opts)


def main(argv: list[str] | None = None) -> int:
    from zerokit.launch.train import main as train_main

    return train_main(parse_rank_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
