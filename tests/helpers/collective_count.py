"""A rank that counts the collective calls of real DeepSpeed optimizer steps (tests/test_timing.py).

Run by `deepspeed --num_gpus 2 --module tests.helpers.collective_count --model M --seq-len S CONFIG.json ...`
(CPU, gloo). torch.distributed's collectives are wrapped before DeepSpeed builds its comm backend (which
keeps references to them), every config trains 3 steps, and rank 0 prints one line per config:
  COUNT {"config": PATH, "all_reduce": N, ...}
with the calls of the third step (the first two build the optimizer states and warm up).
"""

import argparse
import functools
import json
import sys

from zerokit.core.process import close_process_groups

KINDS = ("all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
         "broadcast", "all_to_all_single")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--local_rank", type=int, default=None)  # DeepSpeed may pass it
    ap.add_argument("configs", nargs="+")
    args, _ = ap.parse_known_args()

    import torch
    import torch.distributed as dist

    counts: dict[str, int] = {}

    def wrap(name):
        fn = getattr(dist, name)

        @functools.wraps(fn)
        def counted(*a, **k):
            counts[name] = counts.get(name, 0) + 1
            return fn(*a, **k)

        setattr(dist, name, counted)

    for name in KINDS:
        if hasattr(dist, name):
            wrap(name)

    import deepspeed
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    conf = AutoConfig.from_pretrained(args.model)
    for path in args.configs:
        cfg = json.load(open(path))
        keep = HfDeepSpeedConfig(cfg) if cfg["zero_optimization"]["stage"] == 3 else None  # held while the model builds: transformers then builds it under zero.Init
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(conf)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=cfg)
        x = torch.randint(0, conf.vocab_size, (cfg["train_micro_batch_size_per_gpu"], args.seq_len))
        for _ in range(3):
            counts.clear()
            for _ in range(cfg.get("gradient_accumulation_steps", 1)):
                loss = engine(input_ids=x, labels=x).loss
                engine.backward(loss)
                engine.step()
        if dist.get_rank() == 0:
            sys.stdout.write("COUNT " + json.dumps({"config": path, **counts}) + "\n")
            sys.stdout.flush()
        engine.destroy()
        del engine, model, keep
    dist.barrier()
    close_process_groups()  # not left to the interpreter's teardown (zerokit.core.process says why)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
