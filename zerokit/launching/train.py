"""The per-rank training entry point that `zerokit launch` starts under the deepspeed launcher.

    deepspeed --num_gpus 2 --module zerokit.launching.train RUN/rank_options.json

RUN/rank_options.json is launching/rank_options.RankOptions, written by `zerokit launch` (the ranks parse no command
line; a restart resumes from the latest checkpoint).

Every rank builds the HF causal LM (under ZeRO-3 through transformers' own zero.Init path), the
DeepSpeed engine from the config (optimizer, LR schedule, clipping, precision, accumulation all come
from the config), and a DataLoader over a seeded DistributedSampler. The data stream runs across epoch
boundaries; its position (epoch, micro batch index) is saved in every checkpoint with each rank's RNG
state, so a resumed run continues from the same global step and data position (fp32: losses equal the
uninterrupted run exactly).

Outputs under --output-dir:
  metrics/rank{R}.jsonl   every rank: one JSON line per optimizer step (+ start/end events)
  checkpoints/step{N}/    engine.save_checkpoint; checkpoints/latest names the newest COMPLETE one
                          (written by rank 0 after a barrier, atomically: tmp + os.replace)
  final/                  consolidated weights: save_pretrained (16-bit if the run was bf16), or for
                          ZeRO-3 the fp32 weights from zero_to_fp32; with config.json and the tokenizer.
                          LoRA/QLoRA: the adapter (peft save_pretrained: adapter_config.json +
                          adapter_model.safetensors) and the tokenizer; with --merge also final/merged/,
                          the base with the adapter merged in (loadable by AutoModelForCausalLM)
  base/                   LoRA/QLoRA of a random-init (config-only) model: the base weights the adapter
                          belongs to (its adapter_config.json names this directory)

With the ds_config's tensorboard / wandb / csv_monitor blocks (`zerokit launch --report-to`, config/trackers.py),
rank 0 also writes every step's figures and, at the end, the predicted-vs-measured ones through DeepSpeed's monitor
(write_step_events, close_trackers).

Fine-tuning (RankOptions.finetune, spec.finetune.Finetune): --freeze patterns set requires_grad False; LoRA wraps
the model in peft's get_peft_model; QLoRA loads the base 4-bit NF4 through transformers' BitsAndBytesConfig
first. DeepSpeed's optimizer then holds state for the trainable parameters only.

Test hooks (environment; only act on attempt ZEROKIT_ATTEMPT == ZEROKIT_TEST_CRASH_ATTEMPT, default 0):
  ZEROKIT_TEST_CRASH_AT_STEP=N [ZEROKIT_TEST_CRASH_RANK=R]   SIGKILL rank R after step N
  ZEROKIT_TEST_CRASH_IN_CHECKPOINT=N [ZEROKIT_TEST_CRASH_RANK=R]  SIGKILL rank R after the checkpoint of
                          step N is written but before it is marked latest
"""

from __future__ import annotations

import math
import os
import random
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zerokit.core.errors import EXIT_INVALID, ZerokitError
from zerokit.core.options import flag
from zerokit.launching.checkpoints import (
    CKPT_SUBDIR,
    FINAL_SUBDIR,
    UNIVERSAL_SUFFIX,
    MetricsLog,
    read_latest,
    stale_checkpoints,
    tag_for_step,
    write_config_rejection,
    write_latest,
    write_shape,
)
from zerokit.launching.rank_options import RankOptions, options_file_from_argv
from zerokit.measure.step_phases import StepPhaseMeter
from zerokit.spec.finetune import Finetune, is_frozen, lora_config
from zerokit.spec.setup import optimizer_steps

BASE_SUBDIR = "base"  # LoRA/QLoRA of a random-init model: the base weights its adapter belongs to
MERGED_SUBDIR = "merged"  # final/merged: --merge's base + adapter in one set of weights


# ----------------------------------------------------------------------------------------------
# model


def _causal_lm_class(config):
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        return AutoModelForCausalLM  # remote code etc.: let the auto class resolve it


def build_model(model: str, ds_config: dict, seed: int, device: str | None = None):
    """The HF causal LM in fp32. Under ZeRO-3 transformers enters deepspeed.zero.Init itself (it sees
    the HfDeepSpeedConfig held by the caller); the model class is imported before that context. A random-init model
    is built on `device` when given (a GPU rank: torch's default init and reinit_deterministic run there, not on the
    host, where a 3B model's two fp32 inits took most of a lent GPU job's minute)."""
    from contextlib import nullcontext

    import torch
    from transformers import AutoConfig

    from zerokit.spec.resolve import resolve_model

    resolved = resolve_model(model)
    kind, src = resolved.init, resolved.source
    config = AutoConfig.from_pretrained(src)
    cls = _causal_lm_class(config)  # import the class (and torch._dynamo) BEFORE zero.Init
    import torch._dynamo

    torch.manual_seed(seed)
    if kind == "weights":
        return cls.from_pretrained(src, dtype=torch.float32)
    zero3 = int((ds_config.get("zero_optimization") or {}).get("stage", 0) or 0) == 3
    with torch.device(device) if device and not zero3 else nullcontext():
        if cls.__name__ == "AutoModelForCausalLM":
            m = cls.from_config(config, dtype=torch.float32)
        else:
            m = cls._from_config(config, dtype=torch.float32)
        reinit_deterministic(m, seed, zero3)
    return m


def reinit_deterministic(model, seed: int, zero3: bool) -> None:
    """Re-run the model's own `_init_weights` module by module, each under a generator seeded from
    (seed, module name), so a random-init model has the same weights whatever the ZeRO stage.

    (transformers initializes a ZeRO-3 model on rank 0 after construction with torch's default init
    skipped, a normal model after the default init has consumed the RNG: the two differ otherwise.)
    Under ZeRO-3 each module's partitioned parameters are gathered, initialized on rank 0 and
    re-partitioned (deepspeed.zero.GatheredParameters with modifier_rank=0), as transformers does.
    """
    import zlib
    from contextlib import nullcontext

    import torch
    from transformers import PreTrainedModel

    rank = 0
    if zero3:
        import deepspeed
        from deepspeed import comm as dist

        rank = dist.get_rank()

    def walk(mod, owner, prefix):
        if isinstance(mod, PreTrainedModel):
            owner = mod
        yield prefix, mod, owner
        for n, c in mod.named_children():
            yield from walk(c, owner, f"{prefix}.{n}" if prefix else n)

    for name, mod, owner in walk(model, model, ""):
        params = list(mod.parameters(recurse=False))
        if not params:
            continue
        for p in params:
            if hasattr(p, "_is_hf_initialized"):
                delattr(p, "_is_hf_initialized")
        ctx = deepspeed.zero.GatheredParameters(params, modifier_rank=0) if zero3 else nullcontext()
        with ctx:
            if rank == 0:
                with torch.random.fork_rng(devices=[]), torch.no_grad():
                    torch.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
                    owner._init_weights(mod)


# ----------------------------------------------------------------------------------------------
# fine-tuning: --freeze, LoRA, QLoRA


def _torch_dtype(name: str):
    import torch

    return {"uint8": torch.uint8, "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def bnb_config(finetune: Finetune, compute_dtype):
    """transformers' BitsAndBytesConfig for QLoRA: NF4 (the QLoRA paper's 4-bit type; bitsandbytes' default is fp4),
    double quantization and the storage dtype as the user chose (spec.finetune.Finetune), and the run's precision as
    the compute dtype: bnb.nn.Linear4bit.forward dequantizes to it and multiplies in it."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                              bnb_4bit_use_double_quant=finetune.bnb_4bit_use_double_quant,
                              bnb_4bit_quant_storage=_torch_dtype(finetune.bnb_4bit_quant_storage),
                              bnb_4bit_compute_dtype=compute_dtype)


def base_source(args: RankOptions, out: Path, rank: int) -> str:
    """What a LoRA/QLoRA adapter is trained on: the pretrained weights as given, or, for a random-init (config-only)
    model, its deterministic init (build_model) saved once by rank 0 to OUT/base behind a barrier.

    Why save it: transformers quantizes to 4-bit only while loading weights (from_pretrained with a
    quantization_config; from_config cannot), and a random-init base exists nowhere else, so an adapter without it
    could never be used again; peft's save_pretrained records this directory as the adapter's
    base_model_name_or_path. A restart or --resume finds it and loads the same base."""
    from deepspeed import comm as dist

    from zerokit.spec.resolve import resolve_model

    resolved = resolve_model(args.model)
    if resolved.init == "weights":
        return resolved.source
    base = out / BASE_SUBDIR
    if rank == 0 and not (base / "config.json").is_file():
        import torch

        tmp = out / f".{BASE_SUBDIR}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
        # build_model reseeds torch's global generator: rank 0 alone must not leave with another RNG stream
        with torch.random.fork_rng(devices=[]):
            # fp32; the same weights as a full run's at any stage (on a GPU rank, built there: build_model)
            model = build_model(args.model, {}, args.seed,
                                device=f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else None)
        model.save_pretrained(str(tmp), safe_serialization=True)
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        _copy_tokenizer(args, tmp)
        os.replace(tmp, base)  # atomic: a crash mid-write leaves no half base for a restart to load
    dist.barrier()
    return str(base)


def build_quantized(src: str, finetune: Finetune, compute_dtype, local_rank: int):
    """The base loaded 4-bit NF4 by transformers' from_pretrained(quantization_config=BitsAndBytesConfig(...)), the
    way measured to work on CPU (docs/measured-on-cpu.md "Fine-tuning"): every Linear but the LM head
    becomes bnb.nn.Linear4bit, its weight packed uint8 [N/2, 1] (Params4bit). The other weights (embeddings, norms,
    LM head) load in fp32, which is what peft's prepare_model_for_kbit_training would upcast them to; DeepSpeed
    casts them to bf16 for a bf16 run (engine._cast_module_mixed_precision skips the integer 4-bit storage).

    Not under deepspeed.zero.Init: transformers does not build a quantized model under ZeRO-3 (modeling_utils
    checks `is_deepspeed_zero3_enabled() and not is_quantized`); deepspeed.initialize partitions it afterwards."""
    import torch
    from transformers import AutoConfig

    cls = _causal_lm_class(AutoConfig.from_pretrained(src))
    device_map = {"": local_rank} if torch.cuda.is_available() else "cpu"
    return cls.from_pretrained(src, quantization_config=bnb_config(finetune, compute_dtype), device_map=device_map,
                               dtype=torch.float32)


def wrap_for_finetune(model, finetune: Finetune, seed: int):
    """--freeze: requires_grad False for the parameters the patterns match (spec.finetune.is_frozen, the rule the
    plan counted with). LoRA/QLoRA: peft's get_peft_model(model, LoraConfig(...)), which freezes every base weight
    and adds lora_A/lora_B to the target modules (bnb Linear4bit gets peft's bnb LoRA layer)."""
    import torch

    if finetune.freeze:
        for name, p in model.named_parameters():
            if is_frozen(name, finetune.freeze):
                p.requires_grad_(False)
        return model
    if not finetune.uses_lora:
        return model
    import warnings

    from peft import get_peft_model

    cfg = lora_config(model, finetune)  # the config the plan counted with (fused MoE parameters included)
    # lora_A is drawn from torch's global generator (peft LoraLayer.reset_lora_parameters: kaiming_uniform_): seed it
    # the same on every rank and whatever the ZeRO stage consumed before (ZeRO-3 would otherwise partition different
    # adapters per rank), and leave the training stream (dropout) as it was
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft's notes (fan_in_fan_out on Conv1D, ...): the user cannot act on them
        torch.manual_seed(seed)
        return get_peft_model(model, cfg)


def trainable_count(module) -> int:
    """Trainable elements as the rank holds them (a ZeRO-3 parameter's full size is ds_numel; peft's
    get_nb_trainable_parameters counts the same way)."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in module.parameters() if p.requires_grad)


# ----------------------------------------------------------------------------------------------
# data


def make_dataset(args):
    """Rows of {"input_ids", "labels", and "attention_mask" where the data was padded}: the model's arguments.
    Labels are the input ids unless launching/data.py masked positions (prompts, padding: -100) in labels.npy."""
    import numpy as np
    import torch

    if args.tokens:
        from zerokit.launching.data import load_arrays

        arrays = load_arrays(args.tokens)
    else:
        from zerokit.launching.data import resolve_source, tokenize
        from zerokit.spec.resolve import resolve_model

        data = tokenize(resolve_source(args.data or None), args.tokenizer or resolve_model(args.model).tokenizer,
                        args.seq_len or 64)
        arrays = data.arrays()

    class Packed(torch.utils.data.Dataset):
        def __len__(self):
            return int(arrays["input_ids"].shape[0])

        def __getitem__(self, i):
            row = {k: torch.from_numpy(np.asarray(a[i], dtype=np.int64)) for k, a in arrays.items()}
            row.setdefault("labels", row["input_ids"])
            return row

    return Packed()


def make_sampler_class():
    from torch.utils.data import DistributedSampler

    class ResumableDistributedSampler(DistributedSampler):
        """DistributedSampler whose epoch order can start part-way (skip the first `start_index`)."""

        start_index = 0

        def __iter__(self):
            return iter(list(super().__iter__())[self.start_index:])

        def __len__(self):
            return max(0, self.num_samples - self.start_index)

    return ResumableDistributedSampler


# ----------------------------------------------------------------------------------------------
# helpers


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else None


def _crash_hook(kind: str, step: int, rank: int) -> None:
    """SIGKILL this rank when a test asked for it (only on the configured attempt)."""
    at = _env_int("ZEROKIT_TEST_CRASH_AT_STEP" if kind == "step" else "ZEROKIT_TEST_CRASH_IN_CHECKPOINT")
    if at is None or at != step:
        return
    if (_env_int("ZEROKIT_ATTEMPT") or 0) != (_env_int("ZEROKIT_TEST_CRASH_ATTEMPT") or 0):
        return
    if rank != (_env_int("ZEROKIT_TEST_CRASH_RANK") or 0):
        return
    print(f"[zerokit test hook] rank {rank}: SIGKILL at {kind} {step}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _rng_state() -> dict:
    import numpy as np
    import torch

    st = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: dict) -> None:
    import numpy as np
    import torch

    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def _seed_all(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _fmt_eta(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


# ----------------------------------------------------------------------------------------------
# main, as named steps: configure -> setup_process -> (base_source) -> build_model_for -> make_engine -> make_data ->
# resume_position -> start_metrics -> train_loop -> export -> finish, sharing a Run


def config_accepted(ds_config: dict, out: Path) -> bool:
    """DeepSpeed's config classes on the config, as `zerokit check` puts them (validate_with_deepspeed), for the
    launcher's world size. A launch defers this to the ranks when the verdict is not cached, because they import
    DeepSpeed anyway and the parent then imports nothing heavy (launching/prepare.py). Refused: every rank writes the
    same one-line reason for the parent (launching/execute.py; an atomic replace, so the writes cannot mix), no rank prints
    anything. Every rank, not rank 0 alone: the launcher kills the others when the first rank exits, and a rank 0 killed
    before writing left no reason, so the supervisor restarted the job (seen with two test files at a time)."""
    from zerokit.config.validate import validate_with_deepspeed

    try:
        validate_with_deepspeed(ds_config, _env_int("WORLD_SIZE") or 1)
    except ZerokitError as e:
        write_config_rejection(out, str(e))
        return False
    return True


@dataclass
class Run:
    """What the steps of one rank's run share, filled step by step: configure the first block, setup_process the rank's
    place and the memory meter, main the LoRA base (base_source), build_model_for what must outlive the model build,
    make_engine the engine and what the loss and the meters need."""

    args: RankOptions
    t_start: float  # before the heavy imports: the start record's startup_s counts them
    out: Path
    ckpt_dir: Path
    ds_config: dict
    stage: int
    bf16: bool
    fp16: bool
    attempt: int = 0
    run_id: str | None = None
    # setup_process
    local_rank: int = 0
    on_cuda: bool = False
    rank: int = 0
    world: int = 1
    layout: Any = None  # launching/parallel.RankLayout: the TP, SP and data-parallel groups
    meter: Any = None  # the memory meter while it runs: None without one, or once memory_steps stopped it
    compile_pending: bool = False  # --compile: engine.compile() waits for the CPU meter to stop (compile_engine)
    mem_method: str = "none"
    # main (base_source) and build_model_for
    base_src: str | None = None  # LoRA/QLoRA: the base the adapter trains on
    keep_alive: list = field(default_factory=list)  # ZeRO-3: the HfDeepSpeedConfig transformers' zero.Init reads
    startup_phases_s: dict = field(default_factory=dict)  # main: seconds in setup (imports included), model, engine
    # make_engine
    engine: Any = None
    head_switch: Any = None  # --tiled-loss: parallel.HeadSwitch over the LM head
    sp_group: Any = None  # Ulysses SP: the sequence-parallel process group
    vocab: int = 0
    hf_model: Any = None  # pipeline stages: the HF model whose modules the PipelineModule holds (make_engine)
    phases: Any = None  # measure/step_phases.StepPhaseMeter
    init_peak: int = 0

    @property
    def precision(self) -> str:
        return "bf16" if self.bf16 else "fp16" if self.fp16 else "fp32"


@dataclass
class Data:
    """make_data's dataset, sampler and loader, with the step-count rule's inputs and answer."""

    dataset: Any
    sampler: Any  # ResumableDistributedSampler
    loader: Any
    mb: int  # micro batch per rank
    ga: int  # gradient accumulation steps
    micro_per_epoch: int
    total_steps: int


@dataclass
class Position:
    """Where the run starts: the data position (epoch, micro batch in it) and the step a resume loaded (0: none)."""

    epoch: int = 0
    batch_in_epoch: int = 0
    resumed_from: int = 0


@dataclass
class LoopResult:
    """What train_loop leaves for the end record."""

    step: int
    train_time: float
    peak_alloc: int
    # the stream and the last micro batch (its batch, loss and outputs), alive until main returns, as they were when the
    # loop was main's own: the export and the end record's CUDA peak reserve see the same memory
    live: tuple = ()


def configure(args: RankOptions, t_start: float) -> Run | None:
    """The ds_config read, and the two refusals before any process group exists: DeepSpeed's config classes reject it
    (--check-config, config_accepted), or it asks for fp16 where this CPU's DeepSpeed has none. None: refused (rank 0
    wrote why; main exits EXIT_INVALID)."""
    import torch

    import deepspeed  # noqa: F401 - imported before anything else, as the ranks always have

    from zerokit.config.read import bf16_block, load_config_file

    out = Path(args.output_dir)
    ds_config = load_config_file(args.ds_config)
    if args.check_config and not config_accepted(ds_config, out):
        return None
    zero = ds_config.get("zero_optimization") or {}
    stage = int(zero.get("stage", 0) or 0)
    bf16 = bool((bf16_block(ds_config) or {}).get("enabled"))  # the old name "bfloat16" too, as DeepSpeed reads it
    fp16 = bool((ds_config.get("fp16") or {}).get("enabled"))
    if fp16 and not torch.cuda.is_available():
        # a profile may say fp16 where this CPU's DeepSpeed does not (measured elsewhere, or under
        # bench/accuracy/fp16_on_cpu): one line instead of every rank's "Type fp16 is not supported" traceback
        from zerokit.measure.calibrate import precision_supported

        ok, why = precision_supported("fp16", "cpu")
        if not ok:
            write_config_rejection(out, why)  # every rank (config_accepted says why); the parent prints it, no restarts
            if not _env_int("RANK") and not args.check_config:
                print(f"error: {why}", file=sys.stderr, flush=True)
            return None
    return Run(args=args, t_start=t_start, out=out, ckpt_dir=out / CKPT_SUBDIR, ds_config=ds_config, stage=stage,
               bf16=bf16, fp16=fp16, attempt=_env_int("ZEROKIT_ATTEMPT") or 0, run_id=os.environ.get("ZEROKIT_RUN_ID"))


def setup_process(run: Run) -> None:
    """The rank's device and process group, its TP/SP/data-parallel place, the memory meter, the seeds."""
    import torch

    import deepspeed
    from deepspeed import comm as dist

    from zerokit.launching import parallel

    args = run.args
    run.local_rank = int(os.environ.get("LOCAL_RANK", 0))  # set by the deepspeed launcher on every rank
    run.on_cuda = torch.cuda.is_available()
    if run.on_cuda:
        torch.cuda.set_device(run.local_rank)
    deepspeed.init_distributed(dist_backend=args.dist_backend)  # None: the accelerator's communication_backend_name()
    run.rank, run.world = dist.get_rank(), dist.get_world_size()
    # TP and SP groups (the config's keys): every rank of one reads the same samples (launching/parallel.py)
    run.layout = parallel.RankLayout.from_config(run.ds_config, run.rank, run.world)

    # memory: CUDA allocator counters, or on CPU the exact live-tensor-byte meter from zerokit.measure.meter
    run.meter = None
    run.mem_method = "cuda_max_allocated" if run.on_cuda else "none"
    if not args.no_memory_meter:
        try:
            from zerokit.measure.meter import MemoryMeter

            run.meter = MemoryMeter(f"cuda:{run.local_rank}" if run.on_cuda else "cpu")
            run.meter.start()
            run.mem_method = run.meter.method
        except ImportError:  # measure.py missing: CUDA counters still work, CPU reports nothing
            run.meter = None

    _seed_all(args.seed)


def _staged(run: Run) -> bool:
    """Whether the run trains pipeline stages (a Run built for one step may have no layout)."""
    return run.layout is not None and run.layout.pipeline_parallel > 1


def build_model_for(run: Run):
    """The model the engine trains: built (QLoRA: loaded 4-bit from run.base_src; else build_model from run.base_src or
    the model, under ZeRO-3 through transformers' zero.Init), checkpointing and the cache set, the finetune applied
    (wrap_for_finetune), ZeRO-3's 16-bit adapters cast, --tiled-mlp's MLPs tiled. Needs no process group below ZeRO-3."""
    import torch

    from zerokit.launching import parallel

    args, finetune = run.args, run.args.finetune
    if finetune.mode == "qlora":
        model = build_quantized(run.base_src, finetune,
                                torch.bfloat16 if run.bf16 else torch.float16 if run.fp16 else torch.float32,
                                run.local_rank)
    else:
        if run.stage == 3:  # transformers builds the model under deepspeed.zero.Init while this object lives
            from transformers.integrations import HfDeepSpeedConfig

            run.keep_alive.append(HfDeepSpeedConfig(run.ds_config))
        # pipeline stages: built on the host, the PipelineModule moves its own stage to the GPU (make_engine)
        model = build_model(run.base_src or args.model, run.ds_config, args.seed,
                            device=f"cuda:{run.local_rank}" if run.on_cuda and not _staged(run) else None)
    staged = _staged(run)
    if args.gradient_checkpointing and not staged:
        # (pipeline stages checkpoint through the engine: the config's pipeline.activation_checkpoint_interval)
        # use_reentrant=False: reentrant checkpointing gives no gradient to parameters inside a block whose inputs do
        # not require grad, the case of adapters over a frozen base (transformers' _activation_checkpointing_enable
        # also calls enable_input_require_grads for input_ids models)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hasattr(model, "config"):
        model.config.use_cache = False
    model = wrap_for_finetune(model, finetune, args.seed)
    if run.stage == 3 and (run.bf16 or run.fp16):
        # peft adds its adapters after transformers built the base under zero.Init, in fp32 (LoraLayer.update_layer;
        # get_peft_model's autocast_adapter_dtype upcasts 16-bit adapters to fp32). deepspeed.initialize casts a
        # 16-bit run's parameters to the training dtype only when none is a ZeRO parameter yet
        # (engine._configure_distributed_model: is_zero_init_model skips _cast_module_mixed_precision), so at ZeRO-3
        # the adapters would stay fp32 and run the adapter path in fp32 (measured: +4.8 MiB of fp32 input casts per
        # rank on tiny-llama, -22.7% against the model): cast them as DeepSpeed casts every parameter at ZeRO-0/1/2.
        dtype = torch.bfloat16 if run.bf16 else torch.float16
        for p in model.parameters():
            if not hasattr(p, "ds_id") and p.is_floating_point() and p.dtype != dtype:
                p.data = p.data.to(dtype)

    if args.tiled_mlp:
        parallel.tile_mlps(model)
    return model


def compile_engine(run: Run) -> None:
    """engine.compile(): torch.compile of the engine's module (Inductor); with the config's compile.deepcompile,
    DeepSpeed's graph passes (engine.compile -> get_deepcompile_backend). On CPU ranks only once the memory meter has
    stopped: a frame dynamo first meets under an active TorchDispatchMode (the meter's) is never compiled, even after the
    mode exits (measured: torch._dynamo.utils.counters stays empty; docs/measured-on-cpu.md), so the metered first steps
    run eager and the compiled ones follow."""
    run.engine.compile()
    run.compile_pending = False


def make_engine(run: Run, model) -> None:
    """Ulysses' SP groups, or the pipeline stages' PipelineModule; deepspeed.initialize (an AdamW at --lr when the
    config has no optimizer), the tiled loss's head switch, the meter told of the engine, training mode, and the
    step-phase meter with its init peak."""
    import torch

    import deepspeed

    from zerokit.launching import parallel

    args, ds_config = run.args, run.ds_config
    mpu, trained = None, model
    if run.layout.pipeline_parallel > 1:
        # the config's pipeline block: the HF model as launching/pipeline.py's PipelineModule, its decoder layers
        # checkpointed by the engine every activation_checkpoint_interval layers (in place of HF's); DeepSpeed takes
        # the module's own grid as the mpu
        from zerokit.launching.pipeline import pipeline_module

        interval = int(ds_config["pipeline"].get("activation_checkpoint_interval") or 0)
        trained = pipeline_module(model, run.layout.pipeline_parallel, activation_checkpoint_interval=interval)
    else:
        # Ulysses: the SP groups and the attention wrapper, before the engine (which takes their mpu)
        mpu = parallel.register_ulysses(model, run.layout.sequence_parallel,
                                        int(ds_config.get("train_micro_batch_size_per_gpu", 1)))

    params = [p for p in trained.parameters() if p.requires_grad]
    optimizer = None if "optimizer" in ds_config else torch.optim.AdamW(params, lr=args.lr)
    engine, _, _, _ = deepspeed.initialize(model=trained, optimizer=optimizer, model_parameters=params,
                                           config=ds_config, mpu=mpu)
    if trained is not model:  # pipeline stages: this rank keeps its own stage's weights, export_pipeline writes them
        from zerokit.launching.pipeline import release_other_stages

        release_other_stages(model, trained)
        run.hf_model = model
    run.engine = engine
    run.compile_pending = args.compile != "off"
    if run.compile_pending and (run.on_cuda or run.meter is None):
        compile_engine(run)
    run.head_switch = parallel.HeadSwitch(engine.module.get_output_embeddings()) if args.tiled_loss else None
    run.sp_group = mpu.get_sequence_parallel_group() if mpu is not None else None
    # the whole vocabulary, as memory.tiled_loss_shards prices the slices: an AutoTP LM head's weight holds V / tp rows
    # but gathers its logits to V (the HF model's config: a PipelineModule has none)
    run.vocab = model.config.get_text_config().vocab_size
    if run.meter is not None and hasattr(run.meter, "register_deepspeed_engine"):
        try:
            run.meter.register_deepspeed_engine(engine)
        except Exception:  # attribution is optional
            pass

    # training mode: transformers' from_pretrained returns the model in eval mode (modeling_utils: "model.eval() # Set
    # model in evaluation mode to deactivate Dropout modules by default") and deepspeed.initialize leaves the mode as
    # it is; a model loaded from weights (a pretrained model, a LoRA/QLoRA base) would train without dropout (LoRA's
    # included), and bnb's Linear4bit.forward takes its inference path (a bf16 CPU kernel) in eval mode.
    # DeepSpeedEngine.train() sets module.train(True), as the HF Trainer does each epoch
    engine.train()
    if run.on_cuda:
        # a model built on the GPU (build_model) left its fp32 copy in the caching allocator once DeepSpeed cast it
        # (engine._configure_distributed_model casts before it moves a host-built model): release it, so the reserved
        # and nvidia-smi figures measured are those of a model loaded in 16 bits or from the host
        torch.cuda.empty_cache()
    run.phases = StepPhaseMeter(run.meter, run.on_cuda)
    run.init_peak = run.phases.init_peak()


def make_data(args: RankOptions, dp: int, data_rank: int, mb: int, ga: int) -> Data:
    """The dataset (make_dataset), this data-parallel replica's seeded sampler and its loader of mb rows, and the
    optimizer steps the run takes. Needs no process group."""
    import torch

    dataset = make_dataset(args)
    Sampler = make_sampler_class()
    sampler = Sampler(dataset, num_replicas=dp, rank=data_rank, shuffle=True, seed=args.seed, drop_last=False)
    loader = torch.utils.data.DataLoader(dataset, batch_size=mb, sampler=sampler, drop_last=False, num_workers=0)
    micro_per_epoch = math.ceil(sampler.num_samples / mb)
    # the one step-count rule: `zerokit launch` predicted with it (sampler.num_samples = ceil(n / replicas))
    total_steps = optimizer_steps(len(dataset), dp, mb, ga, args.steps, args.epochs)
    return Data(dataset, sampler, loader, mb, ga, micro_per_epoch, total_steps)


def resume_position(run: Run, data: Data) -> Position:
    """--resume (every restart): stale checkpoints removed, the latest complete one loaded (universal when the launcher
    converted it for this world size), the data position mapped onto this data-parallel size, this rank's RNG
    streams restored. No checkpoint: the start."""
    from deepspeed import comm as dist

    args, engine, ckpt_dir, rank = run.args, run.engine, run.ckpt_dir, run.rank
    mb, dp = data.mb, run.layout.data_parallel
    pos = Position()
    if args.resume and read_latest(ckpt_dir):
        if rank == 0:
            for d in stale_checkpoints(ckpt_dir):
                shutil.rmtree(d, ignore_errors=True)
        dist.barrier()
        tag = read_latest(ckpt_dir)
        if engine.load_universal_checkpoint():
            # the launcher converted the latest checkpoint for this world size (launching/checkpoints.py
            # convert_to_universal); a restart within this run finds a newer one written by this world size,
            # which DeepSpeed loads the ordinary way (engine.load_checkpoint reads only this flag)
            if (ckpt_dir / (tag + UNIVERSAL_SUFFIX)).is_dir():
                tag += UNIVERSAL_SUFFIX
            else:
                engine._config.load_universal_checkpoint = False
        # a LoRA checkpoint holds no base weights (save_checkpoint): the module loads non-strictly, as the HF Trainer
        # loads a peft model's (transformers integrations.deepspeed_load_checkpoint, load_module_strict=not peft); the
        # adapters come back from the module state and, at ZeRO-1/2/3, from the optimizer's fp32 partitions
        load_path, client = engine.load_checkpoint(str(ckpt_dir), tag=tag,
                                                   load_module_strict=not args.finetune.uses_lora)
        if load_path is None:
            raise RuntimeError(f"could not load checkpoint {ckpt_dir}/{tag}")
        zk = client["zerokit"]
        epoch, batch_in_epoch = zk["epoch"], zk["batch_in_epoch"]
        saved_dp = zk.get("data_parallel", zk.get("world_size", run.world))
        if saved_dp != dp:
            # the position by samples consumed: DistributedSampler deals one seeded permutation round-robin
            # (replica r takes indices[r::replicas]), so the first k x replicas samples of the epoch are the same set
            # whatever the number of replicas; with the global batch held the count divides by micro x new replicas
            consumed = zk.get("samples_in_epoch", batch_in_epoch * zk.get("micro_batch", mb) * saved_dp)
            if consumed % (mb * dp):
                raise RuntimeError(f"checkpoint {tag}: {consumed} samples into epoch {epoch} do not split into micro "
                                   f"batch {mb} x {dp} data-parallel replicas")
            batch_in_epoch = consumed // (mb * dp)
        rngs = zk["rng"]
        # rank r continues saved rank r's stream; a rank the old run did not have takes rank 0's (the streams
        # only drive dropout and the like; none is more right than another, rank 0's always exists)
        _set_rng_state(rngs[rank] if rank < len(rngs) else rngs[0])
        pos = Position(epoch, batch_in_epoch, engine.global_steps)
    elif args.resume and rank == 0:
        for d in stale_checkpoints(ckpt_dir):
            shutil.rmtree(d, ignore_errors=True)
    return pos


def start_metrics(run: Run, data: Data, pos: Position) -> MetricsLog:
    """This rank's metrics/rank{R}.jsonl, opened with its start record."""
    import torch

    args = run.args
    metrics = MetricsLog(run.out, run.rank)
    metrics.write({
        "event": "start", "rank": run.rank, "world_size": run.world, "attempt": run.attempt, "run_id": run.run_id,
        "resumed_from": pos.resumed_from,
        "total_steps": data.total_steps, "zero_stage": run.stage, "precision": run.precision,
        "micro_batch": data.mb, "grad_accum": data.ga, "seq_len": int(data.dataset[0]["input_ids"].numel()),
        "samples": len(data.dataset),
        "memory_method": run.mem_method, "startup_s": time.time() - run.t_start,
        "startup_phases_s": run.startup_phases_s, "time": time.time(),
        "init_peak_bytes": run.init_peak, "memory_steps": args.memory_steps, "torch_threads": torch.get_num_threads(),
        # the backend asked for (None: DeepSpeed's default) and the one the process group really runs
        "dist_backend_requested": args.dist_backend, "dist_backend": torch.distributed.get_backend(),
        "finetune": args.finetune.to_dict(), "trainable_params": trainable_count(run.engine.module),
        # what DeepSpeed built from the config: its ZeRO optimizer's class (ZenFlowZeroOptimizer, SuperOffload's, ...)
        "zero_optimizer": type(run.engine.optimizer).__name__,
    })
    return metrics


def data_stream(data: Data, epoch: int, batch_in_epoch: int):
    """(epoch, micro batches read in it, batch) from the position on, across epoch boundaries, without end."""
    e, b = epoch, batch_in_epoch
    while True:
        data.sampler.set_epoch(e)
        data.sampler.start_index = min(b * data.mb, data.sampler.num_samples)
        for batch in data.loader:
            b += 1
            yield e, b, batch
        e, b = e + 1, 0


def client_state(run: Run, data: Data, e: int, b: int) -> dict:
    """What a checkpoint holds beside the engine's state: the data position after (e, b) and every rank's RNG streams
    (a collective: all ranks gather them)."""
    from deepspeed import comm as dist

    rngs = [None] * run.world
    dist.all_gather_object(rngs, _rng_state())
    if b >= data.micro_per_epoch:
        e, b = e + 1, 0
    dp = run.layout.data_parallel
    return {"zerokit": {"epoch": e, "batch_in_epoch": b, "rng": rngs, "seed": run.args.seed, "world_size": run.world,
                        "data_parallel": dp, "micro_batch": data.mb, "samples_in_epoch": b * data.mb * dp}}


def save_checkpoint(run: Run, data: Data, step: int, e: int, b: int) -> None:
    """checkpoints/step{N} on every rank, then (rank 0, after a barrier) its shape and the latest marker."""
    from deepspeed import comm as dist

    tag = tag_for_step(step)
    # LoRA: the frozen base is rebuilt from its source on resume, so checkpoints leave it out, as the HF Trainer saves a
    # peft model's (Trainer._save_checkpoint: save_checkpoint(exclude_frozen_parameters=True)); else each would hold
    # the whole base, twice at ZeRO-2/3 (module state + DeepSpeed's frozen_param_fragments).
    # A --freeze run keeps them: its final weights are the whole model (ZeRO-3's zero_to_fp32 reads them).
    run.engine.save_checkpoint(str(run.ckpt_dir), tag=tag, client_state=client_state(run, data, e, b),
                               save_latest=False, exclude_frozen_parameters=run.args.finetune.uses_lora)
    _crash_hook("checkpoint", step, run.rank)
    dist.barrier()  # every rank has finished writing its part
    if run.rank == 0:  # what wrote it, for a resume on another world size (launching/checkpoints.py read_shape)
        layout = run.layout
        write_shape(run.ckpt_dir / tag, run.world, data.mb, data.ga, run.stage, run.precision,
                    layout.tensor_parallel, layout.sequence_parallel, layout.pipeline_parallel)
        write_latest(run.ckpt_dir, tag)
    dist.barrier()


def forward_loss(run: Run, batch: dict):
    """(loss, outputs) of a micro batch: the model's own loss (HF's mean over real tokens), or with SP or a tiled loss
    the same mean computed here (the model then returns no loss: it gets no labels)."""
    import torch

    from zerokit.launching import parallel

    engine, layout, head_switch = run.engine, run.layout, run.head_switch
    if layout.sequence_parallel == 1 and head_switch is None:
        out_ = engine(**batch)
        return out_.loss, out_
    if layout.sequence_parallel > 1:
        part = parallel.sp_shard(batch, layout)
        shift = part.pop("shift_labels")
    else:
        part = {k: v for k, v in batch.items() if k != "labels"}
        shift = parallel.shift_labels_of(batch)
    out_ = engine(**part, use_cache=False)
    if head_switch is not None:  # out_.logits is the final hidden state: the head returned its input
        total, good = parallel.tiled_causal_lm_loss(head_switch, out_.logits, shift, run.vocab)
    else:
        logits = out_.logits
        total = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), shift.view(-1),
                                                  ignore_index=-100, reduction="sum")
        good = (shift != -100).sum()
    if run.sp_group is not None:
        return parallel.sp_group_loss(total, good, run.sp_group), out_
    return total / good.clamp(min=1), out_


def real_tokens(batch: dict) -> int:
    """A micro batch's real tokens: padding (attention mask 0) is computed but is no data; prompt tokens count."""
    mask = batch.get("attention_mask")
    return int(batch["input_ids"].numel() if mask is None else mask.sum())


def train_loop(run: Run, data: Data, pos: Position, metrics: MetricsLog) -> LoopResult:
    """The optimizer steps from the position to data.total_steps: a step record each, the CPU meter stopped after
    memory_steps, progress on rank 0, the crash hook, a checkpoint every save_every; then the final checkpoint."""
    import contextlib

    import torch

    from deepspeed import comm as dist

    from zerokit.launching import ckpt_offload

    args, engine, layout, phases = run.args, run.engine, run.layout, run.phases
    ga, total_steps, world = data.ga, data.total_steps, run.world
    it = data_stream(data, pos.epoch, pos.batch_in_epoch)
    step = engine.global_steps
    last_saved = step if pos.resumed_from else -1
    peak_alloc = 0
    step_times: list[float] = []
    steps_run = 0  # optimizer steps of this run: a resumed run meters its own first steps (memory_steps)
    train_t0 = time.time()
    e_cur, b_cur = pos.epoch, pos.batch_in_epoch
    # one checkpoint-offload context for the run, entered per micro batch (launching/ckpt_offload.py: its side stream
    # and its pinned host buffers are reused, where a fresh one each micro batch left the last one's blocks cached)
    offload = ckpt_offload.offload_context(run.on_cuda) if args.checkpoint_offload else contextlib.nullcontext()
    while step < total_steps:
        metered = phases.active and not run.on_cuda
        phases.new_step()
        t0 = time.perf_counter()
        loss_sum, tokens = 0.0, 0
        offloaded: dict = {}
        if layout.pipeline_parallel > 1:
            # the pipeline engine pulls the step's ga micro-batches itself (first and last stages); every rank reads
            # them from its stream, so the data position stays the same on every rank
            micro = []
            for _ in range(ga):
                e_cur, b_cur, batch = next(it)
                micro.append((batch["input_ids"].to(engine.device), batch["labels"].to(engine.device)))
                tokens += real_tokens(batch)
            loss_ = phases.run("step", lambda: engine.train_batch(data_iter=iter(micro)))
            loss_sum, out_ = float(loss_.detach().float()) * ga, None
        else:
            for _ in range(ga):
                e_cur, b_cur, batch = next(it)
                batch = {k: v.to(engine.device) for k, v in batch.items()}
                # checkpoint offload: the checkpointed layer inputs go to host memory in forward and come back for the
                # recompute; the context spans forward and backward (launching/ckpt_offload.py)
                with offload:
                    # out_ (the model's outputs, with its logits) lives until the next micro batch replaces it, as in a
                    # loop that keeps `outputs = model(**batch)`: the memory model counts those logits
                    # (memory.phase_terms logits_output)
                    loss_, out_ = phases.run("forward", lambda: forward_loss(run, batch))
                    phases.run("backward", lambda: engine.backward(loss_))
                if args.checkpoint_offload:
                    ckpt_offload.add_stats(offloaded, offload)
                phases.run("step", engine.step)
                loss_sum += float(loss_.detach().float())
                tokens += real_tokens(batch)
        step = engine.global_steps
        step_time = time.perf_counter() - t0
        local_loss = loss_sum / ga
        red = torch.tensor([local_loss, float(tokens)], dtype=torch.float64, device=engine.device)
        dist.all_reduce(red)
        # every rank of a TP or SP group read the same samples and reports its group's loss
        loss, global_tokens = float(red[0]) / world, int(red[1]) // layout.model_parallel
        step_times.append(step_time)
        rec = {
            "event": "step", "step": step, "loss": loss, "local_loss": local_loss, "step_time": step_time,
            "tokens": tokens, "tokens_per_s": tokens / step_time, "global_tokens_per_s": global_tokens / step_time,
            "epoch": e_cur, "batch_in_epoch": b_cur, "attempt": run.attempt, "run_id": run.run_id,
            "lr": engine.get_lr()[0] if engine.get_lr() else None,
            "memory_method": run.mem_method, "time": time.time(), "metered": metered,
        }
        if args.checkpoint_offload:  # what went through the offload path this step, and came back
            rec["checkpoint_offload"] = offloaded
        if args.compile != "off":  # frames dynamo compiled so far: 0 while the step ran eager (compile_engine)
            from torch._dynamo.utils import counters

            rec["compiled_frames"] = int(counters["frames"].get("ok", 0))
        rec.update(phases.step_fields())  # this step's peak per phase (forward, backward, step), the run's so far
        peak_alloc = max(peak_alloc, rec.get("peak_allocated_bytes", 0))
        metrics.write(rec)
        if engine.monitor.enabled:  # --report-to: the ds_config's tensorboard / wandb / csv_monitor blocks
            write_step_events(run, rec)
        steps_run += 1
        if args.memory_steps and not run.on_cuda and phases.active and steps_run >= args.memory_steps:
            phases.stop()
            run.meter = None
            if run.compile_pending:
                compile_engine(run)
        if run.rank == 0 and (step % args.log_every == 0 or step == total_steps):
            avg = sum(step_times[-10:]) / len(step_times[-10:])
            print(f"step {step}/{total_steps}  loss {loss:.4f}  {global_tokens / step_time:,.0f} tok/s  "
                  f"{step_time:.2f} s/step  ETA {_fmt_eta(avg * (total_steps - step))}", flush=True)
        _crash_hook("step", step, run.rank)
        if args.save_every and step % args.save_every == 0 and step < total_steps:
            save_checkpoint(run, data, step, e_cur, b_cur)
            last_saved = step

    train_time = time.time() - train_t0
    # the final checkpoint (resumable, and ZeRO-3's export reads it)
    if last_saved != step and not args.no_save:
        save_checkpoint(run, data, step, e_cur, b_cur)
    return LoopResult(step, train_time, peak_alloc, (it, batch, loss_, out_) if steps_run else (it,))


def write_step_events(run: Run, rec: dict) -> None:
    """A step's figures through DeepSpeed's own monitor (engine.monitor.write_events, which writes on rank 0 only), as
    the engine logs its learning rate at every optimizer step: tagged Train/Samples/* at engine.global_samples
    (DeepSpeedEngine.step writes "Train/Samples/lr" there), so every curve shares DeepSpeed's x-axis and W&B's step
    only grows. Loss and tokens/s are the job's (reduced in train_loop); peak memory the largest rank's running peak
    (a MAX all-reduce: every rank takes part, the monitor's blocks are the same config on every rank)."""
    import torch

    from deepspeed import comm as dist

    engine = run.engine
    peak = torch.tensor([float(rec.get("peak_allocated_bytes") or 0)], dtype=torch.float64, device=engine.device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    at = engine.global_samples
    events = [("Train/Samples/loss", rec["loss"], at), ("Train/Samples/step_time_s", rec["step_time"], at),
              ("Train/Samples/tokens_per_s", rec["global_tokens_per_s"], at)]
    if float(peak[0]) > 0:  # no meter (--no-memory-meter), or the CPU meter stopped before any step: no curve
        events.append(("Train/Samples/peak_memory_MiB", float(peak[0]) / 2**20, at))
    engine.monitor.write_events(events)


def close_trackers(run: Run) -> None:
    """--report-to, at the end: the run's predicted-vs-measured figures (report.run_report.report_scalars of the
    metrics every rank has closed, against the prediction `zerokit launch` wrote to launch.json) through the monitor at
    the last step, then the trackers closed on rank 0. Closed here because the rank leaves by os._exit
    (core/process.finish_rank), which runs no atexit hook: wandb's run would stay unfinished (wandb.finish writes
    its exit record), and DeepSpeed never closes its SummaryWriter."""
    monitor = run.engine.monitor
    if not monitor.enabled:
        return
    from deepspeed import comm as dist

    dist.barrier()  # every rank's end record is written (finish): the figures read them all
    if run.rank != 0:
        return
    at = run.engine.global_samples
    monitor.write_events([(tag, value, at) for tag, value in final_figures(run.out)])
    tb = monitor.tb_monitor
    if tb is not None and tb.summary_writer is not None:
        tb.summary_writer.close()
    if monitor.wandb_monitor is not None:
        import wandb

        wandb.finish()


def final_figures(out: Path) -> list[tuple[str, float]]:
    """(tag, value) of the run report's predicted, measured and ratio figures; measured only when no launch.json holds
    a prediction (ranks started without `zerokit launch`, or from an --sbatch script, which writes none)."""
    from zerokit.report.run_dir import launch_record
    from zerokit.report.run_report import build_report, read_metrics, report_scalars, summarize_metrics

    prediction = (launch_record(out) or {}).get("prediction")
    return report_scalars(build_report(prediction, summarize_metrics(read_metrics(out))))


def export(run: Run, step: int) -> None:
    """final/ (export_final's weights, or a LoRA's export_adapter) unless --no-save; every rank meets at a barrier."""
    from deepspeed import comm as dist

    args = run.args
    final_tag = tag_for_step(step)
    if not args.no_save:
        if args.finetune.uses_lora:
            export_adapter(run.engine, run.out, run.stage, run.bf16, run.rank, args, run.base_src)
        elif run.layout.pipeline_parallel > 1:
            from zerokit.launching.pipeline import export_pipeline

            export_pipeline(run.engine, run.hf_model, run.out / FINAL_SUBDIR, run.layout.data_rank == 0, run.rank,
                            lambda dest: _copy_tokenizer(args, dest))
        else:
            export_final(run.engine, run.out, run.ckpt_dir, final_tag, run.stage, run.bf16, run.rank, args)
    dist.barrier()


def finish(run: Run, metrics: MetricsLog, trained: LoopResult) -> None:
    """The end record, the meter stopped, the metrics closed, rank 0's last line."""
    import torch

    end = {"event": "end", "rank": run.rank, "step": trained.step, "attempt": run.attempt, "run_id": run.run_id,
           "train_s": trained.train_time, "total_s": time.time() - run.t_start, "peak_allocated_bytes": trained.peak_alloc,
           "memory_method": run.mem_method, "time": time.time()}
    if run.on_cuda:
        end["peak_reserved_bytes"] = max(int(run.phases.reserved), int(torch.cuda.max_memory_reserved()))
    if run.meter is not None:
        try:
            run.meter.stop()
        except Exception:
            pass
    metrics.write(end)
    metrics.close()
    if run.rank == 0:
        kept = f"nothing saved ({flag('no-save')})" if run.args.no_save else f"final weights in {run.out / FINAL_SUBDIR}"
        print(f"done: {trained.step} steps in {trained.train_time:.1f} s; {kept}",
              flush=True)


def main(args: RankOptions) -> int:
    """One rank's run, step by step; 0, or EXIT_INVALID when the config is refused before any process group."""
    t_start = time.time()
    run = configure(args, t_start)
    if run is None:
        return EXIT_INVALID
    setup_process(run)
    run.startup_phases_s["setup"] = time.time() - t_start
    run.base_src = base_source(args, run.out, run.rank) if args.finetune.uses_lora else None
    model = build_model_for(run)
    run.startup_phases_s["model"] = time.time() - t_start - sum(run.startup_phases_s.values())
    make_engine(run, model)
    run.startup_phases_s["engine"] = time.time() - t_start - sum(run.startup_phases_s.values())
    data = make_data(args, run.layout.data_parallel, run.layout.data_rank, run.engine.train_micro_batch_size_per_gpu(),
                     run.engine.gradient_accumulation_steps())
    pos = resume_position(run, data)
    metrics = start_metrics(run, data, pos)
    trained = train_loop(run, data, pos, metrics)
    export(run, trained.step)
    finish(run, metrics, trained)
    close_trackers(run)
    return 0


def _export_zero3_fp32(ckpt_dir: Path, tag: str, dest: Path) -> None:
    """Consolidate a ZeRO-3 checkpoint (zero_to_fp32) into dest/model.safetensors.

    Tied weights (GPT-2's lm_head = wte) come back from zero_to_fp32 as one shared tensor under two
    names, which safetensors refuses; keep the first name, as save_pretrained does: from_pretrained
    ties the other back from the config.
    """
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from safetensors.torch import save_file

    state = get_fp32_state_dict_from_zero_checkpoint(str(ckpt_dir), tag=tag)
    seen, unique = set(), {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key not in seen:
            seen.add(key)
            unique[name] = t.contiguous()
    save_file(unique, str(dest / "model.safetensors"), metadata={"format": "pt"})


def export_final(engine, out: Path, ckpt_dir: Path, tag: str, stage: int, bf16: bool, rank: int, args) -> None:
    """Rank 0 writes out/final atomically (final.tmp -> final)."""
    from deepspeed import comm as dist

    final, tmp = out / FINAL_SUBDIR, out / f".{FINAL_SUBDIR}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    module = engine.module
    if stage == 3:
        if rank == 0:
            _export_zero3_fp32(ckpt_dir, tag, tmp)
            module.config.save_pretrained(str(tmp))
    elif engine.autotp_size() > 1:
        # AutoTP: every rank holds a slice of each Linear; DeepSpeed gathers them layer by layer on every rank and
        # hands rank 0 the whole state dict (engine._replace_module_consolidated_state_dict, which
        # _consolidated_16bit_state_dict picks when autotp_size > 1)
        state = engine._consolidated_16bit_state_dict()
        if rank == 0:
            module.save_pretrained(str(tmp), state_dict=state, safe_serialization=True)
    elif rank == 0:
        module.save_pretrained(str(tmp), safe_serialization=True)  # bf16 run: the bf16 module weights
    if rank == 0:
        _copy_tokenizer(args, tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)


def _copy_tokenizer(args, dest: Path) -> None:
    try:
        from zerokit.spec.resolve import resolve_model

        src = args.tokenizer or resolve_model(args.model).tokenizer
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(src).save_pretrained(str(dest))
    except Exception as e:  # weights matter more than the tokenizer copy
        print(f"warning: tokenizer not copied to {dest.name}/: {e}", file=sys.stderr)


def _adapter_state(module, stage: int, rank: int) -> dict:
    """The trainable (adapter) parameters by their module names, whole, as CPU tensors on rank 0 ({} elsewhere).
    ZeRO-3 partitions them (or keeps them whole below stage3_param_persistence_threshold, still as ZeRO
    parameters): every rank enters deepspeed.zero.GatheredParameters (a collective); modifier_rank=None gathers
    read-only, as peft's own warning for ZeRO-3 saves asks (peft utils/save_and_load.py). Adapters are small by
    design, so all are gathered at once."""
    from contextlib import nullcontext

    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    ctx = nullcontext()
    if stage == 3:
        import deepspeed

        ctx = deepspeed.zero.GatheredParameters([p for _, p in named], modifier_rank=None)
    with ctx:
        return {n: p.detach().to("cpu", copy=True) for n, p in named} if rank == 0 else {}


def export_adapter(engine, out: Path, stage: int, bf16: bool, rank: int, args, base_src: str) -> None:
    """Rank 0 writes out/final atomically: peft's PeftModel.save_pretrained with the gathered adapter state (it keeps
    the lora_ keys and drops the adapter name: get_peft_model_state_dict), the tokenizer, and with --merge
    final/merged. The adapter is in the module's dtype (bf16 for a bf16 run, as export_final's 16-bit weights)."""
    from deepspeed import comm as dist

    final, tmp = out / FINAL_SUBDIR, out / f".{FINAL_SUBDIR}.tmp"
    state = _adapter_state(engine.module, stage, rank)
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        engine.module.save_pretrained(str(tmp), state_dict=state, safe_serialization=True)
        _copy_tokenizer(args, tmp)
        if args.merge:
            # the ZeRO-3 run's HfDeepSpeedConfig (Run.keep_alive) would make from_pretrained build the merge's base
            # under deepspeed.zero.Init, a collective that rank 0 alone enters: it hangs. The engine needs it no more
            # (transformers is_deepspeed_zero3_enabled reads the weak reference this clears)
            from transformers.integrations.deepspeed import unset_hf_deepspeed_config

            unset_hf_deepspeed_config()
            merge_adapter(base_src, tmp, tmp / MERGED_SUBDIR, args.finetune, bf16)
            _copy_tokenizer(args, tmp / MERGED_SUBDIR)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    dist.barrier()


def merge_adapter(base_src: str, adapter_dir: Path, dest: Path, finetune: Finetune, bf16: bool) -> None:
    """--merge, on rank 0 alone: the base rebuilt in fp32, the saved adapter loaded over it (peft
    PeftModel.from_pretrained) and folded in (merge_and_unload: W + (alpha/r) B A), saved with save_pretrained.

    QLoRA: the adapter was trained against the 4-bit weights, so it is merged into those weights dequantized (the
    base loaded 4-bit exactly as in training, then transformers' dequantize(), integrations.bitsandbytes
    dequantize_and_replace: Linear4bit -> Linear holding bnb's dequantize_4bit output), not into a requantized base
    (peft's Linear4bit.merge requantizes: lossy) nor into the original weights (not what was trained). The merged
    model then computes what base + adapter computed in training (fp32 compute: to rounding). Saved in bf16 for a
    bf16 run, as export_final saves its weights."""
    import torch
    from peft import PeftModel
    from transformers import AutoConfig

    cls = _causal_lm_class(AutoConfig.from_pretrained(base_src))
    if finetune.mode == "qlora":
        # on the CPU even beside a GPU: the dequantized fp32 base is 8x the 4-bit one that trained there, and
        # bitsandbytes (>= 0.45) dequantizes on the CPU as well
        base = cls.from_pretrained(base_src, quantization_config=bnb_config(finetune, torch.float32), device_map="cpu",
                                   dtype=torch.float32)
        base = base.dequantize(dtype=torch.float32)
    else:
        base = cls.from_pretrained(base_src, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    if bf16:
        merged = merged.to(torch.bfloat16)
    merged.save_pretrained(str(dest), safe_serialization=True)


if __name__ == "__main__":  # `python -m zerokit.launching.train RUN/rank_options.json`, on every rank
    from zerokit.core.process import finish_rank

    # this module runs once, as __main__: nothing in zerokit imports zerokit.launching.train (tests/test_layers.py)
    _opts = RankOptions.load(options_file_from_argv(sys.argv[1:]), attempt=_env_int("ZEROKIT_ATTEMPT") or 0)
    # metrics closed, checkpoints and final/ behind the last barrier: process groups destroyed, then out without
    # the interpreter's teardown (zerokit.core.process says why). An exception above propagates with its traceback.
    finish_rank(main(_opts))
