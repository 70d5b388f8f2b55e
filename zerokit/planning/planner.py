"""The planner: enumerate ZeRO setups, keep those that fit every budget, rank by throughput.

Enumerates stage x offload x precision x activation checkpointing x micro batch. For each family
(everything but the micro batch) it keeps the fastest micro batch that fits; families are ranked
by estimated tokens/s, and near-ties (within TIE_TOLERANCE) go to the simpler setup: no offload
before offload, no recompute before recompute, lower stage before higher. Offload and recompute
only ever add time in the time model, so a setup that fits without them always wins. bf16 beats
fp16 on a tie (no loss scaling).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zerokit.core.errors import ZerokitError
from zerokit.core.options import flag
from zerokit.spec.finetune import Finetune
from zerokit.spec.hardware import Cluster
from zerokit.estimate.memory import DEFAULT_MEMORY_FRACTION, Budget, MemoryEstimate, fit_problems
from zerokit.estimate.pipeline import pipeline_problem, setup_memory, setup_time
from zerokit.spec.model import ModelSpec
from zerokit.estimate.timing import TimeEstimate
from zerokit.core.units import fmt_bytes
from zerokit.spec.setup import Workload, ZeroKnobs, ZeroSetup, batch_split, ulysses_problems

TIE_TOLERANCE = 0.01  # relative step-time difference treated as a tie
MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)
OFFLOAD_CHOICES = (  # (optimizer, param) pairs DeepSpeed supports, simplest first
    ("none", "none"), ("cpu", "none"), ("nvme", "none"), ("cpu", "cpu"), ("nvme", "nvme"),
)
# Beyond data parallelism (ZeroSetup's fields of the same names): enumerated by parallel_options
PARALLEL_KEYS = ("tensor_parallel", "sequence_parallel", "hpz_partition_size", "tiled_loss", "tiled_mlp",
                 "quantized_weights", "quantized_gradients", "compile", "offload_engine", "pipeline_parallel",
                 "seq_parallel_communication_data_type")
PIN_KEYS = ("zero_stage", "offload_optimizer", "offload_param", "precision", "micro_batch_size",
            "gradient_accumulation_steps", "activation_checkpointing", "checkpoint_offload") + PARALLEL_KEYS
# the PARALLEL_KEYS that need the training script's cooperation (make_plan searches them second): needs_script
SCRIPT_LEVEL_KEYS = ("tensor_parallel", "sequence_parallel", "tiled_loss", "tiled_mlp", "pipeline_parallel")


def needs_script(option: dict) -> bool:
    """Whether a parallel_options entry uses any SCRIPT_LEVEL_KEYS (degrees above 1, tiling on)."""
    return (option["tensor_parallel"] > 1 or option["sequence_parallel"] > 1 or option["tiled_loss"] or option["tiled_mlp"]
            or option["pipeline_parallel"] > 1)


@dataclass
class Evaluation:
    setup: ZeroSetup
    fits: bool
    memory: MemoryEstimate
    budget: Budget  # what it was judged against (device memory x --memory-fraction, host RAM, NVMe)
    reasons: list[str] = field(default_factory=list)  # why it does not fit
    # estimate_time's arguments: the step is priced when first read (.time). A search judges far more setups by memory
    # than it ranks by speed (a --seq-len max search reads none of its probes' times), and pricing was half its cost
    time_args: tuple = field(default=(), repr=False, compare=False)
    _time: TimeEstimate | None = field(default=None, repr=False, compare=False)

    @property
    def time(self) -> TimeEstimate:
        if self._time is None:
            self._time = setup_time(*self.time_args)
        return self._time

    def to_dict(self) -> dict:
        return {
            "setup": self.setup.to_dict(),
            "fits": self.fits,
            "memory": self.memory.to_dict(),
            "time": self.time.to_dict(),
            "reasons": list(self.reasons),
        }


def evaluate(model: ModelSpec, cluster: Cluster, workload: Workload, setup: ZeroSetup,
             knobs: ZeroKnobs | None = None, memory_fraction: float = DEFAULT_MEMORY_FRACTION) -> Evaluation:
    """Memory, time and fit of one setup (pipeline stages: estimate/pipeline.py, the largest stage's memory)."""
    mem = setup_memory(model, cluster, setup, workload, knobs)
    budget = Budget.of(cluster, memory_fraction)
    reasons = fit_problems(mem, cluster, budget)
    if not cluster.accelerator.supports(setup.precision):
        reasons.insert(0, f"{setup.precision} is not supported on {cluster.accelerator.name}")
    return Evaluation(setup, not reasons, mem, budget, reasons, time_args=(model, cluster, setup, workload, knobs))


def simplicity(setup: ZeroSetup) -> tuple:
    """Lower is simpler; used only to break ties in throughput. Model parallelism and tiling change how the training
    script runs (Ulysses' attention and data loader, AutoTP's identical batches, patched MLP and loss), so they come
    after checkpointing, which is one call."""
    offloads = (setup.offload_optimizer != "none") + (setup.offload_param != "none")
    # bf16 before fp16: same speed, no loss scaling to diverge
    precision = ("bf16", "fp16", "fp32").index(setup.precision)
    return (setup.checkpoint_offload, offloads, setup.activation_checkpointing, setup.tensor_parallel * setup.sequence_parallel,
            setup.tiled_loss + setup.tiled_mlp, precision, setup.zero_stage, setup.hpz_partition_size,
            setup.gradient_accumulation_steps)


def parallel_problem(model: ModelSpec, cluster: Cluster, workload: Workload, tensor_parallel: int = 1,
                     sequence_parallel: int = 1) -> str | None:
    """Why a TP or SP degree cannot run this model on this cluster (one line naming the fix), or None.
    TP stays inside a node: its all-reduces run every layer (timing.model_parallel_bytes), on the node's links. Ulysses
    SP may span whole nodes, as ALST trains Llama-3.1-8B with SP 32 over 4 nodes of 8 H100 (arXiv 2506.13996): its
    all-to-alls then cross the nodes' links (priced there); the planner only tries in-node degrees unless pinned.
    AutoTP splits the heads and KV heads between its ranks (module_inject tp_shard.get_shard_size over the heads);
    Ulysses' own refusals are spec.setup.ulysses_problems; it also needs an sdpa or flash kernel
    (register_with_transformers refuses eager)."""
    gpn = cluster.gpus_per_node
    a, k = model.num_attention_heads, model.num_kv_heads
    if tensor_parallel > 1 and gpn % tensor_parallel:
        return f"{flag('tensor-parallel')} {tensor_parallel} does not divide the {gpn} GPUs of a node: use a divisor of {gpn}"
    sp = sequence_parallel
    if sp > 1 and gpn % sp and (sp % gpn or cluster.world_size % sp):
        if cluster.nodes == 1:
            return f"{flag('sequence-parallel')} {sp} does not divide the {gpn} GPUs of a node: use a divisor of {gpn}"
        return (f"{flag('sequence-parallel')} {sp} neither divides the {gpn} GPUs of a node nor spans whole nodes of the "
                f"{cluster.world_size} GPUs: use a divisor of {gpn}, or a multiple of {gpn} that divides "
                f"{cluster.world_size}")
    if tensor_parallel > 1:
        if a % tensor_parallel or k % tensor_parallel:
            return (f"{flag('tensor-parallel')} {tensor_parallel} does not divide the model's {a} attention heads "
                    f"and {k} KV heads: use a degree that divides both")
        if model.trained.trainable_params is not None:
            return (f"AutoTP tensor parallelism is planned for full fine-tunes only: drop {flag('tensor-parallel')} "
                    f"or {flag('finetune')}/{flag('freeze')}")
    if sequence_parallel > 1:
        problems = ulysses_problems(a, k, sequence_parallel, workload.seq_len)
        if problems:
            return f"{flag('sequence-parallel')} {problems[0]}"
        if workload.attention == "eager" or not model.supports_sdpa:
            return (f"Ulysses sequence parallelism needs sdpa or flash attention (it refuses eager): use "
                    f"{flag('attention')} sdpa")
    return None


_PIPELINE_PROBED = ("zero_stage", "offload_optimizer", "activation_checkpointing", "checkpoint_offload", "tiled_loss",
                    "tiled_mlp", "compile", "tensor_parallel", "sequence_parallel")


def parallel_options(model: ModelSpec, cluster: Cluster, workload: Workload, pins: dict) -> list[dict]:
    """Every combination of the PARALLEL_KEYS the planner tries, simplest first: data parallelism alone, each TP and SP
    degree that divides a node's GPUs and the model (parallel_problem), hpZ over one node when there are several
    (ZeroSetup refuses it below stage 3; _families pairs it with stage 3 only), tiled loss and tiled MLP on and off
    (the MLP tiling for full fine-tunes: memory.activation_terms). Pinned values are checked and kept alone."""
    gpn = cluster.gpus_per_node
    degrees = [d for d in range(2, gpn + 1) if gpn % d == 0]
    for key in ("tensor_parallel", "sequence_parallel"):
        if pins.get(key, 1) > 1:
            why = parallel_problem(model, cluster, workload, **{key: pins[key]})
            if why:
                raise ZerokitError(why)
    if "tensor_parallel" in pins or "sequence_parallel" in pins:
        modes = [(pins.get("tensor_parallel", 1), pins.get("sequence_parallel", 1))]
        if modes[0][0] > 1 and modes[0][1] > 1:
            raise ZerokitError("DeepSpeed 0.19.8 runs tensor or sequence parallelism, not both: drop one of the two pins")
        if "tensor_parallel" in pins and "sequence_parallel" not in pins and modes[0][0] == 1:
            modes += [(1, d) for d in degrees if not parallel_problem(model, cluster, workload, sequence_parallel=d)]
        if "sequence_parallel" in pins and "tensor_parallel" not in pins and modes[0][1] == 1:
            modes += [(d, 1) for d in degrees if not parallel_problem(model, cluster, workload, tensor_parallel=d)]
    else:
        modes = [(1, 1)]
        modes += [(d, 1) for d in degrees if not parallel_problem(model, cluster, workload, tensor_parallel=d)]
        modes += [(1, d) for d in degrees if not parallel_problem(model, cluster, workload, sequence_parallel=d)]
    if "hpz_partition_size" in pins:
        hpz = pins["hpz_partition_size"]
        if hpz > 1 and cluster.world_size % min(hpz, cluster.world_size):
            raise ZerokitError(f"{flag('hpz')} {hpz} does not divide the {cluster.world_size} ranks (DeepSpeed asserts "
                               f"it): use a divisor, e.g. {gpn}")
        hpzs = [hpz]
    else:
        hpzs = [1] + ([gpn] if cluster.nodes > 1 and gpn > 1 else [])
    tiled_mlp = [pins["tiled_mlp"]] if "tiled_mlp" in pins else [False] + ([True] if model.trained.trainable_params is None else [])
    # a Liger model's loss is Liger's fused one already (memory.activation_terms refuses a tiled loss beside it)
    tiled_loss = [pins["tiled_loss"]] if "tiled_loss" in pins else [False] if model.liger_kernels else [False, True]
    # ZeRO++'s quantized collectives only where pinned: their int8/int4 rounding changes the training, a user's call
    qwz, qgz = pins.get("quantized_weights", False), pins.get("quantized_gradients", False)
    if (qwz or qgz) and cluster.accelerator.is_cpu:
        raise ZerokitError(f"ZeRO++ qwZ and qgZ run DeepSpeed's CUDA quantizer kernels, not on {cluster.accelerator.name}: "
                           f"drop {flag('zero-quantized-weights')} / {flag('zero-quantized-gradients')}")
    # compiling changes the training script: only where pinned (spec/features.py says what each mode needs)
    compiled = pins.get("compile", "off")
    engine = pins.get("offload_engine", "zero-offload")
    from zerokit.spec.features import deepcompile_problem, offload_engine_problem

    for problem in (deepcompile_problem(cluster.accelerator) if compiled == "deepcompile" else None,
                    offload_engine_problem(engine, cluster.accelerator, pins.get("zero_stage"))):
        if problem:
            raise ZerokitError(problem)
    pp = pins.get("pipeline_parallel", 1)
    if pp > 1:  # pinned only: the pipeline runs through zerokit's PipelineModule adapter (launching/pipeline.py)
        why = pipeline_problem(model, pp)
        if why:
            raise ZerokitError(why)
        if pins.get("tensor_parallel", 1) > 1:  # priced (estimate/pipeline.py), but the adapter splits no Linear
            raise ZerokitError(f"{flag('pipeline-parallel')} is planned with data parallelism only (zerokit's "
                               f"PipelineModule adapter runs whole layers; AutoTP inside it is untried): drop "
                               f"{flag('tensor-parallel')}")
        if cluster.world_size % pp:
            raise ZerokitError(f"{flag('pipeline-parallel')} {pp} does not divide the {cluster.world_size} GPUs (every "
                               f"stage has the same data-parallel ranks): use a divisor of {cluster.world_size}")
        if not workload.global_batch and "gradient_accumulation_steps" not in pins:
            raise ZerokitError(f"{flag('pipeline-parallel')} streams micro-batches through the stages (the gradient "
                               f"accumulation steps): give {flag('global-batch')} or {flag('grad-accum')}, e.g. "
                               f"{flag('grad-accum')} {4 * pp}")
        # the pins a pipeline refuses, each in its own line (ZeroSetup._pipeline_problems), before the search
        ZeroSetup(**{"zero_stage": 1, **{k: v for k, v in pins.items() if k in _PIPELINE_PROBED}, "pipeline_parallel": pp})
        modes, hpzs, tiled_loss, tiled_mlp = [modes[0]], [1], [pins.get("tiled_loss", False)], [pins.get("tiled_mlp", False)]
    return [dict(tensor_parallel=tp, sequence_parallel=sp, hpz_partition_size=h, tiled_loss=tl, tiled_mlp=tm,
                 quantized_weights=qwz, quantized_gradients=qgz, compile=compiled, offload_engine=engine,
                 pipeline_parallel=pp,
                 seq_parallel_communication_data_type=pins.get("seq_parallel_communication_data_type", "fp32"))
            for tp, sp in modes for h in hpzs for tl in tiled_loss for tm in tiled_mlp]


@dataclass
class Plan:
    model: ModelSpec
    cluster: Cluster
    workload: Workload
    fits: bool
    best: Evaluation | None  # the chosen setup, or the least-memory one when nothing fits
    rejected: list[dict]
    suggestions: list[str]
    ds_config: dict | None = None
    notes: list[str] = field(default_factory=list)
    memory_fraction: float = DEFAULT_MEMORY_FRACTION  # the share of device memory every fit was judged on
    finetune: Finetune = field(default_factory=Finetune)  # what model.trained.trainable_params came from
    warnings: list[str] = field(default_factory=list)  # e.g. a sequence past the model's rotary positions
    seq_len_search: object | None = None  # --seq-len max: planning/search.py SeqLenSearch
    # "fits", "at the edge" or "does not fit" (planning/search.py verdict: the memory model, and the sequence's memory
    # at seq_memory_factor); None where not judged
    verdict: str | None = None
    others: list[Evaluation] = field(default_factory=list, repr=False)  # the Evaluations behind `rejected`, in order

    @property
    def budget(self) -> Budget:
        return Budget.of(self.cluster, self.memory_fraction)

    @property
    def choice(self) -> ZeroSetup | None:
        return self.best.setup if self.best else None

    def to_dict(self) -> dict:
        budget = self.budget
        out = {
            "model": self.model.to_dict(),
            "hardware": self.cluster.to_dict(),
            "workload": vars(self.workload).copy(),
            "fits": self.fits,
            "verdict": self.verdict or ("fits" if self.fits else "does not fit"),
            "choice": None,
            "memory": None,
            "time": None,
            "ds_config": self.ds_config,
            "rejected": self.rejected,
            "suggestions": self.suggestions,
            "notes": self.notes,
            "warnings": self.warnings,
            "budget": {"per_gpu_bytes": budget.gpu_bytes, "per_node_cpu_bytes": budget.cpu_bytes,
                       "nvme_per_node_bytes": budget.nvme_bytes},
        }
        if self.seq_len_search is not None:  # --seq-len max: the answer, and what binds one step longer
            search = self.seq_len_search.to_dict()
            out["workload"]["max_seq_len"] = search.pop("max_seq_len")
            out["workload"]["max_seq_len_search"] = search
        if self.best:
            out["choice"] = {**self.best.setup.to_dict(), "label": self.best.setup.label,
                             "global_batch": self.best.time.global_batch, "finetune": self.finetune.to_dict()}
            out["memory"] = self.best.memory.to_dict()
            out["time"] = self.best.time.to_dict()
            out["reasons"] = self.best.reasons
        return out


def _micro_batches(cluster: Cluster, workload: Workload, pins: dict, model_parallel: int = 1) -> list[tuple[int, int]]:
    """(micro batch, accumulation) pairs that honour the target global batch exactly; a TP or SP group of
    model_parallel ranks trains on one batch (global = micro x accumulation x world / model_parallel)."""
    n = cluster.world_size // model_parallel
    if "micro_batch_size" in pins:
        micros = [pins["micro_batch_size"]]
    elif workload.global_batch:
        if workload.global_batch % n:
            raise ZerokitError(
                f"global batch {workload.global_batch} is not divisible by {n} GPUs: use a multiple of {n}"
            )
        per_rank = workload.global_batch // n
        micros = [m for m in range(1, min(per_rank, max(MICRO_BATCHES)) + 1) if per_rank % m == 0]
    else:
        micros = list(MICRO_BATCHES)
    pairs = []
    for m in micros:
        if workload.global_batch:
            accum = batch_split(workload.global_batch, n, m)
            if "gradient_accumulation_steps" in pins and pins["gradient_accumulation_steps"] != accum:
                raise ZerokitError(
                    f"{flag('global-batch')} {workload.global_batch} with micro batch {m} on {n} GPUs needs "
                    f"accumulation {accum}, not {pins['gradient_accumulation_steps']}: drop one of the three"
                )
        else:
            accum = pins.get("gradient_accumulation_steps", 1)
        pairs.append((m, accum))
    return pairs


# (activation_checkpointing, checkpoint_offload) of the families; offload last: make_plan searches it only when
# nothing else fits (it moves every layer's checkpoint over PCIe twice a step), or when it is pinned
CHECKPOINTING_CHOICES = ((False, False), (True, False), (True, True))


def _families(cluster: Cluster, pins: dict) -> list[dict]:
    acc = cluster.accelerator
    if "precision" in pins and not acc.supports(pins["precision"]):
        supported = ", ".join(acc.precisions)
        raise ZerokitError(f"{pins['precision']} is not supported on {acc.name}: use {flag('precision')} "
                           f"{supported.split(', ')[0]} (supported: {supported})")
    fams = []
    for stage in (0, 1, 2, 3):
        for opt, param in OFFLOAD_CHOICES:
            if param != "none" and stage != 3:
                continue
            if opt != "none" and stage == 0:
                continue
            if opt == "nvme" and stage != 3 and pins.get("offload_optimizer") != "nvme":
                continue  # DeepSpeed silently treats it as CPU offload below stage 3
            for precision in (pins["precision"],) if "precision" in pins else acc.plannable_precisions:
                for ckpt, ckpt_offload in CHECKPOINTING_CHOICES:
                    fam = dict(zero_stage=stage, offload_optimizer=opt, offload_param=param,
                               precision=precision, activation_checkpointing=ckpt, checkpoint_offload=ckpt_offload)
                    if all(fam[k] == v for k, v in pins.items() if k in fam):
                        fams.append(fam)
    # A pinned combination outside the enumerated ones (e.g. param offload without optimizer offload).
    if not fams:
        fam = {"zero_stage": 2, "offload_optimizer": "none", "offload_param": "none",
               "precision": acc.precisions[0], "activation_checkpointing": False, "checkpoint_offload": False}
        fam.update({k: v for k, v in pins.items() if k in fam})
        fams.append(fam)
    return fams


def compatible(fam: dict, par: dict) -> bool:
    """Whether a _families entry and a parallel_options entry make a setup the planner runs: hpZ, qwZ and qgZ are
    ZeRO-3's, DeepCompile needs ZeRO 1-3, ZenFlow and SuperOffload offload the optimizer to the CPU (SuperOffload
    under ZeRO-3), AutoTP is planned with ZeRO-0/1/2 (as measured)."""
    return (fam["checkpoint_offload"] == par.get("checkpoint_offload", fam["checkpoint_offload"])
            and (fam["zero_stage"] == 3 or (par["hpz_partition_size"] == 1 and not par["quantized_weights"]
                                            and not par["quantized_gradients"]))
            and (fam["zero_stage"] >= 1 or par["compile"] != "deepcompile")
            and (par["offload_engine"] == "zero-offload" or (fam["offload_optimizer"] == "cpu" and (
                par["offload_engine"] != "superoffload" or fam["zero_stage"] == 3)))
            and (fam["zero_stage"] < 3 or par["tensor_parallel"] == 1)
            # DeepSpeed's pipeline engine: ZeRO-0/1 (engine.py), and the adapter runs no offload
            and (par.get("pipeline_parallel", 1) == 1 or (fam["zero_stage"] <= 1 and fam["offload_optimizer"] == "none"
                                                         and not fam["checkpoint_offload"])))


# what a family fixes (a _families entry merged with a parallel_options one): a setup but its batch split
FAMILY_FIELDS = ("zero_stage", "offload_optimizer", "offload_param", "precision", "activation_checkpointing",
                 "checkpoint_offload", "tensor_parallel", "sequence_parallel", "hpz_partition_size", "tiled_loss",
                 "tiled_mlp", "quantized_weights", "quantized_gradients", "compile", "offload_engine", "pipeline_parallel",
                 "seq_parallel_communication_data_type")


def family_key(setup) -> tuple:
    """A setup's family (a ZeroSetup or a family dict): what make_plan searches micro batches for."""
    return tuple(setup[k] if isinstance(setup, dict) else getattr(setup, k) for k in FAMILY_FIELDS)


def make_plan(model: ModelSpec, cluster: Cluster, workload: Workload, pins: dict | None = None,
              knobs: ZeroKnobs | None = None, memory_fraction: float = DEFAULT_MEMORY_FRACTION,
              within: set[tuple] | None = None) -> Plan:
    """The fastest setup that fits, with why the others lose. `within` (family_key values): search only those
    families, e.g. the ones a --seq-len max search found fitting at its answer (the others fit no such length)."""
    pins = {k: v for k, v in (pins or {}).items() if v is not None}
    if problem := cluster.accelerator.attention_problem(workload.attention):
        raise ZerokitError(problem)
    unknown = set(pins) - set(PIN_KEYS)
    if unknown:
        raise ZerokitError(f"unknown setup option(s) {sorted(unknown)}: use {', '.join(PIN_KEYS)}")
    options = parallel_options(model, cluster, workload, pins)
    # SP, TP and tiling change the training script (Ulysses' attention and data loader, AutoTP's identical batches
    # within a group, a patched loss or MLP), so they are searched when data parallelism alone (ZeRO, offload,
    # checkpointing, hpZ) fits nothing, or when one of them is pinned
    plain = [o for o in options if not needs_script(o)]
    pinned = any(k in pins for k in SCRIPT_LEVEL_KEYS)
    stages = [options] if pinned or not plain else [plain, [o for o in options if needs_script(o)]]
    # checkpoint offload (ALST) is reached for after everything else, over every option, unless pinned either way
    offload_last = "checkpoint_offload" not in pins
    if offload_last:
        stages = [[{**o, "checkpoint_offload": False} for o in st] for st in stages]
        stages.append([{**o, "checkpoint_offload": True} for o in options])
    pairs_for: dict[int, list[tuple[int, int]]] = {}
    best_per_family: list[Evaluation] = []
    smallest: Evaluation | None = None  # the least-memory evaluation seen
    family_failures: list[Evaluation] = []
    searched = False
    for stage_options in stages:
        if best_per_family:
            break
        families = [{**fam, **par} for par in stage_options for fam in _families(cluster, pins)
                    if compatible(fam, par) and (within is None or family_key({**fam, **par}) in within)]
        searched = searched or bool(families)
        smallest = _search(model, cluster, workload, pins, knobs, memory_fraction, families, pairs_for,
                           best_per_family, family_failures, smallest)
    if not searched:
        raise ZerokitError("the pinned options exclude one another (hpZ, qwZ, qgZ and SuperOffload need ZeRO-3, "
                           f"DeepCompile ZeRO 1-3, ZenFlow and SuperOffload {flag('offload-optimizer')} cpu; AutoTP is "
                           "planned with ZeRO-0/1/2, as measured): drop a pin")
    ranked = sorted(best_per_family, key=lambda e: e.time.tokens_per_second, reverse=True)
    if ranked:
        top = ranked[0].time.tokens_per_second
        ties = [e for e in ranked if e.time.tokens_per_second >= top * (1 - TIE_TOLERANCE)]
        chosen = min(ties, key=lambda e: simplicity(e.setup))
    else:
        chosen = None
    return _finish_plan(model, cluster, workload, pins, knobs, memory_fraction, ranked, chosen, smallest,
                        family_failures)


def _search(model, cluster, workload, pins, knobs, memory_fraction, families, pairs_for, best_per_family,
            family_failures, smallest: Evaluation | None) -> Evaluation | None:
    """Each family's fastest fitting micro batch into best_per_family; the first micro batch of a family that fits
    none into family_failures. Returns the least-memory evaluation, this search's or the given one."""
    for fam in families:
        mp = fam["tensor_parallel"] * fam["sequence_parallel"] * fam["pipeline_parallel"]
        if mp not in pairs_for:
            try:
                pairs_for[mp] = _micro_batches(cluster, workload, pins, mp)
            except ZerokitError:
                if mp == 1:
                    raise
                pairs_for[mp] = []  # the pinned batch does not split over this many replicas: not a candidate
        pairs = pairs_for[mp]
        fitting = []
        # memory grows with the micro batch at a given accumulation, so once one fails a larger one fits no better;
        # at a fixed global batch only the pair without accumulation can still fit (the accumulated gradients are
        # not alive through its backward: memory.phase_terms), so it is still judged
        uniform = len({a for _, a in pairs}) == 1
        failed = False
        for micro, accum in pairs:
            if failed and (uniform or accum > 1):
                continue
            ev = evaluate(model, cluster, workload, ZeroSetup(micro_batch_size=micro, gradient_accumulation_steps=accum, **fam),
                          knobs, memory_fraction)
            if smallest is None or ev.memory.per_gpu_total < smallest.memory.per_gpu_total:
                smallest = ev
            if ev.fits:
                fitting.append(ev)
            else:
                failed = failed or uniform or accum > 1
                if micro == pairs[0][0]:
                    family_failures.append(ev)
        if fitting:
            best_per_family.append(min(fitting, key=lambda e: (e.time.step_seconds / e.time.tokens_per_step,
                                                               simplicity(e.setup))))
    return smallest


def _finish_plan(model, cluster, workload, pins, knobs, memory_fraction, ranked, chosen, smallest,
                 family_failures) -> Plan:
    rejected, others = [], []
    for ev in ranked:
        if ev is chosen:
            continue
        slower = chosen.time.tokens_per_second / ev.time.tokens_per_second - 1
        reason = (f"fits, but {slower:.0%} slower" if slower > TIE_TOLERANCE
                  else "fits, as fast: the chosen setup is simpler")
        rejected.append(_rejection(ev, reason))
        others.append(ev)
    for ev in family_failures:
        rejected.append(_rejection(ev, "does not fit: " + "; ".join(ev.reasons)))
        others.append(ev)
    plan = Plan(model, cluster, workload, chosen is not None, chosen or smallest, rejected, [],
                memory_fraction=memory_fraction, others=others)
    if chosen is None and smallest is not None:
        plan.suggestions = suggest(model, cluster, workload, smallest, knobs, memory_fraction)
        plan.notes.append(PIPELINE_NOTE)
    acc = cluster.accelerator
    left_out = [p for p in acc.precisions if p not in acc.plannable_precisions and p != pins.get("precision")]
    if left_out:
        fastest = max(acc.plannable_precisions, key=acc.peak_flops)
        plan.notes.append("; ".join(
            f"{p} left out: its matmul measured {acc.peak_flops(p) / 1e9:.3g} GFLOP/s here, under 1/10 of {fastest}'s "
            f"{acc.peak_flops(fastest) / 1e9:.3g} (pin {flag('precision')} {p} to plan it anyway)" for p in left_out))
    return plan


# Why the planner never proposes pipeline parallelism, said when nothing fits: DeepSpeed's pipeline engine trains a
# deepspeed.pipe.PipelineModule, a flat list of layers with the loss given separately (runtime/pipe/module.py), and
# refuses ZeRO-2/3 (pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"); an HF model is one nn.Module whose forward
# takes a dict, so it must be rewritten as such a list first. Per GPU it saves what ZeRO-3 already partitions (model
# states over the ranks), while the activations of the layers in flight stay.
PIPELINE_NOTE = ("pipeline parallelism is not planned: DeepSpeed's pipeline engine needs the model rewritten as a "
                 "PipelineModule (a list of layers, not an HF model as it is) and runs ZeRO-0/1 only, whose model "
                 "states ZeRO-3 already partitions further")


def _rejection(ev: Evaluation, reason: str) -> dict:
    return {
        "setup": ev.setup.to_dict(),
        "label": ev.setup.label,
        "reason": reason,
        "per_gpu_bytes": ev.memory.per_gpu_total,
        "step_seconds": ev.time.step_seconds,
        "tokens_per_second": ev.time.tokens_per_second,
    }


def suggest(model: ModelSpec, cluster: Cluster, workload: Workload, frugal: Evaluation,
            knobs: ZeroKnobs | None, memory_fraction: float) -> list[str]:
    """What would make the least-memory setup fit: more GPUs, NVMe, more host RAM, shorter sequences."""
    from dataclasses import replace

    out = []
    budget = Budget.of(cluster, memory_fraction)
    mem = frugal.memory
    setup = frugal.setup
    gpu_short = mem.per_gpu_total > budget.gpu_bytes
    if gpu_short:
        for nodes in (2, 4, 8, 16, 32, 64, 128, 256):
            bigger = replace(cluster, nodes=cluster.nodes * nodes, hosts=())
            try:
                if evaluate(model, bigger, replace(workload, global_batch=None), setup, knobs, memory_fraction).fits:
                    out.append(f"use {bigger.nodes} nodes of {cluster.gpus_per_node} GPUs ({bigger.world_size} GPUs) "
                               f"with {setup.label}")
                    break
            except ZerokitError:
                break
        lo, hi = 0, workload.seq_len
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if evaluate(model, cluster, replace(workload, seq_len=mid), setup, knobs, memory_fraction).fits:
                lo = mid
            else:
                hi = mid
        if lo >= 1:
            out.append(f"shorten the sequence to {lo} tokens or less (with {setup.label})")
        need = mem.per_gpu_total / memory_fraction
        out.append(f"use GPUs with at least {fmt_bytes(need)} of memory")
    host_short = budget.cpu_bytes and mem.per_node_cpu_total > budget.cpu_bytes
    if host_short:
        if not cluster.nvme_bytes:
            out.append(f"offload to NVMe (ZeRO-Infinity): give {flag('nvme-path')} DIR (and {flag('nvme-size')})")
        out.append(f"use nodes with at least {fmt_bytes(mem.per_node_cpu_total)} of host RAM")
    if mem.nvme_total > budget.nvme_bytes:
        out.append(f"provide at least {fmt_bytes(mem.nvme_total)} of NVMe per node")
    return out


def pipeline_rows(model: ModelSpec, cluster: Cluster, workload: Workload, pins: dict, plan: Plan,
                  knobs: ZeroKnobs | None = None, memory_fraction: float = DEFAULT_MEMORY_FRACTION) -> None:
    """Across nodes, what pipeline stages would do instead (the third axis DeepSpeed offers): for P stages of one or
    more whole nodes each, the fastest pipeline setup that fits, as a row beside the chosen setup saying whether it is
    faster and by how much. Not chosen by itself: it runs the model as a PipelineModule (launching/pipeline.py), a
    different training script, so the user pins it (--pipeline-parallel P). Only where the plan can have stages:
    several nodes, a batch to split into micro-batches, a model the adapter covers, nothing pinned against them."""
    if cluster.nodes < 2 or not workload.global_batch or any(k in pins for k in SCRIPT_LEVEL_KEYS):
        return
    rows = []
    for stages_count in (d for d in (2, 4, 8, 16) if cluster.nodes % d == 0 or d == cluster.nodes):
        if pipeline_problem(model, stages_count) or cluster.world_size % stages_count:
            continue
        alt_pins = {**pins, "pipeline_parallel": stages_count}
        if plan.fits:  # compared in the chosen setup's precision (the planner's choice of it holds for stages too)
            alt_pins.setdefault("precision", plan.best.setup.precision)
        if not _pipeline_can_fit(model, cluster, workload, alt_pins, knobs, memory_fraction):
            continue
        try:
            alt = make_plan(model, cluster, workload, alt_pins, knobs, memory_fraction)
        except ZerokitError:
            continue  # a pin the pipeline cannot honour, a batch that does not split: no row
        if not alt.fits:
            continue
        ev = alt.best
        if plan.fits:
            ratio = plan.best.time.tokens_per_second / ev.time.tokens_per_second - 1
            verdict = (f"{-ratio:.0%} faster than the chosen setup" if ratio < -TIE_TOLERANCE
                       else f"{ratio:.0%} slower" if ratio > TIE_TOLERANCE else "as fast")
        else:
            verdict = "fits where no ZeRO setup does"
        rows.append((ev, _rejection(ev, f"{verdict}: {stages_count} pipeline stages ({_pipeline_why(ev, plan)}); "
                                        f"runs the model as a PipelineModule: pin {flag('pipeline-parallel')} "
                                        f"{stages_count} to choose it")))
    rows.sort(key=lambda r: -r[0].time.tokens_per_second)  # first among the other rows: the third axis, compared
    plan.rejected[:0] = [r for _, r in rows]
    plan.others[:0] = [ev for ev, _ in rows]


def _pipeline_why(ev: Evaluation, plan: Plan) -> str:
    """What a pipeline row pays and what it saves, in seconds of its step: the bubble's idle slots, the blocking sends,
    the gradient reduction and optimizer step after the last micro-batch (estimate/pipeline.pipeline_time), against
    the chosen setup's communication that compute does not hide."""
    t = ev.time
    idle = t.pipeline_bubble * t.compute_seconds
    after = t.communication_seconds - t.pipeline_p2p_seconds
    paid = (f"bubble {t.pipeline_bubble:.0%}: {idle:.3g} s idle, {t.pipeline_p2p_seconds:.3g} s of sends between "
            f"stages, {after:.3g} s of gradient reduction and step after the last micro-batch")
    if not plan.fits:
        return paid
    chosen = plan.best.time
    return (f"{paid}, {t.compute_seconds - idle:.3g} s of compute; the chosen {plan.best.setup.label}: "
            f"{chosen.compute_seconds:.3g} s of compute, {chosen.communication_seconds:.3g} s of communication that "
            "compute does not hide")


def _pipeline_can_fit(model, cluster, workload, pins, knobs, memory_fraction) -> bool:
    """Whether any pipeline setup can fit: the most frugal one does (ZeRO-1, checkpointing, the smallest micro batch,
    a 16-bit precision), and memory only grows from there. One evaluation instead of a search that would fit nothing
    (a 70B across two nodes: ZeRO-1 keeps every weight of a stage on each of its GPUs)."""
    try:
        micro, accum = _micro_batches(cluster, workload, pins, pins["pipeline_parallel"])[0]
        acc = cluster.accelerator
        precision = pins.get("precision") or min(acc.plannable_precisions, key=lambda p: (p == "fp32", p))
        setup = ZeroSetup(zero_stage=1, precision=precision, activation_checkpointing=True, micro_batch_size=micro,
                          gradient_accumulation_steps=accum, pipeline_parallel=pins["pipeline_parallel"])
        return evaluate(model, cluster, workload, setup, knobs, memory_fraction).fits
    except ZerokitError:
        return False


# What a user whose full fine-tune does not fit would try next, in order: LoRA keeps every weight in 16 bits but
# drops gradients, master weights and optimizer states to the adapters'; QLoRA also stores the base in 4-bit NF4
# (and costs dequantization every forward and backward, so it is named only when LoRA does not fit).
FINETUNE_ALTERNATIVES = (Finetune(mode="lora"), Finetune(mode="qlora"))


def finetune_suggestions(config_source: str, model: ModelSpec, cluster: Cluster, workload: Workload, pins: dict,
                         knobs: ZeroKnobs | None = None, memory_fraction: float = DEFAULT_MEMORY_FRACTION) -> list[str]:
    """For a full fine-tune that fits nowhere: the first of LoRA and QLoRA (peft's defaults but r 16, all-linear)
    whose plan fits, with its memory and the option that pins it; both when neither fits, with what they need.
    The adapters are counted from the model's modules (spec.finetune.trainable_split: torch and peft, ~6 s the first
    time for a model, then cached; the bundled models' ship counted), so this runs only after the full plan failed."""
    from zerokit.spec.finetune import finetuned_spec

    out = []
    for finetune in FINETUNE_ALTERNATIVES:
        try:
            tuned = finetuned_spec(model, config_source, finetune)
            plan = make_plan(tuned, cluster, workload, pins, knobs, memory_fraction)
        except ZerokitError:
            continue  # peft or bitsandbytes missing, or a pin the alternative cannot honour: nothing to suggest
        best = plan.best
        mem = fmt_bytes(best.memory.per_gpu_total)
        given = f"{flag('finetune')} {finetune.mode}"
        what = f"{finetune.label}: {tuned.trainable:,} trainable parameters"
        if plan.fits:
            out.append(f"fine-tune with {what} ({given}): {best.setup.label} fits in {mem} per GPU")
            return out
        out.append(f"{given} does not fit either ({what}; the least, {best.setup.label}, needs {mem} per GPU)")
    return out
