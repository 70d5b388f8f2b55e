"""Count the LoRA and QLoRA splits a plan suggests (planner.FINETUNE_ALTERNATIVES) for every bundled model and write
them to zerokit/data/finetune_splits.json, keyed as spec/finetune.py's cache keys them (the config's bytes, the
fine-tune, the torch/transformers/peft versions, the counting code's own bytes).

Why: the first LoRA/QLoRA count of a model imports torch, transformers and peft and wraps every Linear with peft
(~6 s cold for a 70B on 2 cores); with these counted ahead a fresh install answers a non-fitting 70B plan, its
suggestions included, in well under a second (bench/plan_latency.py). Run it after changing spec/finetune.py or the
pinned versions (constraints-cpu.txt); tests/test_split_cache.py fails, naming this command, until you do.

Usage: python scripts/bundle_finetune_splits.py
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    from zerokit.core.errors import ZerokitError
    from zerokit.core.fsutil import atomic_write_text, package_version
    from zerokit.core.quiet import library_output
    from zerokit.core.resources import bundled_data
    from zerokit.planning.planner import FINETUNE_ALTERNATIVES
    from zerokit.spec.finetune import BUNDLED_SPLITS, SPLIT_LIBRARIES, _split_key, count_split

    splits, models = {}, []
    for config in sorted(bundled_data("models").glob("*/config.json")):
        for finetune in FINETUNE_ALTERNATIVES:
            t = time.perf_counter()
            try:
                with library_output():
                    split = count_split(str(config), finetune)
            except ZerokitError as exc:  # an architecture peft or transformers cannot build: counted when asked
                print(f"{config.parent.name} {finetune.mode}: skipped ({exc})")
                continue
            splits[_split_key(str(config), finetune)] = asdict(split)
            models.append(f"{config.parent.name}/{finetune.mode}")
            print(f"{config.parent.name} {finetune.mode}: {split.trainable_params:,} trainable "
                  f"({time.perf_counter() - t:.1f} s)")
    out = {"versions": {p: package_version(p) for p in SPLIT_LIBRARIES}, "counted": models, "splits": splits}
    path = bundled_data(BUNDLED_SPLITS)
    atomic_write_text(path, json.dumps(out, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"wrote {len(splits)} splits to {path.relative_to(REPO)} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
