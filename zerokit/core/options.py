"""Every option zerokit takes, declared once: its name, value type and bounds, default, help, the commands that take
it, and whether its value reaches the training ranks.

From these declarations cli/ builds each command's parser, a run config file (`zerokit plan|render|check|launch
-c run.yaml`: the long option names as keys, command-line flags override the file) is read and typed, and the
lower layers name an option in a message through `flag("merge")`, never as a string literal, so a rename is one
edit. A value type is a plain function from the text a user wrote to the typed value that raises ValueError with
what it expected; cli/ turns that into argparse's one-line usage error, the run-file reader into its own.

The shape follows accelerate's settings dataclasses (each field carries its help) and litgpt's `-c config.yaml`
(one file per run, flags on top).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from zerokit.core.errors import ZerokitError
from zerokit.core.limits import MAX_COUNT, MAX_GPUS_PER_NODE, MAX_WORLD_SIZE

# ---------------------------------------------------------------------------------------------
# value types: text -> value, ValueError naming what was expected (the bounds are zerokit.core.limits')


def _number(text, cast, valid, unreadable: str, invalid: str):
    try:
        v = cast(str(text).strip())
    except (ValueError, OverflowError):
        raise ValueError(f"expected {unreadable}, got {text!r}") from None
    if not valid(v):
        raise ValueError(f"expected {invalid}, got {text!r}")
    return v


def nonneg_int(text) -> int:
    return _number(text, int, lambda v: 0 <= v <= MAX_COUNT, "a whole number", f"0 or more, up to {MAX_COUNT:,}")


def positive_int(text) -> int:
    return _number(text, int, lambda v: 1 <= v <= MAX_COUNT, "a positive integer",
                   f"a positive integer up to {MAX_COUNT:,}")


SEQ_LEN_MAX = "max"  # --seq-len max: the longest sequence that fits (planning/search.py)


def seq_len(text) -> int | str:
    """--seq-len: a positive integer, or "max" for the longest that fits."""
    if str(text).strip().lower() == SEQ_LEN_MAX:
        return SEQ_LEN_MAX
    return _number(text, int, lambda v: 1 <= v <= MAX_COUNT, f"a positive integer or {SEQ_LEN_MAX}",
                   f"a positive integer up to {MAX_COUNT:,}, or {SEQ_LEN_MAX}")


def gpus_per_node(text) -> int:
    return _number(text, int, lambda v: 1 <= v <= MAX_GPUS_PER_NODE, "a positive integer",
                   f"a positive integer up to {MAX_GPUS_PER_NODE} (the ranks one host can run)")


def node_count(text) -> int:
    return _number(text, int, lambda v: 1 <= v <= MAX_WORLD_SIZE, "a positive integer",
                   f"a positive integer up to {MAX_WORLD_SIZE:,}")


def positive_float(text) -> float:
    return _number(text, float, lambda v: 0 < v < math.inf, "a positive number", "a positive finite number")


def fraction(text) -> float:
    return _number(text, float, lambda v: 0 < v <= 1, "a number", "a fraction above 0 and at most 1")


def port(text) -> int:
    return _number(text, int, lambda v: 1 <= v <= 65535, "a port number", "a TCP port, 1 to 65535")


def nonneg_port(text) -> int:
    return _number(text, int, lambda v: 0 <= v <= 65535, "a port number", "a TCP port, 0 (any free one) to 65535")


def nonempty(text) -> str:
    """A name or path that must not be empty ("" is a value argparse and YAML both take as given)."""
    if not str(text).strip():
        raise ValueError("expected a value, got an empty string")
    return str(text)


def integer(text) -> int:
    return _number(text, int, lambda v: True, "a whole number", "a whole number")


_DURATION_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "mins": 60, "minutes": 60, "h": 3600, "hr": 3600,
                   "hrs": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400, "days": 86400, "w": 7 * 86400,
                   "week": 7 * 86400, "weeks": 7 * 86400}
MAX_DURATION_S = 10 * 365 * 86400  # ten years: past any training run's deadline


def duration(text) -> float:
    """Seconds from 36h, 90min, 2d, 1d12h, 45m30s or a bare number of hours (how people say a deadline)."""
    s = str(text).strip().lower().replace(" ", "")
    parts = re.findall(r"(\d+(?:\.\d+)?)([a-z]*)", s)
    if not s or "".join(n + u for n, u in parts) != s:
        raise ValueError(f"expected a duration such as 36h, 90min, 2d or 1d12h, got {text!r}")
    total = 0.0
    for number, unit in parts:
        if unit not in _DURATION_UNITS and not (unit == "" and len(parts) == 1):
            raise ValueError(f"unknown unit {unit!r} in {text!r}: use s, min, h, d or w (e.g. 36h)")
        total += float(number) * _DURATION_UNITS.get(unit, 3600)
    if not 0 < total <= MAX_DURATION_S:
        raise ValueError(f"expected a duration above 0 and at most ten years, got {text!r}")
    return total


def name_list(text) -> tuple[str, ...]:
    """a,b,c: the names, each non-empty."""
    names = tuple(n.strip() for n in str(text).split(","))
    if not names or any(not n for n in names):
        raise ValueError(f"expected names separated by commas, e.g. a100-80gb,h100-80gb, got {text!r}")
    return names


def number(text) -> float:
    return _number(text, float, lambda v: math.isfinite(v), "a number", "a finite number")


ON_OFF = ("on", "off")
# how the engine is compiled (ZeroSetup.compile): not at all, torch.compile through engine.compile(), or DeepCompile
COMPILE_MODES = ("off", "torch", "deepcompile")
# what runs the offloaded optimizer (ZeroSetup.offload_engine): ZeRO-Offload's DeepSpeedCPUAdam after every step,
# ZenFlow (zero_optimization.zenflow) or SuperOffload (offload_optimizer.super_offload, ZeRO-3, Superchips)
OFFLOAD_ENGINES = ("zero-offload", "zenflow", "superoffload")
SEQUENCE_PARALLEL_MODES = ("ulysses", "fpdt")


def liger_kernels(text) -> str:
    """--liger-kernels: on, off, or the liger-kernel release the script runs (on: a current one); spec/liger.py
    liger_release reads the number and refuses what it cannot."""
    if isinstance(text, bool):  # YAML 1.1 reads on/off as booleans
        return "on" if text else "off"
    return str(text).strip().lower()


# the attention kernels zerokit prices (estimate/memory.py, estimate/gpu_time.py): sdpa, FlashAttention-2, -3, eager
ATTENTION_IMPLS = ("sdpa", "flash", "flash3", "eager")
# --activation-checkpointing: offload is on, with the checkpointed layer inputs in host memory
CHECKPOINTING = ("on", "off", "offload")

# the torch.distributed backends DeepSpeed can be told to use (deepspeed.comm.init_distributed(dist_backend=...));
# spec/hardware.py says which device family each carries and prices them
DIST_BACKENDS = ("nccl", "gloo", "mpi", "ccl", "hccl")


# ---------------------------------------------------------------------------------------------
# the declaration

# the commands; "zerokit" is the top-level parser (its options come before the command)
COMMANDS = ("zerokit", "plan", "render", "check", "launch", "calibrate", "serve")
PLANNING = ("plan", "render", "check")
RUNS = ("plan", "render", "check", "launch")
PRECISION_CHOICES = ("bf16", "fp16", "fp32")  # spec.setup.PRECISIONS, which this layer cannot import


@dataclass(frozen=True)
class Option:
    """One option. `name` is the long flag without its dashes and the run file's key."""

    name: str
    commands: tuple[str, ...]
    help: str = ""
    type: Callable[[Any], Any] | None = nonempty  # text -> value; None: a switch (on when given)
    default: Any = None
    choices: tuple | None = None
    metavar: str | None = None
    dest: str | None = None  # the attribute it is read as (default: name with _ for -)
    group: str = ""  # the --help section
    repeat: bool = False  # may be given more than once: a list
    positional: tuple[str, ...] = ()  # commands where it is also (only) the positional argument
    short: str | None = None  # e.g. "-o"
    exclusive: str | None = None  # options sharing this tag exclude each other on a command
    rank: bool = False  # its value reaches the training ranks (launch.rank_options.RankOptions has a field `key`)
    aliases: tuple[str, ...] = ()  # further long flags, e.g. DeepSpeed's spelling
    cli_only: bool = False  # how the command line presents an answer (--json, --plot): no Python keyword takes it

    @property
    def flag(self) -> str:
        return "--" + self.name

    @property
    def key(self) -> str:
        return self.dest or self.name.replace("-", "_")

    @property
    def is_switch(self) -> bool:
        return self.type is None

    def parse(self, value):
        """A value from the command line or a run file, typed and checked; ValueError says what was expected."""
        if self.is_switch:
            if isinstance(value, bool):
                return value
            raise ValueError(f"expected true or false, got {value!r}")
        if self.repeat:
            items = value if isinstance(value, list) else [value]
            return [self._one(v) for v in items]
        if isinstance(value, (list, dict)):
            raise ValueError(f"expected one value, got {type(value).__name__} {value!r}")
        return self._one(value)

    def _one(self, value):
        if isinstance(value, bool) and self.choices is not None and {"on", "off"} <= set(self.choices):  # YAML 1.1 reads on/off as booleans
            value = "on" if value else "off"
        v = self.type(value)
        if self.choices is not None and v not in self.choices:
            raise ValueError(f"expected one of {', '.join(map(str, self.choices))}, got {value!r}")
        return v


_HW, _MODEL, _WL = "hardware (the same on every command)", "model", "workload"
_PIN, _FT = "pin a setup dimension (the planner chooses the rest)", \
    "fine-tuning (what trains: gradients and optimizer states exist for it only)"
_RUN, _OWN, _MULTI = "run", "your own training script", "multi-node"

OPTIONS: tuple[Option, ...] = (
    # -- the top level
    Option("debug", ("zerokit",), "show Python tracebacks on errors (implies -v)", type=None, cli_only=True),
    Option("verbose", ("zerokit",), "let DeepSpeed, transformers and the hub client print their own warnings",
           type=None, short="-v", cli_only=True),
    # -- every run command
    Option("config-file", RUNS + ("calibrate",), "a run config file (YAML or JSON): long option names as keys "
           "(dashes or underscores), e.g. `gpus-per-node: 8`; flags given on the command line override it; keys "
           "of other commands are skipped, unknown keys refused", short="-c", metavar="RUN.yaml"),
    # -- hardware
    Option("gpu", RUNS, "accelerator from the catalog as you would write it or nvidia-smi prints it (a100-80gb, H100, "
           "'NVIDIA A100-SXM4-80GB', rtx-4090, cpu, ...), or auto for this machine's GPUs; default a100-80gb, or cpu "
           "for launch on a machine without CUDA", group=_HW),
    Option("gpu-memory", RUNS, "memory per GPU, overrides the catalog (e.g. 80GB, 24GiB)", metavar="SIZE", group=_HW),
    Option("gpus-per-node", RUNS, "", type=gpus_per_node, metavar="N", group=_HW),
    Option("nodes", RUNS, "", type=node_count, metavar="N", group=_HW),
    Option("hostfile", RUNS, "DeepSpeed hostfile (`host slots=N` per line): sets nodes and GPUs per node",
           metavar="FILE", group=_HW),
    Option("cpu-memory", RUNS, "host RAM per node (checked when given)", metavar="SIZE", group=_HW),
    Option("intra-node-bandwidth", RUNS, "GB/s per GPU, one direction, between the GPUs of a node (NVLink, PCIe): "
           "overrides the catalog's figure for the --gpu (e.g. 25 for a PCIe box of SXM-class cards)",
           type=positive_float, metavar="GBPS", group=_HW),
    Option("inter-node-bandwidth", RUNS, "GB/s per GPU, one direction, between nodes (the node's NICs over its GPUs: "
           "8 x 400 Gb/s InfiniBand for 8 GPUs is 50; AWS p4d's 400 Gb/s EFA for 8 A100 is 6.25): overrides the "
           "catalog's figure", type=positive_float, metavar="GBPS", group=_HW),
    Option("nvme-path", RUNS, "NVMe mount for ZeRO-Infinity offload", metavar="DIR", group=_HW),
    Option("nvme-size", RUNS, "free NVMe per node (default: free space at --nvme-path)", metavar="SIZE", group=_HW),
    Option("hardware-profile", RUNS, "measured profile from `zerokit calibrate` (default: the one calibrate wrote on "
           "this machine, when it measured the --gpu planned for; none: the catalog's figures)", metavar="FILE",
           group=_HW),
    Option("dist-backend", RUNS, "how the ranks communicate (deepspeed.init_distributed(dist_backend=...)); default: "
           "DeepSpeed's for the accelerator (nccl on NVIDIA GPUs, gloo on cpu); priced in the step time",
           choices=DIST_BACKENDS, group=_HW, rank=True),
    # -- model
    Option("model", RUNS + ("calibrate",), "HF model id, local directory with config.json, or bundled name "
           "(tiny-llama, llama-3-8b, ...); launch loads its weights when the directory has them, else initializes at "
           "random; calibrate times only what a plan of it prices (its block family, fp32 and the fastest 16-bit "
           "precision)",
           positional=("plan", "render"), group=_MODEL, rank=True),
    Option("params", PLANNING, "bare parameter count (7e9, 7B, 125M) instead of a model config", metavar="N",
           group=_MODEL),
    Option("hidden-size", PLANNING, "", type=positive_int, group=_MODEL),
    Option("num-layers", PLANNING, "", type=positive_int, group=_MODEL),
    Option("vocab-size", PLANNING, "", type=positive_int, group=_MODEL),
    Option("num-attention-heads", PLANNING, "attention heads of a bare --params shape, with --hidden-size (default: "
           "the nearest Llama's)", type=positive_int, metavar="N", group=_MODEL),
    Option("num-kv-heads", PLANNING, "key/value heads of a bare --params shape (grouped-query attention; default: the "
           "attention heads when those are given)", type=positive_int, metavar="N", group=_MODEL),
    # -- workload
    Option("seq-len", RUNS, "tokens per sample (default: plan/render/check 2048, launch 512, or the model's maximum "
           "when smaller); plan/render/check: max, the longest that fits the pinned (or chosen) setup",
           type=seq_len, group=_WL, rank=True),
    Option("doc-len", PLANNING, "packed sequences: the typical length of the documents packed into each sequence, "
           "position ids restarting at each (TRL packing with padding_free, ms-swift --packing): flash and flash3 "
           "attention read one document at a time, so attention is priced over N-token documents (default: one "
           "document per sequence)", type=positive_int, metavar="N", group=_WL),
    Option("global-batch", RUNS, "samples per optimizer step = micro x accumulation x GPUs per node x nodes",
           type=positive_int, metavar="N", group=_WL),
    Option("samples", RUNS, "training samples per epoch, for the total time (launch: in your own script's data)",
           type=positive_int, metavar="N", group=_WL),
    Option("epochs", RUNS, "passes over the data (default 1)", type=positive_float, group=_WL, exclusive="length"),
    Option("attention", PLANNING, "attention kernel the activations and the step time are counted for (flash: "
           "FlashAttention-2, transformers' flash_attention_2; flash3: FlashAttention-3, flash_attention_3, Hopper GPUs "
           "only)", choices=ATTENTION_IMPLS, default="sdpa", group=_WL),
    Option("liger-kernels", PLANNING, "your script loads the model with Liger-Kernel (AutoLigerKernelForCausalLM, as "
           "ArcticTraining's type: liger): its RMSNorm, SwiGLU and fused linear cross-entropy are priced. on: a current "
           "liger-kernel; or give the release, e.g. 0.5.10: before 0.6.1 its RMSNorm and RoPE, before 0.8.4 a per-head "
           "q_norm, index in 32 bits, which caps a rank's tokens (default off)", type=liger_kernels,
           metavar="on|off|VERSION", group=_WL),
    Option("checkpoint-reentrant", PLANNING, "your script's activation checkpointing is reentrant (use_reentrant=True: "
           "transformers 4.x's default, DeepSpeed's deepspeed.checkpointing, ArcticTraining's checkpoint offload): each "
           "recomputed layer's output is held through its backward, one more hidden state per token (default off: "
           "non-reentrant, transformers 5's default and zerokit's own loop)", choices=ON_OFF, group=_WL),
    Option("training-loop", PLANNING, "the loop the memory is priced for: zerokit (its own loop, or a script that keeps "
           "the model outputs through backward: their logits stay) or trainer (the HF Trainer, TRL's trainers, a script "
           "that keeps only the loss: the logits are freed before backward) (default zerokit)",
           choices=("zerokit", "trainer"), group=_WL),
    # -- setup pins
    Option("stage", ("plan", "render", "launch"), "ZeRO stage", type=int, choices=(0, 1, 2, 3), dest="zero_stage",
           group=_PIN),
    Option("offload-optimizer", ("plan", "render", "launch"), "", choices=("none", "cpu", "nvme"), group=_PIN),
    Option("offload-param", ("plan", "render", "launch"), "", choices=("none", "cpu", "nvme"), group=_PIN),
    Option("precision", RUNS + ("calibrate",), "check: for \"auto\" precision, the Trainer's --bf16/--fp16 (default: "
           "the best the GPU supports); calibrate: measure this precision only (and fp32, which every profile "
           "prices)", choices=PRECISION_CHOICES, group=_PIN),
    Option("micro-batch", RUNS, "samples per GPU per forward (check: for \"auto\" configs, the Trainer's "
           "--per_device_train_batch_size; default: the largest that fits)", type=positive_int,
           dest="micro_batch_size", group=_PIN),
    Option("grad-accum", RUNS, "gradient accumulation steps (check: for \"auto\" configs, what the HF Trainer will "
           "fill in; default 1)", type=positive_int, dest="gradient_accumulation_steps", group=_PIN),
    Option("activation-checkpointing", RUNS, "recompute each layer's activations in backward; offload: and keep the "
           "checkpointed layer inputs in host memory (ALST) (check: overrides the config's activation_checkpointing "
           "block)", choices=CHECKPOINTING, group=_PIN),
    Option("tensor-parallel", ("plan", "render", "launch"), "AutoTP ranks per model replica (1: none; ZeRO-0/1/2, full "
           "fine-tune)", type=positive_int, metavar="N", group=_PIN),
    Option("sequence-parallel", ("plan", "render", "launch"), "Ulysses sequence-parallel ranks per sequence (1: none)",
           type=positive_int, metavar="N", group=_PIN),
    Option("sequence-parallel-mode", ("plan", "render", "launch"), "how the sequence-parallel ranks split a sequence: "
           "ulysses (DeepSpeed-Ulysses, ALST's UlyssesSPAttentionHF: all-to-alls over the attention heads) or fpdt "
           "(DeepSpeed's chunked, offloaded FPDT: not planned, refused by name) (default ulysses)",
           choices=SEQUENCE_PARALLEL_MODES, group=_PIN),
    Option("seq-parallel-comm-dtype", ("plan", "render", "launch"), "the dtype DeepSpeed's engine reduces gradients in "
           "under Ulysses (seq_parallel_communication_data_type, whatever communication_data_type says): fp32, "
           "DeepSpeed's default, moves twice a 16-bit run's gradient bytes and casts each reduced gradient to an fp32 "
           "copy; bf16 or fp16 neither (default fp32)", choices=PRECISION_CHOICES, group=_PIN),
    Option("hpz", ("plan", "render", "launch"), "ZeRO++ hpZ secondary partition size, ranks (ZeRO-3; 1: none)",
           type=positive_int, metavar="N", dest="hpz_partition_size", group=_PIN),
    Option("pipeline-parallel", ("plan", "render", "launch"), "pipeline stages of DeepSpeed's pipeline engine (ZeRO-0/1; "
           "the micro-batches are the gradient accumulation steps; Llama-family models, full fine-tunes; 1: none)",
           type=positive_int,
           metavar="N", group=_PIN),
    Option("zero-quantized-weights", ("plan", "render", "launch"), "ZeRO++ qwZ: ZeRO-3 gathers parameters as int8 "
           "with scales (zero_quantized_weights; CUDA; pins ZeRO-3)", choices=ON_OFF, group=_PIN),
    Option("zero-quantized-gradients", ("plan", "render", "launch"), "ZeRO++ qgZ: ZeRO-3 reduces gradients as int4 "
           "through two all-to-alls, across nodes (zero_quantized_gradients; CUDA; pins ZeRO-3)", choices=ON_OFF,
           group=_PIN),
    Option("offload-engine", ("plan", "render", "launch"), "with --offload-optimizer cpu: zero-offload (DeepSpeedCPUAdam "
           "after each backward), zenflow (the GPU updates the top 5%% of gradient columns each step, the CPU the rest "
           "every 4 steps beside the GPU's work; zero_optimization.zenflow, DeepSpeed >= 0.17.5) or superoffload "
           "(ZeRO-3 on a Superchip: GraceAdam beside the GPU's next step; offload_optimizer.super_offload, DeepSpeed "
           ">= 0.18, CUDA) (default zero-offload)", choices=OFFLOAD_ENGINES, group=_PIN),
    Option("compile", RUNS, "torch: the training script compiles the engine (engine.compile(): torch.compile's "
           "Inductor fuses the element-wise work); deepcompile: DeepSpeed's DeepCompile too (compile.deepcompile, "
           "ZeRO 1-3, CUDA, torch >= 2.6), which runs ZeRO's gathers and releases as graph ops (check: how your "
           "script runs; DeepCompile is read from the config) (default off)", choices=COMPILE_MODES, group=_PIN,
           rank=True),
    Option("tiled-loss", RUNS, "logits and loss one slice of tokens at a time (ALST; check: your script uses "
           "DeepSpeed's TiledFusedLogitsLoss, no config key says so)", choices=ON_OFF, group=_PIN, rank=True),
    Option("tiled-mlp", RUNS, "each MLP one slice of tokens at a time (ALST; check: your script runs its MLPs through "
           "DeepSpeed's TiledMLP)", choices=ON_OFF, group=_PIN, rank=True),
    Option("memory-fraction", ("plan", "render", "launch"), "share of GPU memory a plan may use (default 0.95; the "
           "rest absorbs fragmentation)", type=fraction, group=_PIN),
    # -- fine-tuning
    Option("finetune", RUNS + ("calibrate",), "full: every weight trains (default); lora: peft LoRA adapters on a "
           "frozen base; qlora: LoRA on a base quantized to 4-bit NF4 by bitsandbytes (calibrate: full skips timing "
           "the LoRA/QLoRA models)", choices=("full", "lora", "qlora"), group=_FT, rank=True),
    Option("lora-r", RUNS, "LoRA rank (default 16)", type=integer, metavar="N", group=_FT, rank=True),
    Option("lora-alpha", RUNS, "LoRA alpha (default 8, peft's)", type=number, group=_FT, rank=True),
    Option("lora-dropout", RUNS, "LoRA dropout (default 0)", type=number, group=_FT, rank=True),
    Option("lora-targets", RUNS, "modules that get adapters: all-linear (peft's meaning: every Linear but the LM head; "
           "default) or module names such as q_proj,v_proj; a name of fused MoE expert parameters (gate_up_proj, down_proj) "
           "adapts them through peft's target_parameters", metavar="all-linear|NAME,NAME", group=_FT, rank=True),
    Option("bnb-4bit-quant-storage", RUNS, "qlora: the dtype the packed 4-bit weights are stored in "
           "(BitsAndBytesConfig; default uint8)", choices=("uint8", "bf16", "fp16", "fp32"), group=_FT, rank=True),
    Option("bnb-4bit-use-double-quant", RUNS, "qlora: quantize the quantization constants too (default on, as the "
           "QLoRA paper)", choices=ON_OFF, group=_FT, rank=True),
    Option("freeze", RUNS, "full fine-tune with the parameters whose names contain PATTERN frozen, or match it as a "
           "glob over the whole name when it has *?[ (repeatable; e.g. embed_tokens, layers.0., '*layers.[0-9].*')",
           metavar="PATTERN", repeat=True, group=_FT, rank=True),
    # -- plan / render / check outputs
    Option("deadline", ("plan",), "the fewest GPUs (nodes) of --gpu that fit and finish --samples x --epochs within "
           "this time: 36h, 90min, 2d, 1d12h (the plan is then made for that count; with --compare-gpus, for each GPU)",
           type=duration, metavar="DURATION"),
    Option("compare-gpus", ("plan",), "one row per GPU type: the chosen setup, step time, total time and GPU-hours on "
           "--gpus-per-node x --nodes of each (e.g. a100-80gb,h100-80gb,l40s)", type=name_list, metavar="GPU,GPU"),
    Option("json", PLANNING, "print one JSON object", type=None, cli_only=True),
    Option("trace", ("plan",), "measure activations by tracing the model under FakeTensorMode (slower)", type=None),
    Option("plot", ("plan",), "also draw the per-GPU memory of the chosen setup beside the others and the budget "
           "(FILE.svg or FILE.png; needs matplotlib: pip install 'zerokit[plot]')", metavar="FILE", cli_only=True),
    Option("output", ("render", "calibrate"), "where to write: render's ds_config (default ds_config.json; - for "
           "stdout); calibrate's profile (default: this machine's own, which plans here use without "
           "--hardware-profile: $ZEROKIT_HARDWARE_PROFILE, else $ZEROKIT_CACHE_DIR/hardware/profile.json)",
           short="-o"),
    Option("profile", ("plan", "render", "launch"), "plan, render: the ds_config as deepspeed (every value concrete; "
           "default), hf ('auto' where the "
           "HF Trainer fills values) or accelerate (the hf config and, beside it, accelerate_config.yaml for "
           "`accelerate launch --config_file`); launch, for your own script: hf (the default for a script built on "
           "TrainingArguments) or deepspeed (for deepspeed.initialize)", choices=("deepspeed", "hf", "accelerate")),
    # -- check
    Option("config", ("check", "launch"), "the ds_config.json to check (launch: use it instead of planning one)",
           positional=("check",), metavar="DS_CONFIG", exclusive="source"),
    Option("client-optimizer", ("check",), "for a config without an optimizer block: what the script updates with "
           "(the HF Trainer's --optim; default: its default for the torch installed here, adamw_torch_fused from "
           "torch 2.8); adamw_torch keeps two fp32 temporaries of the partition in the step",
           choices=("adamw_torch", "adamw_torch_fused", "adamw_bnb_8bit")),  # spec/optimizer.py CLIENT_OPTIMIZERS
    # -- launch
    Option("data", ("launch",), "a .txt/.jsonl/.json/.csv/.parquet file or a directory of them, a directory saved with "
           "datasets' save_to_disk, or a hub dataset id org/name; default: the bundled tiny corpus", group=_RUN),
    Option("data-format", ("launch",), "default: from the columns: \"messages\" (chat), prompt/response, "
           "instruction/input/output or question/answer (instruction), \"text\" (text); chat and instruction are "
           "rendered with the tokenizer's chat template and train on the assistant's tokens only",
           choices=("text", "chat", "instruction"), group=_RUN),
    Option("packing", ("launch",), "join examples into --seq-len blocks (on), or pad each to --seq-len (off); default "
           "on for text, off for chat and instruction (TRL's SFT default: no example sees another)", choices=ON_OFF,
           group=_RUN),
    Option("data-split", ("launch",), "split of a hub or saved dataset (default train)", metavar="SPLIT", group=_RUN),
    Option("data-config", ("launch",), "configuration (subset) of a hub dataset", metavar="NAME", group=_RUN),
    Option("tokenizer", ("launch",), "tokenizer for --data (default: the model's own; the bundled one for a "
           "random-init model)", metavar="DIR_OR_HUB_ID", group=_RUN, rank=True),
    Option("plan", ("launch",), "let the planner choose the setup and render the config (the default for your own "
           "script)", type=None, exclusive="source", group=_RUN),
    Option("output-dir", ("launch",), "default runs/<model>-<time>", metavar="DIR", group=_RUN, rank=True),
    Option("steps", ("launch",), "optimizer steps (default: one epoch)", type=positive_int, exclusive="length",
           group=_RUN, rank=True),
    Option("save-every", ("launch",), "checkpoint every K steps (default: 10 checkpoints when --max-restarts > 0, "
           "else only the last)", type=nonneg_int, metavar="K", group=_RUN, rank=True),
    Option("no-save", ("launch",), "write no checkpoint and no final weights: a run that measures time or memory, "
           "with nothing to resume or keep", type=None, group=_RUN, rank=True),
    Option("resume", ("launch",), "continue the run in --output-dir from its latest checkpoint; on another number of "
           "GPUs it is converted to DeepSpeed's universal checkpoint and the global batch is held", type=None,
           group=_RUN, rank=True),
    Option("max-restarts", ("launch",), "relaunch from the latest complete checkpoint up to R times if a rank dies",
           type=nonneg_int, default=0, metavar="R", group=_RUN),
    Option("dry-run", ("launch",), "print the command, environment and config; run nothing", type=None, group=_RUN),
    Option("lr", ("launch",), "peak learning rate (--plan; default 2e-5 for pretrained weights, 1e-3 for a "
           "random-init model)", type=positive_float, group=_RUN, rank=True),
    Option("warmup-steps", ("launch",), "LR warm-up steps (--plan; default 1/10 of the run)", type=nonneg_int,
           group=_RUN),
    Option("seed", ("launch",), "", type=nonneg_int, default=1234, group=_RUN, rank=True),
    Option("master-port", ("launch",), "rendezvous port (default: a free one)", type=port, group=_RUN),
    Option("no-report", ("launch",), "skip the predicted-vs-measured report", type=None, group=_RUN),
    Option("report-to", ("launch",), "also write the curves (loss, learning rate, step time, tokens/s, peak memory) "
           "and the final predicted-vs-measured figures to this tracker, through DeepSpeed's own monitor (the "
           "ds_config's tensorboard / wandb / csv_monitor blocks); repeatable; default none. Your own HF Trainer "
           "script gets --report_to (one tracker)", choices=("tensorboard", "wandb", "csv", "none"), repeat=True,
           group=_RUN),
    Option("report-dir", ("launch",), "where the trackers write: DIR/tensorboard/RUN, DIR/csv/RUN, DIR/wandb "
           "(default: the run's --output-dir)", metavar="DIR", group=_RUN),
    Option("merge", ("launch",), "--finetune lora/qlora: also write final/merged, the base with the adapter merged in "
           "(peft merge_and_unload; QLoRA into the dequantized 4-bit base), loadable by "
           "AutoModelForCausalLM.from_pretrained. final/ itself holds the adapter", type=None, group=_RUN, rank=True),
    Option("launcher", ("launch",), "DeepSpeed's multi-node launcher (default pdsh when --hostfile names other hosts)",
           choices=("pdsh", "openmpi", "mpich", "slurm"), group=_MULTI),
    Option("master-addr", ("launch",), "rendezvous address (default: DeepSpeed asks the first host)", metavar="HOST",
           group=_MULTI),
    Option("sbatch", ("launch",), "prepare the run directory and write a Slurm batch script for this job instead of "
           "running it (submit with: sbatch FILE)", metavar="FILE", group=_MULTI, exclusive="job-file"),
    Option("time-limit", ("launch",), "--sbatch: Slurm time limit (default 04:00:00)", default="04:00:00",
           group=_MULTI),
    Option("partition", ("launch",), "--sbatch: Slurm partition", group=_MULTI),
    Option("k8s", ("launch",), "prepare the run directory and write a Kubernetes PyTorchJob (Kubeflow training "
           "operator) that runs this job instead of running it (submit with: kubectl apply -f FILE)", metavar="FILE",
           group=_MULTI, exclusive="job-file"),
    Option("k8s-image", ("launch",), "--k8s: the container image every pod runs (zerokit, DeepSpeed and torch "
           "installed)", metavar="IMAGE", group=_MULTI),
    Option("k8s-volume", ("launch",), "--k8s: the PersistentVolumeClaim every pod mounts, and where; the run directory "
           "(--output-dir) must be under PATH, mounted at the same path where zerokit runs", metavar="CLAIM:PATH",
           group=_MULTI),
    Option("gpus-per-pod", ("launch",), "--k8s: GPUs (ranks) per pod (default --gpus-per-node: one pod per node); a "
           "divisor of --gpus-per-node", type=gpus_per_node, metavar="N", group=_MULTI),
    # -- serve
    Option("host", ("serve",), "address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 shares the page "
           "on your network)", default="127.0.0.1"),
    Option("port", ("serve",), "TCP port (default 8765; 0: a free one, printed)", type=nonneg_port, default=8765),
    Option("models-dir", ("serve",), "a folder of model directories (each with config.json) the page may plan by "
           "name; without it the page takes bundled names, hub ids and uploaded config.json files, never a path on "
           "this machine", metavar="DIR"),
    # -- calibrate
    Option("from-run", ("calibrate",), "instead of measuring: learn from a finished `zerokit launch` run directory "
           "(its measured step time beside the prediction) into the profile it was planned on, or -o PROFILE; the "
           "next plans near it on that hardware use it (launch does this itself at the end of a run planned on a "
           "profile)", metavar="RUN_DIR"),
    Option("quick", ("calibrate",), "fewer and smaller points, one pass of the plain DeepSpeed engines in one precision (~2 min on 2 cores)", type=None),
    Option("if-missing", ("calibrate",), "do nothing when the output already holds a profile measured on this machine "
           "(a full one, unless --quick)", type=None),
)

_BY_NAME = {o.name: o for o in OPTIONS}
_BY_KEY = {o.key: o for o in OPTIONS}


def option(name: str) -> Option:
    """The declaration of `name` (KeyError for an undeclared one: a typo in code fails where it is written)."""
    return _BY_NAME[name]


def flag(name: str) -> str:
    """`--name` for a declared option: how lower layers name an option in a message."""
    return option(name).flag


def for_command(command: str) -> list[Option]:
    return [o for o in OPTIONS if command in o.commands]


# ---------------------------------------------------------------------------------------------
# run config files


def _closest(word: str, names) -> str:
    near = difflib.get_close_matches(word, list(names), n=1, cutoff=0.6)
    return f": did you mean {near[0]!r}?" if near else ""


def read_run_file(path: str, command: str) -> dict[str, Any]:
    """A run config file's values for `command`, typed by the declarations, keyed by Option.key.

    Keys are long option names (with dashes or underscores). A key of another command is skipped (one run.yaml
    serves plan, render, check and launch); a key that is no option at all, a value an option refuses, or a file
    that is not a mapping is a one-line ZerokitError naming the key and the fix."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ZerokitError(f"run config file {path} not found: check the -c path") from None
    except IsADirectoryError:
        raise ZerokitError(f"run config file {path} is a directory: give a YAML or JSON file to -c") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ZerokitError(f"cannot read run config file {path}: {e}") from None
    if p.suffix.lower() == ".json":
        import json

        try:
            data = json.loads(text)
        except ValueError as e:
            raise ZerokitError(f"{path} is not valid JSON ({e}): fix the file, or write it as YAML") from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            where = getattr(e, "problem_mark", None)
            at = f" at line {where.line + 1}" if where is not None else ""
            raise ZerokitError(f"{path} is not valid YAML{at}: fix the file (keys are option names, e.g. "
                               "`gpus-per-node: 8`)") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ZerokitError(f"{path} holds a {type(data).__name__}, not a mapping of option names to values: write "
                           "one `name: value` per line")
    return typed_values(data, command, path)


def declared(raw_key) -> Option | None:
    """The option a key names: its long name with dashes or underscores, or its attribute (Option.key, e.g.
    micro_batch_size for --micro-batch); None for no option."""
    name = str(raw_key).strip().lstrip("-").replace("_", "-")
    return _BY_NAME.get(name) or _BY_KEY.get(name.replace("-", "_"))


def typed_values(data, command: str, where: str, *, others: str = "skip") -> dict[str, Any]:
    """Values for `command` from a mapping of option names to values (a run file's, the Python API's keywords, the
    web page's JSON), typed by the declarations and keyed by Option.key: the one typing path of them all.

    A key that is no option, or a value an option refuses, is a one-line ZerokitError naming the key (with the
    closest name) and the fix. A key of another command is skipped (others="skip": one run.yaml serves plan,
    render, check and launch) or refused (others="refuse": a keyword the function does not take)."""
    mine = {o.name for o in for_command(command)}
    values: dict[str, Any] = {}
    for raw_key, value in data.items():
        opt = declared(raw_key)
        if opt is not None and opt.name == "config-file" and others == "skip":
            raise ZerokitError(f"{where}: a run config file cannot name another (key {raw_key!r}): merge the two files")
        if opt is None:
            name = str(raw_key).strip().lstrip("-").replace("_", "-")
            hint = _closest(name, mine if others == "refuse" else _BY_NAME)
            raise ZerokitError(f"{where}: unknown {'keyword' if others == 'refuse' else 'key'} {raw_key!r}"
                               f"{hint.replace('-', '_') if others == 'refuse' else hint} (keys are zerokit's long "
                               "option names)")
        if opt.name not in mine or (others == "refuse" and opt.cli_only):
            if others == "skip":
                continue  # another command's option
            why = ("the command line's only" if opt.cli_only else
                   f"{' and '.join(c for c in opt.commands if c != 'zerokit')}'s, not {command}'s")
            raise ZerokitError(f"{where}: {raw_key!r} is {why}: drop it")
        try:
            values[opt.key] = opt.parse(value)
        except ValueError as e:
            raise ZerokitError(f"{where}: {raw_key}: {e}") from None
    return values


def complete_values(given: dict[str, Any], command: str, from_file: dict[str, Any], path: str | None = None
                    ) -> dict[str, Any]:
    """Every option of `command` (and the top level's): the values given, over the run file's, over the declared
    defaults. Options that exclude each other (Option.exclusive): one given directly drops the file's other."""
    mine = for_command(command) + (for_command("zerokit") if command != "zerokit" else [])
    from_file = dict(from_file)
    tags = {o.key: o.exclusive for o in mine if o.exclusive}
    for key, tag in tags.items():
        rivals = [o.key for o in mine if o.exclusive == tag and o.key != key]
        if key in from_file and any(r in given for r in rivals):
            del from_file[key]
        elif key in from_file and any(r in from_file for r in rivals):
            other = next(r for r in rivals if r in from_file)
            raise ZerokitError(f"{path}: {key.replace('_', '-')} and {other.replace('_', '-')} exclude each other: "
                               "keep one")
    out = dict(given)
    for opt in mine:
        if opt.key not in out:
            out[opt.key] = from_file[opt.key] if opt.key in from_file else (False if opt.is_switch else opt.default)
    return out
