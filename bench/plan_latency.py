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
    base_env = dict(os.environ)
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
        "zerokit cold: a fresh cache; the 70B Llama is counted exactly without torch (zerokit/spec/arch_params.py).",
        "zerokit cached: same plan again.",
        "deepspeed estimator: estimate_zero3_model_states_mem_needs_all_cold with the same counts, fresh process.",
        "accelerate: estimate_command on the same local config (hub lookup answered locally, see module doc).",
        "zerokit also enumerates and ranks every ZeRO setup; DeepSpeed and accelerate print one size table each.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
