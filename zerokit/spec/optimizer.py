"""The optimizers zerokit prices, one typed declaration each, and the registry every layer looks them up in.

An optimizer decides three things the memory and time models read: the state it keeps per trainable parameter (Adam's
two fp32 moments: 8 bytes), the temporaries its step makes of the partition it updates (the unfused torch AdamW: two
fp32 tensors, 8 bytes per parameter; fused kernels update in place: 0), and whether DeepSpeed builds it from the
ds_config's optimizer block (``"type"``) or the training script brings its own (the HF Trainer's ``--optim``; a
config without an optimizer block). ``ZeroKnobs.optimizer`` (spec/setup.py) holds the name of one of them:
estimate/memory.py prices its state and temporaries, estimate/timing.py its NVMe traffic, config/render.py writes its
``"type"``, and the config reader (config/setup.py optimizer_of) maps a ds_config's optimizer block or
``zerokit check --client-optimizer`` to it.

Adding an optimizer: declare it below (with its source) and, for a script's own optimizer, add its ``--optim`` name to
the ``client-optimizer`` choices in core/options.py (core cannot import this module; tests/test_optimizer.py holds the
two lists equal); tests/test_optimizer.py prices each declaration (state bytes x trainable parameters) and has
DeepSpeed parse a config of each DeepSpeed type.

The master weights (4 bytes) and the fp32 gradient partition (4 bytes in mixed precision) are DeepSpeed's, the same
for every optimizer (estimate/memory.py model_state_bytes_per_param).
"""

from __future__ import annotations

from dataclasses import dataclass

from zerokit.core.errors import ZerokitError
from zerokit.core.options import flag


@dataclass(frozen=True)
class Optimizer:
    name: str  # zerokit's name (ZeroKnobs.optimizer)
    label: str  # one phrase for messages
    state_bytes: int  # optimizer state per trainable parameter, bytes (Adam: m and v in fp32, 8)
    step_temporaries: int  # bytes per parameter of the partition it updates, alive during its step (0: in place)
    fused: bool  # one kernel over the flat partition, in place (no per-tensor temporaries)
    # the ds_config "optimizer.type" DeepSpeed builds it from (engine._configure_basic_optimizer; matched
    # case-insensitively); None: DeepSpeed has no such type, the script brings it
    ds_type: str | None
    ds_params: tuple[str, ...]  # the optimizer.params render writes for that type (its constructor's keywords)
    # the HF Trainer's --optim name when the script brings it (a config without an optimizer block); None: not one
    client: str | None
    cpu_offload: bool  # DeepSpeed has a CPU implementation used under offload_optimizer (DeepSpeedCPUAdam, ...CPULion)
    # what runs its step on a CPU-only machine without optimizer offload, when not itself (render writes torch_adam
    # there: FusedAdam is a CUDA kernel DeepSpeed would JIT-build)
    on_cpu: str | None
    source: str  # where the numbers come from


ADAMW = Optimizer(
    name="adamw", label="DeepSpeed AdamW (FusedAdam; DeepSpeedCPUAdam with offload)", state_bytes=8, step_temporaries=0,
    fused=True, ds_type="AdamW", ds_params=("lr", "betas", "eps", "weight_decay"), client=None, cpu_offload=True,
    on_cpu="adamw_torch",
    source="Loshchilov & Hutter 2019, Decoupled Weight Decay Regularization (exp_avg, exp_avg_sq); deepspeed/ops/adam/"
           "fused_adam.py FusedAdam (multi_tensor_adam, in place), cpu_adam.py DeepSpeedCPUAdam; DeepSpeed's estimator "
           "counts 12 bytes per parameter of master weights and moments (estimate_zero2_model_states_mem_needs)")
ADAMW_TORCH = Optimizer(
    name="adamw_torch", label="torch.optim.AdamW, unfused", state_bytes=8, step_temporaries=8, fused=False,
    ds_type=None, ds_params=(), client="adamw_torch", cpu_offload=False, on_cpu=None,
    source="torch/optim/adamw.py _single_tensor_adamw: exp_avg_sq.sqrt() then / bias_correction2_sqrt, two fp32 "
           "temporaries of what it updates (measured on CPU, tests/test_fp16_cpu.py; LLaMA-Factory#1221's OOM); a "
           "ds_config optimizer with \"torch_adam\": true builds it (engine._configure_basic_optimizer)")
ADAMW_TORCH_FUSED = Optimizer(
    name="adamw_torch_fused", label="torch.optim.AdamW(fused=True)", state_bytes=8, step_temporaries=0, fused=True,
    ds_type=None, ds_params=(), client="adamw_torch_fused", cpu_offload=False, on_cpu="adamw_torch",
    source="torch/optim/adamw.py _fused_adamw: torch._fused_adamw_ updates in place (CUDA; not measured on CPU, "
           "priced there as the unfused step, an upper bound); the HF Trainer's default --optim from torch 2.8 "
           "(transformers/training_args.py)")
LION = Optimizer(
    name="lion", label="DeepSpeed Lion (FusedLion; DeepSpeedCPULion with offload)", state_bytes=4, step_temporaries=0,
    fused=True, ds_type="Lion", ds_params=("lr", "betas", "weight_decay"), client=None, cpu_offload=True, on_cpu=None,
    source="Chen et al. 2023, Symbolic Discovery of Optimization Algorithms (arXiv:2302.06675): one momentum, "
           "exp_avg; deepspeed/ops/lion/fused_lion.py FusedLion (multi_tensor_lion, in place), cpu_lion.py "
           "DeepSpeedCPULion (both take lr, betas, weight_decay: no eps); runtime/config.py LION_OPTIMIZER = 'lion'")
ADAMW_BNB_8BIT = Optimizer(
    name="adamw_bnb_8bit", label="bitsandbytes AdamW8bit", state_bytes=2, step_temporaries=0, fused=True,
    ds_type=None, ds_params=(), client="adamw_bnb_8bit", cpu_offload=False, on_cpu=None,
    source="Dettmers et al. 2022, 8-bit Optimizers via Block-wise Quantization (arXiv:2110.02861): state1 and state2 "
           "in uint8 (bitsandbytes/optim/optimizer.py Optimizer2State.init_state), updated in place by one blockwise "
           "kernel; not counted: an fp32 absmax per 256-element block (+1.6%) and fp32 states for tensors under "
           "min_8bit_size 4,096 elements; the HF Trainer's --optim adamw_bnb_8bit")

OPTIMIZERS: dict[str, Optimizer] = {o.name: o for o in (ADAMW, ADAMW_TORCH, ADAMW_TORCH_FUSED, LION, ADAMW_BNB_8BIT)}
DEFAULT_OPTIMIZER = ADAMW.name  # what render writes and the planner prices
CLIENT_OPTIMIZERS: dict[str, Optimizer] = {o.client: o for o in OPTIMIZERS.values() if o.client}


def optimizer_named(name: str) -> Optimizer:
    """The declaration of ZeroKnobs.optimizer's value."""
    try:
        return OPTIMIZERS[name]
    except KeyError:
        raise ZerokitError(f"unknown optimizer {name!r}: zerokit prices {', '.join(OPTIMIZERS)}") from None


def step_optimizer(optimizer: Optimizer, on_cpu: bool) -> Optimizer:
    """What runs the step: on a CPU-only machine without offload, the declaration's on_cpu stand-in."""
    return OPTIMIZERS[optimizer.on_cpu] if on_cpu and optimizer.on_cpu else optimizer


def client_optimizer(client: str) -> Optimizer:
    """The optimizer a script brings, by its HF Trainer --optim name."""
    try:
        return CLIENT_OPTIMIZERS[client]
    except KeyError:
        raise ZerokitError(f"{flag('client-optimizer')} {client!r}: zerokit prices "
                           f"{', '.join(CLIENT_OPTIMIZERS)}") from None


def deepspeed_optimizer(ds_type: str) -> Optimizer | None:
    """The optimizer DeepSpeed builds for a ds_config's optimizer.type (case-insensitive, as runtime/config.py
    get_optimizer_name lowers it); None for a type zerokit has no declaration of."""
    t = str(ds_type).lower()
    if t == "adam":  # DeepSpeed's Adam: the same FusedAdam (adam_w_mode from the params), the same state
        return ADAMW
    return next((o for o in OPTIMIZERS.values() if o.ds_type and o.ds_type.lower() == t), None)
