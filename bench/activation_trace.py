"""zerokit's analytic activation and logits terms against FakeTensorMode traces of real HF architectures.

For each (bundled model, seq_len, micro batch, bf16, checkpointing off/on) the real HF modules are
built from the bundled config.json under FakeTensorMode (nothing allocated) and one forward +
backward runs under torch's MemTracker (zerokit/measure/trace.py). The traced bytes are compared, like with
like, with zerokit.estimate.memory.activation_terms:

  after forward (traced activation_bytes: activations held when forward returns)
    no checkpointing:  activations + logits_and_loss          (activations includes the final norm)
    checkpointing:     activations_checkpoints + final norm + logits_and_loss
  peak (traced peak_activation_bytes: most activations + temporaries at once, forward or backward)
    no checkpointing:  after forward + logits_grad [+ attention_backward: falcon's math-kernel attention
                       peaks later, in the last layer's attention backward]
    checkpointing:     max(checkpoints + final norm + logits_and_loss + logits_grad,   start of backward
                           checkpoints + one recomputed layer)                          recompute

The analytic side is called with on_cpu=True (the trace runs the host's CPU kernels); where that
changes the number (sdpa with attention dropout: the CPU math kernel keeps 14 bytes per score, a GPU
flash kernel none) the GPU figure is shown too.

Rows whose error exceeds 5% (and models named with --isolate) are isolated: the same config with 1 and 2 layers is traced at the same
sequence length, giving the traced bytes per layer (2-layer minus 1-layer) and the per-token rest
(embeddings, final norm, logits, loss), each compared with its analytic counterpart.

Also times `python -m zerokit plan <model> ... --trace --json` against the same without --trace.

Usage: python bench/activation_trace.py [--long] [--no-cli] [--only NAME ...] [--isolate NAME ...]
Writes bench/results/activation_trace.txt and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# (model, seq_len, micro_batch, activation_checkpointing, what it exercises)
ROWS = [
    ("llama-3-8b", 2048, 1, False, "Llama: GQA 32/8, RMSNorm, SwiGLU, V=128k"),
    ("llama-3-8b", 2048, 1, True, "Llama with HF gradient checkpointing"),
    ("mistral-7b", 4096, 1, False, "Mistral: GQA 32/8, sliding-window config"),
    ("qwen2.5-7b", 2048, 1, False, "Qwen2: GQA 28/4, qkv bias, V=152k"),
    ("gemma-2b", 4096, 1, False, "Gemma: MQA (1 kv head), GeGLU tanh, V=256k, scaled embeddings"),
    ("phi-2", 2048, 1, False, "Phi: LayerNorm, parallel attn+MLP, partial rotary, gelu_new, resid dropout"),
    ("gpt2-xl", 1024, 1, False, "GPT-2: LayerNorm, learned positions, gelu_new, dropout 0.1 everywhere"),
    ("falcon-7b", 2048, 1, False, "Falcon: MQA, parallel attn+MLP, one LayerNorm per block"),
    ("opt-1.3b", 2048, 1, False, "OPT: LayerNorm, ReLU MLP, learned positions"),
    ("bloom-560m", 2048, 1, False, "BLOOM: ALiBi, LayerNorm, embedding LayerNorm, V=250k"),
]
LONG_ROWS = [("llama-3-8b", 8192, 1, False, "Llama at seq 8192")]
CLI_CASES = [("phi-2", 2048), ("llama-3-8b", 2048)]
TOLERANCE = 0.05
GiB = 2**30


def analytic(name: str, seq: int, micro: int, ckpt: bool, on_cpu: bool = True) -> dict:
    from zerokit.estimate import memory
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.setup import Workload, ZeroSetup

    spec = load_model_spec(name)
    setup = ZeroSetup(precision="bf16", micro_batch_size=micro, activation_checkpointing=ckpt)
    wl = Workload(seq_len=seq, attention="sdpa")
    terms = memory.activation_terms(spec, setup, wl, on_cpu=on_cpu)
    tokens = micro * seq
    final_norm = tokens * memory._norm_bytes_per_token(spec, "bf16")
    one_layer = memory.activation_bytes_per_layer(spec, tokens, seq, "bf16", "sdpa", on_cpu)
    if ckpt:
        after_fw = terms["activations_checkpoints"] + final_norm + terms["logits_and_loss"]
        start_bw = after_fw + terms["logits_grad"]
        recompute = terms["activations_checkpoints"] + one_layer
        peak = max(start_bw, recompute)
    else:
        after_fw = terms["activations"] + terms["logits_and_loss"]
        # the start of backward, or later in the last layer's attention backward (math kernel: falcon)
        peak = after_fw + terms["logits_grad"] + terms["attention_backward"]
    # time the estimate itself (spec already loaded: what plan pays per evaluated setup)
    n = 2000
    per_call = timeit.timeit(lambda: memory.activation_terms(spec, setup, wl, on_cpu=on_cpu), number=n) / n
    return {"terms": terms, "after_forward": after_fw, "peak": peak, "one_layer": one_layer,
            "final_norm": final_norm, "num_layers": spec.num_layers, "vocab": spec.vocab_size,
            "rest": final_norm + terms["logits_and_loss"], "estimate_s": per_call}


def trace(config, seq: int, micro: int, ckpt: bool) -> dict:
    from zerokit.measure.trace import MaxLiveActivations, trace_activation_memory

    with MaxLiveActivations() as live:
        r = trace_activation_memory(config, seq_len=seq, micro_batch=micro, precision="bf16",
                                    activation_checkpointing=ckpt, attn_implementation="sdpa")
    return {k: r[k] for k in ("params", "attn_implementation", "attn_fallback_reason", "activation_bytes",
                              "peak_activation_bytes", "wall_s")} | {"max_live_activation_bytes": live.max,
        "phase_peaks": {p: {"activations": v["peak_categories"]["activations"],
                            "temporaries": v["peak_categories"]["temporaries"]} for p, v in r["phases"].items()}}


def isolate(name: str, seq: int, micro: int, a: dict) -> dict:
    """Trace 1- and 2-layer versions: per-layer bytes and the per-token rest (embeddings, norm, logits)."""
    from zerokit.spec.resolve import resolve_model
    from zerokit.measure.trace import load_config

    out = {}
    for n_layers in (1, 2):
        cfg = load_config(str(resolve_model(name).config_file()))
        cfg.num_hidden_layers = n_layers
        out[n_layers] = trace(cfg, seq, micro, False)
    per_layer = out[2]["activation_bytes"] - out[1]["activation_bytes"]
    rest = out[1]["activation_bytes"] - per_layer
    peak_extra_traced = out[1]["peak_activation_bytes"] - out[1]["activation_bytes"]
    return {
        "traced_per_layer": per_layer, "analytic_per_layer": a["one_layer"],
        "per_layer_rel_err": rel(a["one_layer"], per_layer),
        "traced_rest": rest, "analytic_rest": a["rest"], "rest_rel_err": rel(a["rest"], rest),
        "traced_peak_minus_after_forward": peak_extra_traced,
        "analytic_logits_grad": a["terms"]["logits_grad"],
        "analytic_attention_backward": a["terms"].get("attention_backward", 0),
        "traced_per_layer_bytes_per_token": per_layer / (seq * micro),
        "analytic_per_layer_bytes_per_token": a["one_layer"] / (seq * micro),
        "wall_s": out[1]["wall_s"] + out[2]["wall_s"],
    }


def rel(analytic_v: float, traced_v: float) -> float:
    return (analytic_v - traced_v) / traced_v if traced_v else float("nan")


def time_cli(model: str, seq: int, rounds: int = 2) -> dict:
    env = dict(os.environ)
    base = [sys.executable, "-m", "zerokit", "plan", model, "--seq-len", str(seq), "--micro-batch", "1",
            "--stage", "3", "--json"]
    res = {"plain": [], "trace": []}
    fits = {}
    for _ in range(rounds):
        for kind, cmd in (("plain", base), ("trace", base + ["--trace"])):
            t0 = time.perf_counter()
            p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
            res[kind].append(time.perf_counter() - t0)
            if p.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr[-500:]}")
            d = json.loads(p.stdout)
            fits[kind] = {"fits": d.get("fits"), "per_gpu_total": d.get("memory", {}).get("per_gpu", {}).get("total_bytes"),
                          "notes": [n for n in d.get("memory", {}).get("notes", []) if "traced" in n]}
    return {"model": model, "seq_len": seq, "plain_s": res["plain"], "trace_s": res["trace"],
            "plain_median_s": statistics.median(res["plain"]), "trace_median_s": statistics.median(res["trace"]),
            "command": " ".join(base[1:]) + " [--trace]", "result": fits}


def gib(b: float) -> str:
    return f"{b / GiB:7.2f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--long", action="store_true", help="also llama-3-8b at seq 8192")
    ap.add_argument("--no-cli", action="store_true", help="skip the end-to-end CLI timing")
    ap.add_argument("--only", nargs="*", help="only these bundled models")
    ap.add_argument("--isolate", nargs="*", default=[],
                    help="also isolate per-layer vs per-token bytes for these models (always done over 5%%)")
    ap.add_argument("--cli-rounds", type=int, default=2)
    ap.add_argument("--render", action="store_true", help="only re-render the .txt from the .json")
    args = ap.parse_args()
    if args.render:
        res = REPO / "bench" / "results"
        text = render(json.loads((res / "activation_trace.json").read_text()))
        (res / "activation_trace.txt").write_text(text)
        print(text)
        return

    import torch
    import transformers

    from zerokit.spec.resolve import resolve_model

    rows = ROWS + (LONG_ROWS if args.long else [])
    if args.only:
        rows = [r for r in rows if r[0] in args.only]
    results = []
    for name, seq, micro, ckpt, what in rows:
        print(f"tracing {name} seq {seq} mb {micro} ckpt {ckpt} ...", flush=True)
        a = analytic(name, seq, micro, ckpt)
        a_gpu = analytic(name, seq, micro, ckpt, on_cpu=False)
        try:
            t = trace(str(resolve_model(name).config_file()), seq, micro, ckpt)
        except Exception as e:
            results.append({"model": name, "seq_len": seq, "micro_batch": micro, "checkpointing": ckpt,
                            "what": what, "error": f"{type(e).__name__}: {e}"})
            print("  failed:", e, flush=True)
            continue
        row = {
            "model": name, "seq_len": seq, "micro_batch": micro, "checkpointing": ckpt, "what": what,
            "params": t["params"], "attn_implementation": t["attn_implementation"],
            "attn_fallback_reason": t["attn_fallback_reason"],
            "traced_after_forward": t["activation_bytes"], "traced_peak": t["peak_activation_bytes"],
            "analytic_after_forward": a["after_forward"], "analytic_peak": a["peak"],
            "traced_max_live": t["max_live_activation_bytes"],
            "peak_vs_max_live_rel_err": rel(a["peak"], t["max_live_activation_bytes"]),
            "after_forward_rel_err": rel(a["after_forward"], t["activation_bytes"]),
            "peak_rel_err": rel(a["peak"], t["peak_activation_bytes"]),
            "analytic_gpu_after_forward": a_gpu["after_forward"], "analytic_gpu_peak": a_gpu["peak"],
            "analytic_terms": a["terms"], "trace_phase_peaks": t["phase_peaks"],
            "trace_wall_s": t["wall_s"], "analytic_estimate_s": a["estimate_s"],
        }
        print(f"  after-fw {gib(t['activation_bytes'])} GiB traced vs {gib(a['after_forward'])} analytic "
              f"({row['after_forward_rel_err']:+.2%}); peak {gib(t['peak_activation_bytes'])} vs {gib(a['peak'])} "
              f"({row['peak_rel_err']:+.2%}); trace {t['wall_s']:.1f} s", flush=True)
        over = max(abs(row["after_forward_rel_err"]), abs(row["peak_rel_err"])) > TOLERANCE
        if (over or name in args.isolate) and not ckpt:
            print("  isolating per-layer vs per-token terms ...", flush=True)
            row["isolation"] = isolate(name, seq, micro, a)
            iso = row["isolation"]
            print(f"  per layer {iso['traced_per_layer']:,} traced vs {iso['analytic_per_layer']:,} "
                  f"({iso['per_layer_rel_err']:+.2%}); rest {iso['traced_rest']:,} vs {iso['analytic_rest']:,} "
                  f"({iso['rest_rel_err']:+.2%})", flush=True)
        results.append(row)

    cli = []
    if not args.no_cli:
        for model, seq in CLI_CASES:
            print(f"timing CLI plan {model} seq {seq} with/without --trace ...", flush=True)
            cli.append(time_cli(model, seq, args.cli_rounds))

    machine = {
        "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(), "load_note": "2 cores shared with other workers (timings are upper bounds)",
    }
    command = "cd /work/main && export PATH=/work/main/.venv/bin:$PATH && python bench/activation_trace.py " + " ".join(sys.argv[1:])
    out = {"machine": machine, "command": command.strip(), "tolerance": TOLERANCE, "rows": results, "cli": cli}
    res_dir = REPO / "bench" / "results"
    res_dir.mkdir(parents=True, exist_ok=True)
    (res_dir / "activation_trace.json").write_text(json.dumps(out, indent=2) + "\n")
    text = render(out)
    (res_dir / "activation_trace.txt").write_text(text)
    print(text)


# Analysis of the rows over 5%, from the isolation traces above and from listing what autograd saves in
# one layer (torch.autograd.graph.saved_tensors_hooks on a 1-layer config under FakeTensorMode).
# Written by hand from the run recorded here; rerun the isolation to check after transformers/torch upgrades.
FINDINGS = """Findings (per architecture; B/token = bytes per token per layer, bf16)
  Exact (|err| < 0.1%): every row. The isolated layers equal the trace to 16 bytes (gemma-2b: 0.002%),
    the per-token rest (embeddings, final norm, logits, loss) is within 0.25% and the backward's extra
    (logits_grad, + attention_backward for falcon) within 0.01 GiB.
  Fixed in zerokit after the first run of this table (see git log): trace.py's peak is now the max of
    activations + temporaries at any op (it missed the start of backward under checkpointing: +16% before);
    CPU dropout masks are E bytes and sdpa-with-dropout on CPU costs 12 B/score + fp32 q/k/v (gpt2-xl was
    +9%); ReLU MLPs keep E i, not 2 E i (opt was +17%); BLOOM has no sdpa in transformers, so it is priced
    with eager attention (was -67%).
  Fixed next (after-forward error before -> now; new ModelSpec fields in brackets; docs/memory-model.md):
  mistral-7b (-8.98% -> -0.01%) [sliding_window, sliding_window_layers]: transformers builds an explicit
    mask once the keys reach the window (masking_utils._ignore_causal_mask_sdpa: no is_causal skip when
    kv_length >= sliding_window, 4096 here); with a mask HF's sdpa path repeats K/V to all heads
    (+2(a-k)d E = 12,288) and the kernel saves the bool mask converted to bf16, one per layer (+E s =
    8,192). Small configs traced at seq 256 and 512 show that term follows s, not h (it is not a copy of
    the attention output). The same on GPUs (the mem-efficient kernel saves the converted bias); with
    flash_attention_2 neither; below the window, or Qwen2 without use_sliding_window, Llama's layer.
  falcon-7b (-80.29% -> -0.00%) [sdpa_broadcast_kv, sdpa_mask, norms_per_layer 1]: Falcon calls sdpa with
    its 1 MQA K/V head un-repeated and no enable_gqa; torch 2.13 has no fused kernel for unequal head
    counts (check_batch_size_and_num_heads_dense, CPU and CUDA alike), so the math kernel runs on GPUs
    too: fp32 q/k/v and fp32 probabilities (4 B/score). Its peak is the last layer's softmax backward:
    8 B/score of fp32 gradients plus the tied LM head's weight gradient (V h E = 0.55 GiB), less the
    freed logits (attention_backward, 1.125 GiB over the start of backward). flash_attention_2 keeps no
    scores.
  phi-2 (+3.23% -> -0.00%) [norms_per_layer 1, attention_output_copy]: a parallel block (attention and
    MLP read one LayerNorm: -10,244 B/token), and partial rotary's torch.cat leaves q in (b, a, s, d)
    layout, which the kernel output follows, so o_proj gets a copy (+5,120).
  gemma-2b (-3.17% -> -0.02%) [norm_fp32_weight]: GemmaRMSNorm multiplies by (1 + w) in fp32 and keeps
    the fp32 normalised input (10h + 4 per norm vs Llama's 8h + 4: +4,096 B/token x 37 norms). Its
    gelu_pytorch_tanh MLP (4 E i, like SwiGLU) and embedding scaling add nothing.
  CPU vs GPU: the trace runs CPU kernels; the rules above are the same on GPUs. For models that train
    with attention dropout (gpt2-xl, opt) a CPU trace keeps sdpa-math dropout scores that flash attention
    on a GPU does not (gpt2-xl: 19.19 GiB traced on CPU vs 4.55 GiB analytic for a GPU), so `plan --trace`
    for a GPU target of such a model over-reports: prefer the analytic model there. The CLI notes above
    compare the plan's analytic terms for its default GPU (a100-80gb: 1-byte dropout masks) with the CPU
    trace: phi-2's 3% gap there is its residual dropout masks (2 bytes per element on CPU).
  Note: transformers 5 builds phi-2 and opt-1.3b in their config's torch_dtype (float16) although the
    trace asks for bf16 via set_default_dtype: same bytes, different dtype label."""


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def render(out: dict) -> str:
    rows = [r for r in out["rows"] if "error" not in r]
    lines = ["zerokit analytic activation + logits terms vs FakeTensorMode traces of the real HF modules",
             "(bf16, sdpa, one forward + backward under torch MemTracker; no memory allocated)", ""]
    hdr = (f"{'model':<12} {'seq':>5} {'mb':>2} {'ckpt':>4} {'params':>6} | {'after-fw GiB':>13} {'analytic':>8} "
           f"{'err':>7} | {'peak GiB':>8} {'analytic':>8} {'err':>7} | {'max-live':>8} {'err':>7} | {'trace s':>7} "
           f"{'analytic':>9}")
    lines += ["columns: after-fw = activations held when forward returns (traced activation_bytes vs analytic",
              "  activations [+ checkpoints + final norm] + logits_and_loss); peak = trace.py's peak_activation_bytes (what",
              "  `plan --trace` uses) vs analytic + logits_grad [+ attention_backward] [checkpointing: max(start of",
              "  backward, recompute)];",
              "  max-live = the most activations + temporaries alive at any op (this bench's hook), vs the same analytic peak;",
              "  err = (analytic - traced) / traced; trace s = trace wall time; analytic = one activation_terms call", ""]
    lines += [hdr, "-" * len(hdr)]
    for r in rows:
        lines.append(
            f"{r['model']:<12} {r['seq_len']:>5} {r['micro_batch']:>2} {'on' if r['checkpointing'] else 'off':>4} "
            f"{r['params'] / 1e9:5.2f}B | {gib(r['traced_after_forward']):>13} {gib(r['analytic_after_forward']):>8} "
            f"{r['after_forward_rel_err']:+7.2%} | {gib(r['traced_peak']):>8} {gib(r['analytic_peak']):>8} "
            f"{r['peak_rel_err']:+7.2%} | {gib(r['traced_max_live']):>8} {r['peak_vs_max_live_rel_err']:+7.2%} | "
            f"{r['trace_wall_s']:7.1f} {r['analytic_estimate_s'] * 1e6:6.1f} us")
    for r in out["rows"]:
        if "error" in r:
            lines.append(f"{r['model']:<12} {r['seq_len']:>5}  trace failed: {r['error']}")
    errs_fw = [abs(r["after_forward_rel_err"]) for r in rows]
    errs_pk = [abs(r["peak_rel_err"]) for r in rows]
    errs_ml = [abs(r["peak_vs_max_live_rel_err"]) for r in rows]
    walls = [r["trace_wall_s"] for r in rows]
    lines += ["", "Summary"]
    if rows:
        lines += [
            f"  after forward: median |err| {statistics.median(errs_fw):.2%}, max {max(errs_fw):.2%} "
            f"({rows[errs_fw.index(max(errs_fw))]['model']})",
            f"  peak:          median |err| {statistics.median(errs_pk):.2%}, max {max(errs_pk):.2%} "
            f"({rows[errs_pk.index(max(errs_pk))]['model']})",
            f"  peak vs max-live: median |err| {statistics.median(errs_ml):.2%}, max {max(errs_ml):.2%}",
            f"  rows within {out['tolerance']:.0%} on both: "
            f"{sum(1 for a, b in zip(errs_fw, errs_pk) if max(a, b) <= out['tolerance'])}/{len(rows)}",
            f"  trace wall time: median {statistics.median(walls):.1f} s, min {min(walls):.1f} s, max {max(walls):.1f} s "
            f"(analytic estimate: {statistics.median(r['analytic_estimate_s'] for r in rows) * 1e6:.0f} us per call)",
        ]
    gpu_diff = [r for r in rows if r["analytic_gpu_peak"] != r["analytic_peak"]]
    if gpu_diff:
        lines += ["", "CPU vs GPU kernels (the trace runs CPU kernels; analytic shown above with on_cpu=True):"]
        for r in gpu_diff:
            lines.append(f"  {r['model']} seq {r['seq_len']}: analytic for a GPU (flash, no dropout scores kept) "
                         f"after-fw {gib(r['analytic_gpu_after_forward']).strip()} GiB, peak "
                         f"{gib(r['analytic_gpu_peak']).strip()} GiB; the CPU trace keeps sdpa-math dropout scores")
    iso = [r for r in rows if "isolation" in r]
    if iso:
        lines += ["", "Isolation (rows over 5% and --isolate; same config traced with 1 and 2 layers, same seq):"]
        for r in iso:
            i = r["isolation"]
            lines.append(
                f"  {r['model']} seq {r['seq_len']}: per layer {i['traced_per_layer_bytes_per_token']:,.0f} B/token traced vs "
                f"{i['analytic_per_layer_bytes_per_token']:,.0f} analytic ({i['per_layer_rel_err']:+.2%}); "
                f"rest (embeddings, final norm, logits, loss) {i['traced_rest'] / GiB:.3f} GiB vs "
                f"{i['analytic_rest'] / GiB:.3f} ({i['rest_rel_err']:+.2%}); backward adds "
                f"{i['traced_peak_minus_after_forward'] / GiB:.3f} GiB traced vs logits_grad "
                f"{i['analytic_logits_grad'] / GiB:.3f}"
                + (f" + attention_backward {i['analytic_attention_backward'] / GiB:.3f}"
                   if i.get("analytic_attention_backward") else ""))
    if out["cli"]:
        lines += ["", "End-to-end CLI cost (fresh process each; median of rounds):"]
        for c in out["cli"]:
            lines.append(f"  {c['command']}")
            lines.append(f"    without --trace {c['plain_median_s']:.1f} s, with --trace {c['trace_median_s']:.1f} s "
                         f"(+{c['trace_median_s'] - c['plain_median_s']:.1f} s, x{c['trace_median_s'] / c['plain_median_s']:.0f}); "
                         f"runs {[round(x, 1) for x in c['plain_s']]} / {[round(x, 1) for x in c['trace_s']]}")
            for n in c["result"].get("trace", {}).get("notes", []):
                lines.append(f"    note: {n}")
    lines += ["", FINDINGS]
    m = out["machine"]
    lines += ["", f"Machine: {m['cpu_model']}, {m['cpus']} cores ({m['load_note']}); {m['platform']}; "
                  f"python {m['python']}, torch {m['torch']}, transformers {m['transformers']}",
              f"Command: {out['command']}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
