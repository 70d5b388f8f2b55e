"""What a fine-tune trains: every weight (full), LoRA adapters on a frozen base, or a full fine-tune with some
modules frozen (--freeze), and the exact parameter counts that follow from the real module shapes.

Why exact counts matter: DeepSpeed keeps gradients, the fp32 master copy and Adam's moments for trainable
parameters only, at every ZeRO stage (its optimizer drops requires_grad=False parameters even when they are
passed in: stage_1_and_2.py and stage3.py; measured, docs/measured-on-cpu.md), while every weight, frozen or not,
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
from functools import lru_cache
from typing import Literal

from zerokit.core.errors import ZerokitError
from zerokit.core.options import flag
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
            raise ZerokitError(f"{flag('finetune')} must be one of {', '.join(FINETUNE_MODES)}, got {self.mode!r}")
        if self.lora_r < 1:
            raise ZerokitError(f"{flag('lora-r')} must be at least 1, got {self.lora_r}: the adapter rank (16 is "
                               "common)")
        if not 0 <= self.lora_dropout < 1:
            raise ZerokitError(f"{flag('lora-dropout')} must be in [0, 1), got {self.lora_dropout}")
        if not self.lora_alpha > 0:
            raise ZerokitError(f"{flag('lora-alpha')} must be positive, got {self.lora_alpha}")
        if not self.target_names and self.lora_targets != ALL_LINEAR:
            raise ZerokitError(f"{flag('lora-targets')} is empty: give all-linear or module names such as "
                               "q_proj,v_proj")
        if any(not p for p in self.freeze):
            raise ZerokitError(f"{flag('freeze')} got an empty pattern: give a module-name pattern such as "
                               "embed_tokens or layers.0.")
        if self.freeze and self.mode != "full":
            raise ZerokitError(f"{flag('freeze')} applies to {flag('finetune')} full: LoRA already freezes every base "
                               "weight")
        if self.bnb_4bit_quant_storage not in QUANT_STORAGE_DTYPES:
            raise ZerokitError(f"{flag('bnb-4bit-quant-storage')} must be one of {', '.join(QUANT_STORAGE_DTYPES)}, "
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
    # what the memory and time models need beyond the counts (read from the real module tree by module_layout; the
    # spec/trained.py Trained fields of the same names document them). None: not read (a full fine-tune needs none of it)
    layout: dict | None = None

    @property
    def frozen_params(self) -> int:
        return self.total_params - self.trainable_params


def _freeze_matches(pattern: str, name: str) -> bool:
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern in name


def is_frozen(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether --freeze PATTERN(s) freeze the parameter `name`: the one rule the plan counts with (freeze_split) and
    the ranks freeze with (launching/train.py wrap_for_finetune), so what is planned is what trains."""
    return any(_freeze_matches(p, name) for p in patterns)


def freeze_split(params: list[tuple[str, int]], freeze: tuple[str, ...]) -> TrainableSplit:
    """A full fine-tune with the parameters [(name, numel)] (tied weights once) matching `freeze` frozen."""
    total = sum(n for _, n in params)
    for pat in freeze:
        if not any(_freeze_matches(pat, name) for name, _ in params):
            example = params[len(params) // 2][0] if params else "?"
            raise ZerokitError(f"{flag('freeze')} {pat!r} matches no parameter (names look like {example!r}): "
                               "give part of a module name, e.g. embed_tokens or layers.0.")
    frozen = sum(n for name, n in params if any(_freeze_matches(p, name) for p in freeze))
    if frozen == total:
        raise ZerokitError(f"{flag('freeze')} {' '.join(freeze)} freezes every parameter: nothing would train; narrow "
                           "the patterns")
    return TrainableSplit(total, total - frozen)


def lora_split(model, finetune: Finetune) -> TrainableSplit:
    """peft's own LoRA model built over `model` (real or on the meta device), counted as peft counts it
    (PeftModel.get_nb_trainable_parameters). peft decides what `all-linear` and fused MoE experts get (its
    ParamWrapper adapts transformers 5's 3-D expert weights: Mixtral all-linear is 360M trainable, not the
    14M its attention Linears alone would give), so zerokit asks it rather than copying its rules."""
    try:
        from peft import get_peft_model
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:
        raise ZerokitError(f"{flag('finetune')} lora counts the adapters with peft, which is not installed: "
                           "pip install 'zerokit[train]' (or pip install peft)") from None
    cfg = lora_config(model, finetune)
    try:
        with warnings.catch_warnings():  # peft's notes on Conv1D fan_in_fan_out and the like: not the user's concern
            warnings.simplefilter("ignore")
            # low_cpu_mem_usage: peft creates the adapter weights on the meta device (no allocation, no kaiming init:
            # 13 of 20 s of a 70B plan's LoRA suggestion went to initialising ~100M adapter weights on the CPU)
            peft_model = get_peft_model(model, cfg, low_cpu_mem_usage=True)
    except ValueError as exc:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                         if type(m).__name__ in ("Linear", "Conv1D") and "." in n})
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ZerokitError(f"{flag('lora-targets')} {finetune.lora_targets}: peft refused it ({first[:160]}); this "
                           f"model's Linear modules are named {', '.join(linear[:12])}") from None
    trainable, total = peft_model.get_nb_trainable_parameters()
    adapted = sum(1 for m in peft_model.modules() if isinstance(m, BaseTunerLayer))
    return TrainableSplit(int(total), int(trainable), int(trainable), adapted)


def lora_config(model, finetune: Finetune):
    """peft's LoraConfig for `finetune` on `model`: the one plan counts with (lora_split) and the ranks train with
    (launching/train.py wrap_for_finetune). --lora-targets names go to target_modules, except a name that matches no module
    but a fused MoE parameter (transformers 5's experts.gate_up_proj / experts.down_proj, a router's gate.weight): peft
    adapts those only through target_parameters (its ParamWrapper, lora/layer.py), matching a parameter whose
    `module.param` name ends with the given one (tuners_utils.py BaseTuner._inject_parameters). all-linear stays
    peft's: it adapts Mixtral's and Qwen-MoE's experts itself (utils/transformers_weight_conversion.py
    _convert_peft_config_moe) and leaves other fused experts frozen."""
    from peft import LoraConfig

    names = finetune.target_names
    if not names:
        return LoraConfig(r=finetune.lora_r, lora_alpha=finetune.lora_alpha, lora_dropout=finetune.lora_dropout,
                          target_modules=ALL_LINEAR)
    modules = [n.replace(".base_layer", "") for n, _ in model.named_modules()]
    fused = [f"{n.replace('.base_layer', '')}.{pname}" for n, m in model.named_modules()
             for pname, _ in _moe_matmul_params(m)]

    def is_module(t: str) -> bool:  # peft's list matching: the whole name or its dotted suffix (check_target_key)
        return any(n == t or n.endswith(f".{t}") for n in modules)

    parameters = [t for t in names if not is_module(t) and any(k == t or k.endswith(f".{t}") for k in fused)]
    return LoraConfig(r=finetune.lora_r, lora_alpha=finetune.lora_alpha, lora_dropout=finetune.lora_dropout,
                      target_modules=[t for t in names if t not in parameters],
                      target_parameters=parameters or None)


def measure_split(model, finetune: Finetune, layout: bool = True) -> TrainableSplit:
    """The counts for a built transformers model (real or on the meta device), and with `layout` what the memory and
    time models read from its module tree (module_layout). QLoRA: which Linears transformers would quantize is read
    before peft wraps them (quantized_weights)."""
    quantized = quantized_weights(model) if finetune.mode == "qlora" else {}
    if finetune.uses_lora:
        split = lora_split(model, finetune)  # wraps `model`'s Linears in place (get_peft_model)
    else:
        params = [(name, p.numel()) for name, p in model.named_parameters()]  # tied weights once
        if not finetune.freeze:
            total = sum(n for _, n in params)
            return TrainableSplit(total, total)
        split = freeze_split(params, finetune.freeze)
        for name, p in model.named_parameters():
            p.requires_grad_(not any(_freeze_matches(pat, name) for pat in finetune.freeze))
    if not layout:
        return split
    return replace(split, layout=module_layout(model, finetune, quantized))


# bitsandbytes' packed storage: BitsAndBytesConfig(bnb_4bit_quant_storage) -> bytes per stored element
QUANT_STORAGE_BYTES = {"uint8": 1, "bf16": 2, "fp16": 2, "fp32": 4}
NF4_BLOCKSIZE = 64  # bitsandbytes quantize_4bit's default blocksize (transformers' Linear4bit passes none)
NESTED_BLOCKSIZE = 256  # quantize_4bit(compress_statistics=True) quantizes the absmax with quantize_blockwise(blocksize=256)


def quantized_weights(model) -> dict[int, int]:
    """{id(weight): elements} of the Linear weights transformers' bitsandbytes 4-bit quantizer converts: every exact
    nn.Linear or Conv1D (integrations/bitsandbytes.py replace_with_bnb_linear: `isinstance(module, Conv1D) or
    type(module) is nn.Linear`) except the modules its get_keys_to_not_convert names (tied weights, the last parameter's
    module, the output embedding: the LM head stays in the compute dtype) and the model's _keep_in_fp32_modules
    (Bnb4BitHfQuantizer._process_model_before_weight_loading -> get_modules_to_not_convert with
    llm_int8_skip_modules None), matched by should_convert_module. transformers' own functions, called on the model."""
    import torch
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import get_keys_to_not_convert
    from transformers.quantizers.quantizers_utils import should_convert_module

    skip = list(set(get_keys_to_not_convert(model)) | set(getattr(model, "_keep_in_fp32_modules", None) or []))
    return {id(m.weight): m.weight.numel() for name, m in model.named_modules()
            if should_convert_module(name, skip) and (isinstance(m, Conv1D) or type(m) is torch.nn.Linear)}


def packed_4bit_elements(n: int, storage_bytes: int) -> int:
    """Stored elements of a weight of n elements: quantize_4bit's out is ((n + 1) // (itemsize * 2), 1) of
    quant_storage (bitsandbytes/_ops.py, the fake of bitsandbytes::quantize_4bit): two 4-bit values a byte."""
    return (n + 1) // (storage_bytes * 2)


def quant_state_bytes(n: int, double_quant: bool) -> int:
    """The QuantState tensors of one 4-bit weight of n elements (bitsandbytes functional.quantize_4bit): an fp32 absmax
    per block of 64 and the 16-entry fp32 NF4 code (get_4bit_type, a new tensor per weight); with double quantization
    the absmax is quantize_blockwise'd (blocksize 256) to uint8, with its own fp32 absmax per 256 blocks, a copy of the
    256-entry fp32 dynamic code (`code.to(A.device, copy=True)`) and the fp32 0-d offset (the absmax mean)."""
    blocks = -(n // -NF4_BLOCKSIZE)
    if not double_quant:
        return 4 * blocks + 4 * 16
    return blocks + 4 * 16 + 4 + 4 * -(blocks // -NESTED_BLOCKSIZE) + 4 * 256


# Linear names by the input they read (module_layout): in an attention block the output projection reads the attention
# output, every other Linear the block's input; in an MLP the down projection reads the activation's output.
_ATTN_OUT = {"o_proj", "out_proj", "dense", "c_proj", "wo", "o"}
_MLP_OUT = {"down_proj", "c_proj", "fc2", "w2", "dense_4h_to_h", "wo"}
_LINEAR_TYPES = {"Linear", "Conv1D", "Linear4bit", "Linear8bitLt"}


def module_layout(model, finetune: Finetune, quantized: dict[int, int] | None = None) -> dict:
    """What the memory and time models read from the module tree of the model as fine-tuned (after get_peft_model or
    the --freeze requires_grad flags): per-tensor stored sizes, the 4-bit bytes, which Linear inputs autograd still
    saves, where the gradient starts. The fields are spec/trained.py Trained's (with_finetune copies them)."""
    quantized = quantized or {}
    storage = QUANT_STORAGE_BYTES[finetune.bnb_4bit_quant_storage]
    named = list(model.named_parameters())  # tied weights once
    layers_name, layers = _decoder_layers(model)
    prefix = layers_name + "."
    num_layers = len(layers)

    def layer_of(name: str) -> int | None:
        if not name.startswith(prefix):
            return None
        return int(name[len(prefix):].split(".", 1)[0])

    linears, linear_params = _layer_linears(model, prefix, layer_of)

    layer_trainable = [False] * num_layers
    pre_trainable = False
    seen_layer = False
    first_norm_trainable: dict[int, bool] = {}
    norm_trainable = {}
    post_norm_trainable = False
    for name, p in named:
        li = layer_of(name)
        if li is not None:
            seen_layer = True
            layer_trainable[li] |= p.requires_grad
            if id(p) not in linear_params:  # a norm's weight or bias
                norm_trainable.setdefault(li, False)
                norm_trainable[li] |= p.requires_grad
                first_norm_trainable.setdefault(li, p.requires_grad)
        elif not seen_layer:
            pre_trainable |= p.requires_grad  # embeddings (a tied LM head is the input embedding)
        elif id(p) not in linear_params:
            post_norm_trainable |= p.requires_grad
    # the first layer with a trainable parameter; with trainable embeddings its input has a gradient too, otherwise it
    # is the partial layer: what runs before its first trainable parameter records nothing for backward
    grad_start = 0 if pre_trainable else next((i for i, t in enumerate(layer_trainable) if t), num_layers)
    rep = num_layers - 1  # the layers from the first trainable one on are read off the last
    adapters, frozen = _layer_slots(linears, rep) if num_layers else ([0] * 4, [True] * 4)
    start_adapters, start_frozen = _layer_slots(linears, grad_start) if grad_start < num_layers else ([0] * 4, [True] * 4)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    head_trainable = bool(head is not None and (any(p.requires_grad for p in head.parameters())))
    sizes, q_elems, q_bytes, q_state = _stored_sizes(named, quantized, storage, finetune.bnb_4bit_use_double_quant)
    # matmul weights (every Linear's, adapters' included, and a tied LM head once): the time model's FLOPs
    tied = head is not None and id(head.weight) not in linear_params
    matmul = [(p, layer_of(name)) for name, p in named if id(p) in linear_params]
    if tied:
        matmul.append((head.weight, None))
    # parameters of modules no gradient reaches (frozen embeddings, a tied LM head excepted, and the layers before the
    # first trainable one): under ZeRO-3 their modules fire no backward hook, so the gathered copies are released after
    # forward (memory.phase_terms)
    no_backward = [p for name, p in named
                   if not pre_trainable and (layer_of(name) is None and not name.startswith(prefix) and _before_layers(name, named, prefix)
                                             and not (head is not None and p is head.weight)
                                             or (layer_of(name) is not None and layer_of(name) < grad_start))]
    nb_q = sum(packed_4bit_elements(p.numel(), storage) * storage for p in no_backward if id(p) in quantized)
    nb_params = sum(p.numel() for p in no_backward if id(p) not in quantized)
    trainable_mm = sum(p.numel() for p, _ in matmul if p.requires_grad)
    # input gradients run through every matmul at and after the gradient's first layer (layers before it run no backward)
    backward_mm = sum(p.numel() for p, li in matmul if li is None or li >= grad_start)
    return {
        "quantized_params": q_elems, "quantized_bytes": q_bytes, "quant_state_bytes": q_state,
        "quantized_tensors": sum(1 for _, p in named if id(p) in quantized),
        "lora_r": finetune.lora_r if finetune.uses_lora else 0,
        "lora_dropout": finetune.lora_dropout if finetune.uses_lora else 0.0,
        "lora_slots": tuple(adapters), "frozen_slots": tuple(frozen),
        "frozen_norms": not norm_trainable.get(rep, True),
        "frozen_final_norm": not post_norm_trainable,
        "frozen_head": not head_trainable,
        "grad_start_layer": grad_start, "grad_start_partial": not pre_trainable,
        "grad_start_attention": bool(first_norm_trainable.get(grad_start, False) or any(start_adapters[:2])
                                     or not all(start_frozen[:2])),
        "param_tensors": tuple(sorted((n, b, c) for (n, b), c in sizes.items())),
        # gradients become ready in reverse registration order (the LM head first, the embedding last), the order
        # DeepSpeed fills its reduce buckets with (timing.reduce_bucket_calls); frozen tensors reduce nothing
        "trainable_tensors": tuple(p.numel() for _, p in reversed(named) if p.requires_grad),
        "extra_modules_per_layer": _peft_modules(layers[0]) if num_layers else 0,
        "lora_io_per_layer": _lora_io(layers[rep]) if num_layers else 0,
        "trainable_matmul_params": trainable_mm, "backward_matmul_params": backward_mm,
        "no_backward_params": nb_params, "no_backward_quantized_bytes": nb_q,
        "merged_params_per_layer": sum(m.get_param().numel() for _, m in layers[rep].named_modules()
                                       if _is_param_wrapper(m)) if num_layers else 0,
    }


def _decoder_layers(model) -> tuple[str, list]:
    """module_layout's decoder layers: the name of their ModuleList and the list ("" and [] where there is none)."""
    import torch

    # the decoder layers: the shallowest ModuleList (an MoE layer's expert list sits deeper) of the text model's depth
    # (a vision-language model's vision blocks can sit as shallow: Qwen2-VL's model.visual.blocks)
    lists = [(n.count("."), n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    text = model.config.get_text_config(decoder=True) if hasattr(getattr(model, "config", None), "get_text_config") else None
    depth = getattr(text, "num_hidden_layers", None)
    lists = [t for t in lists if len(t[2]) == depth] or lists
    _, layers_name, layers = min(lists, key=lambda t: t[0]) if lists else (0, "", [])
    return layers_name, layers


def _layer_linears(model, prefix: str, layer_of) -> tuple[dict[int, list[tuple[str, bool, bool]]], set[int]]:
    """module_layout's Linear-like modules per decoder layer (layer_of: a parameter or module name's layer, or None)
    and the ids of every matmul weight: Linears', adapters', MoE experts' and routers'."""
    # Linear-like modules per layer: (relative name, adapted, base weight trainable)
    linears: dict[int, list[tuple[str, bool, bool]]] = {}
    linear_params: set[int] = set()
    # the fused-expert parameters peft's ParamWrapper adapts (module, parameter name): their modules' other parameters
    # are still plain matmul weights
    wrapped = {(id(m.get_base_layer()), m.parameter_name) for _, m in model.named_modules() if _is_param_wrapper(m)}

    def relative(name: str) -> str:
        return name[len(prefix):].split(".", 1)[1] if "." in name[len(prefix):] else ""

    for name, m in model.named_modules():
        li = layer_of(name)
        base = getattr(m, "base_layer", None)
        if _is_param_wrapper(m):
            # peft's ParamWrapper (lora/layer.py): LoRA on one parameter of a module that is not a Linear (transformers
            # 5's fused experts [E, 2i, h] / [E, h, i], the MoE router's weight). Nested wrappers adapt one parameter
            # each ("experts" wraps down_proj around "experts.base_layer" wrapping gate_up_proj); get_param() reads the
            # base module's parameter, which has no `.weight` of its own
            for p in m.parameters():
                linear_params.add(id(p))
            if li is not None:
                rel = ".".join(part for part in relative(name).split(".") if part != "base_layer")
                linears.setdefault(li, []).append((f"{rel}.{m.parameter_name}", True, m.get_param().requires_grad))
        elif hasattr(m, "lora_A") and base is not None:  # peft's LoRA wrapper: its lora_A/B are Linears of their own
            for p in m.parameters():
                linear_params.add(id(p))
            if li is not None:
                linears.setdefault(li, []).append((relative(name), True, base.weight.requires_grad))
        elif type(m).__name__ in _LINEAR_TYPES and ".lora_" not in name and not name.endswith(".base_layer"):
            for p in m.parameters(recurse=False):
                linear_params.add(id(p))
            if li is not None:
                linears.setdefault(li, []).append((relative(name), False, m.weight.requires_grad))
        elif ".lora_" not in name:
            # MoE matmul weights outside nn.Linear: fused experts and routers, the ones no ParamWrapper adapts
            for pname, p in _moe_matmul_params(m):
                linear_params.add(id(p))
                if li is not None and (id(m), pname) not in wrapped:
                    rel = ".".join(part for part in relative(name).split(".") if part != "base_layer")
                    linears.setdefault(li, []).append((f"{rel}.{pname}", False, p.requires_grad))
    return linears, linear_params


def _slot(rel: str) -> int:
    """The slot of a Linear in its decoder layer (module_layout), by the input it reads: 0 the attention block's
    input, 1 the attention output (_ATTN_OUT), 2 the MLP block's input, 3 the activation's output (_MLP_OUT)."""
    parts = rel.split(".")
    last = parts[-1]
    if any("attn" in p or "attention" in p for p in parts[:-1]):
        return 1 if last in _ATTN_OUT else 0
    return 3 if last in _MLP_OUT else 2


def _layer_slots(linears: dict[int, list[tuple[str, bool, bool]]], li: int) -> tuple[list[int], list[bool]]:
    """Per slot (_slot) of decoder layer li: how many of its Linears carry an adapter, and whether every base weight
    is frozen."""
    adapters, frozen = [0, 0, 0, 0], [True, True, True, True]
    for rel, adapted, trainable in linears.get(li, []):
        s = _slot(rel)
        adapters[s] += adapted
        frozen[s] = frozen[s] and not trainable
    return adapters, frozen


def _stored_sizes(named: list, quantized: dict[int, int], storage: int,
                  double_quant: bool) -> tuple[dict[tuple[int, int], int], int, int, int]:
    """module_layout's stored tensors, {(stored elements, a 4-bit weight's storage bytes else 0): count}, and the
    4-bit weights' elements, packed bytes and quant-state bytes."""
    # stored tensors for ZeRO-3's persistence rule: a 4-bit weight at its packed size in its storage dtype
    sizes: dict[tuple[int, int], int] = {}
    q_elems = q_bytes = q_state = 0
    for _, p in named:
        n = p.numel()
        if id(p) in quantized:
            k = (packed_4bit_elements(n, storage), storage)
            q_elems += n
            q_bytes += k[0] * storage
            q_state += quant_state_bytes(n, double_quant)
        else:
            k = (n, 0)
        sizes[k] = sizes.get(k, 0) + 1
    return sizes, q_elems, q_bytes, q_state


def _is_param_wrapper(m) -> bool:
    """peft's lora.ParamWrapper (tuners/lora/layer.py): LoRA on one nn.Parameter (target_parameters, or what peft's
    transformers-v5 conversion targets for Mixtral/Qwen-MoE experts: utils/transformers_weight_conversion.py
    _convert_peft_config_moe). It has lora_A/B and a base_layer but adapts `parameter_name`, not `.weight`."""
    return hasattr(m, "lora_A") and hasattr(m, "parameter_name") and hasattr(m, "get_param")


def _moe_matmul_params(m) -> list[tuple[str, object]]:
    """The direct parameters of a module that are MoE matmul weights without being an nn.Linear: transformers 5's fused
    experts hold 3-D [experts, out, in] parameters (MixtralExperts gate_up_proj / down_proj; integrations/moe.py runs
    them as batched or grouped matmuls), and its routers a 2-D weight read by F.linear (MixtralTopKRouter). A Conv1d's
    3-D kernel (Mamba, ShortConv blocks) is a convolution, not an expert stack."""
    import torch

    if isinstance(m, (torch.nn.Conv1d, torch.nn.Embedding)):
        return []
    router = "router" in type(m).__name__.lower()
    out = []
    for n, p in m.named_parameters(recurse=False):
        dims = len(getattr(p, "ds_shape", p.shape))  # ZeRO-3 partitions a parameter to 1-D; ds_shape keeps its shape
        if dims == 3 or (router and dims == 2):
            out.append((n, p))
    return out


def _peft_modules(layer) -> int:
    """The submodules peft added to a decoder layer: the ones named lora_* and the wrapped Linears' base_layer (the
    wrapper itself takes the Linear's place). ZeRO-3 registers its fetch/release hooks on every module
    (parameter_offload.py _register_deepspeed_module), so each costs a hook call per pass (timing.estimate_time)."""
    return sum(1 for n, _ in layer.named_modules() if "lora_" in n or n.endswith("base_layer"))


def _lora_io(layer) -> int:
    """The in + out features of every adapted Linear in a decoder layer (peft's LoraLayer records its base layer's,
    Conv1D included): per token, an adapter's forward scales and adds an out-wide product to the base output and its
    backward adds an in-wide gradient to the input's (peft lora.layer.Linear.forward), element-wise work the time
    model prices per element (timing.compute_features "adapter_element")."""
    # a ParamWrapper adds no per-token work: it folds B @ A into the expert weights once per forward (its
    # _activate_lora parametrization), and the experts then run on that weight as before
    return sum(m.in_features + m.out_features for _, m in layer.named_modules()
               if hasattr(m, "lora_A") and getattr(m, "base_layer", None) is not None and not _is_param_wrapper(m))


def _before_layers(name: str, named: list, prefix: str) -> bool:
    """Whether parameter `name` comes before the decoder layers in the model's parameter order (an embedding), not
    after them (the final norm, an untied LM head)."""
    for n, _ in named:
        if n == name:
            return True
        if n.startswith(prefix):
            return False
    return False


def with_finetune(model: ModelSpec, split: TrainableSplit, mode: str = "full") -> ModelSpec:
    """The model as fine-tuned: every weight counted (adapters included), the trainable ones marked, and what the module
    tree said about storage, saved activations and the gradient's path (split.layout)."""
    fields = dict(split.layout or {})
    if mode != "qlora":  # a layout read for another mode keeps the weights in the training dtype
        fields.update(quantized_params=0, quantized_bytes=0, quant_state_bytes=0, quantized_tensors=0)
    return replace(model, params=split.total_params,
                   trained=replace(model.trained, trainable_params=split.trainable_params, finetune_mode=mode, **fields))


def finetuned_spec(model: ModelSpec, config_source: str, finetune: Finetune) -> ModelSpec:
    """The ModelSpec as `finetune` trains it, counted from the model's modules (trainable_split), with what peft and
    bitsandbytes print while importing (bitsandbytes' note on its optional CPU kernels package) kept out of the
    output as other libraries' (core.quiet). The one path plan, check, launch and the suggestions count through."""
    from zerokit.core.quiet import library_output

    with library_output():
        split = trainable_split(config_source, finetune)
    return with_finetune(model, split, finetune.mode)


# Counted splits, by _split_key: in this process, and on disk as $ZEROKIT_CACHE_DIR/finetune_splits/<key>.json
_SPLITS: dict[str, TrainableSplit] = {}


def trainable_split(config_source: str, finetune: Finetune) -> TrainableSplit:
    """The split for the model whose config.json is `config_source` (the file or its folder), counted once
    (count_split) and then read from the cache: a 70B LoRA count costs ~6 s cold (torch, transformers and peft
    imports, peft wrapping 560 Linears), a cache hit imports none of them (bench/plan_latency.py)."""
    key = _split_key(config_source, finetune)
    if key is None:
        return count_split(config_source, finetune)
    split = _SPLITS.get(key) or _split_read(key)
    if split is None:
        split = count_split(config_source, finetune)
        _split_write(key, split)
    _SPLITS[key] = split
    return split


def _split_key(config_source: str, finetune: Finetune) -> str | None:
    """Everything that decides a split: the config.json's bytes, the fine-tune, the torch, transformers and peft that
    build and wrap the model, and this module's own source (any change to the counting rules is a new key, so a cache
    can never answer with an older rule). None for a hub id (its config is fetched, not on disk): counted each time."""
    import hashlib
    from pathlib import Path

    from zerokit.core.fsutil import package_version

    path = Path(config_source)
    path = path / "config.json" if path.is_dir() else path
    try:
        config = path.read_bytes()
    except OSError:
        return None
    material = b"\n".join([b"zerokit-finetune-split/1", *(package_version(p).encode() for p in SPLIT_LIBRARIES),
                           repr(sorted(asdict(finetune).items())).encode(),
                           _code_digest(), hashlib.sha256(config).digest()])
    return hashlib.sha256(material).hexdigest()


# the libraries a count runs (the meta-device model, peft's wrapping): their versions are part of every key
SPLIT_LIBRARIES = ("torch", "transformers", "peft")
# splits of the bundled models (zerokit/data/models) for the fine-tunes a plan suggests (planner.FINETUNE_ALTERNATIVES),
# counted ahead by scripts/bundle_finetune_splits.py under the versions constraints-cpu.txt pins, so a fresh install's
# first 70B suggestion is instant too; tests/test_split_cache.py holds them current and equal to a fresh count
BUNDLED_SPLITS = "finetune_splits.json"


def _split_read(key: str) -> TrainableSplit | None:
    import json

    from zerokit.core.fsutil import cache_dir

    data = _bundled_splits().get(key)
    if data is None:
        try:
            entry = json.loads((cache_dir("finetune_splits") / f"{key}.json").read_text(encoding="utf-8"))
            data = entry["split"] if entry.get("key") == key else None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # missing or corrupt: recount
    try:
        return split_from_dict(data) if data is not None else None
    except (KeyError, TypeError, AttributeError):
        return None


def split_from_dict(data: dict) -> TrainableSplit:
    """A TrainableSplit from its JSON (asdict), the lists back to the tuples Trained holds (lora_slots, ...)."""
    def tuples(v):
        return tuple(tuples(x) for x in v) if isinstance(v, list) else v

    layout = data.get("layout")
    return TrainableSplit(**{**data, "layout": {k: tuples(v) for k, v in layout.items()} if layout is not None else None})


@lru_cache(maxsize=1)
def _bundled_splits() -> dict:
    import json

    from zerokit.core.resources import bundled_data

    try:
        return json.loads(bundled_data(BUNDLED_SPLITS).read_text(encoding="utf-8"))["splits"]
    except (OSError, ValueError, KeyError):
        return {}


@lru_cache(maxsize=1)
def _code_digest() -> bytes:
    """This module's own bytes, hashed once per process (part of every split key)."""
    import hashlib
    from pathlib import Path

    return hashlib.sha256(Path(__file__).read_bytes()).digest()


def _split_write(key: str, split: TrainableSplit) -> None:
    import json

    from zerokit.core.fsutil import atomic_write_text, cache_dir

    directory = cache_dir("finetune_splits")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(directory / f"{key}.json", json.dumps({"key": key, "split": asdict(split)}), mode=0o644)
    except OSError:
        pass  # an unwritable cache only costs a recount next time


def count_split(config_source: str, finetune: Finetune) -> TrainableSplit:
    """Build the causal LM from its config.json on the meta device (no weights) and count (imports torch and
    transformers: ~6 s on 2 cores; a full fine-tune without --freeze needs none of it)."""
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError as exc:
        raise ZerokitError(f"{flag('finetune')} {finetune.mode} and {flag('freeze')} count the model's modules with "
                           f"torch and transformers ({exc.name} is missing): pip install 'zerokit[train]'") from None
    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        cfg = AutoConfig.from_pretrained(config_source)
        # the classes spec/model.py counts with, in its order: the causal LM, else the image-text-to-text model
        # (Qwen2/2.5-VL, Llama-3.2-Vision, Gemma 3: the language model, its vision tower and projector together)
        autos = [AutoModelForCausalLM, getattr(transformers, "AutoModelForImageTextToText", None)]
        model, error = None, None
        for auto in [a for a in autos if a is not None]:
            try:
                with torch.device("meta"):
                    model = auto.from_config(cfg)
                break
            except Exception as exc:
                error = error or exc
        if model is None:
            raise error
    except Exception as exc:  # an architecture transformers cannot build as a causal LM
        raise ZerokitError(f"{flag('finetune')} {finetune.mode}/{flag('freeze')}: transformers cannot build "
                           f"{config_source} as a causal LM "
                           f"({str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__})") from None
    finally:
        transformers.logging.set_verbosity(verbosity)
    return measure_split(model, finetune)
