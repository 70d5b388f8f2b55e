"""Render a ZeroSetup into a DeepSpeed ds_config from the Jinja2 templates in templates/.

Two profiles, one template each (the shared blocks are the partials templates/_*.j2):
- "deepspeed": for a plain `deepspeed.initialize` script; every value concrete.
- "hf": for the HF Trainer / accelerate; "auto" on exactly the keys the Trainer fills.
`render --profile accelerate` writes the hf profile's config and, beside it, an accelerate config that points at it
(render_accelerate_config, templates/accelerate_config.yaml.j2).

Only jinja2 is needed here: no torch, no deepspeed.
"""

from __future__ import annotations

import json
import math

from zerokit.core.errors import ZerokitError
from zerokit.core.options import flag
from zerokit.core.resources import template_environment
from zerokit.spec.hardware import Cluster
from zerokit.spec.features import ZENFLOW
from zerokit.spec.model import ModelSpec
from zerokit.spec.optimizer import ADAMW, optimizer_named
from zerokit.spec.setup import Workload, ZeroKnobs, ZeroSetup, steps_per_epoch

PROFILES = ("deepspeed", "hf")
TEMPLATE_NAMES = {profile: f"ds_config.{profile}.json.j2" for profile in PROFILES}


def _total_steps(total_steps, workload, global_batch):
    if total_steps is not None:
        if int(total_steps) != total_steps or total_steps < 1:
            raise ZerokitError(f"total steps must be a positive whole number, got {total_steps}")
        return int(total_steps)
    if workload is not None and workload.samples:
        return math.ceil(steps_per_epoch(workload.samples, global_batch) * workload.epochs)
    return None


def render_ds_config(
    setup: ZeroSetup,
    cluster: Cluster,
    model: ModelSpec | None,
    workload: Workload | None = None,
    profile: str = "deepspeed",
    knobs: ZeroKnobs | None = None,
    lr: float = 2e-5,
    weight_decay=0.0,
    warmup_steps=0,
    total_steps=None,
    gradient_clipping=1.0,
    steps_per_print=10,
) -> dict:
    """The ds_config dict for `setup` on `cluster`, rendered from the profile's template.

    knobs None: the HF integration's hidden-size buckets (ZeroKnobs.for_hidden_size); in the hf profile those
    bucket keys are then left "auto" for the Trainer to fill with the same values. Explicit knobs are written
    as given in both profiles (so the memory model prices what runs).
    total_steps None: taken from the workload (samples x epochs) when it has samples; the deepspeed profile
    then uses WarmupDecayLR, or WarmupLR (constant after warm-up) when the length is unknown.
    """
    if profile not in PROFILES:
        raise ZerokitError(f"unknown config profile {profile!r}: use one of {', '.join(PROFILES)}")
    acc = cluster.accelerator
    if not acc.supports(setup.precision):
        raise ZerokitError(
            f"{acc.name} does not support {setup.precision}: use one of {', '.join(acc.precisions)}"
        )
    uses_nvme = "nvme" in (setup.offload_optimizer, setup.offload_param)
    if uses_nvme and not cluster.nvme_path:
        raise ZerokitError(f"NVMe offload needs a path on the NVMe drive: give {flag('nvme-path')} DIR")
    world = cluster.world_size
    model_parallel = setup.parallelism.model_parallel
    if world % model_parallel:
        raise ZerokitError(f"{model_parallel} model-parallel ranks do not divide the {world} GPUs: choose degrees that "
                           "divide the GPUs per node")
    replicas = setup.data_parallel(world)  # a TP or SP group trains on one batch
    samples_per_step = setup.micro_batch_size * setup.gradient_accumulation_steps * replicas
    # train_batch_size as DeepSpeed checks it (runtime/config.py _batch_assertion: micro x accumulation x its
    # world_size): world / sp under Ulysses (sequence_parallel_size in the config, or the SP mpu); under AutoTP the
    # full world, because deepspeed.initialize builds DeepSpeedConfig before the engine makes the TP groups (no mpu
    # yet), so the figure counts each TP group's one batch tp times; with pipeline stages deepspeed.initialize hands
    # the PipelineModule's mpu over, and the check counts its data-parallel ranks, world / stages (pipe/engine.py)
    train_batch = (setup.micro_batch_size * setup.gradient_accumulation_steps
                   * (world // (setup.sequence_parallel * setup.pipeline_parallel)))
    if workload is not None and workload.global_batch is not None and workload.global_batch != samples_per_step:
        raise ZerokitError(
            f"global batch {workload.global_batch} != micro batch {setup.micro_batch_size} x accumulation "
            f"{setup.gradient_accumulation_steps} x {replicas} data-parallel replicas = {samples_per_step}: change the "
            "accumulation or the global batch"
        )
    if warmup_steps < 0:
        raise ZerokitError(f"warmup steps must be 0 or more, got {warmup_steps}")
    if not lr > 0:
        raise ZerokitError(f"learning rate must be positive, got {lr}")
    total = _total_steps(total_steps, workload, samples_per_step)
    optimizer = optimizer_named(knobs.optimizer) if knobs is not None else ADAMW
    if optimizer.ds_type is None:
        raise ZerokitError(f"{optimizer.label} is the training script's own optimizer (HF Trainer --optim "
                           f"{optimizer.client}), not one a ds_config's optimizer block builds: render with a DeepSpeed "
                           "optimizer and drop the block for the script's")
    context = {
        "setup": setup,
        "knobs": knobs or (ZeroKnobs.for_model(model) if model else ZeroKnobs()),
        "zenflow": ZENFLOW,
        "knobs_auto": knobs is None,
        # QLoRA's threshold (ZeroKnobs.for_model) is written as a number even for the HF Trainer, which would fill
        # "auto" with 10 h and keep small packed 4-bit weights whole on every rank
        "persistence_auto": knobs is None and not (model is not None and model.trained.finetune_mode == "qlora"),
        "train_batch_size": train_batch,
        "gradient_clipping": gradient_clipping,
        "steps_per_print": steps_per_print,
        "lr": lr,
        "weight_decay": weight_decay,
        # DeepSpeed >= 0.19.6 rejects warmup_num_steps <= 0 (lr_schedules.WarmupLR); the HF Trainer clamps to 1 too.
        "warmup_num_steps": max(1, int(warmup_steps)),
        "total_steps": total,
        # CPU-only machines: DeepSpeed's FusedAdam is a slow JIT build, so use torch.optim.AdamW. Not with optimizer
        # offload: torch_adam wins over DeepSpeedCPUAdam in engine.get_optimizer_configuration, which is the
        # optimizer offload is built for (ZeRO-3's offload fast path requires it).
        "optimizer": optimizer,
        "torch_adam": acc.is_cpu and setup.offload_optimizer == "none" and optimizer.on_cpu == "adamw_torch",
        "nvme_path": cluster.nvme_path,
        "aio": uses_nvme,
    }
    text = template_environment().get_template(TEMPLATE_NAMES[profile]).render(**context)
    try:
        rendered = json.loads(text)
    except json.JSONDecodeError as e:  # a template bug, not a user error
        raise RuntimeError(f"template {TEMPLATE_NAMES[profile]} rendered invalid JSON ({e}):\n{text}") from e
    if setup.checkpoint_offload:
        # where DeepSpeed reads it: activation_checkpointing.cpu_checkpointing (runtime/activation_checkpointing/
        # config.py), applied by deepspeed.checkpointing.checkpoint, which a script calls after
        # deepspeed.checkpointing.configure(deepspeed_config=...). HF models checkpoint through torch.utils.checkpoint
        # instead: zerokit's loop reads this key and offloads their layer inputs with DeepSpeed's
        # CheckpointHiddenStatesOffload (launching/ckpt_offload.py); `check` reads it as checkpointing with offload.
        rendered["activation_checkpointing"] = {"partition_activations": False, "cpu_checkpointing": True}
    return rendered


ACCELERATE_TEMPLATE = "accelerate_config.yaml.j2"


def render_accelerate_config(setup: ZeroSetup, cluster: Cluster, ds_config_path: str, yaml_name: str) -> str:
    """An accelerate config (YAML) that launches `setup` on `cluster` with the ds_config at ds_config_path: what
    `accelerate config` would write for DeepSpeed with a config file (accelerate's ClusterConfig reads it back,
    tests/test_render.py). mixed_precision follows the setup: accelerate fills the ds_config's "auto" precision
    from it (its DeepSpeedPlugin)."""
    return template_environment(keep_trailing_newline=True).get_template(ACCELERATE_TEMPLATE).render(
        label=setup.label, yaml_name=yaml_name, ds_config_path=str(ds_config_path), zero3=setup.zero_stage == 3,
        mixed_precision={"bf16": "bf16", "fp16": "fp16"}.get(setup.precision, "no"), num_machines=cluster.nodes,
        num_processes=cluster.world_size, use_cpu=cluster.accelerator.is_cpu)


def write_json_atomic(path, obj) -> None:
    """Write obj as indented JSON atomically (zerokit.core.fsutil.atomic_write_text)."""
    from zerokit.core.fsutil import atomic_write_text

    try:
        atomic_write_text(path, json.dumps(obj, indent=2) + "\n")
    except OSError as e:
        raise ZerokitError(f"cannot write {path}: {e.strerror}: choose a writable path") from None
