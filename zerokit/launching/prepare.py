"""`zerokit launch`, before anything runs: a typed LaunchRequest becomes a frozen LaunchPlan.

Order: validate everything (model, data, tokenizer, hardware, hostfile, config, fit) before the output
directory exists. Each step is a small function; prepare_launch() runs them in order and writes nothing.
Raises ZerokitError (one line) on bad input; a setup that does not fit prints its breakdown to stderr first.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from zerokit.core.errors import EXIT_DOES_NOT_FIT, ZerokitError
from zerokit.core.options import SEQ_LEN_MAX, flag
from zerokit.core.quiet import verbose
from zerokit.config import trackers as trackers_mod
from zerokit.estimate.memory import DEFAULT_MEMORY_FRACTION
from zerokit.launching.checkpoints import (
    CKPT_SUBDIR,
    Resize,
    check_resize_parallelism,
    detect_resize,
    held_accumulation,
    read_latest,
    read_shape,
)
from zerokit.launching.command import LaunchSpec, validate
from zerokit.launching import k8s, learn, user_script
from zerokit.launching.rank_options import RANK_OPTIONS_FILE, RankOptions
from zerokit.launching.probes import check_hosts_reachable, cuda_devices, deepspeed_bin, is_local
from zerokit.measure.ranks import free_port
from zerokit.report.run_dir import launch_record
from zerokit.spec.finetune import Finetune
from zerokit.spec.hardware import Cluster, HardwareOptions, local_gpus_in_catalog
from zerokit.spec.resolve import ResolvedModel, resolve_model
from zerokit.spec.setup import Workload, optimizer_steps

DEFAULT_SEQ_LEN = 512  # at most; the model's maximum positions when smaller


@dataclass(frozen=True)
class LaunchRequest:
    """What the user asked `zerokit launch` for (zerokit/cli/launch.py builds it from the command line)."""

    model: str
    hardware: HardwareOptions = HardwareOptions()
    data: str | None = None  # None: the bundled tiny corpus
    tokenizer: str | None = None  # None: the model's own (ResolvedModel.tokenizer)
    data_format: str | None = None  # text | chat | instruction; None: from the columns (launching/data_sources.py)
    packing: bool | None = None  # None: on for text, off for chat and instruction (launching/data.py)
    data_split: str | None = None  # a hub or saved dataset's split; None: train
    data_config: str | None = None  # a hub dataset's configuration
    config: str | None = None  # a ds_config.json to use (checked); None: plan one
    pins: dict = field(default_factory=dict)  # setup dimensions pinned for the planner (planner.PIN_KEYS)
    memory_fraction: float = DEFAULT_MEMORY_FRACTION
    output_dir: str | None = None  # default runs/<model>-<time>
    steps: int | None = None
    epochs: float | None = None
    save_every: int | None = None  # None: 10 checkpoints when max_restarts > 0, else only the last
    resume: bool = False
    max_restarts: int = 0
    seq_len: int | None = None  # default min(DEFAULT_SEQ_LEN, the model's maximum positions)
    global_batch: int | None = None
    lr: float | None = None  # default 2e-5 for pretrained weights, 1e-3 for a random-init model
    warmup_steps: int | None = None  # default 1/10 of the run
    seed: int = 1234
    master_port: int | None = None
    launcher: str | None = None  # pdsh | openmpi | mpich | slurm; default pdsh when the hostfile names other hosts
    master_addr: str | None = None
    sbatch: str | None = None  # write a Slurm batch script here instead of running
    time_limit: str = "04:00:00"
    partition: str | None = None
    k8s: str | None = None  # write a Kubeflow PyTorchJob manifest here instead of running (launching/k8s.py)
    k8s_image: str | None = None  # --k8s: the pods' container image
    k8s_volume: str | None = None  # --k8s: CLAIM:PATH, the PersistentVolumeClaim holding the run directory
    gpus_per_pod: int | None = None  # --k8s: ranks per pod; None: --gpus-per-node (a pod per node)
    dry_run: bool = False  # print the command, start nothing
    # the user's own script (`zerokit launch ... -- python train.py ARGS`); empty: zerokit's own loop
    script_command: tuple[str, ...] = ()
    samples: int | None = None  # the script's training samples per epoch, for the total-time prediction
    profile: str | None = None  # ds_config profile for the script: hf ("auto", the Trainer fills) | deepspeed
    # what trains (--finetune, --lora-*, --freeze): the plan and the fit count the trainable parameters; zerokit's
    # loop applies it in the ranks; a user's script applies it itself (it only sizes the plan then)
    finetune: Finetune = Finetune()
    merge: bool = False  # LoRA/QLoRA: also write final/merged (the adapter merged into the base weights)
    no_save: bool = False  # write no checkpoint and no final weights (zerokit's loop)
    report_to: tuple[str, ...] = ()  # --report-to: tensorboard, wandb, csv (config/trackers.py); () or none: none
    report_dir: str | None = None  # where the trackers write; None: the run directory


@dataclass(frozen=True, eq=False)
class LaunchPlan:
    """Everything validated: what a run, a dry run or an sbatch script needs. Nothing is written yet."""

    request: LaunchRequest
    model: ResolvedModel
    cluster: Cluster
    spec: Any  # spec.model.ModelSpec
    files: list  # the data files
    tokenizer: str
    tokens: Any  # numpy int32 [samples, seq_len]; None when the user's script brings its own data
    total_tokens: int
    seq_len: int
    ds_config: dict
    evaluation: Any  # plan.planner.Evaluation of the setup that runs
    steps: int | None  # None: a user's script whose length zerokit was not told (--steps / --samples)
    save_every: int
    out: Path  # as the user named it
    out_abs: Path
    launcher: str  # local | pdsh | openmpi | mpich | slurm
    multi_node: bool
    port: int
    env: dict
    deepspeed_bin: str
    prediction: dict
    deepspeed_checked: bool = True  # False: the ranks put ds_config to DeepSpeed's config classes first (--check-config)
    script: Any = None  # launch.user_script.UserCommand: the user's own script instead of zerokit's loop
    data: Any = None  # launch.data.TokenizedData: tokens and, where masked or padded, labels and attention mask
    resize: Resize | None = None  # --resume of a checkpoint written by another number of ranks (held_global_batch)
    trackers: tuple[str, ...] = ()  # --report-to, checked (config/trackers.py); their blocks are in ds_config
    report_dir: Path | None = None  # where they write (absolute); None without trackers
    report_args: tuple[str, ...] = ()  # a user's HF Trainer script: its --report_to (config/trackers.trainer_report_to)

    @property
    def tracker_locations(self) -> dict:
        """tracker -> where its curves are (the run report names them)."""
        return trackers_mod.locations(self.trackers, self.report_dir, trackers_mod.job_name(self.out_abs))

    @property
    def uses_own_loop(self) -> bool:
        return self.script is None

    @property
    def setup(self):
        return self.evaluation.setup

    @property
    def samples(self) -> int | None:
        return self.request.samples if self.tokens is None else int(self.tokens.shape[0])

    @property
    def cfg_path(self) -> Path:
        return self.out_abs / "ds_config.json"

    @property
    def tokens_path(self) -> Path:
        return self.out_abs / "data" / "tokens.npy"

    @property
    def rank_options_path(self) -> Path:
        return self.out_abs / RANK_OPTIONS_FILE

    def rank_options(self, resume: bool) -> RankOptions:
        """What zerokit's loop is told on every rank (written to rank_options_path by execute.write_run_directory)."""
        return RankOptions(
            model=self.model.source, tokens=str(self.tokens_path), tokenizer=self.tokenizer, ds_config=str(self.cfg_path),
            output_dir=str(self.out_abs), steps=self.steps, save_every=self.save_every, seed=self.request.seed,
            gradient_checkpointing=self.setup.activation_checkpointing,
            checkpoint_offload=self.setup.checkpoint_offload, tiled_loss=self.setup.tiled_loss,
            tiled_mlp=self.setup.tiled_mlp, compile=self.setup.compile, check_config=not self.deepspeed_checked,
            dist_backend=self.cluster.dist_backend,  # deepspeed.init_distributed(dist_backend=...) in the ranks
            finetune=self.request.finetune,  # the ranks freeze / wrap in peft / quantize (train.py wrap_for_finetune)
            merge=self.request.merge, resume=resume, no_save=self.request.no_save)

    def script_args(self, resume: bool) -> list[str]:
        """The rank entrypoint's one argument, its options file (a restart resumes by itself: RankOptions.load), or
        the user's script and its arguments (the same on a restart: the script resumes from its own checkpoints)."""
        if self.script is not None:
            return self.script.runner_args(self.placeholder_values()) + list(self.report_args)
        return [str(self.rank_options_path)]

    def placeholder_values(self) -> dict:
        """What {ds_config}, {micro_batch}, ... in the user's script arguments stand for (user_script.PLACEHOLDERS)."""
        setup = self.setup
        return {"ds_config": self.cfg_path, "output_dir": self.out_abs, "micro_batch": setup.micro_batch_size,
                "grad_accum": setup.gradient_accumulation_steps, "seq_len": self.seq_len, "steps": self.steps,
                "world_size": self.cluster.world_size, "precision": setup.precision}

    def launch_spec(self, resume: bool) -> LaunchSpec:
        """What launching/command.py turns into the deepspeed command (a fresh run, or a resume)."""
        req, cluster = self.request, self.cluster
        common = dict(num_gpus=cluster.gpus_per_node, master_port=self.port, script_args=self.script_args(resume),
                      env=self.env, deepspeed_bin=self.deepspeed_bin)
        if self.script is not None:
            common["module"] = user_script.MODULE
        hostfile = req.hardware.hostfile
        if self.launcher == "slurm":
            # the sbatch template replaces hostfile and master address with the allocation's
            return LaunchSpec(launcher="slurm", num_nodes=cluster.nodes,
                              hostfile=str(Path(hostfile).resolve() if hostfile else self.out_abs / "hostfile"),
                              master_addr=req.master_addr or "localhost", **common)
        if self.multi_node:
            return LaunchSpec(launcher=self.launcher, num_nodes=cluster.nodes, hostfile=str(Path(hostfile).resolve()),
                              master_addr=req.master_addr, **common)
        return LaunchSpec(launcher="local", **common)


# ----------------------------------------------------------------------------------------------
# the steps


def resolve_cluster(req: LaunchRequest) -> tuple[Cluster, dict, bool]:
    """(cluster, hosts from the hostfile, whether other hosts take part). On a machine without CUDA the ranks
    are CPU processes (gloo): the default accelerator is then `cpu`, else the local GPUs."""
    hw = req.hardware
    n_cuda, cuda_mib = cuda_devices()
    gpus_per_node = hw.gpus_per_node if hw.gpus_per_node is not None else (None if hw.hostfile else n_cuda or 1)
    gpu = hw.gpu or (None if n_cuda else "cpu")
    if gpu is None and hw.gpu_memory is None and local_gpus_in_catalog():
        gpu = "auto"  # the local GPUs' kind from nvidia-smi: their TFLOP/s and links, not the default's
    gpu_memory = hw.gpu_memory or (None if gpu else (f"{cuda_mib}MiB" if cuda_mib else None))
    cluster = replace(hw, gpu=gpu, gpu_memory=gpu_memory, gpus_per_node=gpus_per_node).build()
    hosts = dict(cluster.hosts) if cluster.hosts else {}
    multi_node = bool(hosts) and not (len(hosts) == 1 and is_local(next(iter(hosts))))
    if cluster.nodes > 1 and not hosts and not (req.sbatch or req.k8s or req.launcher == "slurm"):
        raise ZerokitError(f"{flag('nodes')} {cluster.nodes} needs {flag('hostfile')} naming the nodes: give one")
    return cluster, hosts, multi_node


def check_dist_backend_installed(req: LaunchRequest, cluster: Cluster, ranks_here: bool) -> None:
    """--dist-backend, before any rank starts: one line naming what to install when this torch cannot run it (the
    ranks run this machine's software; on other hosts, the same is assumed). Imports torch only when --dist-backend
    is given: DeepSpeed's own default needs no check, and a cold launch should not pay the torch import for nothing
    (see deepspeed_check_in_ranks)."""
    backend = cluster.dist_backend
    if backend is None:
        return
    if req.script_command:
        raise ZerokitError(f"{flag('dist-backend')} {backend} is passed to zerokit's own training loop; your script "
                           f"chooses its backend itself (the HF Trainer: --ddp_backend): drop {flag('dist-backend')}")
    import importlib.util

    import torch.distributed as dist

    def installed(*modules: str) -> bool:
        return any(importlib.util.find_spec(m) is not None for m in modules)  # finds, imports nothing

    if backend == "nccl" and not (dist.is_nccl_available() and (cuda_devices()[0] or not ranks_here)):
        raise ZerokitError(f"{flag('dist-backend')} nccl needs NVIDIA GPUs (and a CUDA build of torch), which this "
                           "machine lacks: use gloo on CPU")
    if backend == "gloo" and not dist.is_gloo_available():
        raise ZerokitError(f"{flag('dist-backend')} gloo: this torch was built without gloo: install torch from PyPI")
    if backend == "mpi" and not dist.is_mpi_available():
        raise ZerokitError(f"{flag('dist-backend')} mpi: PyPI's torch is built without MPI: build torch from source "
                           "with MPI, or use gloo")
    if backend == "ccl" and not installed("oneccl_bindings_for_pytorch"):
        raise ZerokitError(f"{flag('dist-backend')} ccl needs Intel's oneCCL bindings for torch: pip install "
                           "oneccl_bind_pt (the build matching your torch), or use gloo")
    if backend == "hccl" and not installed("torch_npu", "habana_frameworks"):
        raise ZerokitError(f"{flag('dist-backend')} hccl needs Ascend's torch_npu (pip install torch_npu) or Gaudi's "
                           "habana_frameworks: install the one for your accelerator, or use gloo")


def check_cuda_arch_list(cluster: Cluster, ranks_here: bool) -> None:
    """TORCH_CUDA_ARCH_LIST with an architecture variant (9.0a, 10.0a: valid for torch, and what Hopper builds of
    FlashAttention-3 ask for) that the installed DeepSpeed's JIT op builder cannot parse: its
    CUDAOpBuilder.compute_capability_args sorts the list with int() on each part, so every rank fails building
    FusedAdam (or any CUDA op) with "invalid literal for int() with base 10: '0a'" (seen on an H200 with DeepSpeed
    0.19.8; deepspeedai/DeepSpeed#7589, the fix in #8619). Asked of DeepSpeed's own builder, so a DeepSpeed that parses
    variants passes; deepspeed is imported only when the list has a variant."""
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if cluster.accelerator.is_cpu or not ranks_here or not re.search(r"\d\.\d+[a-zA-Z]", archs):
        return
    from zerokit.core.quiet import library_output

    with library_output():
        try:
            from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder  # the CUDA builder, whatever the accelerator
        except ImportError:
            return  # DeepSpeed's absence is reported where the ranks start
        builder = FusedAdamBuilder()
        builder.jit_mode, builder._jit_arch_list = True, archs
        try:
            builder.compute_capability_args()
        except ValueError:
            plain = ";".join(re.sub(r"(\d+\.\d+)[a-zA-Z]+", r"\1", a) for a in re.split(r"[;\s]+", archs) if a)
            raise ZerokitError(f"TORCH_CUDA_ARCH_LIST={archs!r} names an architecture variant that this DeepSpeed's JIT "
                               f"op builder cannot parse (compute_capability_args; DeepSpeed#8619), so every rank would "
                               f"fail building its CUDA ops: export TORCH_CUDA_ARCH_LIST='{plain}' for the run") from None
        except Exception:  # anything else is the build's own to report, in the ranks
            return


def check_no_save(req: LaunchRequest) -> None:
    """--no-save keeps nothing: no checkpoint to restart from or resume, no adapter to merge."""
    if not req.no_save:
        return
    kept = [f for f, v in ((flag("save-every"), req.save_every), (flag("max-restarts"), req.max_restarts or None),
                           (flag("merge"), req.merge or None), (flag("resume"), req.resume or None)) if v is not None]
    if kept:
        raise ZerokitError(f"{flag('no-save')} writes no checkpoint or weights, and {', '.join(kept)} "
                           f"need{'s' * (len(kept) == 1)} them: drop one or the other")


def check_finetune(req: LaunchRequest, model: ResolvedModel, spec):
    """The ModelSpec as fine-tuned (spec.finetune.trainable_split: peft's own count on the meta device), after the
    checks that need no counting: --merge only merges LoRA adapters, and only zerokit's loop writes them; QLoRA needs
    bitsandbytes importable. With the user's script the fine-tune only sizes the plan: the script builds its model."""
    finetune = req.finetune
    if req.merge and not finetune.uses_lora:
        raise ZerokitError(f"{flag('merge')} merges LoRA adapters into the base weights: it needs {flag('finetune')} "
                           "lora or qlora")
    if req.merge and req.script_command:
        raise ZerokitError(f"{flag('merge')} is for zerokit's own training loop; your script saves its own model: drop "
                           f"{flag('merge')} (peft: model.merge_and_unload() in your script)")
    if finetune.mode == "qlora":
        # bitsandbytes logs a warning at import on AVX512-BF16 CPUs (no `kernels` package for its fused CPU gemm)
        from zerokit.core.quiet import library_output

        try:  # imported, not just found: a broken install (its native library) fails here, not in every rank
            with library_output():
                import bitsandbytes  # noqa: F401 - the import is the check
        except Exception as exc:  # ImportError, or the native library's own error
            why = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
            raise ZerokitError(f"{flag('finetune')} qlora quantizes the base to 4-bit with bitsandbytes, which does "
                               f"not import here ({why}): pip install bitsandbytes") from None
    if finetune.is_full:
        return spec
    from zerokit.spec.finetune import finetuned_spec

    return finetuned_spec(spec, str(model.config_file()), finetune)


def check_resume_finetune(req: LaunchRequest) -> None:
    """--resume trains what the run trained: a LoRA checkpoint holds adapters and no base (launching/train.py saves with
    exclude_frozen_parameters), a full one every weight; DeepSpeed loads neither into the other. The run's launch.json
    says what it was; one without the key was written before zerokit's loop could fine-tune anything but every weight."""
    if not (req.resume and req.output_dir):
        return
    record = launch_record(req.output_dir)
    if record is None:
        return  # no record (a run started by hand, an --sbatch run not yet started): nothing to judge by
    was = record.get("finetune", {"mode": "full"})
    if isinstance(was, dict) and "mode" in was:
        try:
            before = Finetune.from_dict(was)
        except (ZerokitError, TypeError):
            return
        if before != req.finetune:
            a, b = before.to_dict(), req.finetune.to_dict()
            changed = ", ".join(f"{k} {b.get(k)} (the run's: {a.get(k)})" for k in sorted(a.keys() | b.keys())
                                if a.get(k) != b.get(k))
            raise ZerokitError(f"{flag('resume')}: the run in {req.output_dir} trained {before.label}; this launch "
                               f"asks for {changed}: resume with the run's {flag('finetune')}, --lora-* and "
                               f"{flag('freeze')} options")


def check_quant_storage(finetune: Finetune, precision: str) -> None:
    """QLoRA's packed 4-bit weights stored in a floating dtype other than the run's would be cast by DeepSpeed (engine.
    _cast_module_mixed_precision casts every float parameter to bf16/fp16, bytes and all), corrupting them."""
    storage = finetune.bnb_4bit_quant_storage
    if finetune.mode == "qlora" and storage != "uint8" and precision in ("bf16", "fp16") and storage != precision:
        raise ZerokitError(f"{flag('bnb-4bit-quant-storage')} {storage} in a {precision} run: DeepSpeed casts every "
                           f"floating-point parameter to {precision}, which would corrupt the packed 4-bit weights: "
                           f"use {flag('bnb-4bit-quant-storage')} uint8 or {precision}")


def choose_seq_len(req: LaunchRequest, spec) -> int:
    """--seq-len, or DEFAULT_SEQ_LEN capped at the model's positions; past a learned position table refused, past
    rotary positions one warning line (ModelSpec.check_seq_len)."""
    if req.seq_len == SEQ_LEN_MAX:
        raise ZerokitError(f"{flag('seq-len')} {SEQ_LEN_MAX} is answered by plan and check: run `zerokit plan ... "
                           f"{flag('seq-len')} {SEQ_LEN_MAX}`, then launch with the length it gives")
    seq_len = req.seq_len or min(DEFAULT_SEQ_LEN, spec.max_positions or DEFAULT_SEQ_LEN)
    warning = spec.check_seq_len(seq_len)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    return seq_len


def tokenize_data(req: LaunchRequest, model: ResolvedModel, config: dict, spec, seq_len: int):
    """(files, tokenizer, launch.data.TokenizedData): the empty-data and vocabulary checks need the tokens."""
    from zerokit.launching import data as zdata

    source = zdata.resolve_source(req.data, req.data_split, req.data_config)
    tokenizer = req.tokenizer or model.tokenizer
    data = zdata.tokenize(source, tokenizer, seq_len, req.data_format, req.packing)
    arr = data.tokens
    vocab = config.get("vocab_size") or spec.vocab_size
    if vocab and int(arr.max()) >= int(vocab):
        raise ZerokitError(f"tokenizer {tokenizer} produces token id {int(arr.max())} but the model's vocabulary has "
                           f"{vocab} entries: use the model's own tokenizer")
    return list(source.files), tokenizer, data


def deepspeed_check_in_ranks(req: LaunchRequest, multi_node: bool) -> bool:
    """Whether DeepSpeed's config classes may judge --config in the ranks rather than here.

    Why: they need DeepSpeed imported, which imports torch (2 s here on 2 cores, a cold launch's largest cost);
    the ranks import it anyway and check before anything else (launching/train.py config_accepted). Only where a
    refusal can end as cleanly as a refusal here: a fresh local run, whose new run directory execute.run removes
    again with the one-line reason. A dry run, an sbatch script, a k8s manifest, a resume, a multi-node launch or an
    existing --output-dir are checked here first, as is a verdict already cached (config/check.py)."""
    return bool(req.config) and not req.script_command and not (req.dry_run or req.sbatch or req.k8s or req.resume
                                     or multi_node or req.launcher not in (None, "local")
                                     or (req.output_dir is not None and Path(req.output_dir).exists()))


def held_global_batch(req: LaunchRequest, resize: Resize | None) -> int | None:
    """The global batch a resume on another world size keeps: the checkpoint's (checkpoints.SHAPE_FILE, else the
    run's launch.json), so the optimizer steps, the LR schedule and the data position mean what they meant."""
    if resize is None:
        return None
    held = resize.old.global_batch
    if held is None:  # a checkpoint written before SHAPE_FILE: the run's own record of its setup
        try:
            setup = (launch_record(req.output_dir) or {})["setup"]
            held = setup["micro_batch_size"] * setup["gradient_accumulation_steps"] * resize.old.world_size
        except (KeyError, TypeError):
            raise ZerokitError(f"{flag('resume')}: checkpoint {resize.old.tag} was written by {resize.old.world_size} "
                               f"ranks but neither it nor {req.output_dir}/launch.json gives its global batch: resume "
                               f"on {resize.old.world_size} ranks") from None
    if req.global_batch is not None and req.global_batch != held:
        raise ZerokitError(f"{flag('global-batch')} {req.global_batch} differs from the checkpoint's global batch "
                           f"{held}; a resume holds it: drop {flag('global-batch')}")
    return held


def _hold_in_config(ds_config: dict, held: int, resize: Resize, world: int) -> dict:
    """The user's micro batch stays; accumulation is re-derived for the new world size (DeepSpeed's
    _configure_train_batch_size: train_batch_size = micro x accumulation x world, its replicas under TP or SP)."""
    micro = ds_config.get("train_micro_batch_size_per_gpu")
    micro = micro if isinstance(micro, int) and not isinstance(micro, bool) else resize.old.micro_batch
    if not micro:
        raise ZerokitError(f"{flag('resume')} on another world size needs train_micro_batch_size_per_gpu in "
                           f"{flag('config')}: set it")
    from zerokit.config.read import parallelism_from_config

    par = parallelism_from_config(ds_config)
    check_resize_parallelism(resize, par.tensor_parallel, par.sequence_parallel)
    # the ranks of one TP or SP group read the same samples: the batch counts data-parallel replicas
    out = dict(ds_config, train_micro_batch_size_per_gpu=micro,
               gradient_accumulation_steps=held_accumulation(held, micro, par.data_parallel(world), par.model_parallel))
    if "train_batch_size" in out:
        out["train_batch_size"] = held
    return out


def choose_setup(req: LaunchRequest, model: ResolvedModel, spec, cluster: Cluster, samples: int | None, seq_len: int,
                 deepspeed_in_ranks: bool = False, profile: str = "deepspeed", resize: Resize | None = None):
    """(ds_config, evaluation, steps, deepspeed_checked): the user's --config checked, or the planner's choice
    rendered. A setup that does not fit prints its breakdown to stderr and raises (exit 1). With `resize` the
    checkpoint's global batch is held (held_global_batch) and the ranks load its universal checkpoint."""
    from zerokit.report.plan_text import format_check, format_plan

    pins, world = dict(req.pins), cluster.world_size
    held = held_global_batch(req, resize)
    if req.config:
        # what the script does beyond the config may be pinned with --config: checkpointing and ALST's tiling
        if pins.keys() - {"activation_checkpointing", "checkpoint_offload", "tiled_loss", "tiled_mlp", "compile"}:
            raise ZerokitError(f"{flag('stage')}/--offload-*/{flag('precision')}/{flag('micro-batch')}/"
                               f"{flag('grad-accum')}/{flag('tensor-parallel')}/{flag('sequence-parallel')}/"
                               f"{flag('hpz')} choose a setup for {flag('plan')}; with {flag('config')} the config "
                               f"decides: drop them or use {flag('plan')}")
        from zerokit.config.check import check_config
        from zerokit.config.auto import auto_keys
        from zerokit.config.read import load_config_file

        ds_config = load_config_file(req.config)
        if held is not None:
            ds_config = _with_universal_load(_hold_in_config(ds_config, held, resize, world), resize)
        result = check_config(ds_config, req.config, spec, cluster, Workload(seq_len=seq_len, samples=samples),
                              activation_checkpointing=bool(pins.get("activation_checkpointing")),
                              checkpoint_offload=bool(pins.get("checkpoint_offload")),
                              memory_fraction=req.memory_fraction,
                              # the ranks read the file itself: with "auto" in it, what was filled is checked here
                              deepspeed_now=not deepspeed_in_ranks or bool(auto_keys(ds_config)),
                              # a user's Trainer fills "auto" from its own arguments, unknown here: judge the largest
                              # micro batch that fits and the best precision, as `zerokit check` answers
                              answer_auto=bool(req.script_command),
                              tiled={**{k: bool(pins.get(k)) for k in ("tiled_loss", "tiled_mlp")},
                                     **({"compile": pins["compile"]} if "compile" in pins else {})})
        if not result.valid:
            if verbose():
                print(format_check(result), file=sys.stderr)
            raise ZerokitError(f"{req.config} is not a valid DeepSpeed config for {world} ranks: {result.problem()}")
        if result.evaluation is not None and not result.evaluation.fits:
            print(format_check(result), file=sys.stderr)
            raise ZerokitError(f"the setup in {req.config} does not fit: see the breakdown above (or try "
                               f"{flag('plan')})",
                               exit_code=EXIT_DOES_NOT_FIT)
        evaluation = result.evaluation
        # "auto" (an HF-style config for a user's Trainer script): the values the check judged
        micro, accum = (v if isinstance(v, int) and not isinstance(v, bool) else default for v, default in (
            (ds_config.get("train_micro_batch_size_per_gpu"), evaluation.setup.micro_batch_size),
            (ds_config.get("gradient_accumulation_steps"), evaluation.setup.gradient_accumulation_steps)))
        steps = _steps(samples, world, micro, accum, req)
        return ds_config, evaluation, steps, result.deepspeed_checked

    from zerokit.config.render import render_ds_config
    from zerokit.planning.planner import make_plan

    if held is not None:  # the checkpoint's stage and precision: its optimizer state only loads into the same kind
        pins.pop("gradient_accumulation_steps", None)  # re-derived for the new world size
        pins.update({k: v for k, v in (("zero_stage", resize.old.zero_stage), ("precision", resize.old.precision))
                     if v is not None})
        check_resize_parallelism(resize, pins.get("tensor_parallel", resize.old.tensor_parallel),
                                 pins.get("sequence_parallel", 1))
        if resize.old.tensor_parallel > 1:  # its AutoTP slices load only at their own degree
            pins.setdefault("tensor_parallel", resize.old.tensor_parallel)
    workload = Workload(seq_len=seq_len, global_batch=held or req.global_batch, samples=samples,
                        epochs=req.epochs or 1.0)
    plan = make_plan(spec, cluster, workload, pins, memory_fraction=req.memory_fraction)
    if not plan.fits or plan.best is None:
        print(format_plan(plan), file=sys.stderr)
        raise ZerokitError("no ZeRO setup fits this model on this hardware: see the breakdown above",
                           exit_code=EXIT_DOES_NOT_FIT)
    setup = plan.best.setup
    steps = _steps(samples, setup.data_parallel(world), setup.micro_batch_size, setup.gradient_accumulation_steps, req)
    lr = req.lr or (2e-5 if model.init == "weights" else 1e-3)
    warmup = req.warmup_steps if req.warmup_steps is not None else max(1, (steps or 10) // 10)
    ds_config = render_ds_config(setup, cluster, spec, workload, profile=profile, lr=lr, warmup_steps=warmup,
                                 total_steps=steps)
    if held is not None:
        ds_config = _with_universal_load(ds_config, resize)
    return ds_config, plan.best, steps, True  # the templates' output is held to DeepSpeed's classes in the tests


def _with_universal_load(ds_config: dict, resize: Resize) -> dict:
    """DeepSpeed's `checkpoint.load_universal` (runtime/config.py): the ranks load checkpoints/<tag>_universal
    (launching/train.py picks the tag). ZeRO-0 needs no conversion: its optimizer state is not partitioned."""
    if not resize.needs_conversion:
        return ds_config
    return dict(ds_config, checkpoint=dict(ds_config.get("checkpoint") or {}, load_universal=True))


def _steps(samples: int | None, world: int, micro: int, accum: int, req: LaunchRequest) -> int | None:
    """Optimizer steps of the run (spec.setup.optimizer_steps); None for a user's script given neither --steps nor
    --samples (its length is its own business: the report then predicts per step only)."""
    if samples is None and req.steps is None:
        return None
    return optimizer_steps(samples or 1, world, micro, accum, req.steps, req.epochs)


def check_user_script(req: LaunchRequest) -> "user_script.UserCommand":
    """The user's `-- python train.py ARGS`, checked: the script exists, gets the config, and none of zerokit's
    own-loop options were given (the script decides its data, checkpoints and learning rate)."""
    loop_only = [name for name, value in ((flag("data"), req.data), (flag("tokenizer"), req.tokenizer),
                                          (flag("save-every"), req.save_every), (flag("resume"), req.resume or None),
                                          (flag("lr"), req.lr), (flag("warmup-steps"), req.warmup_steps),
                                          (flag("data-format"), req.data_format), (flag("packing"), req.packing),
                                          (flag("data-split"), req.data_split), (flag("data-config"), req.data_config),
                                          (flag("no-save"), req.no_save or None))
                 if value is not None]
    if loop_only:
        raise ZerokitError(f"{', '.join(loop_only)} set zerokit's own training loop; your script decides them: drop them "
                           "(a restart reruns the script, which resumes from its own checkpoints)")
    cmd = user_script.parse_command(req.script_command)
    user_script.check_config_argument(cmd)
    if req.steps is None and req.samples is None and any("{steps}" in a for a in cmd.args):
        raise ZerokitError(f"{{steps}} in the script's arguments needs {flag('steps')} (or {flag('samples')}) on "
                           "zerokit launch")
    return cmd


def output_dir(req: LaunchRequest, data) -> Path:
    """The run directory, checked against --resume: a resumed run must exist with the same data."""
    out = Path(req.output_dir) if req.output_dir else Path("runs") / (
        f"{Path(req.model.rstrip('/')).name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and not out.is_dir():
        raise ZerokitError(f"{flag('output-dir')} {out} is a file: give a directory")
    ckpt = out / CKPT_SUBDIR
    if req.resume:
        if not read_latest(ckpt):
            raise ZerokitError(f"{flag('resume')}: {out} has no complete checkpoint (checkpoints/latest): drop "
                               f"{flag('resume')} to start fresh")
        if (out / "data" / "tokens.npy").is_file() and data is not None:
            from zerokit.launching.data import written_data_matches

            if not written_data_matches(out / "data", data):  # tokens, labels and attention masks alike
                raise ZerokitError(f"{flag('resume')}: the data or {flag('seq-len')} differ from the run in {out} (its "
                                   f"data position would point elsewhere): resume with the same {flag('data')}, "
                                   f"{flag('seq-len')}, {flag('data-format')} and {flag('packing')}")
    elif ckpt.is_dir() and any(ckpt.iterdir()):
        raise ZerokitError(f"{flag('output-dir')} {out} already holds checkpoints: pass {flag('resume')} to continue "
                           "it, or choose another directory")
    return out


def choose_launcher(req: LaunchRequest, hosts: dict, multi_node: bool) -> tuple[str, bool]:
    """(launcher, multi_node): local, DeepSpeed's pdsh / openmpi / mpich runners, or slurm (--sbatch)."""
    launcher = req.launcher or ("pdsh" if multi_node else "local")
    if req.sbatch:
        from zerokit.core.fsutil import check_writable_file

        check_writable_file(req.sbatch, f"{flag('sbatch')} {req.sbatch}")  # missing folders: created (mkdir -p)
        launcher = "slurm"  # the script runs DeepSpeed's slurm launcher inside the allocation
    elif launcher == "slurm" and not req.master_addr:
        raise ZerokitError(f"{flag('launcher')} slurm runs inside a Slurm allocation and needs {flag('master-addr')}: "
                           f"or use {flag('sbatch')} FILE to get a batch script that finds it")
    if launcher in ("pdsh", "openmpi", "mpich"):
        if not hosts:
            raise ZerokitError(f"{flag('launcher')} {launcher} needs {flag('hostfile')} naming the nodes: give one")
        check_hosts_reachable(list(hosts), need_pdsh=launcher == "pdsh")
    return launcher, multi_node or launcher != "local"


def rank_environment(cluster: Cluster, multi_node: bool) -> dict:
    """Variables every rank needs beyond the launcher's own: this package importable, CPU ranks' threads."""
    pkg_root = str(Path(__file__).resolve().parents[2])
    env = {"PYTHONPATH": os.pathsep.join(x for x in (pkg_root, os.environ.get("PYTHONPATH", "")) if x)}
    if cluster.accelerator.is_cpu:
        env["DS_ACCELERATOR"] = "cpu"
        if "OMP_NUM_THREADS" not in os.environ:
            # torch gives every rank all cores; N ranks on N x fewer cores each fight for them
            # (measured: a tiny ZeRO-0 step 5.8 s instead of 0.05 s with 2 ranks on 2 cores)
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // cluster.gpus_per_node))
    for k in ("TORCH_EXTENSIONS_DIR", "HF_HOME", "HF_HUB_OFFLINE"):
        if os.environ.get(k) and multi_node:
            env[k] = os.environ[k]
    return env


def check_pipeline(req: LaunchRequest, stages: int, script, resize) -> None:
    """Pipeline stages run in zerokit's own loop (launching/pipeline.py's PipelineModule); a pipeline checkpoint holds
    one file per layer and its stage's optimizer partitions, and resumes at the GPU count and stage count that wrote
    it (its zerokit.json records both: checkpoints.write_shape)."""
    shape = read_shape(Path(req.output_dir) / CKPT_SUBDIR) if req.resume and req.output_dir and script is None else None
    if shape is not None and shape.pipeline_parallel != stages:
        raise ZerokitError(f"the checkpoint in {req.output_dir} was written with {shape.pipeline_parallel} pipeline "
                           f"stage(s) and this run has {stages}: a checkpoint's optimizer partitions belong to its "
                           f"stages, so resume with {flag('pipeline-parallel')} {shape.pipeline_parallel}; to change "
                           f"the stages, start a new run from the exported model ({flag('model')} "
                           f"{Path(req.output_dir) / 'final'} once a run has finished)")
    if stages <= 1:
        return
    if script is not None:
        raise ZerokitError(f"{flag('pipeline-parallel')} trains zerokit's own PipelineModule of the model; a script of "
                           "your own builds its own deepspeed.pipe.PipelineModule and takes the ds_config's pipeline "
                           f"block: drop {flag('pipeline-parallel')} (render the config with it instead)")
    if resize is not None:
        raise ZerokitError(f"the checkpoint in {req.output_dir} was written by {resize.old.world_size} ranks; a pipeline "
                           f"checkpoint resumes at the GPU count that wrote it: launch on {resize.old.world_size} GPUs")


def prepare_launch(req: LaunchRequest) -> LaunchPlan:
    """All validation and planning, in order; writes nothing. Raises ZerokitError."""
    from zerokit.report.run_report import prediction_from_evaluation
    from zerokit.spec.model import load_model_spec

    k8s.check_request(req)  # --k8s and its options, before anything slow
    check_no_save(req)
    model = resolve_model(req.model)
    config = model.read_config()
    cluster, hosts, multi_node = resolve_cluster(req)
    check_dist_backend_installed(req, cluster, ranks_here=not (multi_node or req.sbatch or req.k8s))
    check_cuda_arch_list(cluster, ranks_here=not (multi_node or req.sbatch or req.k8s))
    spec = load_model_spec(model)
    seq_len = choose_seq_len(req, spec)
    script = check_user_script(req) if req.script_command else None
    spec = check_finetune(req, model, spec)
    check_resume_finetune(req)
    trackers = trackers_mod.trackers_from(req.report_to)
    trackers_mod.check_installed(trackers)
    report_args = tuple(trackers_mod.trainer_report_to(trackers, script.args)) if (
        script is not None and script.uses_hf_trainer) else ()
    if script is None:
        files, tokenizer, data = tokenize_data(req, model, config, spec, seq_len)
        tokens, total_tokens = data.tokens, data.total_tokens
        samples, profile = int(tokens.shape[0]), "deepspeed"
    else:  # the script brings its own data; an HF Trainer script gets the "auto" profile the Trainer fills
        files, tokenizer, tokens, total_tokens, data = [], "", None, 0, None
        samples, profile = req.samples, req.profile or ("hf" if script.uses_hf_trainer else "deepspeed")
    # a checkpoint written by another number of ranks: converted by execute.write_run_directory, global batch held here
    resize = detect_resize(Path(req.output_dir) / CKPT_SUBDIR, cluster.world_size) if (
        req.resume and req.output_dir and script is None) else None
    check_pipeline(req, req.pins.get("pipeline_parallel", 1), script, resize)
    ds_config, evaluation, steps, deepspeed_checked = choose_setup(
        req, model, spec, cluster, samples, seq_len, deepspeed_check_in_ranks(req, multi_node), profile, resize)
    check_pipeline(req, evaluation.setup.pipeline_parallel, script, resize)  # a --config with a pipeline block too
    check_quant_storage(req.finetune, evaluation.setup.precision)
    save_every = 0 if script is not None else req.save_every if req.save_every is not None else (
        max(1, steps // 10) if req.max_restarts else 0)
    out = output_dir(req, data)
    report_dir = trackers_mod.report_dir_for(req.report_dir, out, trackers)
    if trackers:
        name = trackers_mod.job_name(out)
        if not report_args:  # zerokit's loop, or a deepspeed.initialize script: DeepSpeed's own monitor writes
            ds_config = trackers_mod.with_monitor(ds_config, trackers, report_dir, name)
    launcher, multi_node = choose_launcher(req, hosts, multi_node)
    env = rank_environment(cluster, multi_node)
    if script is not None:
        env["ZEROKIT_OUTPUT_DIR"] = str(out.resolve())  # where ZerokitCallback writes the metrics
    if trackers:
        env.update(trackers_mod.rank_env(trackers, report_dir, name, trainer=bool(report_args)))
    plan = LaunchPlan(
        request=req, model=model, cluster=cluster, spec=spec, files=files, tokenizer=tokenizer, tokens=tokens,
        total_tokens=total_tokens, seq_len=seq_len, ds_config=ds_config, evaluation=evaluation, steps=steps,
        save_every=save_every, out=out, out_abs=out.resolve(), launcher=launcher, multi_node=multi_node,
        port=req.master_port or free_port(), env=env, deepspeed_bin=deepspeed_bin(),
        prediction={**prediction_from_evaluation(evaluation, steps, cluster.time_source),
                    **learn.prediction_keys(cluster, spec, seq_len)}, deepspeed_checked=deepspeed_checked, script=script,
        data=data, resize=resize, trackers=trackers, report_dir=report_dir, report_args=report_args,
    )
    validate(plan.launch_spec(req.resume))  # the command's own checks (launching/command.py), now, not at run time
    if req.k8s:
        k8s.job(plan)  # the pods' paths, the GPUs per pod and the manifest's own checks, before anything is written
    return plan
