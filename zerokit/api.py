"""zerokit's Python API: the answers `zerokit plan|render|check|launch` print, as objects, for scripts and notebooks.

    import zerokit
    p = zerokit.plan("llama-3-8b", gpu="h100-80gb", gpus_per_node=8, seq_len=4096, global_batch=64)
    p.fits, p.best.setup.label, p.to_dict()        # to_dict() is `zerokit plan --json`
    TrainingArguments(..., deepspeed=zerokit.plan("tiny-llama", gpu="cpu", profile="hf").ds_config)
    zerokit.check("ds_config.json", model="llama-3-8b", gpus_per_node=8).valid
    zerokit.render("tiny-llama", gpu="cpu", output="ds_config.json")

Keywords are the long options in snake_case (`--gpus-per-node` is gpus_per_node; an option's attribute name, e.g.
micro_batch_size for --micro-batch, is taken too), typed and bounded by the same declarations as the command line
(zerokit.core.options) through the one typing path the run file and the web page use (typed_values). An unknown
keyword or a bad value raises ZerokitError with the command line's one line. The command line (zerokit/cli/) is a
shell over this module: it parses, calls these functions and prints; every planning decision is made here or below.

Functions named for a command take a `Request` (`request(command, mapping)`): one command's options, complete
(given, over the -c run file, over the declared defaults), and what it has to say on stderr (`said`), which the
command line prints and the API keeps on the result (`notes`, `warnings`).
"""

from __future__ import annotations

import html
import sys
from typing import Any

from zerokit.core.errors import EXIT_DOES_NOT_FIT, ZerokitError
from zerokit.core.options import SEQ_LEN_MAX, complete_values, flag, option, read_run_file, typed_values

DEFAULT_PLAN_SEQ_LEN = 2048  # plan, render, check: tokens per sample unless seq_len (capped at the model's maximum)
ACCELERATE_YAML = "accelerate_config.yaml"
SCRIPT_ONLY_OPTIONS = ("samples", "profile")  # launch takes these only for a user's own script (after `--`)


# ---------------------------------------------------------------------------------------------
# requests: options, typed once


class Request:
    """One command's options as attributes (Option.key), complete, and the notes and warnings it has to say (kept in
    `said`; with echo, as the command line makes it, also printed on stderr as they come)."""

    def __init__(self, command: str, values: dict[str, Any], echo: bool = False):
        self.__dict__.update(values)
        self.command = command
        self.said: list[str] = []
        self.echo = echo

    def say(self, line: str) -> None:
        if line not in self.said:
            self.said.append(line)
            if self.echo:
                print(line, file=sys.stderr)


def request(command: str, given: dict[str, Any], where: str | None = None) -> Request:
    """`command`'s Request from keywords: typed and bounded (typed_values: an unknown keyword, another command's, or
    a bad value is its one line), over the run file `config_file` names, over the declared defaults."""
    typed = typed_values({k: v for k, v in given.items() if v is not None}, command,
                         where or f"zerokit.{command}()", others="refuse")
    path = typed.get("config_file")
    from_file = read_run_file(path, command) if path else {}
    return Request(command, complete_values(typed, command, from_file, path))


# ---------------------------------------------------------------------------------------------
# options -> typed objects (the only place a request becomes a model spec, hardware, workload and pins)


def hardware_from(req):
    from zerokit.spec.hardware import HardwareOptions

    return HardwareOptions(gpu=req.gpu, gpu_memory=req.gpu_memory, gpus_per_node=req.gpus_per_node,
                           nodes=req.nodes, hostfile=req.hostfile, cpu_memory=req.cpu_memory,
                           nvme_path=req.nvme_path, nvme_size=req.nvme_size, hardware_profile=req.hardware_profile,
                           dist_backend=getattr(req, "dist_backend", None),
                           intra_node_bandwidth=getattr(req, "intra_node_bandwidth", None),
                           inter_node_bandwidth=getattr(req, "inter_node_bandwidth", None))


def gpu_name_note(req) -> None:
    """A family named without its size ("A100") is planned for its largest entry: say so."""
    if req.gpu and req.gpu.strip().lower() != "auto":
        from zerokit.spec.hardware import resolve_gpu_name

        _, note = resolve_gpu_name(req.gpu)  # an unknown name raises its one line here already
        if note:
            req.say(f"note: {note}")


def load_cluster(req):
    gpu_name_note(req)
    return hardware_from(req).build()


def load_model(req):
    """The ModelSpec: from params (pure arithmetic) or the model the resolver finds; as Liger-Kernel patches it
    with liger_kernels on (or a release number)."""
    model = _counted_model(req)
    liger = getattr(req, "liger_kernels", None)
    if liger in (None, "off"):
        return model
    return model.with_liger_kernels(None if liger == "on" else liger)


# the options that shape a bare --params count (spec_from_params); a model's config fixes its own
SHAPE_OPTIONS = ("hidden_size", "num_layers", "vocab_size", "num_attention_heads", "num_kv_heads")


def _counted_model(req):
    if getattr(req, "params", None):
        if getattr(req, "model", None):
            raise ZerokitError(f"give either a model or {flag('params')}, not both")
        from zerokit.core.units import parse_param_count
        from zerokit.spec.model import spec_from_params

        return spec_from_params(parse_param_count(req.params, flag("params")), hidden_size=req.hidden_size,
                                num_layers=req.num_layers, vocab_size=req.vocab_size,
                                num_attention_heads=getattr(req, "num_attention_heads", None),
                                num_kv_heads=getattr(req, "num_kv_heads", None))
    shaped = [flag(k.replace("_", "-")) for k in SHAPE_OPTIONS if getattr(req, k, None) is not None]
    if shaped and getattr(req, "model", None):
        raise ZerokitError(f"{shaped[0]} shapes a bare {flag('params')} count; {req.model}'s config fixes its shapes: "
                           f"drop {shaped[0]}")
    if not getattr(req, "model", None):
        raise ZerokitError("no model given: pass a model id/directory/bundled name (e.g. tiny-llama) or "
                           f"{flag('params')} N")
    from zerokit.spec.model import load_model_spec

    return load_model_spec(req.model)


def seq_len_is_max(req) -> bool:
    """seq_len max: the longest sequence that fits (planning/search.py)."""
    return getattr(req, "seq_len", None) == SEQ_LEN_MAX


def warn_seq_len(req, model, seq_len: int) -> str | None:
    """ModelSpec.check_seq_len: refused past a learned position table; past rotary positions one warning (said on
    stderr, and in --json's `warnings` from the same rule). Returns the warning."""
    warning = model.check_seq_len(seq_len)
    if warning:
        req.say(f"warning: {warning}")
    return warning


def load_workload(req, model=None):
    """The Workload; with the model, its seq_len held to the model's positions (ModelSpec.check_seq_len)."""
    from zerokit.spec.setup import Workload

    seq_len = req.seq_len
    if seq_len == SEQ_LEN_MAX:
        seq_len = 1  # a placeholder: the caller searches (planning/search.py)
    elif seq_len is None:
        seq_len = min(DEFAULT_PLAN_SEQ_LEN, (model.max_positions if model is not None else None) or DEFAULT_PLAN_SEQ_LEN)
    elif model is not None:
        warn_seq_len(req, model, seq_len)
    doc_len = getattr(req, "doc_len", None)
    if doc_len is not None and req.seq_len != SEQ_LEN_MAX and doc_len > seq_len:
        raise ZerokitError(f"{flag('doc-len')} {doc_len} is longer than the {seq_len}-token sequence it is packed into: "
                           f"give at most {seq_len}, or leave it out for one document per sequence")
    return Workload(seq_len=seq_len, global_batch=req.global_batch, samples=req.samples, epochs=req.epochs or 1.0,
                    attention=req.attention, doc_len=doc_len,
                    checkpoint_reentrant=getattr(req, "checkpoint_reentrant", None) == "on",
                    outputs_held=getattr(req, "training_loop", None) != "trainer")


def finetune_from(req):
    from zerokit.spec.finetune import Finetune

    mode = getattr(req, "finetune", None) or "full"
    lora = {k: getattr(req, k, None) for k in ("lora_r", "lora_alpha", "lora_dropout", "lora_targets")}
    quant = {k: getattr(req, k, None) for k in ("bnb_4bit_quant_storage", "bnb_4bit_use_double_quant")}
    given = [flag(k.replace("_", "-")) for k, v in lora.items() if v is not None]
    if mode == "full" and given:
        raise ZerokitError(f"{given[0]} needs {flag('finetune')} lora or qlora")
    given = [flag(k.replace("_", "-")) for k, v in quant.items() if v is not None]
    if mode != "qlora" and given:
        raise ZerokitError(f"{given[0]} needs {flag('finetune')} qlora")
    if quant["bnb_4bit_use_double_quant"] is not None:
        quant["bnb_4bit_use_double_quant"] = quant["bnb_4bit_use_double_quant"] == "on"
    return Finetune(mode=mode, freeze=tuple(getattr(req, "freeze", None) or ()),
                    **{k: v for k, v in {**lora, **quant}.items() if v is not None})


def finetuned_model(req, model, finetune):
    """The ModelSpec as fine-tuned, counted from the model's real module shapes (spec/finetune.py)."""
    if getattr(req, "params", None):
        if finetune.freeze or finetune.mode == "full":
            raise ZerokitError(f"{flag('freeze')} names the model's modules, which a bare {flag('params')} count does "
                               f"not have: give a model config")
        from zerokit.spec.bare_count import shape_finetuned_spec

        return shape_finetuned_spec(model, finetune)
    from zerokit.spec.finetune import finetuned_spec
    from zerokit.spec.resolve import resolve_model

    return finetuned_spec(model, str(resolve_model(req.model).config_file()), finetune)


def pins_from(req) -> dict:
    """The setup dimensions the request pins, as the planner reads them (on/off as booleans)."""
    if getattr(req, "sequence_parallel_mode", None) == "fpdt":
        # FPDT (deepspeed/sequence/fpdt_layer.py, the Ulysses-Offload blog): each sequence in chunks whose keys and
        # values are offloaded to the host between attention passes; wired into Megatron-DeepSpeed's GPT
        # (--ds-sequence-parallel-fpdt), not into an HF model, so zerokit can neither run nor price it
        raise ZerokitError(f"{flag('sequence-parallel-mode')} fpdt: DeepSpeed's FPDT (Fully Pipelined Distributed "
                           "Transformer: chunked, offloaded sequence parallelism) runs inside Megatron-DeepSpeed's GPT, "
                           "not an HF model, and zerokit does not plan it: use ulysses, with "
                           f"{flag('activation-checkpointing')} offload and {flag('tiled-mlp')} on for the longest "
                           "sequences")
    pins = {k: getattr(req, k, None) for k in ("zero_stage", "offload_optimizer", "offload_param", "precision",
                                               "micro_batch_size", "gradient_accumulation_steps", "tensor_parallel",
                                               "sequence_parallel", "hpz_partition_size", "pipeline_parallel")}
    for key in ("activation_checkpointing", "tiled_loss", "tiled_mlp"):
        v = getattr(req, key, None)
        if v is not None:
            pins[key] = v in ("on", "offload")
    for key in ("compile", "offload_engine"):
        if getattr(req, key, None) is not None:
            pins[key] = getattr(req, key)
    if getattr(req, "seq_parallel_comm_dtype", None) is not None:
        pins["seq_parallel_communication_data_type"] = req.seq_parallel_comm_dtype
    for key in ("quantized_weights", "quantized_gradients"):
        v = getattr(req, f"zero_{key}", None)
        if v is not None:
            pins[key] = v == "on"
    if getattr(req, "activation_checkpointing", None) is not None:  # on: without offload (the planner's own reach)
        pins["checkpoint_offload"] = req.activation_checkpointing == "offload"
    return {k: v for k, v in pins.items() if v is not None}


def memory_fraction_from(req) -> float:
    from zerokit.estimate.memory import DEFAULT_MEMORY_FRACTION

    return getattr(req, "memory_fraction", None) or DEFAULT_MEMORY_FRACTION  # bounded by its type, options.fraction


def planned_model(req):
    """The ModelSpec as the fine-tune trains it (LoRA/QLoRA/freeze counted from the model's modules)."""
    model = load_model(req)
    finetune = finetune_from(req)
    if not finetune.is_full:
        model = finetuned_model(req, model, finetune)
    return model


# ---------------------------------------------------------------------------------------------
# plan


def build_plan(req, model=None):
    """The planner's Plan for a plan/render request (zerokit.planning.planner.Plan); `model`: planned_model(req),
    when the caller has it already."""
    from zerokit.planning.planner import make_plan

    model = model if model is not None else planned_model(req)
    finetune = finetune_from(req)
    cluster = load_cluster(req)
    workload = load_workload(req, model)
    fraction = memory_fraction_from(req)
    pins = pins_from(req)
    if seq_len_is_max(req):  # the longest sequence that fits, by search over the memory model
        from zerokit.planning.search import longest_plan

        plan, search = longest_plan(model, cluster, workload, pins, fraction)
        workload = plan.workload
        plan.seq_len_search = search
        plan.notes.append(search.note)
        warn_seq_len(req, model, workload.seq_len)
    else:
        from zerokit.planning.planner import pipeline_rows

        plan = make_plan(model, cluster, workload, pins, memory_fraction=fraction)
        pipeline_rows(model, cluster, workload, pins, plan, memory_fraction=fraction)
    if plan.best is not None:  # fits, at the edge or does not fit (search.verdict)
        from zerokit.planning.search import verdict

        plan.verdict = verdict(model, cluster, plan.workload, plan.best)
    warning = model.check_seq_len(workload.seq_len)  # said by load_workload / warn_seq_len: once
    plan.warnings += [warning] if warning else []
    plan.finetune = finetune
    if not plan.fits and finetune.is_full and req.model:  # would LoRA or QLoRA fit where the full fine-tune does not?
        from zerokit.planning.planner import finetune_suggestions
        from zerokit.spec.resolve import resolve_model

        plan.suggestions += finetune_suggestions(str(resolve_model(req.model).config_file()), model, cluster,
                                                 workload, pins, memory_fraction=fraction)
    if cluster.profile is not None:  # hardware_profile, or this machine's own (spec.hardware.machine_profile_for)
        plan.notes.append(_calibration_note(req, plan, model, workload, pins, fraction))
    if getattr(req, "trace", False) and plan.best is not None:
        _trace(req, plan, workload)
    if plan.best is not None:
        from zerokit.config.render import render_ds_config

        profile = getattr(req, "profile", None) or "deepspeed"
        plan.ds_config = render_ds_config(plan.best.setup, cluster, model, workload,
                                          profile="hf" if profile == "accelerate" else profile)
        if model.trained.finetune_mode == "qlora" and plan.best.setup.zero_stage == 3:
            plan.notes.append("ds_config: stage3_param_persistence_threshold 0 (not 10 x hidden): a packed 4-bit weight "
                              "holds 1/2 to 1/8 of its weight's elements, and DeepSpeed keeps every parameter under the "
                              "threshold whole on every rank (ZeroKnobs.for_model)")
    return plan


def _calibration_note(req, plan, model, workload, pins, fraction) -> str:
    """What the measured profile changed: the same plan on the catalog's figures, beside it."""
    from dataclasses import replace

    from zerokit.planning.planner import make_plan
    from zerokit.planning.refine import calibration_effect

    try:
        catalog_cluster = replace(hardware_from(req), hardware_profile="none").build()
        catalog = make_plan(model, catalog_cluster, workload, pins, memory_fraction=fraction)
    except ZerokitError:
        catalog = None
    return calibration_effect(plan, catalog, plan.cluster.profile.path)


def _trace(req, plan, workload) -> None:
    """trace: the chosen setup's activations measured under FakeTensorMode, in place of the model's."""
    s = plan.best.setup
    if not req.model:
        raise ZerokitError(f"{flag('trace')} needs a model config to trace: give a model id or directory, not "
                           f"{flag('params')}")
    if plan.model.liger_kernels:  # the trace runs transformers' own modules
        raise ZerokitError(f"{flag('trace')} traces transformers' own modules, not Liger's kernels (Triton, GPU "
                           f"only): drop {flag('trace')} or {flag('liger-kernels')}")
    if s.tensor_parallel > 1 or s.sequence_parallel > 1 or s.tiled_loss or s.tiled_mlp:
        # the trace runs the unsplit HF model on one process: it measures none of these
        raise ZerokitError(f"{flag('trace')} measures the unsplit model on one process, not {s.label}: pin "
                           f"{flag('tensor-parallel')} 1 {flag('sequence-parallel')} 1 {flag('tiled-loss')} off "
                           f"{flag('tiled-mlp')} off, or drop {flag('trace')}")
    from zerokit.measure.trace import trace_activation_memory
    from zerokit.planning.refine import apply_activation_trace
    from zerokit.spec.resolve import resolve_model

    traced = trace_activation_memory(
        str(resolve_model(req.model).config_file()), seq_len=workload.seq_len, micro_batch=s.micro_batch_size,
        precision=s.precision, activation_checkpointing=s.activation_checkpointing,
        attn_implementation="eager" if workload.attention == "eager" else "sdpa",
    )
    apply_activation_trace(plan, traced)


def plan_request(req) -> Plan:
    """plan (and render's planning): with deadline, the fewest GPUs that finish in time, then the plan for them."""
    if getattr(req, "compare_gpus", None):
        raise ZerokitError(f"{flag('compare-gpus')} answers one row per GPU: call zerokit.compare_gpus(...) instead")
    if getattr(req, "deadline", None):
        if seq_len_is_max(req):  # each answers for one sequence length
            raise ZerokitError(f"{flag('seq-len')} max searches the length for one setup: give a length with "
                               f"{flag('deadline')}, or drop it")
        from zerokit.planning import scale

        model = planned_model(req)
        workload = load_workload(req, model)
        hw = hardware_from(req)
        gpu = hw.build().accelerator.name  # an unknown gpu: its one line before the search
        answer = scale.for_deadline(model, hw, workload, pins_from(req), req.deadline, memory_fraction_from(req))
        if not answer.met:
            raise scale.deadline_missed(answer, gpu, workload)
        req.gpus_per_node, req.nodes = answer.row.gpus_per_node, answer.row.nodes
        return Plan(build_plan(req, model), said=req.said, deadline=answer)
    return Plan(build_plan(req), said=req.said)


def compare_request(req) -> Comparison:
    """plan --compare-gpus: one row per GPU kind (planning.scale.compare_gpus)."""
    from zerokit.planning import scale

    if seq_len_is_max(req):
        raise ZerokitError(f"{flag('seq-len')} max searches the length for one setup: give a length with "
                           f"{flag('compare-gpus')}, or drop it")
    for name in ("plot", "trace"):
        if getattr(req, name, None):
            raise ZerokitError(f"{flag('compare-gpus')} prints one row per GPU: drop {flag(name)}")
    model = planned_model(req)
    workload = load_workload(req, model)
    rows = scale.compare_gpus(model, hardware_from(req), req.compare_gpus, workload, pins_from(req),
                              memory_fraction_from(req), req.deadline)
    return Comparison(model, workload, req.deadline, rows, said=req.said)


def _plain(obj):
    """As --json prints it and json.loads reads it back (tuples become lists): to_dict() == json.loads(--json)."""
    import json

    return json.loads(json.dumps(obj))


class _Answer:
    """What every answer shares: the planner's object inside (its attributes read through), what was said, a text
    table (str), and an HTML one for notebooks."""

    _inner: Any

    def __getattr__(self, name):
        if name.startswith("__") or name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __str__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        return f"<pre style='font-size:12px'>{html.escape(self.text())}</pre>"


class Plan(_Answer):
    """zerokit.plan's answer: .fits, .best (the chosen setup's Evaluation: .setup, .memory, .time), .setups (the
    chosen and the others, as to_dict rows), .ds_config, .notes, .warnings, .suggestions, .to_dict() (`zerokit plan
    --json`); str() is the table `zerokit plan` prints."""

    def __init__(self, plan, said=(), deadline=None):
        self._inner = plan
        self.deadline = deadline  # planning.scale.DeadlineAnswer when planned for a deadline
        self.said = list(said)

    @property
    def setups(self) -> list[dict]:
        """The chosen setup first (reason "chosen"), then the others with why each loses (the plan's `rejected`)."""
        b = self.best
        chosen = [{"setup": b.setup.to_dict(), "label": b.setup.label, "reason": "chosen",
                   "per_gpu_bytes": b.memory.per_gpu_total, "step_seconds": b.time.step_seconds,
                   "tokens_per_second": b.time.tokens_per_second}] if self.fits and b is not None else []
        return chosen + list(self.rejected)

    def close_evaluations(self) -> list:
        """(Evaluation, why it lost) for the other setups, in the plan's order (`rejected`)."""
        return [(ev, r["reason"]) for ev, r in zip(self._inner.others, self.rejected)]

    def ds_config_for(self, profile: str = "deepspeed") -> dict | None:
        """The chosen setup's ds_config in a profile: deepspeed (every value concrete) or hf ("auto" where the HF
        Trainer fills values); None when nothing fits."""
        if self.best is None or not self.fits:
            return None
        if profile not in ("deepspeed", "hf"):
            raise ZerokitError(f"profile {profile!r}: deepspeed or hf")
        from zerokit.config.render import render_ds_config

        return render_ds_config(self.best.setup, self.cluster, self.model, self.workload, profile=profile)

    def to_dict(self) -> dict:
        out = self._inner.to_dict()
        return _plain({**out, "deadline": self.deadline.to_dict()} if self.deadline is not None else out)

    def text(self) -> str:
        from zerokit.report.plan_text import format_deadline, format_plan

        table = format_plan(self._inner)
        return f"{format_deadline(self.deadline, self.workload)}\n{table}" if self.deadline is not None else table

    def _repr_html_(self) -> str:
        from zerokit.report.plan_text import plan_html

        return plan_html(self._inner, self.deadline)


class Comparison(_Answer):
    """zerokit.compare_gpus's answer: .rows (planning.scale.Row), .to_dict() (`plan --compare-gpus --json`)."""

    def __init__(self, model, workload, deadline, rows, said=()):
        self._inner, self.model, self.workload, self.deadline_seconds, self.rows = rows, model, workload, deadline, rows
        self.said = list(said)

    @property
    def fits(self) -> bool:
        return any(r.fits and r.meets_deadline is not False for r in self.rows)

    def to_dict(self) -> dict:
        return _plain({"model": self.model.to_dict(), "workload": vars(self.workload).copy(),
                       "deadline_seconds": self.deadline_seconds, "compare": [r.to_dict() for r in self.rows]})

    def text(self) -> str:
        from zerokit.report.plan_text import format_scale_rows

        return format_scale_rows(self.rows, self.workload, self.deadline_seconds)


# ---------------------------------------------------------------------------------------------
# render


def render_request(req) -> Plan:
    """render: the plan, and (req.output, not "-") its ds_config written, with accelerate_config.yaml beside it for
    profile accelerate: both or neither. Raises EXIT_DOES_NOT_FIT when nothing fits (nothing written)."""
    out = getattr(req, "output", None)
    if out and out != "-":  # a file that could not be written is refused before the planning
        from zerokit.core.fsutil import check_writable_file

        check_writable_file(out, f"{option('output').short} {out}")
    if out == "-" and req.profile == "accelerate":
        raise ZerokitError(f"{flag('profile')} accelerate writes two files (the ds_config and {ACCELERATE_YAML}): "
                           f"give {option('output').short} FILE instead of -")
    plan = plan_request(req)
    if plan.ds_config is None or not plan.fits:
        raise NothingFits(plan)
    plan.written = []
    if out and out != "-":
        plan.written = write_ds_config(plan, out, accelerate=req.profile == "accelerate")
    return plan


class NothingFits(ZerokitError):
    """render when no setup fits: the plan rides along (the command line prints its table before the line)."""

    def __init__(self, plan: Plan):
        super().__init__("nothing fits, no ds_config written: see the suggestions above", exit_code=EXIT_DOES_NOT_FIT)
        self.plan = plan


def write_ds_config(plan: Plan, output: str, accelerate: bool = False) -> list[str]:
    """The ds_config at `output` (atomically), and for accelerate its yaml beside it, written first: a failure
    leaves neither. Folders that do not exist are made (mkdir -p) and removed again on failure."""
    from zerokit.config.render import write_json_atomic
    from zerokit.core.fsutil import missing_folders, remove_folders

    created = missing_folders(output)
    yaml_path = _write_accelerate_config(plan, output) if accelerate else None
    try:
        write_json_atomic(output, plan.ds_config)
    except ZerokitError:
        if yaml_path is not None:
            yaml_path.unlink(missing_ok=True)  # nothing half-written: the pair or neither
            remove_folders(created)
        raise
    return [output] + ([str(yaml_path)] if yaml_path is not None else [])


def _write_accelerate_config(plan: Plan, ds_config_output: str):
    """accelerate_config.yaml beside the ds_config (written atomically, before it)."""
    from pathlib import Path

    from zerokit.config.render import render_accelerate_config
    from zerokit.core.fsutil import atomic_write_text

    ds_path = Path(ds_config_output).resolve()
    yaml_path = Path(ds_config_output).parent / ACCELERATE_YAML
    text = render_accelerate_config(plan.best.setup, plan.cluster, str(ds_path), str(yaml_path))
    try:
        atomic_write_text(yaml_path, text)
    except OSError as e:
        raise ZerokitError(f"cannot write {yaml_path}: {e.strerror}: choose a writable -o directory") from None
    return yaml_path


def accelerate_config_text(plan: Plan, ds_config_path: str = "ds_config.json") -> str:
    """The accelerate yaml for a plan whose ds_config will be saved at ds_config_path (the web page's download)."""
    from zerokit.config.render import render_accelerate_config

    return render_accelerate_config(plan.best.setup, plan.cluster, ds_config_path, ACCELERATE_YAML)


# ---------------------------------------------------------------------------------------------
# check


class Check(_Answer):
    """zerokit.check's answer: .valid, .fits, .findings, .problem(), .exit_code, .to_dict() (`check --json`);
    str() is the table `zerokit check` prints."""

    def __init__(self, result, said=()):
        self._inner = result
        self.said = list(said)

    @property
    def fits(self) -> bool:
        ev = self._inner.evaluation
        return bool(self._inner.valid and ev is not None and ev.fits)

    def to_dict(self) -> dict:
        return _plain(self._inner.to_dict())

    def text(self) -> str:
        from zerokit.report.plan_text import format_check

        return format_check(self._inner)


def check_request(req, config=None) -> Check:
    """check: a ds_config (req.config, a path; or `config`, a dict already read) judged as DeepSpeed would read it,
    then against the memory model. An invalid config is an answer (.valid False), not an error."""
    from zerokit.config.accelerate_yaml import is_accelerate_config, read_accelerate_config
    from zerokit.config.check import check_config
    from zerokit.config.read import load_config_file

    path = req.config
    if config is None and not path:
        raise ZerokitError("no ds_config given: zerokit check DS_CONFIG (or `config:` in the -c run file)")
    acc = None
    if config is not None:
        path = path or "ds_config"  # a label for the messages: the dict is never read from disk
    elif is_accelerate_config(path):
        # an accelerate config (HF Trainer / TRL ALST): its ds_config, with the Ulysses degree of its
        # parallelism_config; its ranks unless the hardware options give them
        acc = read_accelerate_config(path)
        config = acc.ds_config
        if acc.processes is not None and not (req.gpus_per_node or req.nodes or req.hostfile):
            if acc.processes % acc.machines:
                raise ZerokitError(f"{path}: num_processes {acc.processes} does not split over num_machines "
                                   f"{acc.machines}: give {flag('gpus-per-node')} and {flag('nodes')}")
            req.gpus_per_node, req.nodes = acc.processes // acc.machines, acc.machines
    else:
        config = load_config_file(path)
    has_model = bool(getattr(req, "model", None) or getattr(req, "params", None))
    model = load_model(req) if has_model else None
    finetune = finetune_from(req)
    if not finetune.is_full:
        if model is None:
            raise ZerokitError(f"{flag('finetune')} {finetune.mode}/{flag('freeze')} count the model's modules: give "
                               f"{flag('model')}")
        model = finetuned_model(req, model, finetune)
    cluster = load_cluster(req)
    trainer_values = {}
    if req.micro_batch_size:
        trainer_values["train_micro_batch_size_per_gpu"] = req.micro_batch_size
    if req.gradient_accumulation_steps:
        trainer_values["gradient_accumulation_steps"] = req.gradient_accumulation_steps
    ckpt = None if req.activation_checkpointing is None else req.activation_checkpointing in ("on", "offload")
    longest = seq_len_is_max(req)
    if longest and model is None:
        raise ZerokitError(f"{flag('seq-len')} max searches the memory model: give {flag('model')}")
    result = check_config(config, path, model, cluster, load_workload(req, model), activation_checkpointing=ckpt,
                          trainer_values=trainer_values or None, precision=req.precision, answer_auto=True,
                          client_optimizer=req.client_optimizer,
                          tiled={"tiled_loss": req.tiled_loss == "on", "tiled_mlp": req.tiled_mlp == "on",
                                 **({"compile": req.compile} if req.compile else {})},
                          checkpoint_offload=req.activation_checkpointing == "offload", longest_seq=longest)
    result.finetune, result.model = finetune, model
    if acc is not None:
        result.findings += acc.ignored
        if acc.sequence_parallel > 1:
            # accelerate registers Ulysses itself (accelerator.py: UlyssesSPAttentionHF.register_with_transformers,
            # its mpu to deepspeed.initialize): lint's warning that the key alone splits nothing is not this launch's
            result.findings = [f for f in result.findings if f.key != "sequence_parallel_size"]
            result.assumed.append({"key": "sequence_parallel_size", "value": acc.sequence_parallel, "why": (
                f"parallelism_config_sp_size of {path}: accelerate registers Ulysses with this degree (ds_config "
                f"from {acc.source})")})
    if model is not None and result.workload is not None:
        if longest:
            warn_seq_len(req, model, result.workload.seq_len)  # the answer, past the rotary positions: said once
        warning = model.check_seq_len(result.workload.seq_len)
        result.warnings += [warning] if warning else []
    return Check(result, said=req.said)


# ---------------------------------------------------------------------------------------------
# launch


def script_command(req, script_argv) -> list[str]:
    """A user's own script command (what followed `--`); checks that what needs it is there."""
    cmd = list(script_argv or [])
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    if not cmd:
        if not (req.plan or req.config):
            raise ZerokitError(f"give {flag('plan')} (the planner chooses) or {flag('config')} DS_CONFIG, or your own "
                               "script after `--`: e.g. `-- python train.py --deepspeed {ds_config}`")
        for name in SCRIPT_ONLY_OPTIONS:
            if getattr(req, name) is not None:
                raise ZerokitError(f"{flag(name)} is for your own script (after `--`): drop it, or give the script")
    return cmd


def launch_request(req, script_argv=()):
    """launch: the LaunchRequest (launching/prepare.py validates and plans it, writing nothing)."""
    if not req.model:
        raise ZerokitError(f"no model given: {flag('model')} ID|DIR|bundled name (e.g. tiny-llama), or `model:` in "
                           "the -c run file")
    if req.profile == "accelerate":
        raise ZerokitError(f"{flag('profile')} accelerate is render's (it writes accelerate_config.yaml): launch takes "
                           "hf or deepspeed")
    gpu_name_note(req)
    from zerokit.launching.prepare import LaunchRequest

    return LaunchRequest(
        model=req.model, hardware=hardware_from(req), data=req.data, tokenizer=req.tokenizer, config=req.config,
        data_format=req.data_format, packing={"on": True, "off": False}.get(req.packing), data_split=req.data_split,
        data_config=req.data_config,
        pins=pins_from(req), memory_fraction=memory_fraction_from(req), output_dir=req.output_dir,
        steps=req.steps, epochs=req.epochs, save_every=req.save_every, resume=req.resume,
        max_restarts=req.max_restarts, seq_len=req.seq_len, global_batch=req.global_batch, lr=req.lr,
        warmup_steps=req.warmup_steps, seed=req.seed, master_port=req.master_port, launcher=req.launcher,
        master_addr=req.master_addr, sbatch=req.sbatch, time_limit=req.time_limit, partition=req.partition,
        k8s=req.k8s, k8s_image=req.k8s_image, k8s_volume=req.k8s_volume, gpus_per_pod=req.gpus_per_pod,
        dry_run=req.dry_run, script_command=tuple(script_command(req, script_argv)), samples=req.samples,
        profile=req.profile, finetune=finetune_from(req), merge=req.merge, no_save=req.no_save,
        report_to=tuple(req.report_to or ()), report_dir=req.report_dir,
    )


class Launch:
    """zerokit.launch's answer: .command (the exact launcher command and env, as --dry-run prints it), .ds_config,
    .run_dir, .exit_code (None for a dry run; a Slurm or Kubernetes launch: the file written, in .written)."""

    def __init__(self, plan, exit_code=None, written=None, said=()):
        from zerokit.launching import execute

        self.plan, self.exit_code, self.written, self.said = plan, exit_code, written, list(said)
        self.command = execute.describe_command(plan, plan.request.resume)
        self.ds_config = plan.ds_config
        self.run_dir = str(plan.out)

    def __repr__(self) -> str:
        return f"Launch(run_dir={self.run_dir!r}, exit_code={self.exit_code!r})"


def run_launch(req, script_argv=(), report: bool = True) -> Launch:
    """launch, for real (or req.dry_run: nothing written or started): the run directory, then the ranks under the
    deepspeed launcher through the restart supervisor (or the sbatch / Kubernetes file written)."""
    from zerokit.launching import execute
    from zerokit.launching.prepare import prepare_launch

    plan = prepare_launch(launch_request(req, script_argv))
    if req.dry_run:
        return Launch(plan, said=req.said)
    execute.write_run_directory(plan)
    if req.sbatch:
        return Launch(plan, written=execute.write_sbatch(plan), said=req.said)
    if req.k8s:
        return Launch(plan, written=execute.write_k8s(plan), said=req.said)
    return Launch(plan, exit_code=execute.run(plan, report=report), said=req.said)


# ---------------------------------------------------------------------------------------------
# the public functions


def plan(model: str | None = None, **options) -> Plan:
    """Will it fit, which setup, how long: `zerokit plan MODEL --OPTIONS` as a Plan. ZerokitError for bad input
    (one line); a plan that does not fit is an answer (.fits False, .suggestions)."""
    return plan_request(request("plan", {"model": model, **options}))


def compare_gpus(model: str | None = None, gpus=(), **options) -> Comparison:
    """`zerokit plan MODEL --compare-gpus A,B`: one row per GPU kind (with deadline: the GPUs each needs)."""
    return compare_request(request("plan", {"model": model, "compare_gpus": ",".join(gpus) if not isinstance(
        gpus, str) else gpus, **options}))


def render(model: str | None = None, output: str | None = None, **options) -> dict:
    """The ds_config `zerokit render` writes (profile deepspeed, hf or accelerate), as a dict; written to `output`
    when given (accelerate: with accelerate_config.yaml beside it). ZerokitError (exit code 1) when nothing fits."""
    return render_request(request("render", {"model": model, "output": output, **options})).ds_config


def check(config, **options) -> Check:
    """`zerokit check CONFIG`: a ds_config (a path, or a dict) validated as DeepSpeed reads it, its "auto" values
    answered, and judged against the memory model (with model=...)."""
    if isinstance(config, dict):
        return check_request(request("check", options), config=config)
    return check_request(request("check", {"config": config, **options}))


def launch(model: str | None = None, script: list[str] | None = None, **options) -> Launch:
    """`zerokit launch`: plan (plan=True) or take a ds_config (config=PATH), check it fits, then train under the
    deepspeed launcher; `script`: your own training command, as after `--`. dry_run=True writes and starts nothing.
    Blocks until the run ends."""
    return run_launch(request("launch", {"model": model, **options}), script or ())
