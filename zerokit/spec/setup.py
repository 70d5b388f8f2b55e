"""The typed objects a plan is made of: the ZeRO setup chosen, the workload, DeepSpeed's buffer knobs.

Validation lives here, in one place; everything downstream (memory, timing, planner, render) can
trust these objects.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from zerokit.core.errors import ZerokitError
from zerokit.core.options import ATTENTION_IMPLS, COMPILE_MODES, OFFLOAD_ENGINES, flag
from zerokit.spec.optimizer import DEFAULT_OPTIMIZER

STAGES = (0, 1, 2, 3)
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
PRECISIONS = ("bf16", "fp16", "fp32")
# bytes per element of each training precision, and the torch dtype it names (torch.<name>)
BYTES_PER_ELEMENT = {"bf16": 2, "fp16": 2, "fp32": 4}
TORCH_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def bytes_per_element(precision: str) -> int:
    return BYTES_PER_ELEMENT[precision]


@dataclass(frozen=True)
class ZeroSetup:
    """One candidate training setup: what the planner enumerates and what render turns into JSON."""

    zero_stage: int = 2
    offload_optimizer: str = "none"  # none | cpu | nvme
    offload_param: str = "none"  # none | cpu | nvme (stage 3 only)
    precision: str = "bf16"  # bf16 | fp16 | fp32
    micro_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    activation_checkpointing: bool = False
    # ALST's activation-checkpoint offload: the checkpointed layer inputs (the hidden states each recomputed layer
    # starts from) are moved to pinned host memory in forward and brought back for the recompute (DeepSpeed 0.19.8
    # runtime/activation_checkpointing/offload_activations.py CheckpointHiddenStatesOffload, around HF's gradient
    # checkpointing; launching/ckpt_offload.py). Needs activation_checkpointing.
    checkpoint_offload: bool = False
    # the ds_config's communication_data_type (fp32 | fp16 | bf16): the dtype gradients are reduced in; None =
    # DeepSpeed's default, the training precision (DeepSpeedEngine.communication_data_type)
    communication_data_type: str | None = None
    # Ulysses inside DeepSpeed's engine (an SP mpu given to deepspeed.initialize: zerokit's loop, ArcticTraining,
    # accelerate's sp_backend deepspeed) makes the engine reduce gradients in the config's
    # seq_parallel_communication_data_type whatever communication_data_type says (engine.py, once the sequence
    # parallel group is set; default fp32, runtime/constants.py). SP run outside the engine (a framework's own
    # all-to-all, as XTuner's and ms-swift's) leaves the engine plain data parallelism: set it to the dtype that reduces
    # then, as bench/published_runs.py SP_OUTSIDE_ENGINE does
    seq_parallel_communication_data_type: str = "fp32"
    # Beyond data parallelism (spec.setup.Parallelism says how DeepSpeed 0.19.8 builds each group; 1 = unused):
    # AutoTP ranks, Ulysses sequence-parallel ranks, the ZeRO++ hpZ secondary partition's group size.
    tensor_parallel: int = 1
    sequence_parallel: int = 1
    hpz_partition_size: int = 1
    # ALST's tiled compute (deepspeed/runtime/sequence_parallel/ulysses_sp.py): TiledFusedLogitsLoss computes the
    # logits and the loss one slice of tokens at a time and never holds the whole logits; TiledMLP runs each MLP one
    # slice of tokens at a time and recomputes it in backward, keeping only its input.
    tiled_loss: bool = False
    tiled_mlp: bool = False
    # ZeRO++'s quantized collectives (Wang et al. 2023; zero_optimization.zero_quantized_weights / _gradients, read
    # by stage3.py only): qwZ gathers parameters as int8 with fp32 scales, qgZ reduces gradients as int4 through an
    # intra-node then an inter-node all-to-all. Priced with the same keys read from a config (ZeroKnobs).
    quantized_weights: bool = False
    quantized_gradients: bool = False
    # How the engine runs (COMPILE_MODES): eager; "torch", the script calls engine.compile() (torch.compile, Inductor);
    # "deepcompile", with the config's compile.deepcompile, engine.compile() builds DeepSpeed's graph passes
    # (deepspeed/compile: init_z1_and_2 / init_z3), which schedule ZeRO's gathers, releases and reductions as ops.
    compile: str = "off"
    # What runs the offloaded optimizer (OFFLOAD_ENGINES), with offload_optimizer "cpu": ZeRO-Offload's DeepSpeedCPUAdam;
    # ZenFlow (deepspeed/runtime/zenflow: the top-k gradient columns updated on the GPU every step, the rest by the
    # CPU every update_interval steps, overlapped); SuperOffload (deepspeed/runtime/superoffload: ZeRO-3, GraceAdam
    # overlapped with the GPU's next step, rolled back if the step is skipped)
    offload_engine: str = "zero-offload"
    # DeepSpeed's pipeline engine (deepspeed/runtime/pipe): the model as a PipelineModule of this many stages, each
    # micro batch of the gradient accumulation a pipeline micro-batch (1F1B, schedule.py TrainSchedule); 1 = none
    pipeline_parallel: int = 1

    def __post_init__(self):
        if self.zero_stage not in STAGES:
            raise ZerokitError(f"ZeRO stage must be one of 0, 1, 2, 3, got {self.zero_stage}")
        for name in ("offload_optimizer", "offload_param"):
            if getattr(self, name) not in OFFLOAD_DEVICES:
                raise ZerokitError(f"{name.replace('_', '-')} must be none, cpu or nvme, got {getattr(self, name)!r}")
        if self.precision not in PRECISIONS:
            raise ZerokitError(f"precision must be bf16, fp16 or fp32, got {self.precision!r}")
        if self.offload_param != "none" and self.zero_stage != 3:
            raise ZerokitError(f"parameter offload needs ZeRO stage 3: use {flag('stage')} 3 or "
                               f"{flag('offload-param')} none")
        if self.offload_optimizer != "none" and self.zero_stage == 0:
            raise ZerokitError(f"optimizer offload needs ZeRO stage 1, 2 or 3: use {flag('stage')} 1 or higher")
        if self.micro_batch_size < 1 or self.gradient_accumulation_steps < 1:
            raise ZerokitError("micro batch and gradient accumulation must be at least 1")
        for key, allowed in (("communication_data_type", (None, *PRECISIONS)),
                             ("seq_parallel_communication_data_type", PRECISIONS)):
            if getattr(self, key) not in allowed:  # DeepSpeed's get_communication_data_type
                raise ZerokitError(f"{key} must be fp32, fp16 or bf16, got {getattr(self, key)!r}")
        if self.checkpoint_offload and not self.activation_checkpointing:
            raise ZerokitError("checkpoint offload moves the checkpointed layer inputs to host memory: it needs "
                               f"activation checkpointing ({flag('activation-checkpointing')} offload)")
        par = self.parallelism  # validates the degrees
        if par.tensor_parallel > 1 and par.sequence_parallel > 1:
            # engine.py builds one model-parallel mesh: mp_mode = "tp" if tp_size > 1 else "sp"
            raise ZerokitError("DeepSpeed 0.19.8 runs tensor or sequence parallelism, not both: drop "
                               f"{flag('tensor-parallel')} or {flag('sequence-parallel')}")
        if par.hpz_partition_size > 1 and self.zero_stage != 3:
            # only stage3.py reads zero_hpz_partition_size
            raise ZerokitError(f"ZeRO++ hpZ partitions ZeRO-3 parameters: use {flag('stage')} 3 or drop {flag('hpz')}")
        if self.offload_engine not in OFFLOAD_ENGINES:
            raise ZerokitError(f"{flag('offload-engine')} {self.offload_engine!r}: use one of {', '.join(OFFLOAD_ENGINES)}")
        if self.offload_engine != "zero-offload" and self.offload_optimizer != "cpu":
            raise ZerokitError(f"{flag('offload-engine')} {self.offload_engine} runs an optimizer offloaded to the CPU: "
                               f"use {flag('offload-optimizer')} cpu")
        if self.offload_engine == "superoffload" and self.zero_stage != 3:
            # runtime/engine.py builds SuperOffloadOptimizer_Stage3 only at stage 3
            raise ZerokitError(f"SuperOffload is a ZeRO-3 optimizer: use {flag('stage')} 3")
        if self.compile not in COMPILE_MODES:
            raise ZerokitError(f"{flag('compile')} {self.compile!r}: use one of {', '.join(COMPILE_MODES)}")
        if self.compile == "deepcompile" and self.zero_stage == 0:
            # engine.get_deepcompile_backend: "DeepCompile supports ZeRO stage 1, 2, or 3 only ... Falling back to
            # the torch compiler"
            raise ZerokitError(f"DeepCompile runs ZeRO stage 1, 2 or 3 (at stage 0 DeepSpeed falls back to "
                               f"torch.compile): use {flag('stage')} 1 or higher, or {flag('compile')} torch")
        if (self.quantized_weights or self.quantized_gradients) and self.zero_stage != 3:
            # only stage3.py and partition_parameters.py read zero_quantized_weights / zero_quantized_gradients
            raise ZerokitError(f"ZeRO++ qwZ and qgZ quantize ZeRO-3's collectives: use {flag('stage')} 3 or drop "
                               f"{flag('zero-quantized-weights')} / {flag('zero-quantized-gradients')}")

        if self.pipeline_parallel > 1:
            self._pipeline_problems()

    def _pipeline_problems(self) -> None:
        """What DeepSpeed's pipeline engine refuses, or what zerokit has not run with it, in one line each."""
        if self.zero_stage > 1:
            # runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
            raise ZerokitError(f"DeepSpeed's pipeline engine runs ZeRO-0 or ZeRO-1 only (ZeRO-2 and ZeRO-3 are "
                               f"incompatible with pipeline parallelism): use {flag('stage')} 0 or 1, or drop "
                               f"{flag('pipeline-parallel')}")
        if self.sequence_parallel > 1:
            # Ulysses with pipeline stages is an open DeepSpeed issue (#4645). Tensor parallelism with stages is priced
            # (Megatron-DeepSpeed's 3D runs, bench/published_3d.py); planner.parallel_options refuses it for a plan
            raise ZerokitError(f"{flag('pipeline-parallel')} is planned without Ulysses (sequence parallelism with "
                               f"pipeline stages is not supported by DeepSpeed, issue #4645): drop "
                               f"{flag('sequence-parallel')}")
        if self.offload_optimizer != "none" or self.checkpoint_offload or self.tiled_loss or self.tiled_mlp:
            raise ZerokitError(f"{flag('pipeline-parallel')} is planned without optimizer offload, checkpoint offload "
                               f"and tiling (zerokit's pipeline adapter runs none of them): drop them")
        if self.compile != "off":
            raise ZerokitError(f"{flag('pipeline-parallel')} runs eager (the pipeline engine schedules the stages "
                               f"itself): drop {flag('compile')}")

    @property
    def parallelism(self) -> "Parallelism":
        return Parallelism(self.tensor_parallel, self.sequence_parallel, self.hpz_partition_size,
                           self.pipeline_parallel)

    def data_parallel(self, world_size: int) -> int:
        """Data-parallel replicas: what the global batch counts (a TP or SP group trains on one batch together)."""
        return self.parallelism.data_parallel(world_size)

    def zero_ranks(self, world_size: int) -> int:
        """Ranks ZeRO partitions over: data x sequence-parallel ranks (utils/groups.py _get_sequence_data_parallel_group:
        "the process group for zero sharding and gradient allreduce must be across both dimensions of data and
        sequence parallelism"); with AutoTP the data-parallel group, world / TP (_init_tp_mesh_device); with pipeline
        stages the data-parallel group of one stage, world / stages (pipe/topology.py PipeDataParallelTopology)."""
        return world_size // (self.tensor_parallel * self.pipeline_parallel)

    @property
    def gradient_comm_precision(self) -> str:
        """The dtype gradients travel in: under Ulysses in DeepSpeed's engine seq_parallel_communication_data_type,
        else communication_data_type, else the training precision (DeepSpeedEngine.communication_data_type)."""
        if self.sequence_parallel > 1:
            return self.seq_parallel_communication_data_type
        return self.communication_data_type or self.precision

    @property
    def is_infinity(self) -> bool:
        """ZeRO-Infinity: stage 3 with something offloaded to NVMe."""
        return self.zero_stage == 3 and "nvme" in (self.offload_optimizer, self.offload_param)

    @property
    def label(self) -> str:
        parts = [f"ZeRO-{self.zero_stage}"]
        if self.offload_optimizer != "none":
            parts.append(f"opt->{self.offload_optimizer}")
        if self.offload_param != "none":
            parts.append(f"param->{self.offload_param}")
        parts.append(self.precision)
        if self.gradient_comm_precision != self.precision:
            parts.append(f"comm={self.gradient_comm_precision}")
        parts.append(f"mb={self.micro_batch_size}x{self.gradient_accumulation_steps}")
        if self.activation_checkpointing:
            parts.append("ckpt->cpu" if self.checkpoint_offload else "ckpt")
        for name, v in (("tp", self.tensor_parallel), ("sp", self.sequence_parallel), ("hpz", self.hpz_partition_size),
                        ("pp", self.pipeline_parallel)):
            if v > 1:
                parts.append(f"{name}={v}")
        if self.quantized_weights:
            parts.append("qwZ")
        if self.quantized_gradients:
            parts.append("qgZ")
        if self.offload_engine != "zero-offload":
            parts.append(self.offload_engine)
        if self.compile != "off":
            parts.append("compiled" if self.compile == "torch" else "deepcompile")
        if self.tiled_loss:
            parts.append("tiled-loss")
        if self.tiled_mlp:
            parts.append("tiled-mlp")
        return " ".join(parts)

    def to_dict(self) -> dict:
        return asdict(self)

    def with_(self, **changes) -> "ZeroSetup":
        return replace(self, **changes)


@dataclass(frozen=True)
class Parallelism:
    """How a job's ranks split beyond data parallelism, as DeepSpeed 0.19.8 builds the groups: world = data x tensor x
    sequence ranks; ZeRO partitions over data x sequence ranks (ZeroSetup.zero_ranks). 1 means unused.

    tensor_parallel: AutoTP, `tensor_parallel.autotp_size` (engine._configure_tensor_parallel acts above 1;
      utils/groups.py _init_tp_mesh_device: data-parallel size = world // tp).
    sequence_parallel: Ulysses, top-level `sequence_parallel_size` (runtime/config.py: the batch check's world is
      world / sp; sequence_parallel/parallel_state_sp.py initialize_sequence_parallel refuses a world it does not
      divide).
    hpz_partition_size: ZeRO++ hpZ, `zero_optimization.zero_hpz_partition_size`: a secondary copy of each ZeRO-3
      parameter partition over groups of this many consecutive ranks (utils/groups.py
      _create_zero_param_parallel_group asserts it divides the world); read by stage 3 only (zero/stage3.py)."""

    tensor_parallel: int = 1
    sequence_parallel: int = 1
    hpz_partition_size: int = 1
    pipeline_parallel: int = 1  # pipeline stages (pipe/topology.py PipeDataParallelTopology: rank = stage x data + d)

    def __post_init__(self):
        for name in ("tensor_parallel", "sequence_parallel", "hpz_partition_size", "pipeline_parallel"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ZerokitError(f"{name.replace('_', ' ')} must be a whole number of ranks, at least 1, got {v!r}")

    @property
    def model_parallel(self) -> int:
        """Ranks one data-parallel replica spans (TP x SP x pipeline stages)."""
        return self.tensor_parallel * self.sequence_parallel * self.pipeline_parallel

    def data_parallel(self, world_size: int) -> int:
        """Data-parallel replicas (what the global batch counts); world must divide."""
        return world_size // self.model_parallel

    def to_dict(self, world_size: int) -> dict:
        return {"data_parallel": self.data_parallel(world_size), "tensor_parallel": self.tensor_parallel,
                "sequence_parallel": self.sequence_parallel, "hpz_partition_size": self.hpz_partition_size,
                "pipeline_parallel": self.pipeline_parallel}


def ulysses_problems(heads: int, kv_heads: int, sp: int, seq_len: int) -> list[str]:
    """What Ulysses refuses for a model and sequence once the ranks run (deepspeed/runtime/sequence_parallel/
    ulysses_sp.py): UlyssesSPAttentionHF.__init__ splits the attention heads over the SP ranks (and the KV heads, or
    replicates them over the ranks when there are fewer), UlyssesSPDataLoaderAdapter splits every sequence. Each
    reason starts with the degree, so a caller puts its own name for it in front (`check`: the config key, the
    planner: --sequence-parallel)."""
    if sp <= 1:
        return []
    out = []
    kv = kv_heads or heads
    if heads % sp:
        out.append(f"{sp} does not divide the model's {heads} attention heads (Ulysses splits them over the "
                   "sequence-parallel ranks): use a divisor of it")
    elif kv % sp and sp % kv:
        out.append(f"{sp} and the model's {kv} KV heads do not divide one another (Ulysses splits or replicates "
                   "them): use a divisor or multiple of it")
    if seq_len % sp:
        out.append(f"{sp} does not divide the sequence of {seq_len} tokens (each rank takes an equal slice): use a "
                   f"{flag('seq-len')} that is a multiple of {sp}")
    return out


@dataclass(frozen=True)
class Workload:
    """What is trained: sequence length, batch, how much data."""

    seq_len: int = 2048
    global_batch: int | None = None  # samples per optimizer step; None = derive from micro batch
    samples: int | None = None  # training samples per epoch (sequences of seq_len tokens)
    epochs: float = 1.0
    attention: str = "sdpa"  # sdpa/flash/flash3 keep no s^2 scores; eager stores them
    # packed sequences: the documents' length, position ids restarting at each; flash kernels' varlen path attends
    # within one document (transformers _flash_attention_forward: _is_packed_sequence, then flash_attn_varlen_func)
    doc_len: int | None = None
    # the script checkpoints with use_reentrant=True (torch.utils.checkpoint.CheckpointFunction): its backward holds the
    # recomputed layer's output until the layer's backward ends (estimate/memory.py recompute_backward_terms)
    checkpoint_reentrant: bool = False
    # the training loop keeps the model's outputs (their logits) through backward and the step, as zerokit's own loop
    # does (`out` beside `out.loss`); the HF Trainer and TRL keep only the loss (Trainer.training_step: compute_loss
    # returns the loss, the outputs go out of scope before backward): False
    outputs_held: bool = True

    def __post_init__(self):
        if self.seq_len < 1:
            raise ZerokitError(f"sequence length must be at least 1, got {self.seq_len}")
        if self.global_batch is not None and self.global_batch < 1:
            raise ZerokitError(f"global batch must be at least 1, got {self.global_batch}")
        if self.samples is not None and self.samples < 1:
            raise ZerokitError(f"samples must be at least 1, got {self.samples}")
        if not self.epochs > 0:
            raise ZerokitError(f"epochs must be positive, got {self.epochs}")
        if self.attention not in ATTENTION_IMPLS:
            raise ZerokitError(f"attention must be one of {', '.join(ATTENTION_IMPLS)}, got {self.attention!r}")
        if self.doc_len is not None:
            if self.doc_len < 1:
                raise ZerokitError(f"{flag('doc-len')} must be at least 1, got {self.doc_len}")
            if self.attention not in ("flash", "flash3"):
                # transformers gives sdpa and eager a block-diagonal mask over the whole packed sequence
                # (masking_utils find_packed_sequence_indices): every score is computed, and the mask is held
                raise ZerokitError(f"{flag('doc-len')} prices flash attention's per-document (varlen) kernel; "
                                   f"{self.attention} attends over the whole packed sequence through a mask: use "
                                   f"{flag('attention')} flash or flash3")

    @property
    def attention_span(self) -> int:
        """The keys a query's attention runs over at most: the sequence, or its packed document."""
        return min(self.seq_len, self.doc_len) if self.doc_len else self.seq_len


def batch_split(global_batch: int, world_size: int, micro_batch: int) -> int:
    """Gradient accumulation for a target global batch: global = micro x accumulation x world size.

    Raises if the numbers do not divide, naming the sizes that would.
    """
    per_step = micro_batch * world_size
    if global_batch % per_step:
        raise ZerokitError(
            f"global batch {global_batch} is not divisible by micro batch {micro_batch} x {world_size} GPUs "
            f"= {per_step}: choose a global batch that is a multiple of {per_step}"
        )
    return global_batch // per_step


def steps_per_epoch(samples: int, global_batch: int) -> int:
    """Optimizer steps in one epoch; a last partial batch still costs a step."""
    return math.ceil(samples / global_batch)


def optimizer_steps(num_sequences: int, world: int, micro: int, accum: int, steps: int | None = None,
                    epochs: float | None = None) -> int:
    """Optimizer steps of a run, counted exactly as zerokit.launching.train streams the data: DistributedSampler pads
    every rank to ceil(n / world) samples, the last micro batch of an epoch may be short, and the data stream runs
    across epoch boundaries, so a fractional epoch counts its micro batches. `steps` given wins; at least one."""
    if steps is not None:
        return steps
    per_rank = math.ceil(num_sequences / world)
    micro_per_epoch = math.ceil(per_rank / micro)
    return max(1, int(math.floor((epochs or 1.0) * micro_per_epoch / accum)))


# ZeRO++'s quantizer (deepspeed/runtime/zero/partition_parameters.py CUDAQuantizer): int8 values in groups of about
# target_group_size = 8000 elements (its adaptive grouping keeps each under 16k), one fp32 scale per group
QWZ_GROUP_ELEMENTS = 8000
QWZ_BYTES_PER_ELEMENT = 1 + 4 / QWZ_GROUP_ELEMENTS


@dataclass(frozen=True)
class ZeroKnobs:
    """DeepSpeed's buffer settings, in elements, as they appear in zero_optimization.

    Defaults follow the HF integration (reduce bucket h^2, prefetch 0.9 h^2, persistence 10 h), which is
    what render writes, so the memory model prices what the rendered config will actually allocate.
    """

    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_max_live_parameters: int = 1_000_000_000
    stage3_max_reuse_distance: int = 1_000_000_000
    stage3_param_persistence_threshold: int = 100_000
    sub_group_size: int = 1_000_000_000
    # ZeRO++ (stage 3, CUDA: DeepSpeed's quantizer kernels): qwZ gathers parameters as int8 with fp32 scales, also only
    # the frozen ones stored so (nontrainable); qgZ reduces gradients as int4 through two all-to-alls, across nodes only.
    # Priced in estimate/memory.py (zeropp_terms) and estimate/timing.py (collective_bytes); render writes qwZ and qgZ when the setup pins them (--zero-quantized-weights, --zero-quantized-gradients).
    zero_quantized_weights: bool = False
    zero_quantized_nontrainable_weights: bool = False
    zero_quantized_gradients: bool = False
    # Not a zero_optimization key: what updates the fp32 weights, the name of a spec/optimizer.py declaration (its
    # state bytes, step temporaries, ds_config type or HF Trainer --optim name). "adamw": the config's AdamW block built
    # by DeepSpeed (FusedAdam; DeepSpeedCPUAdam with offload), in place; on CPU targets render writes torch AdamW.
    # "adamw_torch": torch.optim.AdamW unfused, i.e. a config without an optimizer block run by the HF Trainer's
    # --optim adamw_torch or a plain torch.optim.AdamW, or with "torch_adam": true; "lion", "adamw_bnb_8bit", ... Read
    # from a ds_config by config.setup.optimizer_of (`zerokit check --client-optimizer` for a script's own).
    optimizer: str = DEFAULT_OPTIMIZER
    # Not a zero_optimization key either: data_types.grad_accum_dtype ("fp32", "bf16", "fp16"; None: the model's),
    # what DeepSpeed accumulates gradients in (engine.get_data_types), read by config.setup.setup_from_config; render
    # never writes it. estimate/memory.py grad_accum_terms says what it changes.
    grad_accum_dtype: str | None = None

    @classmethod
    def for_hidden_size(cls, hidden_size: int | None) -> "ZeroKnobs":
        if not hidden_size:
            return cls()
        h2 = hidden_size * hidden_size
        return cls(
            reduce_bucket_size=h2,
            allgather_bucket_size=h2,
            stage3_prefetch_bucket_size=int(0.9 * h2),
            stage3_param_persistence_threshold=10 * hidden_size,
        )

    @classmethod
    def for_model(cls, model) -> "ZeroKnobs":
        """What render writes for a model (a spec.model.ModelSpec): the hidden-size buckets, and for QLoRA a
        persistence threshold of 0. DeepSpeed keeps a parameter whole on every rank when its ds_numel is under
        stage3_param_persistence_threshold (partition_parameters.py _convert_to_deepspeed_param: ds_persist), and a
        packed 4-bit weight holds 1/2 (uint8 storage) to 1/8 (fp32 storage) of its weight's elements, so at the HF
        default of 10 h whole 4-bit weights stay unpartitioned that a 16-bit model would partition (measured on CPU:
        the tiny Llama's 4-bit weights were partitioned only at 0, docs/measured-on-cpu.md "Fine-tuning").
        0 partitions every parameter; the norms it adds to each gather are h elements each."""
        knobs = cls.for_hidden_size(getattr(model, "hidden_size", None))
        if model is not None and model.trained.finetune_mode == "qlora":
            return replace(knobs, stage3_param_persistence_threshold=0)
        return knobs

    @classmethod
    def from_zero_config(cls, zero: dict) -> "ZeroKnobs":
        """Knobs from a ds_config's zero_optimization block; DeepSpeed's defaults for absent keys."""
        d = cls()
        vals = {}
        for f in d.__dataclass_fields__:
            if f in ("optimizer", "grad_accum_dtype"):  # from the config's optimizer block and data_types
                continue
            v = zero.get(f, getattr(d, f))
            if v == "auto":
                vals[f] = getattr(d, f)
            elif isinstance(getattr(d, f), bool):
                vals[f] = bool(v)
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0:
                vals[f] = int(v)  # DeepSpeed's pydantic fields take 5e8 for an int
            else:
                raise ZerokitError(f"zero_optimization.{f} is {v!r}: DeepSpeed reads a non-negative number there")
        return cls(**vals)

    def to_dict(self) -> dict:
        return asdict(self)
