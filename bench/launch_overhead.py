"""Wall time of `zerokit launch` vs the same job started with a hand-written deepspeed command.

Both run the same training script (zerokit.launching.train), the same ds_config, the same packed tokens,
2 CPU ranks, tiny-llama, a few steps. `zerokit launch` adds: lint and the fit check, tokenization, writing
the config/tokens/launch.json, the runner, and the report. The ratio says what that costs end to end.

Two kinds of zerokit run: cold, the first launch of this config (a fresh $ZEROKIT_CACHE_DIR every time: no cached
spec, tokens or DeepSpeed verdict), and warm, a repeated launch (one cache, filled by an uncounted first run). Each
repetition runs cold, warm and hand-written in turn, so machine load hits all three alike; medians are compared.

    python bench/launch_overhead.py [--reps 5] [--steps 6]
    -> prints a table, writes bench/results/launch_overhead.txt
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from zerokit.measure.ranks import free_port
from zerokit.launching.rank_options import RankOptions

CONFIG = {
    "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0, "torch_adam": True}},
    "gradient_clipping": 1.0, "zero_optimization": {"stage": 2, "reduce_bucket_size": 16384,
                                                    "allgather_bucket_size": 16384},
    "steps_per_print": 1000000,
}




def timed(argv, env) -> tuple[float, int]:
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-3000:])
    return dt, p.returncode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "launch_overhead.txt"))
    args = ap.parse_args(argv)

    from zerokit.core import resources
    from zerokit.launching import data as zdata

    work = Path(tempfile.mkdtemp(prefix="zk-bench-"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO), env.get("PYTHONPATH", "")) if x)
    env.setdefault("OMP_NUM_THREADS", "1")
    cfg = work / "ds_config.json"
    cfg.write_text(json.dumps(CONFIG))
    files = zdata.resolve_data_files(None)
    tok = str(resources.bundled_tokenizer())
    arr, total = zdata.tokenize_files(files, tok, args.seq_len)
    prepared = zdata.write_tokens(arr, total, files, tok, args.seq_len, work / "tokens")
    ds = str(Path(sys.executable).parent / "deepspeed")
    model = str(resources.bundled_models_dir() / "tiny-llama")

    names = ("zerokit launch, cold", "zerokit launch, warm", "hand-written deepspeed")
    rows: dict[str, list[float]] = {n: [] for n in names}
    try:
        for i in range(-1, args.reps):  # rep -1 fills the warm cache (and the page cache): not counted
            runs = {}
            for name in names if i >= 0 else names[1:2]:
                out = work / f"{name.split()[-1]}{i}"
                if name.startswith("zerokit"):
                    cache = work / (f"cold-cache{i}" if name.endswith("cold") else "warm-cache")
                    runs[name] = ([sys.executable, "-m", "zerokit", "launch", "--model", "tiny-llama", "--config",
                                   str(cfg), "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", str(args.seq_len),
                                   "--steps", str(args.steps), "--output-dir", str(out)], {"ZEROKIT_CACHE_DIR": str(cache)})
                else:
                    port = free_port()
                    opts = work / f"rank_options{i}.json"
                    RankOptions(model=model, tokens=str(prepared.tokens_path), tokenizer=tok, ds_config=str(cfg),
                                output_dir=str(out), steps=args.steps).save(opts)
                    runs[name] = ([ds, "--num_gpus", "2", "--master_port", str(port), "--module", "zerokit.launching.train",
                                   str(opts)], {"_port": str(port)})
            for name, (cmd, extra) in runs.items():
                dt, rc = timed(cmd, {**env, **{k: v for k, v in extra.items() if not k.startswith("_")}})
                if rc != 0:
                    print(f"{name} failed with exit code {rc}", file=sys.stderr)
                    return 1
                if i >= 0:
                    rows[name].append(dt)
                print(f"rep {'warm-up' if i < 0 else f'{i + 1}/{args.reps}'}  {name:<24} {dt:7.2f} s", flush=True)
                if "_port" in extra:  # the hand-written run leaves its /dev/shm buffers behind (DeepSpeed's CPU launcher does)
                    for f in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{extra['_port']}_*"):
                        f.unlink(missing_ok=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {n: statistics.median(v) for n, v in rows.items()}
    hw = med["hand-written deepspeed"]
    lines = [
        f"launch overhead: tiny-llama, 2 CPU ranks (gloo), ZeRO-2 fp32, seq {args.seq_len}, {args.steps} steps, "
        f"{args.reps} repetitions of cold / warm / hand-written in turn",
        f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}; {time.strftime('%Y-%m-%d %H:%M:%S')}",
        f"{'':<24} {'median':>8} {'min':>8} {'max':>8}   runs",
    ]
    for name, v in rows.items():
        lines.append(f"{name:<24} {med[name]:8.2f} {min(v):8.2f} {max(v):8.2f}   " + " ".join(f"{x:.2f}" for x in v))
    for name in names[:2]:
        lines.append(f"ratio {name} / hand-written (medians): {med[name] / hw:.2f}x  ({med[name] - hw:+.2f} s)")
    lines.append("cold: a fresh cache each run (first launch of the config); warm: one cache, filled before counting")
    lines.append("command: python bench/launch_overhead.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
