"""How well the calibrated compute model predicts real HF models it was not fitted on.

One process, one thread, nothing else timed at once (the calibration times the same models on every
rank in lockstep; alone, both sides here see the same uncontended machine, measured in the same run):
  1. times the calibration's own synthetic HF models (zerokit/measure/compute_fit.py) and fits the costs;
  2. times forward + backward with the loss of the bundled tiny-llama / tiny-GPT-2 and the benchmark's
     small-llama / small-GPT-2 at the accuracy grid's shapes, with and without checkpointing, in fp32 and
     bf16, and compares each with timing's prediction from those costs.

    python bench/compute_fit.py [--quick] [--out bench/results/compute_fit.txt]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

MODELS = (("tiny-llama", "tiny-llama"), ("tiny-gpt2", "tiny-gpt2"),
          ("small-llama", str(ROOT / "bench/accuracy/models/small-llama")),
          ("small-gpt2", str(ROOT / "bench/accuracy/models/small-gpt2")))
TINY_SHAPES = ((1, 64), (2, 128), (4, 128), (2, 256), (8, 64))
SMALL_SHAPES = ((2, 256), (4, 128))


class Alone:
    """The median of a loop in this process alone (the lockstep timer's interface)."""

    def time(self, fn, min_time_s: float) -> float:
        fn()
        fn()
        times, t0 = [], time.perf_counter()
        while time.perf_counter() - t0 < min_time_s or len(times) < 3:
            t1 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t1)
        return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the calibration's quick shapes; tiny models only")
    ap.add_argument("--out", default=str(ROOT / "bench/results/compute_fit.txt"))
    args = ap.parse_args(argv)

    import warnings

    warnings.filterwarnings("ignore")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from zerokit.measure import compute_fit as cc
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.resolve import resolve_model
    from zerokit.estimate.timing import _calibrated_compute
    from zerokit.spec.setup import Workload, ZeroSetup

    hf_logging.set_verbosity_error()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    precisions = ["fp32", "bf16"]
    jobs = cc.benchmark_jobs(precisions, on_gpu=False, quick=args.quick)
    fits = cc.fit_profile(jobs, cc.time_jobs(jobs, torch.device("cpu"), 0.3, Alone()))
    lines = [f"calibration models: {len(jobs)} timed alone, fit's largest point error {cc.max_fit_error(fits):.1%}"]
    rows, errs = [], []
    for name, path in MODELS[:2] if args.quick else MODELS:
        spec, conf = load_model_spec(path), AutoConfig.from_pretrained(str(resolve_model(path).config_file()))
        family = "gated" if spec.gated_mlp else "plain"
        for prec in precisions:
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(conf).to(torch.bfloat16 if prec == "bf16" else torch.float32)
            model.train()
            model.config.use_cache = False
            for ckpt in (False, True):
                if ckpt:
                    model.gradient_checkpointing_enable()
                for mb, seq in TINY_SHAPES if name.startswith("tiny") else SMALL_SHAPES:
                    x = torch.randint(0, conf.vocab_size, (mb, seq))
                    meas = Alone().time(lambda: model(input_ids=x, labels=x).loss.backward(), 0.4)
                    setup = ZeroSetup(zero_stage=0, precision=prec, micro_batch_size=mb, activation_checkpointing=ckpt)
                    pred = _calibrated_compute(spec, setup, Workload(seq_len=seq), fits[family][prec]["coef"])
                    errs.append(abs(pred - meas) / meas)
                    rows.append(f"{name:<12} {prec:<5} {'ckpt' if ckpt else '-':<5} mb{mb:<2} s{seq:<4} "
                                f"{pred * 1e3:8.1f} {meas * 1e3:8.1f} {(pred - meas) / meas:+8.1%}")
    head = f"{'model':<12} {'prec':<5} {'ckpt':<5} {'shape':<9} {'pred ms':>8} {'meas ms':>8} {'err':>8}"
    text = "\n".join([
        "zerokit compute model vs real HF forward + backward (one process, 1 thread; both sides in this run)",
        f"command: python bench/compute_fit.py{' --quick' if args.quick else ''}",
        f"machine: {platform.node()}: {os.cpu_count()} cores; torch {torch.__version__}",
        f"date: {time.strftime('%Y-%m-%d %H:%M:%S')}; wall {time.perf_counter() - t0:.0f} s",
        *lines, "", head, "-" * len(head), *rows, "",
        f"median |err| {statistics.median(errs):.1%}, max |err| {max(errs):.1%} over {len(errs)} rows"]) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
