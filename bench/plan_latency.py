"""Plan latency for a 70B config: zerokit cold and cached against DeepSpeed's own estimator (the anchor) and
`accelerate estimate-memory`.

Each tool runs as a fresh process (what a user waits for at the shell), interleaved round by round
so machine noise hits all of them alike; medians and ratios are printed and written to
bench/results/plan_latency.txt.

`accelerate estimate-memory` accepts only hub ids (it calls the hub's model_info first), so for the
same LOCAL config we run accelerate's own estimate_command with that one lookup answered locally:
everything after it (AutoConfig, init_empty_weights model, size tables) is accelerate's code.

DeepSpeed's anchor is `estimate_zero3_model_states_mem_needs_all_cold` for the same model (its exact
parameter and largest-layer counts, 2 nodes x 8 GPUs), in a fresh process as a user would run it: it needs
no model, but importing deepspeed is most of its time.

Then every kind of plan the page (zerokit serve) asks for, including the slow kinds (a 70B that fits nowhere with
its LoRA/QLoRA suggestions, --seq-len max, --deadline, --compare-gpus): each answered warm, in this process, by the
page's own handler (serve/app.py answer: plan, text, bars, both ds_configs, downloads), and cold, as a fresh
`zerokit plan --json` process with an empty cache. Targets (issue 44): at most 0.3 s warm, 1 s cold.

Usage: python bench/plan_latency.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO / "zerokit" / "data" / "models" / "llama-3-70b"

def deepspeed_snippet() -> str:
    sys.path.insert(0, str(REPO))
    from zerokit.spec.model import load_model_spec

    spec = load_model_spec(str(CONFIG_DIR))
    return (
        "from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold as est\n"
        f"est(total_params={spec.params}, largest_layer_params={spec.largest_layer_params}, "
        "num_gpus_per_node=8, num_nodes=2)\n"
    )


ACCELERATE_SNIPPET = f"""
import json, types, sys
import accelerate.commands.estimate as est
cfg = json.load(open({str(CONFIG_DIR / 'config.json')!r}))
est.verify_on_hub = lambda repo, token=None: types.SimpleNamespace(config=cfg, library_name="transformers")
parser = est.estimate_command_parser()
args = parser.parse_args([{str(CONFIG_DIR)!r}, "--library_name", "transformers", "--dtypes", "float16"])
est.estimate_command(args)
"""


def timed(cmd: list[str], env: dict) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t
    if r.returncode not in (0, 1):  # plan exits 1 when nothing fits: still a completed plan
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip().splitlines()[-1:]}")
    return elapsed


# (name, the page's options): each kind of plan the page can ask for, the slow ones included
PAGE_CASES = [
    ("70B fits 2x8 H100", dict(model="llama-3-70b", gpu="h100-80gb", gpus_per_node=8, nodes=2, seq_len=4096,
                               global_batch=256)),
    ("70B fits nowhere on 1 RTX 4090 (+LoRA/QLoRA)", dict(model="llama-3-70b", gpu="rtx4090", cpu_memory="64GB")),
    ("8B --seq-len max on 8 H100", dict(model="llama-3-8b", gpu="h100-80gb", gpus_per_node=8, seq_len="max")),
    ("70B --seq-len max on 8 H100", dict(model="llama-3-70b", gpu="h100-80gb", gpus_per_node=8, seq_len="max")),
    ("8B --deadline 12h", dict(model="llama-3-8b", gpu="h100-80gb", gpus_per_node=8, global_batch=256,
                               samples=2_000_000, deadline="12h")),
    ("8B --compare-gpus (4 GPUs)", dict(model="llama-3-8b", gpu="h100-80gb", gpus_per_node=8,
                                        compare_gpus="a100-80gb,h100-80gb,l40s,rtx4090")),
    ("Mixtral LoRA on 8 A100", dict(model="mixtral-8x7b", gpu="a100-80gb", gpus_per_node=8, finetune="lora")),
    ("8B QLoRA --seq-len max on 1 RTX 4090", dict(model="llama-3-8b", gpu="rtx4090", finetune="qlora", seq_len="max")),
]


def cli_args(options: dict) -> list[str]:
    args = [options["model"]]
    for k, v in options.items():
        if k != "model":
            args += [f"--{k.replace('_', '-')}", str(v)]
    return args


def page_latency(rounds: int) -> list[str]:
    """Each PAGE_CASES plan, warm (this process, the page's handler, after one untimed answer) and cold (a fresh CLI
    process, an empty cache)."""
    import json

    sys.path.insert(0, str(REPO))
    from zerokit.serve.app import answer

    py = sys.executable
    rows = []
    for name, options in PAGE_CASES:
        body = json.dumps({"options": options}).encode()
        status, _, _ = answer("POST", "/api/plan", body)
        if status != 200:
            raise SystemExit(f"{name}: the page answered {status}")
        warm = []
        for _ in range(rounds):
            t = time.perf_counter()
            answer("POST", "/api/plan", body)
            warm.append(time.perf_counter() - t)
        cold = []
        for _ in range(max(1, rounds // 2)):
            with tempfile.TemporaryDirectory() as cache:
                cold.append(timed([py, "-m", "zerokit", "plan", *cli_args(options), "--json"],
                                  {**os.environ, "ZEROKIT_CACHE_DIR": cache}))
        w, c = statistics.median(warm), statistics.median(cold)
        ok = "yes" if w <= 0.3 and c <= 1.0 else "NO"
        rows.append(f"{name:<46} {w:>8.3f} {max(warm):>8.3f} {c:>8.2f} {max(cold):>8.2f}  {ok}")
    return [f"{'page plan':<46} {'warm s':>8} {'max':>8} {'cold s':>8} {'max':>8}  within 0.3 s / 1 s", *rows]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "plan_latency.txt"))
    args = ap.parse_args()
    py = sys.executable
    plan = [py, "-m", "zerokit", "plan", "llama-3-70b", "--gpu", "h100-80gb", "--gpus-per-node", "8", "--nodes", "2",
            "--seq-len", "4096", "--global-batch", "256", "--json"]
    params_plan = [py, "-m", "zerokit", "plan", "--params", "70e9", "--gpu", "h100-80gb", "--gpus-per-node", "8",
                   "--json"]
    results: dict[str, list[float]] = {k: [] for k in ("zerokit cold", "zerokit cached", "zerokit --params",
                                                        "deepspeed estimator (cold)", "accelerate estimate-memory")}
    ds_snippet = deepspeed_snippet()
    # bytecode as a user's install has it (pip compiles .pyc at install time); some machines set
    # PYTHONDONTWRITEBYTECODE, which would make every process here compile every module from source again
    base_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # the page section's cold processes inherit it
    for cmd in (plan, params_plan, [py, "-c", ds_snippet], [py, "-c", ACCELERATE_SNIPPET]):
        timed(cmd, base_env)  # untimed: writes the bytecode caches
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as cache:
            env = {**base_env, "ZEROKIT_CACHE_DIR": cache}
            results["zerokit cold"].append(timed(plan, env))
            results["zerokit cached"].append(timed(plan, env))
            results["zerokit --params"].append(timed(params_plan, env))
        results["deepspeed estimator (cold)"].append(timed([py, "-c", ds_snippet], base_env))
        results["accelerate estimate-memory"].append(timed([py, "-c", ACCELERATE_SNIPPET], base_env))
    med = {k: statistics.median(v) for k, v in results.items()}
    ref = med["deepspeed estimator (cold)"]
    lines = [
        f"plan latency, llama-3-70b config (zerokit/data/models/llama-3-70b), {args.rounds} interleaved rounds, "
        f"fresh process each",
        f"machine: {platform.platform()}, {os.cpu_count()} cores, python {platform.python_version()}",
        f"command: python bench/plan_latency.py --rounds {args.rounds}",
        "",
        f"{'tool':<30} {'median s':>9} {'min s':>7} {'max s':>7} {'vs deepspeed':>13}",
    ]
    for k, v in results.items():
        lines.append(f"{k:<30} {med[k]:>9.2f} {min(v):>7.2f} {max(v):>7.2f} {med[k] / ref:>12.2f}x")
    lines += [
        "",
        "every process with bytecode caches in place, as after pip install (one untimed run of each first).",
        "zerokit cold: a fresh cache; the 70B Llama is counted exactly without torch (zerokit/spec/arch_params.py).",
        "zerokit cached: same plan again.",
        "deepspeed estimator: estimate_zero3_model_states_mem_needs_all_cold with the same counts, fresh process.",
        "accelerate: estimate_command on the same local config (hub lookup answered locally, see module doc).",
        "zerokit also enumerates and ranks every ZeRO setup; DeepSpeed and accelerate print one size table each.",
    ]
    lines += ["", f"the page's plans: warm = median of {args.rounds} answers from serve/app.py's handler in one process "
              f"(after one untimed); cold = median of {max(1, args.rounds // 2)} fresh `zerokit plan --json` "
              "processes, each with an empty cache (bundled LoRA/QLoRA splits: zerokit/data/finetune_splits.json)", ""]
    lines += page_latency(args.rounds)
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
