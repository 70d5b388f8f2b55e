"""One Ulysses rank's attention after the all-to-all, measured on the device against zerokit's pricing (issue 28).

After `UlyssesSPAttentionHF`'s all-to-all a rank holds the whole sequence for a / sp query heads and k / sp KV heads (at
least one). zerokit overshoots ALST's Llama-3.1-8B maxima with Ulysses (SP 8, 16, 32: x1.24-1.37) and not without,
and on CPU ranks prices what Ulysses adds (docs/long-context.md): the gap is in what runs on a GPU. This runs that
piece alone, as transformers' sdpa integration runs it (`sdpa_attention_forward`: causal, no mask, GQA through
enable_gqa), forward and backward, and reports the peak allocated bytes above its inputs (q, k, v) beside what zerokit prices for the same piece: the
output and the fp32 log-sum-exp the kernel keeps, and its backward's buffers with the output's gradient
(memory.flash_backward_bytes). "kept" is what the forward leaves alive: where the kernel's output is not laid out
(b, s, a, d), HF's `transpose(1, 2).contiguous()` copies it (in a model, the copy o_proj keeps), so a kept ratio near
2x there says the layout, not a missing buffer. On a GPU: torch.cuda.max_memory_allocated. On CPU (a smoke run): live
tensor bytes; torch's CPU kernel is not FlashAttention, so its ratios say nothing about a GPU.

Usage: python bench/ulysses_attention_probe.py [--seq N ...] [--rows a:k,...] [--out FILE]
The default rows are Llama-3.1-8B's per-rank heads at SP 8 (4 query heads, 1 KV head), SP 16 (2:1) and SP 32 (1:1,
replicated), at 1M tokens: linear in the sequence, so the per-token ratio holds at 3.7M, 16x faster. Run by
bench/gpu_lend.sh when a GPU is lent; nothing here informed a rule."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def probe(seq: int, a: int, k: int, d: int = 128, device: str | None = None) -> dict:
    """Measured and priced bytes of one rank's attention at `seq` tokens, a query and k KV heads (bf16 on a GPU,
    fp32 on CPU)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from zerokit.estimate.memory import flash_backward_bytes
    from zerokit.measure.meter import MemoryMeter

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    e = torch.finfo(dtype).bits // 8

    class Module(torch.nn.Module):  # what sdpa_attention_forward reads from an attention module
        is_causal = True
        num_key_value_groups = a // k

    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(1, a, seq, d, device=device, dtype=dtype, generator=g, requires_grad=True)
    kv = [torch.randn(1, k, seq, d, device=device, dtype=dtype, generator=g, requires_grad=True) for _ in range(2)]
    t0 = time.perf_counter()
    with MemoryMeter(device) as meter:
        base = meter.current_bytes()
        out, _ = sdpa_attention_forward(Module(), q, *kv, None, scaling=d ** -0.5)
        kept = meter.current_bytes() - base
        out.backward(torch.ones_like(out))
    if device == "cuda":
        torch.cuda.synchronize()
    peak = meter.peak_bytes() - base
    priced_kept = seq * (e * a * d + 4 * a)  # the output and the fp32 log-sum-exp per head
    priced = priced_kept + flash_backward_bytes(seq, a, k, d, e, "sdpa")
    return {"seq": seq, "heads": a, "kv_heads": k, "device": device, "dtype": str(dtype).replace("torch.", ""),
            "kept_bytes": kept, "kept_priced_bytes": priced_kept, "peak_bytes": peak, "peak_priced_bytes": priced,
            "seconds": round(time.perf_counter() - t0, 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=1 << 20, help="the full sequence a rank attends over (default 1M)")
    ap.add_argument("--rows", default="4:1,2:1,1:1", help="query:KV heads per rank, comma-separated")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lines = [f"{'seq':>9} {'heads':>5} {'kv':>3} {'device':>6} {'kept':>10} {'priced':>10} {'ratio':>6} "
             f"{'peak':>10} {'priced':>10} {'ratio':>6} {'s':>6}"]
    for row in args.rows.split(","):
        a, k = (int(x) for x in row.split(":"))
        r = probe(args.seq, a, k, device=args.device)
        mib = 2 ** 20
        lines.append(f"{r['seq']:>9} {a:>5} {k:>3} {r['device']:>6} {r['kept_bytes'] / mib:>9.1f}M "
                     f"{r['kept_priced_bytes'] / mib:>9.1f}M {r['kept_bytes'] / r['kept_priced_bytes']:>5.2f}x "
                     f"{r['peak_bytes'] / mib:>9.1f}M {r['peak_priced_bytes'] / mib:>9.1f}M "
                     f"{r['peak_bytes'] / r['peak_priced_bytes']:>5.2f}x {r['seconds']:>6}")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text("python bench/ulysses_attention_probe.py " + " ".join(sys.argv[1:]) + "\n\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
