"""zerokit's built-in loop against the HF Trainer (issue 13b): same model, data, ds_config and ranks, tokens/s side by side.

    python bench/loop_vs_trainer.py                     # small-llama, ZeRO-2 bf16 mb 4 x 2, seq 128, 12 steps, 3 rounds
    python bench/loop_vs_trainer.py --rounds 1 --steps 8     # a smoke run
    python bench/loop_vs_trainer.py --reuse             # re-read the runs already on disk (no jobs)

Both sides run through the CLI a user types, 2 CPU ranks over gloo, alternating A B A B ... so a shared machine's
drift hits both alike:
  A  zerokit launch --model M --config CFG --gpu cpu --gpus-per-node 2 --seq-len S --steps N   (zerokit.launching.train)
  B  the same, then `-- python examples/train_hf_trainer.py --tokens DATA ...`                  (Trainer + ZerokitCallback)
Same: the ds_config (rendered once by zerokit's deepspeed profile: every value concrete, the Trainer's arguments set
to the same numbers, which its fill_match in transformers.integrations.deepspeed verifies), the data (the bundled
corpus tokenized once by zerokit's data path, launch.data.tokenize; A tokenizes it the same way and the bench checks
A's rows are byte-identical; B reads the same file), packed to S tokens with no padding, so both count mb x accum x
S x 2 tokens per step; ZEROKIT_MEMORY_STEPS=2 (the CPU meter stops after step 2 on both) and OMP_NUM_THREADS =
cores / ranks on both (launch sets it).

Two measures, each the median over the steady steps (after the first --warmup and the metered ones, and not the
first step after those), the slowest rank's, each side's fastest round kept:
  step    tokens / step_time from each side's metrics (zerokit: next batch + forward + backward + step of every micro
          batch; ZerokitCallback: on_step_begin..on_step_end, which leaves out the Trainer's batch prefetch
          (get_batch_samples) and its logging)
  wall    tokens / the interval between consecutive step records: everything a step costs on both sides (data
          loading, logging, callbacks).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

EXAMPLE = ROOT / "examples" / "train_hf_trainer.py"
MODELS = {"tiny-llama": "tiny-llama", "small-llama": str(HERE / "accuracy" / "models" / "small-llama")}
SIDES = ("zerokit loop", "HF Trainer")


# ----------------------------------------------------------------------------------------------------------
# pure helpers (tests/test_bench_scripts.py)


def steady_throughput(records_by_rank: dict[int, list[dict]], warmup: int) -> dict | None:
    """From metrics/rank*.jsonl records: tokens per optimizer step (all ranks), and tokens/s by the step time
    ("step_tok_s") and by the interval since the step record before ("wall_tok_s"); each the slowest rank's median
    over the steady steps: after `warmup`, not metered, and the step before likewise (the first step after the meter
    stopped is left out: its interval would carry the stop). None without steady steps."""
    tokens_at: dict[int, int] = {}
    step_s, wall_s = [], []
    for recs in records_by_rank.values():
        steps = [r for r in recs if r.get("event") == "step"]
        for r in steps:
            tokens_at[r["step"]] = tokens_at.get(r["step"], 0) + int(r["tokens"])
        after = {r["step"]: r for r in steps if r["step"] > warmup and not r.get("metered")}
        # both measures over the same steps: those whose step before was steady too (an interval needs it)
        steady = [r for r in after.values() if r["step"] - 1 in after]
        if not steady:
            return None
        step_s.append(statistics.median(r["step_time"] for r in steady))
        wall_s.append(statistics.median(r["time"] - after[r["step"] - 1]["time"] for r in steady))
    counts = sorted(set(tokens_at.values()))
    if len(counts) != 1:
        raise ValueError(f"tokens per step differ between steps: {counts}")
    return {"tokens_per_step": counts[0], "step_s": max(step_s), "step_tok_s": counts[0] / max(step_s),
            "wall_s": max(wall_s), "wall_tok_s": counts[0] / max(wall_s)}


def best_of_rounds(rounds: list[dict | None], key: str) -> float | None:
    """The highest tokens/s over the rounds (a shared machine's interference only takes speed away)."""
    vals = [r[key] for r in rounds if r and r.get(key) is not None]
    return max(vals) if vals else None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="small-llama", choices=sorted(MODELS))
    ap.add_argument("--stage", type=int, default=2, choices=(0, 1, 2, 3))
    ap.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=12, help="optimizer steps per run")
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the median (the metered 2 are out too)")
    ap.add_argument("--rounds", type=int, default=3, help="A B rounds; each side's fastest kept")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--runs", default="/tmp/zerokit-loop-vs-trainer", help="where the run directories go")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "loop_vs_trainer"), help="output prefix")
    ap.add_argument("--reuse", action="store_true", help="do not launch runs whose metrics exist; re-read them")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run")
    return ap


# ----------------------------------------------------------------------------------------------------------
# the runs


def prepare(args, runs: Path) -> tuple[Path, Path, object]:
    """(ds_config path, tokens.npy path, setup): rendered and tokenized once, by zerokit."""
    from zerokit.config.render import render_ds_config, write_json_atomic
    from zerokit.launching import data as zdata
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.resolve import resolve_model
    from zerokit.spec.setup import Workload, ZeroSetup

    model = MODELS[args.model]
    setup = ZeroSetup(zero_stage=args.stage, precision=args.precision, micro_batch_size=args.micro_batch,
                      gradient_accumulation_steps=args.grad_accum)
    cluster = build_cluster(gpu="cpu", gpus_per_node=2)
    cfg = render_ds_config(setup, cluster, load_model_spec(model), Workload(seq_len=args.seq_len), lr=args.lr,
                           warmup_steps=1, total_steps=args.steps)
    cfg_path = runs / "ds_config.json"
    write_json_atomic(cfg_path, cfg)
    source = zdata.resolve_source(None)  # the bundled corpus, as `zerokit launch` without --data
    tokenizer = resolve_model(model).tokenizer
    data = zdata.tokenize(source, tokenizer, args.seq_len)
    prepared = zdata.write_data(data, list(source.files), tokenizer, runs / "data")
    return cfg_path, prepared.tokens_path, setup


def commands(args, cfg: Path, tokens: Path, out: Path) -> dict[str, list[str]]:
    py = sys.executable
    base = [py, "-m", "zerokit", "launch", "--model", MODELS[args.model], "--config", str(cfg), "--gpu", "cpu",
            "--gpus-per-node", "2", "--seq-len", str(args.seq_len), "--steps", str(args.steps), "--no-report"]
    # the Trainer's arguments equal to the config's values (fill_match refuses a mismatch): lr, warm-up 1 step,
    # clipping 1.0, betas/eps/weight decay at their defaults, bf16 as the config says; loss logged every step as
    # zerokit's loop does; no checkpoints (zerokit's loop saves once, after its last timed step)
    script = ["--", py, str(EXAMPLE), "--model", MODELS[args.model], "--tokens", str(tokens), "--seq_len", "{seq_len}",
              "--per_device_train_batch_size", "{micro_batch}", "--gradient_accumulation_steps", "{grad_accum}",
              "--max_steps", "{steps}", "--output_dir", "{output_dir}/trainer", "--learning_rate", str(args.lr),
              "--warmup_steps", "1", "--max_grad_norm", "1.0", "--logging_steps", "1", "--report_to", "none",
              "--save_strategy", "no", "--seed", "1234", "--deepspeed", "{ds_config}"]
    if args.precision == "bf16":
        script += ["--bf16", "true"]
    return {SIDES[0]: base + ["--output-dir", str(out / "loop")], SIDES[1]: base + ["--output-dir", str(out / "trainer")]
            + script}


def run(cmd: list[str], out: Path, timeout: int) -> dict:
    import shutil

    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # OMP_NUM_THREADS: launch sets cores / ranks for both (bench/accuracy/run.py rank_threads says why)
    env = dict(os.environ, ZEROKIT_MEMORY_STEPS="2")
    t0 = time.perf_counter()
    with open(f"{out}.log", "w") as log:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return {"returncode": rc, "wall_s": time.perf_counter() - t0}


def same_rows(a: Path, b: Path) -> bool:
    import numpy as np

    return a.is_file() and b.is_file() and np.array_equal(np.load(a), np.load(b))


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.steps < max(args.warmup, 2) + 3:
        ap.error(f"--steps must be at least {max(args.warmup, 2) + 3}: the warm-up and metered steps leave too few")
    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    cfg, tokens, setup = prepare(args, runs)
    from zerokit.report.run_dir import metrics_file, metrics_files
    from zerokit.report.run_report import read_metrics

    t_all = time.perf_counter()
    per_round: list[dict] = []
    for r in range(1, args.rounds + 1):
        rdir = runs / f"round{r}"
        cmds = commands(args, cfg, tokens, rdir)
        res = {}
        for side, sub in zip(SIDES, ("loop", "trainer")):
            out = rdir / sub
            if not (args.reuse and metrics_file(out, 0).is_file()):
                print(f"round {r}/{args.rounds}: {side} ...", file=sys.stderr, flush=True)
                launch = run(cmds[side], out, args.timeout)
                print(f"    rc={launch['returncode']} {launch['wall_s']:.1f} s", file=sys.stderr, flush=True)
            tp = steady_throughput(read_metrics(out), args.warmup) if metrics_files(out) else None
            res[side] = tp
        res["same_rows"] = same_rows(rdir / "loop" / "data" / "tokens.npy", tokens)
        per_round.append(res)
    wall = time.perf_counter() - t_all
    text, summary = report(args, setup, per_round, wall, cmds)
    from zerokit.core.fsutil import atomic_write_text

    atomic_write_text(f"{args.out}.txt", text)
    atomic_write_text(f"{args.out}.json", json.dumps({"summary": summary, "rounds": per_round}, indent=1) + "\n")
    print(text)
    return 0


def report(args, setup, per_round, wall, cmds) -> tuple[str, dict]:
    from planner_pick import _accuracy_run  # bench/accuracy/run.py's machine() and rank_threads()

    acc = _accuracy_run()
    cmd = (f"python bench/loop_vs_trainer.py --model {args.model} --stage {args.stage} --precision {args.precision} "
           f"--micro-batch {args.micro_batch} --grad-accum {args.grad_accum} --seq-len {args.seq_len} "
           f"--steps {args.steps} --rounds {args.rounds}")
    tokens = {r[s]["tokens_per_step"] for r in per_round for s in SIDES if r.get(s)}
    lines = [
        f"zerokit's loop vs the HF Trainer: {args.model}, {setup.label}, seq {args.seq_len}, 2 CPU ranks (gloo), "
        f"same ds_config and data",
        f"command: {cmd}" + ("   (re-read existing runs: --reuse)" if args.reuse else ""),
        f"machine: {acc.machine()}",
        f"date: {time.strftime('%Y-%m-%d %H:%M:%S')}; wall {wall:.0f} s; {args.steps} steps per run, steps after "
        f"the first {args.warmup}, the 2 metered ones (ZEROKIT_MEMORY_STEPS=2) and the one after them timed; A B alternating, "
        f"{args.rounds} round(s), each side's fastest round kept; slowest rank",
        f"threads: OMP_NUM_THREADS={acc.rank_threads(2)} per rank (set by zerokit launch for both)",
        f"tokens per optimizer step (all ranks): {', '.join(map(str, sorted(tokens)))}"
        + ("" if len(tokens) == 1 else "  MISMATCH")
        + f"; same tokenized rows: {'yes' if all(r['same_rows'] for r in per_round) else 'NO'}",
        f"A: {' '.join(cmds[SIDES[0]][1:])}",
        f"B: {' '.join(cmds[SIDES[1]][1:])}",
        "",
        f"{'round':<6} {'side':<14} {'step tok/s':>11} {'wall tok/s':>11} {'step ms':>8} {'wall ms':>8}",
        "-" * 63,
    ]
    for i, r in enumerate(per_round, 1):
        for s in SIDES:
            m = r.get(s)
            if not m:
                lines.append(f"{i:<6} {s:<14} {'FAILED':>11}")
                continue
            lines.append(f"{i:<6} {s:<14} {m['step_tok_s']:>11,.0f} {m['wall_tok_s']:>11,.0f} "
                         f"{m['step_s'] * 1e3:>8.1f} {m['wall_s'] * 1e3:>8.1f}")
    summary = {"tokens_per_step": sorted(tokens)}
    lines.append("")
    for key, what in (("step_tok_s", "step"), ("wall_tok_s", "wall")):
        a, b = best_of_rounds([r[SIDES[0]] for r in per_round], key), best_of_rounds([r[SIDES[1]] for r in per_round], key)
        if a is None or b is None:
            lines.append(f"{what}: a side has no measurement")
            continue
        summary[key] = {"loop": a, "trainer": b, "ratio": a / b}
        lines.append(f"{what:<5} tokens/s: zerokit loop {a:,.0f}, HF Trainer {b:,.0f}, loop/Trainer = {a / b:.3f} "
                     f"({'not slower' if a >= b else 'SLOWER'})")
    return "\n".join(lines) + "\n", summary


if __name__ == "__main__":
    raise SystemExit(main())
