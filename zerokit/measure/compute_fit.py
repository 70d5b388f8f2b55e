"""What a training micro step's forward + backward costs, measured on real HF models (part of `zerokit calibrate`).

A FLOPs-over-throughput model misses small and medium models badly on CPUs (and small micro batches on
GPUs): measured on this project's 2-vCPU machine, a hand-written block benchmark under-predicted HF
tiny-GPT-2 forward + backward by 3-43% (median 24%). Three costs do not scale with FLOPs:
  - a fixed cost per layer and per micro step (the ~60 op launches of a block; the embedding, final norm,
    loss), which dominates tiny layers;
  - the attention scores (micro batch x heads x seq^2 per layer): softmax, masking and dropout over the
    materialised score matrix are memory-bound, and GPT-2's attention dropout sends sdpa down its math
    path: at 512 tokens, seq 256 instead of 64 made a tiny-GPT-2 layer 1.3x slower in fp32 and 1.6x in
    bf16 while its FLOPs grew 1.2x;
  - the logits (tokens x vocab): the loss upcasts them to fp32 and runs log-softmax and its gradient.
So this module times the forward + backward (with the loss) of real HF models, a Llama (RMSNorm, GQA,
rotary, gated MLP) and a GPT-2 (LayerNorm, fused qkv, dropout, tanh-GELU), built from synthetic configs at
1 and 3 layers (and 3 layers checkpointed) over shapes that vary tokens, hidden size, head size, sequence
length and vocabulary, on every benchmark rank at once (as a job's ranks share the machine), and fits per
family and precision the seconds per unit of each of timing.compute_features (fixed costs per micro step,
layer and recomputed layer; FLOPs; attention score, activation and logit elements). The same function
prices the models zerokit plans, so what is fitted is what is predicted. Least squares on relative error,
coefficients >= 0.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from zerokit.estimate.timing import ADAPTER_FEATURES, COMPUTE_FEATURES, compute_features
from zerokit.spec.profile import compute_fit_problem

FAMILIES = ("gated", "plain")  # Llama-style (gated MLP) and GPT-2-style (plain MLP) blocks
# (layers, activation checkpointing): two depths split the per-layer costs from the per-micro-step ones, the
# checkpointed run prices recompute
RUNS = ((1, False), (3, False), (3, True))
# (micro batch, seq, hidden, heads, vocab): tokens 64..512, hidden 64..384, head size 32 and 64, seq
# 64..256 at equal tokens, vocab 512..8192, so that no two features move together
SHAPES_CPU = ((1, 64, 64, 2, 512), (2, 128, 128, 4, 2048), (1, 256, 128, 2, 1024), (4, 64, 256, 8, 4096),
              (2, 256, 256, 4, 1024), (1, 128, 384, 6, 8192), (2, 256, 384, 12, 2048))
SHAPES_CPU_QUICK = SHAPES_CPU  # fewer shapes leave 7 costs under-determined: quick times each point less
SHAPES_GPU = ((1, 512, 512, 8, 8192), (4, 1024, 1024, 16, 32000), (2, 2048, 1024, 8, 32000),
              (1, 2048, 2048, 64, 50000), (4, 2048, 2048, 16, 32000), (2, 4096, 4096, 32, 32000))
SHAPES_GPU_QUICK = SHAPES_GPU[:5]


def synthetic_block_config(family: str, layers: int, hidden: int, heads: int, vocab: int, seq: int) -> dict:
    """An HF config of the family (no shape of a bundled or benchmark model)."""
    if family == "gated":
        inter = 64 * max(1, round(2.75 * hidden / 64))
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
                "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": max(1, heads // 2),
                "num_hidden_layers": layers, "vocab_size": vocab, "max_position_embeddings": max(seq, 256),
                "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False, "attention_dropout": 0.0,
                "torch_dtype": "float32"}
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": hidden, "n_head": heads,
            "n_layer": layers, "vocab_size": vocab, "n_positions": max(seq, 256), "activation_function": "gelu_new",
            "attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1, "layer_norm_epsilon": 1e-5,
            "bos_token_id": 0, "eos_token_id": 0,
            "torch_dtype": "float32"}


def benchmark_jobs(precisions: list[str], on_gpu: bool, quick: bool, smallest: int | None = None,
                   families: tuple[str, ...] = FAMILIES) -> list[dict]:
    """Every (family, precision, shape, depth) to time, with its features from the model's exact spec; only the
    `smallest` shapes when given (a pathologically slow precision: measure/calibrate.SLOW_PRECISION_SHAPES)."""
    from zerokit.spec.model import load_model_spec

    shapes = (SHAPES_GPU_QUICK if quick else SHAPES_GPU) if on_gpu else (SHAPES_CPU_QUICK if quick else SHAPES_CPU)
    shapes = shapes[:smallest] if smallest else shapes
    jobs, specs = [], {}
    with tempfile.TemporaryDirectory(prefix="zerokit-compute-") as tmp:
        for family in families:
            for b, s, h, a, v in shapes:
                for layers, ckpt in RUNS:
                    cfg = synthetic_block_config(family, layers, h, a, v, s)
                    d = Path(tmp) / f"{family}-{b}-{s}-{h}-{a}-{v}-{layers}"
                    if str(d) not in specs:  # the checkpointed run reuses its depth's model
                        d.mkdir()
                        (d / "config.json").write_text(json.dumps(cfg))
                        specs[str(d)] = load_model_spec(str(d))
                    feats = compute_features(specs[str(d)], b, s, ckpt)
                    for prec in precisions:
                        jobs.append({"family": family, "precision": prec, "config": cfg, "micro_batch": b, "seq": s,
                                     "checkpointing": ckpt, "features": feats})
    return jobs


# LoRA versions of the shapes (fit_adapters): peft's defaults but r, on every Linear of the decoder layers
# ("all-linear"), at the deeper depth without checkpointing; the shapes vary the tokens and the Linears' widths
ADAPTER_LORA_R = 8
ADAPTER_DEPTH = 3
ADAPTER_QUICK_SHAPES = 3


def adapter_jobs(precisions: list[str], on_gpu: bool, quick: bool) -> list[dict]:
    """The LoRA jobs, and the QLoRA ones where bitsandbytes imports, that fit_adapters prices the adapters and the
    4-bit dequantization on, with their features from the spec as peft wraps the model (spec.finetune.finetuned_spec:
    the module tree on the meta device); [] without peft."""
    try:
        import peft  # noqa: F401 - the import is the check
    except ImportError:
        return []
    from zerokit.spec.finetune import Finetune, finetuned_spec
    from zerokit.spec.model import load_model_spec

    modes = ["lora"]
    try:
        import bitsandbytes  # noqa: F401 - the import is the check

        modes.append("qlora")
    except Exception:  # ImportError, or a native library that fails to load
        pass
    shapes = (SHAPES_GPU_QUICK if quick else SHAPES_GPU) if on_gpu else (SHAPES_CPU_QUICK if quick else SHAPES_CPU)
    shapes = shapes[:ADAPTER_QUICK_SHAPES] if quick else shapes  # two unknowns per stage: three points still fit them
    jobs = []
    with tempfile.TemporaryDirectory(prefix="zerokit-adapter-") as tmp:
        for mode in modes:
            finetune = Finetune(mode=mode, lora_r=ADAPTER_LORA_R)
            for family in FAMILIES:
                for b, s, h, a, v in shapes:
                    cfg = synthetic_block_config(family, ADAPTER_DEPTH, h, a, v, s)
                    d = Path(tmp) / f"{mode}-{family}-{b}-{s}-{h}-{a}-{v}"
                    d.mkdir()
                    (d / "config.json").write_text(json.dumps(cfg))
                    feats = compute_features(finetuned_spec(load_model_spec(str(d)), str(d), finetune), b, s, False)
                    for prec in precisions:
                        jobs.append({"family": family, "precision": prec, "config": cfg, "micro_batch": b, "seq": s,
                                     "checkpointing": False, "features": feats, "finetune": mode,
                                     "lora_r": ADAPTER_LORA_R})
    return jobs


def _quantized_model(cfg: dict, dtype, device):
    """A random-init model of `cfg` loaded 4-bit as QLoRA trains it (zerokit.launching.train: NF4, double quantization,
    uint8 storage, the run's dtype as compute dtype): transformers quantizes only while loading saved weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig

    cfg = dict(cfg)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg))
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                           bnb_4bit_quant_storage=torch.uint8, bnb_4bit_compute_dtype=dtype)
    with tempfile.TemporaryDirectory(prefix="zerokit-qlora-") as tmp:
        # every benchmark rank writes its own copy: under torch.distributed, save_pretrained writes on rank 0 only
        # (transformers distributed/mixin.py should_save_on_this_rank), so the weights go through safetensors directly
        from safetensors.torch import save_model

        model.config.save_pretrained(tmp)
        save_model(model, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        # loaded as zerokit.launching.train build_quantized loads it (fp32; time_jobs then casts as DeepSpeed does): the
        # 4-bit weights' quant_state keeps the loading dtype, which dequantize_4bit returns
        return type(model).from_pretrained(tmp, quantization_config=q, dtype=torch.float32,
                                           device_map=quantized_device_map(device))


def quantized_device_map(device) -> dict:
    """from_pretrained's device_map for a benchmark rank's 4-bit model: the rank's own GPU by index. The ranks pass
    torch.device("cuda") (each has set its GPU with torch.cuda.set_device), whose index is None, and transformers
    refuses {"": None}: an H200 calibration lost its QLoRA points to it."""
    import torch

    if device.type != "cuda":
        return {"": "cpu"}
    return {"": device.index if device.index is not None else torch.cuda.current_device()}


def time_jobs(jobs: list[dict], device, min_time_s: float, lockstep) -> list[float]:
    """One benchmark rank: forward + backward with the loss of each job's model, timed in lockstep."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    seconds = []
    for job in jobs:
        cfg = dict(job["config"])
        torch.manual_seed(0)
        if job.get("finetune") == "qlora":
            model = _quantized_model(cfg, dtypes[job["precision"]], device)
        else:
            # built on the device: on an H200, 10 jobs built on the host took 40 s in one process, ~3 s each against
            # the ~0.3 s their timed loops need, and the full benchmark's 96 jobs ran past 7 min (1-thread host init)
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg))
        if job.get("lora_r"):  # as zerokit.launching.train wraps a LoRA run (peft get_peft_model)
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=job["lora_r"], target_modules="all-linear"))
        if job.get("finetune") != "qlora":
            model = model.to(device=device, dtype=dtypes[job["precision"]])
        else:  # as DeepSpeed casts a 16-bit run's module (engine._cast_module_mixed_precision: the floating-point
            # parameters, adapters included; the 4-bit storage is uint8); a 4-bit model refuses .to(dtype)
            for p in model.parameters():
                if p.dtype.is_floating_point and p.dtype != dtypes[job["precision"]]:
                    p.data = p.data.to(dtypes[job["precision"]])
        if job["checkpointing"]:
            model.gradient_checkpointing_enable()  # as zerokit.launching.train does
        model.train()
        model.config.use_cache = False  # as zerokit.launching.train runs it
        x = torch.randint(0, model.config.vocab_size, (job["micro_batch"], job["seq"]), device=device)

        def once():
            model(input_ids=x, labels=x).loss.backward()

        seconds.append(lockstep.time(once, min_time_s))
    return seconds


def fit(points: list[dict], names: tuple[str, ...]) -> dict[str, float]:
    """Least squares of seconds (or a point's "value", a residual of its seconds) = sum(coef[n] x features[n]) on
    relative error (weights 1/t^2, so the small points that set the fixed costs count as much as the large ones that
    set the rates), every coefficient >= 0: a negative one is dropped (0) and the rest refitted, most negative first."""
    active = list(names)
    while True:
        coef = _weighted_lstsq(points, active)
        worst = min(active, key=lambda n: coef[n]) if active else None
        if worst is None or coef[worst] >= 0:
            return {n: max(0.0, coef.get(n, 0.0)) for n in names}
        active.remove(worst)


def _weighted_lstsq(points: list[dict], names: list[str]) -> dict[str, float]:
    """Normal equations, columns scaled to unit max so that seconds-per-FLOP and seconds-per-layer are
    solved on one footing; Gauss-Jordan with partial pivoting (7 unknowns at most)."""
    if not names:
        return {}
    scale = {n: max(abs(p["features"][n]) for p in points) or 1.0 for n in names}
    k = len(names)
    a = [[0.0] * (k + 1) for _ in range(k)]
    for p in points:
        w = 1.0 / p["seconds"] ** 2
        row = [p["features"][n] / scale[n] for n in names]
        y = p.get("value", p["seconds"])  # what is fitted: the seconds, or a residual of them (fit_adapters)
        for i in range(k):
            for j in range(k):
                a[i][j] += w * row[i] * row[j]
            a[i][k] += w * row[i] * y
    for c in range(k):
        piv = max(range(c, k), key=lambda r: abs(a[r][c]))
        a[c], a[piv] = a[piv], a[c]
        if abs(a[c][c]) < 1e-300:
            a[c][c] = 1e-300  # a feature that never varies: its coefficient comes out 0
        for r in range(k):
            if r != c:
                f = a[r][c] / a[c][c]
                a[r] = [x - f * y for x, y in zip(a[r], a[c])]
    return {n: a[i][k] / a[i][i] / scale[n] for i, n in enumerate(names)}


def fit_profile(jobs: list[dict], seconds: list[float]) -> dict[str, Any]:
    """The profile's compute_timing: {family: {precision: {coef: {feature: s per unit}, tflops, points}}}."""
    out: dict[str, Any] = {}
    for family in FAMILIES:
        for prec in sorted({j["precision"] for j in jobs}):
            pts = [{"seconds": t, "features": j["features"], "micro_batch": j["micro_batch"], "seq": j["seq"],
                    "checkpointing": j["checkpointing"],
                    "hidden": j["config"].get("hidden_size", j["config"].get("n_embd")),
                    "layers": j["config"].get("num_hidden_layers", j["config"].get("n_layer")),
                    "vocab": j["config"]["vocab_size"]}
                   for j, t in zip(jobs, seconds) if j["family"] == family and j["precision"] == prec]
            if not pts:
                continue
            coef = fit(pts, COMPUTE_FEATURES)
            for p in pts:
                p["predicted"] = sum(coef[n] * p["features"][n] for n in COMPUTE_FEATURES)
            tflops = 1.0 / coef["flop"] / 1e12 if coef["flop"] > 0 else None
            out.setdefault(family, {})[prec] = {"coef": coef, "tflops": tflops, "points": pts}
    return out


# fit_adapters' stages: each fits its features on its jobs' time beyond everything fitted before it
ADAPTER_STAGES = (("lora", ("adapter", "adapter_element")), ("qlora", ("dequant", "dequant_call")))


def fit_adapters(compute_timing: dict, jobs: list[dict], seconds: list[float]) -> dict:
    """Add the ADAPTER_FEATURES' seconds per unit to each fitted family and precision, in stages (ADAPTER_STAGES):
    the LoRA jobs' time beyond their price on the full models' features (which stay as fitted, so a full fine-tune's
    price does not change) fits the adapter costs; the QLoRA jobs' time beyond that fits the dequantization. Least
    squares on relative error, >= 0, as fit(). The points are kept as adapter_points."""
    for family, by_prec in compute_timing.items():
        for prec, v in by_prec.items():
            kept = []
            for n in ADAPTER_FEATURES:  # a re-measurement replaces, never builds on, an earlier fit
                v["coef"].pop(n, None)
            for mode, names in ADAPTER_STAGES:
                pts = [{"seconds": t, "features": j["features"], "finetune": mode, "micro_batch": j["micro_batch"],
                        "seq": j["seq"], "hidden": j["config"].get("hidden_size", j["config"].get("n_embd"))}
                       for j, t in zip(jobs, seconds)
                       if (j["family"], j["precision"], j.get("finetune", "lora")) == (family, prec, mode)]
                if not pts:
                    continue
                known = [n for n in COMPUTE_FEATURES + ADAPTER_FEATURES if n in v["coef"]]
                before = [sum(v["coef"][n] * p["features"].get(n, 0.0) for n in known) for p in pts]
                # the residual fitted, each point weighted by its whole time (fit's relative error)
                coef = fit([{"seconds": p["seconds"], "features": p["features"], "value": p["seconds"] - b}
                            for p, b in zip(pts, before)], names)
                v["coef"].update(coef)
                for p, b in zip(pts, before):
                    p["predicted"] = b + sum(coef[n] * p["features"][n] for n in names)
                kept += pts
            if kept:
                v["adapter_points"] = kept
    return compute_timing


def max_fit_error(compute_timing: dict) -> float:
    """The largest |predicted - measured| / measured over the fitted points (how well the form fits)."""
    errs = [abs(p["predicted"] - p["seconds"]) / p["seconds"]
            for fam in compute_timing.values() for v in fam.values() for p in v["points"]]
    return max(errs) if errs else 0.0


def compute_fit_problems(compute_timing: dict, matmul_tflops: dict) -> dict[tuple[str, str], str]:
    """{(family, precision): why its fit is degenerate} under spec.profile.SANITY (empty when all are sane)."""
    out = {}
    for family, by_prec in compute_timing.items():
        for prec, v in by_prec.items():
            why = compute_fit_problem(family, prec, v["coef"], max_fit_error({family: {prec: v}}),
                                      matmul_tflops.get(prec))
            if why:
                out[(family, prec)] = why
    return out


def rank_main(spec: dict, device, lockstep) -> list[float]:
    """Entry from calibrate._worker_main on every rank."""
    return time_jobs(spec["jobs"], device, spec.get("min_time_s", 0.3), lockstep)
