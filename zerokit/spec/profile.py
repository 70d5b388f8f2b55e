"""A hardware profile (what `zerokit calibrate` measured) as a typed object the estimates read from the cluster.

`zerokit calibrate` (zerokit/measure/calibrate.py) writes the JSON; this module only reads it. Keys (schema 1;
every number measured on the machine named in "device"):
  zerokit_hardware_profile: 1
  device: {type: "cpu"|"cuda", name, count, memory_bytes, cpu_cores}
  matmul_tflops: {bf16, fp16, fp32}: TFLOP/s, or null where the device does not support the precision
  matmul_size: n of the n x n x n matmul
  matmul_spread_cv: {precision: coefficient of variation of the repeats averaged into matmul_tflops}
    (calibrate refuses a spread over CalibrationSanity.max_spread_cv below)
  collectives: {backend, world_size, all_reduce_busbw_gbps, all_gather_busbw_gbps, by_size: [...]}
    (bus bandwidth in GB/s, the nccl-tests convention: all-reduce algbw * 2(n-1)/n, all-gather
    algbw * (n-1)/n), or {error: ...}
  collectives_by_backend: {backend: {world_size, all_reduce_busbw_gbps, all_gather_busbw_gbps}}: the same
    figures keyed by the torch.distributed backend they were measured over, read by the time model for a plan
    over that backend (--dist-backend); profiles before this key: their collectives.backend's figures
  h2d_gbps, d2h_gbps: pinned host<->device copies (GPU only, else null)
  cpu_adam_params_per_s: DeepSpeedCPUAdam fp32 step rate (null if its op is not built)
  torch_adamw_params_per_s: torch.optim.AdamW (default foreach) step rate on torch_adamw_device
  torch_adamw_device: "cpu"|"cuda", where that rate was timed: the device a step without optimizer offload updates
    on. Profiles before this key timed it on the host, also on GPUs: a GPU profile without it has no such rate
    (TimingTerms.from_profile), as the host's is not what its steps run
  compute_timing: {gated|plain: {precision: {coef: {feature: seconds per unit}, tflops, points}}}, the
    features COMPUTE_FEATURES below: forward + backward with the loss of real HF models (a Llama for
    "gated", a GPT-2 for "plain"), timed on every rank at once and fitted (measure/compute_fit.py); with
    coef's ADAPTER_FEATURES and adapter_points when LoRA versions of them were timed too (peft installed).
    (Profiles written before it have layer_timing, a block benchmark's overhead and throughput: still read.)
  compute_threads: torch threads per rank during the compute benchmark (CPU), null on GPUs
  collective_latency_s: the time of a 4 KiB all-reduce / all-gather, the faster (per-call cost of a collective)
  all_reduce_latency_s, all_gather_latency_s, all_to_all_latency_s: the same per kind (all-to-all: Ulysses' exchange;
    profiles before it price an all-to-all as an all-reduce)
  engine_overhead: {world_size, by_precision: {precision: {"0".."3": {per_step_s, per_layer_micro_s, ...}}}} (at
    "1" and "2" per_call_s, per collective call, in place of per_layer_micro_s in profiles from 2026-11-26 on):
    what real DeepSpeed engines cost beyond the terms above (measure/engine_fit.py); absent in quick mode; with
    "tp" and "sp": {per_call_s, runs} beside the stages, what a TP 2 / SP 2 collective call costs inside a real step
    (engine_fit.measure_model_parallel_calls, read by estimate.timing.model_parallel_call_seconds); stage "3" with
    "ring": {ranks, per_call_s, runs} on a CPU, what a ZeRO-3 call costs per ring step inside real steps on 4 ranks
    (engine_fit.measure_zero_ring_calls, read by estimate.timing.zero_call_seconds)
  notes: [str], quick: bool, created, software: {torch, deepspeed}, wall_s
  learned_runs: [LearnedRun.to_dict()]: step times measured by finished runs on this hardware (`zerokit launch` adds
    one at the end of a run, `zerokit calibrate --from-run RUN_DIR` one from a run directory), each beside what
    the model predicted for it before any run was learned; the time model scales a plan by the nearest one's
    measured / predicted (nearest_learned_run)
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from zerokit.core.errors import ZerokitError
from zerokit.core.fsutil import cache_dir, parse_json_text
from zerokit.core.options import flag

SCHEMA = 1
PRECISIONS = ("bf16", "fp16", "fp32")

# What one micro step's forward + backward is priced on with a calibrated profile (estimate/timing.py
# compute_features gives each feature's count, measure/compute_fit.py fits the seconds per unit): a fixed
# cost per micro step, per layer, per recomputed layer, per FLOP, per attention score element, per layer
# activation element and per logit. The profile's schema names them, so they live here.
COMPUTE_FEATURES = ("micro", "layer", "recompute", "flop", "score", "activation", "logit")
# What fine-tuning adds beyond its FLOPs (already in "flop"): per LoRA adapter (peft), a cost per adapted Linear per
# micro step (its extra module calls and autograd nodes) and per element of its in + out features per token (the
# scaled product added to the base output, the input gradient added to the base path's); for QLoRA, per 4-bit weight
# element bitsandbytes dequantizes (timing.dequantized_elements) and per dequantization call (a fixed cost: measured,
# a 3-layer QLoRA model at hidden 64 took 5-6 ms more than its LoRA twin, 21 Linear4bit, while its elements
# predicted under 1 ms). Fitted after the features above, on LoRA and QLoRA
# versions of the same models (measure/compute_fit.fit_adapters). Absent from profiles measured before them: the
# adapters then cost their FLOPs only and a dequantized element an activation element (timing._calibrated_compute).
ADAPTER_FEATURES = ("adapter", "adapter_element", "dequant", "dequant_call")


def _nonneg(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < float("inf")


def _pos(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and v == v and v != float("inf")


@dataclass(frozen=True)
class CalibrationSanity:
    """What `zerokit calibrate` accepts as a measurement of the machine rather than of its other jobs (issue 13:
    with other work on the 2 cores, a quick calibration fitted 0 s per FLOP and wrote it). A measurement that
    breaks a bound is re-measured `retries` times, then calibration fails and writes no profile. Bounds from
    `zerokit calibrate --quick` and 3 x 0.1 s matmul repeats on this project's 2-vCPU AMD EPYC (AVX2), shared
    with other engineers' jobs (load 1.1-2.4): matmul fp32 53-190 GFLOP/s, bf16 147-413; repeats' coefficient
    of variation 0.9-5%, 18% once; good compute fits 0.34-0.48 x that run's matmul (1.15-1.66 x in a run whose
    matmul met another job's load and its models did not; committed full profile
    bench/results/accuracy_cpu_profile.json: 0.44-0.53 x), largest point error 10-55% quick (7-14% full). In one
    of three quick runs the first fit was degenerate (plain bf16 0 s/FLOP, plain fp32 445 GFLOP/s = 8.4 x its
    matmul) and the re-measurement fixed it."""

    # a real device, however slow, does more: the pathological bf16 (no AVX-512) ran 0.3 GFLOP/s and is
    # recorded as measured; below this the fit is dividing by a cost it did not see
    min_rate_gflops: float = 0.1
    # a fit whose FLOPs run 4x faster than the same precision's dense matmul has put the FLOP cost into another
    # term (good fits 0.34-1.66 x, the degenerate one 8.4 x). Not the catalog peak: the CPU catalog entry is
    # rough (bf16 0.03 TFLOP/s, measured 0.15-0.41)
    max_rate_vs_matmul: float = 4.0
    # repeats of one matmul: 18% was the worst seen on the shared machine, the busy run 45%
    max_spread_cv: float = 0.30
    # the largest |predicted - measured| / measured over a fit's points: 55% seen in a good quick fit, so a
    # point off by more than 2x means the timings are not of one machine
    max_fit_error: float = 1.0
    retries: int = 2


SANITY = CalibrationSanity()

# A precision whose measured matmul runs under 1/SLOW_PRECISION_FACTOR of the machine's best is never planned there
# unless pinned, and calibrate skips its model and engine benchmarks (issue 13: bf16 on an AVX2 EPYC without
# AVX-512 ran 0.3 GFLOP/s against fp32's 115, and its benchmarks stretched calibration from ~2.5 to 12 min; this
# machine with AVX2 kernels forced, ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2: bf16 2.3 GFLOP/s, fp32 99).
SLOW_PRECISION_FACTOR = 10.0


def slow_precisions(matmul_tflops: dict) -> tuple[str, ...]:
    """The precisions a profile measured at under 1/SLOW_PRECISION_FACTOR of its fastest matmul."""
    rates = {p: v for p, v in matmul_tflops.items() if p in PRECISIONS and _pos(v)}
    best = max(rates.values(), default=0.0)
    return tuple(p for p in PRECISIONS if p in rates and rates[p] * SLOW_PRECISION_FACTOR < best)


def matmul_problem(precision: str, repeats_tflops: list[float], sanity: CalibrationSanity = SANITY) -> str | None:
    """Why repeated matmul timings (TFLOP/s) of one precision are not a measurement, or None when they are.
    A slow but consistent precision passes: it is what the machine does (the planner ranks on time)."""
    import statistics

    if not repeats_tflops or not all(_pos(r) for r in repeats_tflops):
        return f"{precision} matmul gave {min(repeats_tflops, default=0) * 1e3:.3g} GFLOP/s"
    mean = statistics.fmean(repeats_tflops)
    cv = statistics.pstdev(repeats_tflops) / mean
    if mean * 1e3 < sanity.min_rate_gflops:
        return f"{precision} matmul gave {mean * 1e3:.3g} GFLOP/s (below {sanity.min_rate_gflops} GFLOP/s)"
    if cv > sanity.max_spread_cv:
        return f"{precision} matmul spread {cv:.0%} across {len(repeats_tflops)} repeats"
    return None


def compute_fit_problem(family: str, precision: str, coef: dict, max_error: float, matmul_tflops: float | None,
                        sanity: CalibrationSanity = SANITY) -> str | None:
    """Why a fitted compute_timing entry (measure/compute_fit.fit_profile) is degenerate, or None when sane."""
    where = f"{family} {precision}"
    bad = [n for n in COMPUTE_FEATURES if not (isinstance(coef.get(n), (int, float)) and coef[n] >= 0 and coef[n] == coef[n])]
    if bad:
        return f"compute fit gave {bad[0]} = {coef.get(bad[0])!r} for {where}"
    if not _pos(coef["flop"]):
        return f"compute fit gave 0 s/FLOP for {where}"
    gflops = 1e-9 / coef["flop"]
    if gflops < sanity.min_rate_gflops:
        return f"compute fit gave {gflops:.3g} GFLOP/s for {where}"
    if _pos(matmul_tflops) and gflops > sanity.max_rate_vs_matmul * matmul_tflops * 1e3:
        return f"compute fit gave {gflops:.0f} GFLOP/s for {where}, over {sanity.max_rate_vs_matmul:g} x its matmul"
    if not max_error <= sanity.max_fit_error:
        return f"compute fit misses a point by {max_error:.0%} for {where}"
    return None


def torch_adamw_device(prof: dict) -> str:
    """Where a profile's torch_adamw_params_per_s was timed: its torch_adamw_device, else the host (calibrate timed it
    on "cpu" on every machine before that key)."""
    return prof.get("torch_adamw_device") or "cpu"


@dataclass(frozen=True)
class TimingTerms:
    """The measured step-time terms of a profile, in the units their names say."""

    # {family ("gated" | "plain"): {precision: {feature: seconds per unit}}}
    compute: dict = field(default_factory=dict)
    all_reduce_latency_s: float = 0.0
    all_gather_latency_s: float = 0.0
    all_to_all_latency_s: float = 0.0
    torch_adamw_params_per_s: float = 0.0
    cpu_adam_params_per_s: float = 0.0
    engine_overhead: dict | None = None  # measure/engine_fit.py's fit, read by estimate.timing.engine_seconds
    # the ranks the latencies above were measured on (collectives.world_size): a call over them took
    # estimate.timing.ring_steps(latency_ranks) message steps
    latency_ranks: int = 2

    @classmethod
    def from_profile(cls, prof: dict) -> "TimingTerms":
        compute: dict[str, dict] = {}
        for family, by_prec in (prof.get("compute_timing") or {}).items():
            for prec, v in (by_prec or {}).items():
                coef = (v or {}).get("coef") if isinstance(v, dict) else None
                if prec in PRECISIONS and isinstance(coef, dict) and _pos(coef.get("flop")) and all(
                        isinstance(coef.get(n, 0.0), (int, float)) and coef.get(n, 0.0) >= 0 for n in COMPUTE_FEATURES):
                    compute.setdefault(family, {})[prec] = {
                        **{n: float(coef.get(n, 0.0)) for n in COMPUTE_FEATURES},
                        **{n: float(coef[n]) for n in ADAPTER_FEATURES if _nonneg(coef.get(n))}}
        # profiles before compute_timing: a block benchmark's (overhead, throughput) per precision, priced as
        # (layers (x 4/3 with recompute) + 1) x overhead + FLOPs / throughput
        lt = {} if compute else (prof.get("layer_timing") or {})
        for family, block in (("gated", lt), ("plain", lt.get("plain") or {})):
            for prec, v in block.items():
                if prec in PRECISIONS and isinstance(v, dict) and _pos(v.get("layer_tflops")) \
                        and isinstance(v.get("layer_overhead_s"), (int, float)) and v["layer_overhead_s"] >= 0:
                    o = float(v["layer_overhead_s"])
                    compute.setdefault(family, {})[prec] = {"micro": o, "layer": o, "recompute": o / 3,
                                                            "flop": 1e-12 / float(v["layer_tflops"])}
        latency = {}
        for key in ("all_reduce_latency_s", "all_gather_latency_s"):  # profiles before these keys: the shared one
            v = prof.get(key) if _pos(prof.get(key)) else prof.get("collective_latency_s")
            latency[key] = float(v) if _pos(v) else 0.0
        a2a = prof.get("all_to_all_latency_s")
        latency["all_to_all_latency_s"] = float(a2a) if _pos(a2a) else latency["all_reduce_latency_s"]
        rates = {k: float(prof[k]) if _pos(prof.get(k)) else 0.0
                 for k in ("torch_adamw_params_per_s", "cpu_adam_params_per_s")}
        if torch_adamw_device(prof) != prof["device"]["type"]:  # the host's rate on a GPU: not what a step runs
            rates["torch_adamw_params_per_s"] = 0.0
        engine = prof.get("engine_overhead") if isinstance(prof.get("engine_overhead"), dict) else None
        ranks = (prof.get("collectives") or {}).get("world_size")
        ranks = int(ranks) if isinstance(ranks, int) and not isinstance(ranks, bool) and ranks >= 2 else 2
        return cls(compute=compute, engine_overhead=engine, latency_ranks=ranks, **latency, **rates)

    def compute_coefficients(self, gated_mlp: bool, precision: str) -> dict[str, float] | None:
        """Seconds per unit of each compute feature for this block family and precision: the GPT-2-style fit
        (plain MLP) where the profile measured one, else the Llama-style one; None when not measured."""
        family = "gated" if gated_mlp else "plain"
        return (self.compute.get(family) or {}).get(precision) or (self.compute.get("gated") or {}).get(precision)


@dataclass(frozen=True)
class HardwareProfile:
    path: str
    device_type: str  # "cpu" | "cuda"
    device_name: str
    created: str
    quick: bool
    timing: TimingTerms
    data: dict = field(repr=False, compare=False)  # the whole JSON, for the accelerator figures
    # what finished runs measured here (learned_runs), read once: the time model looks them up for every setup planned
    learned: tuple = field(default=(), repr=False, compare=False)

    @classmethod
    def from_dict(cls, prof: dict, path: str | os.PathLike = "<profile>") -> "HardwareProfile":
        path = os.fspath(path)
        if not isinstance(prof, dict) or prof.get("zerokit_hardware_profile") != SCHEMA:
            raise ZerokitError(f"{path} is not a zerokit hardware profile (schema {SCHEMA}): re-run `zerokit calibrate`")
        mt = prof.get("matmul_tflops")
        if not isinstance(mt, dict) or not _pos(mt.get("fp32")):
            raise ZerokitError(f"hardware profile {path} has no positive matmul_tflops.fp32: re-run `zerokit calibrate`")
        for prec in PRECISIONS:
            v = mt.get(prec)
            if v is not None and not _pos(v):
                raise ZerokitError(f"hardware profile {path}: matmul_tflops.{prec} = {v!r} is not a positive number or null")
        dev = prof.get("device")
        if not isinstance(dev, dict) or dev.get("type") not in ("cpu", "cuda"):
            raise ZerokitError(f"hardware profile {path} has no device.type (cpu or cuda): re-run `zerokit calibrate`")
        return cls(path=path, device_type=dev["type"], device_name=str(dev.get("name") or dev["type"]),
                   created=str(prof.get("created", "?")), quick=bool(prof.get("quick")),
                   timing=TimingTerms.from_profile(prof), data=prof, learned=learned_runs(prof))

    def cpu_oversubscription(self, ranks_per_node: int) -> float:
        """How much slower each rank's CPU work runs with ranks_per_node ranks than when this profile was measured: the
        OS time-slices runnable threads, so with more threads (ranks x compute_threads) than cores each rank gets
        cores / threads of a core. 1 on GPUs, and wherever the profile does not say its cores and threads."""
        cores = (self.data.get("device") or {}).get("cpu_cores")
        threads = self.data.get("compute_threads")
        if self.device_type != "cpu" or not _pos(cores) or not _pos(threads):
            return 1.0
        return max(1.0, ranks_per_node * threads / cores)

    @classmethod
    def from_file(cls, profile_path: str | os.PathLike) -> "HardwareProfile":
        return cls.from_dict(load_profile(profile_path), profile_path)

    def all_reduce_busbw_gbps(self, backend: str) -> float | None:
        """The all-reduce bus bandwidth (GB/s) measured over `backend`, or None where it was not measured."""
        by_backend = self.data.get("collectives_by_backend")
        entry = by_backend.get(backend) if isinstance(by_backend, dict) else None
        coll = self.data.get("collectives")
        if not isinstance(entry, dict) and isinstance(coll, dict) and coll.get("backend") == backend:
            entry = coll  # profiles written before collectives_by_backend
        v = entry.get("all_reduce_busbw_gbps") if isinstance(entry, dict) else None
        return float(v) if _pos(v) else None

    @property
    def source(self) -> str:
        """What the plan names as the origin of the accelerator's figures."""
        return (f"a profile measured by `zerokit calibrate{' ' + flag('quick') if self.quick else ''}` on "
                f"{self.device_name} at {self.created} ({self.path})")


# Where `zerokit calibrate` writes this machine's profile by default, and where plans look for it when no
# --hardware-profile is given (issue 13: the demo's first report was 4x off on the catalog's rough cpu figures;
# scripts/setup.sh measures a quick profile once). ZEROKIT_HARDWARE_PROFILE names another file, or "none" for the
# catalog's figures (the test suite sets "none": its expectations must not depend on what this machine measured).
LOCAL_PROFILE_ENV = "ZEROKIT_HARDWARE_PROFILE"


def local_profile_path() -> str | None:
    """The machine's own profile file (it may not exist yet), or None when ZEROKIT_HARDWARE_PROFILE=none."""
    env = os.environ.get(LOCAL_PROFILE_ENV, "").strip()
    if env.lower() == "none":
        return None
    if env:
        return env
    return os.fspath(cache_dir("hardware") / "profile.json")


def cpu_model_name() -> str:
    """This machine's CPU as /proc/cpuinfo names it ("AMD EPYC 9B14"): what a CPU profile was measured on."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measured_here(profile: "HardwareProfile") -> bool:
    """Whether a profile describes this machine. A CPU profile: the same CPU model and core count (the catalog's
    one `cpu` entry stands for every CPU, so a CPU profile from another machine must not price this one; issue 13:
    the same grid on an AVX2 EPYC without AVX-512 ran bf16 matmuls at 0.3 GFLOP/s, this machine at 411). A GPU
    profile: written on this host."""
    import platform

    dev = profile.data.get("device") or {}
    if profile.device_type == "cuda":
        return profile.data.get("host") == platform.node()
    return dev.get("name") == cpu_model_name() and dev.get("cpu_cores") == os.cpu_count()


def load_profile(profile_path: str | os.PathLike) -> dict:
    """The profile JSON, validated (one-line ZerokitError naming the fix otherwise)."""
    path = os.fspath(profile_path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ZerokitError(f"hardware profile {path} does not exist: run `zerokit calibrate {flag('output')} {path}` "
                           "first") from None
    except (OSError, ValueError) as e:
        raise ZerokitError(f"hardware profile {path} is not readable ({e}): re-run `zerokit calibrate`") from None
    prof = parse_json_text(text, f"hardware profile {path}")
    HardwareProfile.from_dict(prof, path)  # validates
    return prof


def apply_profile(accelerator, profile: "HardwareProfile | str | os.PathLike"):
    """The accelerator with measured figures from a profile. TFLOP/s <- matmul_tflops (efficiency 1.0: measured
    throughput already includes it; a precision the profile marks null becomes unsupported), intra_node_bw <-
    all-reduce bus bandwidth, pcie_bw <- min(h2d, d2h), memory_bytes <- device memory, source names the profile."""
    if not isinstance(profile, HardwareProfile):
        profile = HardwareProfile.from_file(profile)
    prof, is_cpu_profile = profile.data, profile.device_type == "cpu"
    if bool(getattr(accelerator, "is_cpu", False)) != is_cpu_profile:
        want = f"{flag('gpu')} cpu" if is_cpu_profile else f"the {flag('gpu')} it was measured on"
        raise ZerokitError(
            f"hardware profile {profile.path} was measured on {profile.device_type} ({profile.device_name}) "
            f"but the plan targets {accelerator.name}: use {want}, or calibrate on the target machine"
        )
    mt = prof["matmul_tflops"]
    changes: dict[str, Any] = {"efficiency": 1.0, "fp32_tflops": float(mt["fp32"])}
    for prec in ("bf16", "fp16"):
        if prec not in mt:
            continue
        if mt[prec] is None:
            changes[prec] = False
            changes[f"{prec}_tflops"] = 0.0
        else:
            changes[prec] = True
            changes[f"{prec}_tflops"] = float(mt[prec])
    coll = prof.get("collectives") or {}
    if _pos(coll.get("all_reduce_busbw_gbps")) and not (profile.device_type == "cuda" and coll.get("backend") != "nccl"):
        changes["intra_node_bw"] = float(coll["all_reduce_busbw_gbps"])
    copies = [prof.get("h2d_gbps"), prof.get("d2h_gbps")]
    if all(_pos(c) for c in copies):
        changes["pcie_bw"] = float(min(copies))
    if _pos(prof["device"].get("memory_bytes")):
        changes["memory_bytes"] = int(prof["device"]["memory_bytes"])
    fields = {f.name for f in dataclasses.fields(accelerator)}
    if getattr(accelerator, "matmul_fraction", 0) and mt.get("bf16") and accelerator.bf16_tflops:
        # the GPU time model's rates are fractions of the peak: the measured matmul rate is the matmul's (1.0), and
        # the attention kernels keep their published rate over the measured peak
        changes["matmul_fraction"] = 1.0
        for key in ("attention_fraction", "flash3_fraction"):
            changes[key] = min(1.0, getattr(accelerator, key, 0.0) * accelerator.bf16_tflops / float(mt["bf16"]))
    for key in ("cpu_adam_params_per_s", "torch_adamw_params_per_s"):
        if key in fields and _pos(prof.get(key)):
            changes[key] = float(prof[key])
    changes["source"] = profile.source
    changes["slow_precisions"] = slow_precisions(mt)
    return dataclasses.replace(accelerator, **{k: v for k, v in changes.items() if k in fields})


# -- what finished runs measured ----------------------------------------------------------------------------------
LEARNED_RUNS = "learned_runs"
MAX_LEARNED_RUNS = 64  # the newest kept: a profile is read by every plan
# How far a learned run may be from a plan and still correct it: the parameters, tokens per rank per micro step and
# world size each within this factor (summed in log space). Beyond it the run says little about the plan's balance of
# compute, communication and overheads, and the plan is priced as without it.
LEARNED_REACH = 4.0


@dataclass(frozen=True)
class LearnedRun:
    """One finished run's steady-state step time beside what the time model predicted for it (before any learned
    correction), with what identifies the plan it corrects."""

    accelerator: str
    precision: str
    zero_stage: int
    params: int
    world_size: int
    tokens_per_micro_step: int  # per rank: micro batch x seq len
    setup: str  # the setup's label, for the note
    predicted_step_s: float
    measured_step_s: float
    run_dir: str
    recorded: str

    @property
    def ratio(self) -> float:
        return self.measured_step_s / self.predicted_step_s

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> "LearnedRun | None":
        """None for an entry that is not one (an older or hand-edited profile: skipped, never trusted)."""
        try:
            run = cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})
        except (KeyError, TypeError):
            return None
        ok = (_pos(run.predicted_step_s) and _pos(run.measured_step_s) and _pos(run.params) and _pos(run.world_size)
              and _pos(run.tokens_per_micro_step) and run.zero_stage in (0, 1, 2, 3) and run.precision in PRECISIONS)
        return run if ok else None


def learned_runs(data: dict) -> tuple[LearnedRun, ...]:
    return tuple(r for r in map(LearnedRun.from_dict, data.get(LEARNED_RUNS) or ()) if r is not None)


def nearest_learned_run(runs, accelerator: str, precision: str, zero_stage: int, params: int, world_size: int,
                        tokens_per_micro_step: int) -> LearnedRun | None:
    """The learned run on the same accelerator, precision and ZeRO stage closest to the plan (log distance over
    parameters, tokens per micro step and world size), if within LEARNED_REACH; the newest of equals."""
    import math

    def distance(r: LearnedRun) -> float:
        return (abs(math.log(r.params / params)) + abs(math.log(r.tokens_per_micro_step / tokens_per_micro_step))
                + abs(math.log(r.world_size / world_size)))

    same = [r for r in runs if (r.accelerator, r.precision, r.zero_stage) == (accelerator, precision, zero_stage)]
    if not same or min(params, world_size, tokens_per_micro_step) < 1:
        return None
    best = min(reversed(same), key=distance)  # reversed: min keeps the first of equals, the newest
    return best if distance(best) <= math.log(LEARNED_REACH) else None
