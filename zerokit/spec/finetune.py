"""What a fine-tune trains: every weight (full), LoRA adapters on a frozen base, or a full fine-tune with some
modules frozen (--freeze), and the exact parameter counts that follow from the real module shapes.

Why exact counts matter: DeepSpeed keeps gradients, the fp32 master copy and Adam's moments for trainable
parameters only, at every ZeRO stage (its optimizer drops requires_grad=False parameters even when they are
passed in: ../shared/reference/finetune-and-parallel-on-cpu.md, measured), while every weight, frozen or not,
is held in the training dtype. So a LoRA plan's model states are the base weights plus 16 x the adapters, not
18 x everything.

LoRA counts come from peft itself, run over the model built on the meta device (no weights): what peft will
build is what trains, fused MoE experts included; tests/test_finetune.py holds them equal to peft's count on
the real models and to the elements DeepSpeed's optimizer keeps state for in a real run.
--freeze PATTERN freezes every parameter whose full name contains PATTERN (or matches it as a glob when it has
*, ? or [): `embed_tokens`, `layers.0.`.
"""

from __future__ import annotations

import fnmatch
import warnings
from dataclasses import asdict, dataclass, replace
from typing import Literal

from zerokit.core.errors import ZerokitError
from zerokit.spec.model import ModelSpec

FINETUNE_MODES = ("full", "lora", "qlora")
# BitsAndBytesConfig(bnb_4bit_quant_storage=...): the dtype the packed 4-bit weights are stored in (uint8 packs two
# weights a byte; FSDP/ZeRO-3 recipes store them in the compute dtype so they shard like the other weights)
QUANT_STORAGE_DTYPES = ("uint8", "bf16", "fp16", "fp32")
ALL_LINEAR = "all-linear"  # peft's INCLUDE_LINEAR_LAYERS_SHORTHAND
DEFAULT_LORA_R = 16
DEFAULT_LORA_ALPHA = 8.0  # peft LoraConfig.lora_alpha's default (the scale is alpha / r)


@dataclass(frozen=True)
class Finetune:
    """How the model is fine-tuned, as the user asked (plan --finetune/--lora-*/--freeze)."""

    mode: Literal["full", "lora", "qlora"] = "full"
    lora_r: int = DEFAULT_LORA_R
    lora_alpha: float = DEFAULT_LORA_ALPHA
    lora_dropout: float = 0.0
    lora_targets: str = ALL_LINEAR  # "all-linear" or comma-separated module names
    freeze: tuple[str, ...] = ()  # parameter-name patterns frozen in a full fine-tune
    # QLoRA only (BitsAndBytesConfig): NF4 weights, double quantization of their absmax constants (the QLoRA paper's
    # setting, 0.127 instead of 0.5 bits per weight of constants; bitsandbytes' own default is off)
    bnb_4bit_use_double_quant: bool = True
    bnb_4bit_quant_storage: str = "uint8"

    def __post_init__(self):
        if self.mode not in FINETUNE_MODES:
            raise ZerokitError(f"--finetune must be one of {', '.join(FINETUNE_MODES)}, got {self.mode!r}")
        if self.lora_r < 1:
            raise ZerokitError(f"--lora-r must be at least 1, got {self.lora_r}: the adapter rank (16 is common)")
        if not 0 <= self.lora_dropout < 1:
            raise ZerokitError(f"--lora-dropout must be in [0, 1), got {self.lora_dropout}")
        if not self.lora_alpha > 0:
            raise ZerokitError(f"--lora-alpha must be positive, got {self.lora_alpha}")
        if not self.target_names and self.lora_targets != ALL_LINEAR:
            raise ZerokitError("--lora-targets is empty: give all-linear or module names such as q_proj,v_proj")
        if any(not p for p in self.freeze):
            raise ZerokitError("--freeze got an empty pattern: give a module-name pattern such as embed_tokens or layers.0.")
        if self.freeze and self.mode != "full":
            raise ZerokitError("--freeze applies to --finetune full: LoRA already freezes every base weight")
        if self.bnb_4bit_quant_storage not in QUANT_STORAGE_DTYPES:
            raise ZerokitError(f"--bnb-4bit-quant-storage must be one of {', '.join(QUANT_STORAGE_DTYPES)}, "
                               f"got {self.bnb_4bit_quant_storage!r}")

    @property
    def target_names(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in self.lora_targets.split(",") if t.strip()) if self.lora_targets != ALL_LINEAR else ()

    @property
    def is_full(self) -> bool:
        return self.mode == "full" and not self.freeze

    @property
    def uses_lora(self) -> bool:
        return self.mode in ("lora", "qlora")

    @property
    def label(self) -> str:
        """One phrase for plan text and reports."""
        if self.uses_lora:
            quant = (f", NF4 base{' + double quant' if self.bnb_4bit_use_double_quant else ''}"
                     f" stored as {self.bnb_4bit_quant_storage}" if self.mode == "qlora" else "")
            return f"{'QLoRA' if self.mode == 'qlora' else 'LoRA'} r={self.lora_r} on {self.lora_targets}{quant}"
        return f"full, frozen {', '.join(self.freeze)}" if self.freeze else "full"

    def to_dict(self) -> dict:
        """JSON (plan's choice.finetune, the ranks' --finetune-json): only the fields the mode uses."""
        d = asdict(self)
        d["freeze"] = list(self.freeze)
        if not self.uses_lora:
            for k in ("lora_r", "lora_alpha", "lora_dropout", "lora_targets"):
                d.pop(k)
        if self.mode != "qlora":
            for k in ("bnb_4bit_use_double_quant", "bnb_4bit_quant_storage"):
                d.pop(k)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Finetune":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if "freeze" in known:
            known["freeze"] = tuple(known["freeze"])
        return cls(**known)


@dataclass(frozen=True)
class TrainableSplit:
    """Exact parameter counts of the model as fine-tuned (tied weights once, as DeepSpeed and peft count)."""

    total_params: int  # base weights + adapters
    trainable_params: int
    adapter_params: int = 0
    adapted_modules: int = 0  # modules that got a LoRA adapter

    @property
    def frozen_params(self) -> int:
        return self.total_params - self.trainable_params


def _freeze_matches(pattern: str, name: str) -> bool:
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern in name


def freeze_split(params: list[tuple[str, int]], freeze: tuple[str, ...]) -> TrainableSplit:
    """A full fine-tune with the parameters [(name, numel)] (tied weights once) matching `freeze` frozen."""
    total = sum(n for _, n in params)
    for pat in freeze:
        if not any(_freeze_matches(pat, name) for name, _ in params):
            example = params[len(params) // 2][0] if params else "?"
            raise ZerokitError(f"--freeze {pat!r} matches no parameter (names look like {example!r}): "
                               "give part of a module name, e.g. embed_tokens or layers.0.")
    frozen = sum(n for name, n in params if any(_freeze_matches(p, name) for p in freeze))
    if frozen == total:
        raise ZerokitError(f"--freeze {' '.join(freeze)} freezes every parameter: nothing would train; narrow the patterns")
    return TrainableSplit(total, total - frozen)


def lora_split(model, finetune: Finetune) -> TrainableSplit:
    """peft's own LoRA model built over `model` (real or on the meta device), counted as peft counts it
    (PeftModel.get_nb_trainable_parameters). peft decides what `all-linear` and fused MoE experts get (its
    ParamWrapper adapts transformers 5's 3-D expert weights: Mixtral all-linear is 360M trainable, not the
    14M its attention Linears alone would give), so zerokit asks it rather than copying its rules."""
    try:
        from peft import LoraConfig, get_peft_model  # noqa: PLC0415
        from peft.tuners.tuners_utils import BaseTunerLayer  # noqa: PLC0415
    except ImportError:
        raise ZerokitError("--finetune lora counts the adapters with peft, which is not installed: "
                           "pip install 'zerokit[train]' (or pip install peft)") from None
    names = finetune.target_names
    cfg = LoraConfig(r=finetune.lora_r, lora_alpha=finetune.lora_alpha, lora_dropout=finetune.lora_dropout,
                     target_modules=list(names) if names else ALL_LINEAR)
    try:
        with warnings.catch_warnings():  # peft's notes on Conv1D fan_in_fan_out and the like: not the user's concern
            warnings.simplefilter("ignore")
            peft_model = get_peft_model(model, cfg)
    except ValueError as exc:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                         if type(m).__name__ in ("Linear", "Conv1D") and "." in n})
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ZerokitError(f"--lora-targets {finetune.lora_targets}: peft refused it ({first[:160]}); this model's "
                           f"Linear modules are named {', '.join(linear[:12])}") from None
    trainable, total = peft_model.get_nb_trainable_parameters()
    adapted = sum(1 for m in peft_model.modules() if isinstance(m, BaseTunerLayer))
    return TrainableSplit(int(total), int(trainable), int(trainable), adapted)


def measure_split(model, finetune: Finetune) -> TrainableSplit:
    """The counts for a built transformers model (real or on the meta device)."""
    if finetune.uses_lora:
        return lora_split(model, finetune)
    params = [(name, p.numel()) for name, p in model.named_parameters()]  # tied weights once
    if not finetune.freeze:
        total = sum(n for _, n in params)
        return TrainableSplit(total, total)
    return freeze_split(params, finetune.freeze)


def with_finetune(model: ModelSpec, split: TrainableSplit, mode: str = "full") -> ModelSpec:
    """The model as fine-tuned: every weight counted (adapters included), the trainable ones marked."""
    return replace(model, params=split.total_params, trainable_params=split.trainable_params, finetune_mode=mode)


def trainable_split(config_source: str, finetune: Finetune) -> TrainableSplit:
    """Build the causal LM from its config.json on the meta device (no weights) and count (imports torch and
    transformers: ~6 s on 2 cores; a full fine-tune without --freeze needs none of it)."""
    try:
        import torch  # noqa: PLC0415
        from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415
    except ImportError as exc:
        raise ZerokitError(f"--finetune {finetune.mode} and --freeze count the model's modules with torch and "
                           f"transformers ({exc.name} is missing): pip install 'zerokit[train]'") from None
    import transformers  # noqa: PLC0415

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        cfg = AutoConfig.from_pretrained(config_source)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
    except Exception as exc:  # noqa: BLE001  (an architecture transformers cannot build as a causal LM)
        raise ZerokitError(f"--finetune {finetune.mode}/--freeze: transformers cannot build {config_source} as a "
                           f"causal LM ({str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__})") from None
    finally:
        transformers.logging.set_verbosity(verbosity)
    return measure_split(model, finetune)
