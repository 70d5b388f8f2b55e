"""`zerokit check`: validate a ds_config.json a user already has, then check that it fits.

Order: the file parses; zerokit's lint rules (what DeepSpeed silently ignores or misreads); DeepSpeed's
own config classes for the world size; then the memory model on the setup the config implies.
Exit 0 = valid and fits, 1 = valid but does not fit, 2 = invalid.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace

from zerokit.core.fsutil import atomic_write_text, cache_dir, package_version

from zerokit.core.errors import EXIT_DOES_NOT_FIT, EXIT_INVALID, EXIT_OK, ZerokitError
from zerokit.core.options import flag

# zerokit's own bound on the search for the largest micro batch of an "auto" config: doubling to 2^16 and bisecting
# is at most 32 evaluations (arithmetic), and 2^16 sequences per GPU is past what any catalog GPU holds of any model.
MAX_SEARCHED_MICRO_BATCH = 2**16

# What HfTrainerDeepSpeedConfig.trainer_config_finalize (transformers/integrations/deepspeed.py) fills these with
_HIDDEN_SIZE_FILLS = {
    "zero_optimization.reduce_bucket_size": "hidden^2",
    "zero_optimization.stage3_prefetch_bucket_size": "int(0.9 x hidden^2)",
    "zero_optimization.stage3_param_persistence_threshold": "10 x hidden",
}


@dataclass
class MicroBatchSearch:
    """The largest micro batch per GPU that fits, for a config whose micro batch is "auto": the HF Trainer fills it
    from --per_device_train_batch_size, which is the user's question, not an answer."""

    largest: int  # 0: not even micro batch 1 fits
    too_big: object | None  # planner.Evaluation at largest + 1 (why it does not fit); None: the search stopped at limit
    limit: int = MAX_SEARCHED_MICRO_BATCH

    def to_dict(self) -> dict:
        nxt = self.too_big
        return {"largest_micro_batch_size": self.largest, "limit": self.limit,
                "next": None if nxt is None else {"micro_batch_size": nxt.setup.micro_batch_size,
                                                  "per_gpu_bytes": nxt.memory.per_gpu_total,
                                                  "reasons": list(nxt.reasons)}}


def largest_fitting_micro_batch(judge, limit: int = MAX_SEARCHED_MICRO_BATCH):
    """(N, the evaluation at max(N, 1), the evaluation at N + 1 or None when N is the limit) for judge(micro batch)
    -> planner.Evaluation: doubling from 1, then bisection between the last size that fits and the first that does
    not. Memory only grows with the micro batch (activations, logits), so the first failure bounds the answer."""
    first = judge(1)
    if not first.fits:
        return 0, first, first
    lo, lo_ev, hi, hi_ev = 1, first, None, None
    while hi is None and lo < limit:
        m = min(2 * lo, limit)
        ev = judge(m)
        if ev.fits:
            lo, lo_ev = m, ev
        else:
            hi, hi_ev = m, ev
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        ev = judge(mid)
        if ev.fits:
            lo, lo_ev = mid, ev
        else:
            hi, hi_ev = mid, ev
    return lo, lo_ev, hi_ev


@dataclass
class CheckResult:
    config_path: str
    findings: list = field(default_factory=list)  # config.lint.Finding
    deepspeed_error: str | None = None
    evaluation: object | None = None  # planner.Evaluation when the config is valid
    world_size: int = 1
    cluster: object | None = None  # hardware.Cluster
    # False: DeepSpeed's config classes have not seen it yet (check_config(deepspeed_now=False)); the ranks will
    deepspeed_checked: bool = True
    assumed: list = field(default_factory=list)  # {"key", "value", "why"}: what each "auto" was taken to be
    search: MicroBatchSearch | None = None  # an "auto" micro batch, searched (check_config(answer_auto=True))
    finetune: object | None = None  # spec.finetune.Finetune the model was counted for (`check --finetune ...`)
    model: object | None = None  # spec.model.ModelSpec judged (its trainable count), None without --model
    parallelism: object | None = None  # spec.setup.Parallelism the config asks for (TP, SP, hpZ), once DeepSpeed reads it
    workload: object | None = None  # spec.setup.Workload judged (with --seq-len max: at the longest that fits)
    seq_len_search: object | None = None  # --seq-len max: planning/search.py SeqLenSearch
    warnings: list = field(default_factory=list)  # e.g. a sequence past the model's rotary positions
    verdict: str | None = None  # "fits", "at the edge" or "does not fit" (planning/search.py verdict); None: not judged

    @property
    def valid(self) -> bool:
        return self.deepspeed_error is None and not any(f.level == "error" for f in self.findings)

    def problem(self) -> str:
        """The first reason the config is invalid, as one line (and how many more there are)."""
        errors = [f"{f.key}: {f.message}" for f in self.findings if f.level == "error"]
        if self.deepspeed_error:
            errors.append(self.deepspeed_error)
        more = f" (and {len(errors) - 1} more: see `zerokit -v check`)" if len(errors) > 1 else ""
        return (errors[0] if errors else "no problem found") + more

    @property
    def exit_code(self) -> int:
        if not self.valid:
            return EXIT_INVALID
        return EXIT_OK if self.evaluation is None or self.evaluation.fits else EXIT_DOES_NOT_FIT

    def to_dict(self) -> dict:
        return {
            "config": self.config_path,
            "world_size": self.world_size,
            "valid": self.valid,
            "fits": None if self.evaluation is None else self.evaluation.fits,
            "verdict": None if self.evaluation is None else (
                self.verdict or ("fits" if self.evaluation.fits else "does not fit")),
            "findings": [{"level": f.level, "key": f.key, "message": f.message} for f in self.findings],
            "deepspeed_error": self.deepspeed_error,
            "evaluation": None if self.evaluation is None else self.evaluation.to_dict(),
            "assumed": list(self.assumed),
            "micro_batch_search": None if self.search is None else self.search.to_dict(),
            "finetune": None if self.finetune is None else self.finetune.to_dict(),
            "parallelism": None if self.parallelism is None else self.parallelism.to_dict(self.world_size),
            "workload": None if self.workload is None else {
                **vars(self.workload),
                **({} if self.seq_len_search is None else {"max_seq_len": self.seq_len_search.longest,
                                                           "max_seq_len_search": self.seq_len_search.to_dict()})},
            "warnings": list(self.warnings),
        }


def check_config(config: dict, config_path: str, model, cluster, workload, activation_checkpointing: bool | None = None,
                 memory_fraction: float | None = None, trainer_values: dict | None = None,
                 deepspeed_now: bool = True, precision: str | None = None, answer_auto: bool = False,
                 client_optimizer: str | None = None, tiled: dict | None = None,
                 checkpoint_offload: bool | None = None, longest_seq: bool = False) -> CheckResult:
    """trainer_values: for an HF-profile config with "auto", what the Trainer will fill (dotted keys, e.g.
    {"train_micro_batch_size_per_gpu": 4}); the rest takes TrainingArguments' defaults, as the Trainer would.
    precision: what the Trainer's --bf16/--fp16 make of "auto" precision; a concrete precision must agree with it.
    answer_auto (`zerokit check`): an "auto" micro batch not in trainer_values is searched for the largest that fits,
    and "auto" precision is the best the accelerator supports; without it (launch), TrainingArguments' defaults
    (micro batch 8, fp32) as the Trainer would fill them unasked.
    activation_checkpointing: None = what the config says (its activation_checkpointing block).
    tiled: {"tiled_loss": bool, "tiled_mlp": bool}, what the training script tiles (no ds_config key says it).
    checkpoint_offload: None = what the config says (activation_checkpointing.cpu_checkpointing); with
    activation_checkpointing given, False unless given.
    longest_seq (--seq-len max): the longest sequence the config fits at this world size, searched over the memory
    model (planning/search.py); result.seq_len_search says it and what binds, result.evaluation is at that length.
    deepspeed_now=False leaves DeepSpeed's config classes to whoever imports DeepSpeed next (a launch's ranks) when
    the verdict is not cached; a config zerokit cannot read a setup from is still put to DeepSpeed now."""

    from zerokit.config.auto import AUTO, auto_keys
    from zerokit.config.lint import Finding
    from zerokit.config.read import parallelism_from_config
    from zerokit.config.setup import setup_from_config, trainer_default_optimizer
    from zerokit.estimate.memory import DEFAULT_MEMORY_FRACTION
    from zerokit.planning.planner import evaluate

    from zerokit.config.read import checked_config

    checked_config(config)
    acc = cluster.accelerator
    if problem := acc.attention_problem(workload.attention):
        raise ZerokitError(problem)
    if precision is not None and not acc.supports(precision):
        raise ZerokitError(f"{flag('precision')} {precision}: {acc.name} does not support {precision}: use "
                           f"{' or '.join(acc.precisions)}")
    from zerokit.config.read import with_bf16_name

    # an old "bfloat16" block is DeepSpeed's bf16 (get_bfloat16_config): its "auto" is the precision's
    values, autos = dict(trainer_values or {}), set(auto_keys(with_bf16_name(config)))
    chosen = precision or (acc.precisions[0] if answer_auto else None)
    precision_keys = {"fp16.enabled", "bf16.enabled"}
    precision_auto = bool(autos & precision_keys) and not values.keys() & precision_keys
    if precision_auto and chosen is not None:
        values.update({"bf16.enabled": chosen == "bf16", "fp16.enabled": chosen == "fp16"})
        if chosen != "fp32" and chosen not in config and not (chosen == "bf16" and "bfloat16" in config):
            # the Trainer's --bf16/--fp16 with no such block: accelerate adds it (DeepSpeedPlugin.set_mixed_precision)
            config = {**config, chosen: {"enabled": True, **({"auto_cast": True} if chosen == "fp16" else {})}}
    # the micro batch is the Trainer's to fill: "auto", or absent beside an "auto" train_batch_size (DeepSpeed
    # derives it from that); a concrete train_batch_size fixes it
    micro, total, auto = config.get("train_micro_batch_size_per_gpu"), config.get("train_batch_size"), AUTO
    search = (answer_auto and "train_micro_batch_size_per_gpu" not in values
              and (micro == auto and total in (None, auto) or micro is None and total == auto))
    if search:
        values["train_micro_batch_size_per_gpu"] = 1  # DeepSpeed's checks at 1; the memory model searches

    result = CheckResult(config_path=config_path, world_size=cluster.world_size, cluster=cluster, workload=workload)
    hidden = model.hidden_size if model is not None else None
    verdict = deepspeed_verdict(config, cluster.world_size, acc, values or None, hidden, run_deepspeed=deepspeed_now)
    result.findings = [Finding(**f) for f in verdict["findings"]]
    result.deepspeed_error = verdict["deepspeed_error"]
    result.deepspeed_checked = verdict.get("deepspeed_checked", True)
    if not result.valid:
        return result
    concrete = verdict["concrete"]
    result.parallelism = parallelism_from_config(concrete)
    if model is not None:
        sp = result.parallelism.sequence_parallel
        # --seq-len max searches multiples of the SP degree: the sequence is not the config's to be wrong about
        result.findings += sequence_parallel_findings(sp, model, sp if longest_seq else workload.seq_len)
        if not result.valid:
            return result
    result.assumed = _assumed(config, concrete, values, trainer_values or {}, searched=search,
                              has_model=model is not None,
                              precision=chosen if precision_auto else None, precision_given=precision is not None,
                              accelerator=acc, hidden=hidden, seq_len=workload.seq_len, world_size=cluster.world_size)
    if model is not None:
        try:
            # no optimizer block: the script's own. `check` and a user's script: the HF Trainer's default --optim for
            # the torch installed here (unless --client-optimizer); zerokit's own loop: torch.optim.AdamW (unfused)
            client = client_optimizer or (trainer_default_optimizer(package_version("torch")) if answer_auto
                                          else "adamw_torch")
            setup, knobs = setup_from_config(concrete, cluster.world_size, client_optimizer=client)
            if not isinstance(config.get("optimizer"), dict):
                whose = (f"{flag('client-optimizer')} given" if client_optimizer else
                         "the HF Trainer's default --optim with the torch installed here" if answer_auto else
                         "zerokit's loop: torch.optim.AdamW")
                result.assumed.append({"key": "optimizer", "value": client, "why": (
                    "no optimizer block: the script's own, " + whose + "; adamw_torch (unfused) keeps two fp32 "
                    "temporaries of the partition in the step, adamw_torch_fused none")})
            comm = concrete.get("communication_data_type")  # the gradients' dtype (estimate.timing.collective_bytes)
            setup = replace(setup, communication_data_type=comm.lower() if isinstance(comm, str) else None)
        except ZerokitError:  # setup_from_config's one line for a value it cannot read (tests/test_fuzz.py)
            if result.deepspeed_checked:
                raise
            # a value of a type DeepSpeed would refuse: its own words, now
            return check_config(config, config_path, model, cluster, workload, activation_checkpointing,
                                memory_fraction, trainer_values, deepspeed_now=True, precision=precision,
                                answer_auto=answer_auto, client_optimizer=client_optimizer, tiled=tiled,
                                checkpoint_offload=checkpoint_offload, longest_seq=longest_seq)
        if precision is not None and setup.precision != precision:
            raise ZerokitError(f"{flag('precision')} {precision} disagrees with {config_path}, which trains in "
                               f"{setup.precision}: the HF Trainer refuses the mismatch; drop {flag('precision')} or "
                               "make the config's precision \"auto\"")
        if activation_checkpointing is not None:
            setup = replace(setup, activation_checkpointing=activation_checkpointing,
                            checkpoint_offload=bool(checkpoint_offload) and activation_checkpointing)
        script = dict(tiled or {})
        if script.get("compile") == "deepcompile" and setup.compile != "deepcompile":
            raise ZerokitError(f"{flag('compile')} deepcompile: DeepCompile is read from the config: add \"compile\": "
                               f"{{\"deepcompile\": true}} to {config_path}, or give {flag('compile')} torch")
        if setup.compile != "off":  # the config's DeepCompile: the script's engine.compile() builds it
            script.pop("compile", None)
        setup = replace(with_parallelism(setup, result.parallelism), **script)
        threshold = knobs.stage3_param_persistence_threshold
        if model is not None and model.trained.finetune_mode == "qlora" and setup.zero_stage == 3 and threshold > 0:
            # priced as it is (whole small 4-bit weights on every rank); said, since render writes 0 (ZeroKnobs.for_model)
            result.findings.append(Finding(
                "warning", "zero_optimization.stage3_param_persistence_threshold",
                f"{threshold:,} with QLoRA: packed 4-bit weights under {threshold:,} stored elements stay whole on every "
                "rank (a packed weight holds 1/2 to 1/8 of its weight's elements); 0 partitions them all"))
        fraction = memory_fraction or DEFAULT_MEMORY_FRACTION
        if longest_seq:
            result.seq_len_search = config_longest(model, cluster, workload, setup, knobs, fraction, config_path)
            workload = replace(workload, seq_len=result.seq_len_search.longest)
            result.workload = workload
        if search:
            largest, result.evaluation, too_big = largest_fitting_micro_batch(
                lambda m: evaluate(model, cluster, workload, replace(setup, micro_batch_size=m), knobs, fraction))
            result.search = MicroBatchSearch(largest, too_big)
        else:
            result.evaluation = evaluate(model, cluster, workload, setup, knobs, fraction)
            from zerokit.planning.search import verdict  # fits, at the edge or does not fit, as plan says

            result.verdict = verdict(model, cluster, workload, result.evaluation, knobs=knobs)
    return result


def config_longest(model, cluster, workload, setup, knobs, fraction: float, config_path: str):
    """`check --seq-len max`: the config's setup at the longest sequence it fits (planning/search.py longest_fitting),
    cut, as plan's answer is (search.longest_plan), to where published long runs ended; a SeqLenSearch."""
    from zerokit.planning.planner import evaluate
    from zerokit.planning.search import (SeqLenSearch, binding, likely_range, longest_fitting, safe_longest,
                                         seq_len_limit, seq_memory_factor)

    granule, limit = setup.sequence_parallel, seq_len_limit(model)
    longest, at, beyond = longest_fitting(
        lambda s: evaluate(model, cluster, replace(workload, seq_len=s), setup, knobs, fraction), granule, limit)
    if longest == 0:
        raise ZerokitError(f"{flag('seq-len')} max: {config_path} fits nothing even at {granule} token"
                           f"{'s' if granule > 1 else ''}: {binding(at)}", exit_code=EXIT_DOES_NOT_FIT)
    bound, factor = longest, seq_memory_factor(cluster, longest)
    longest = granule * max(1, safe_longest(model, cluster, workload, setup, at.budget.gpu_bytes, granule,
                                            longest // granule, factor, knobs))
    return SeqLenSearch(longest, granule, limit, binding(beyond), likely_range(
        bound, granule, setup.sequence_parallel, not cluster.accelerator.is_cpu), bound, factor)


def with_parallelism(setup, par):
    """The setup priced with the config's TP, SP and hpZ as DeepSpeed acts on them: hpZ at stage 3 only
    (stage3.py reads it), TP or SP but not both (engine.py's one model-parallel mesh; lint_config warns)."""
    if par is None or (par.tensor_parallel > 1 and par.sequence_parallel > 1):
        return setup
    return replace(setup, tensor_parallel=par.tensor_parallel, sequence_parallel=par.sequence_parallel,
                   hpz_partition_size=par.hpz_partition_size if setup.zero_stage == 3 else 1,
                   # pipeline stages at ZeRO-0/1 only (engine.py asserts it; lint_config says so)
                   pipeline_parallel=par.pipeline_parallel if setup.zero_stage <= 1 else 1)


def sequence_parallel_findings(sp: int, model, seq_len: int) -> list:
    """spec.setup.ulysses_problems for this model and sequence, as errors on sequence_parallel_size."""
    from zerokit.config.lint import Finding
    from zerokit.spec.setup import ulysses_problems

    return [Finding("error", "sequence_parallel_size", why)
            for why in ulysses_problems(model.num_attention_heads, model.num_kv_heads, sp, seq_len)]


def _assumed(config: dict, concrete: dict, values: dict, given: dict, *, searched: bool, has_model: bool,
             precision: str | None, precision_given: bool, accelerator, hidden: int | None, seq_len: int,
             world_size: int) -> list[dict]:
    """What each "auto" in config was taken to be, and why: as the HF Trainer fills it from its arguments
    (HfTrainerDeepSpeedConfig in transformers/integrations/deepspeed.py), or DeepSpeed's default where it does not."""
    from zerokit.config.auto import AUTO, TRAINER_DEFAULTS, TRAINER_FILLED_KEYS, auto_keys
    from zerokit.config.keys import ZERO_FIELD_TO_ALIAS
    from zerokit.config.read import batch_world_size, lookup
    from zerokit.spec.setup import ZeroKnobs

    out, autos = [], auto_keys(config)

    def add(key, value, why):
        out.append({"key": key, "value": value, "why": why})

    def arg(key, named, default_why):
        return f"{named} given" if key in given else default_why

    micro, accum = "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"
    if searched and not has_model:
        add(micro, 1, f"for DeepSpeed's checks; give {flag('model')} to search the largest that fits")
    elif searched:
        add(micro, "searched", f"the largest that fits at seq {seq_len}, for the Trainer's "
                               f"--per_device_train_batch_size; {flag('micro-batch')} N judges N")
    elif micro in autos or (micro not in config and "train_batch_size" in autos):
        add(micro, values.get(micro, TRAINER_DEFAULTS[micro]),
            arg(micro, flag("micro-batch"), "TrainingArguments' default per_device_train_batch_size"))
    if accum in autos:
        add(accum, values.get(accum, TRAINER_DEFAULTS[accum]),
            arg(accum, flag("grad-accum"), f"TrainingArguments' default; {flag('grad-accum')} N to change"))
    if "train_batch_size" in autos:
        dp = batch_world_size(config, world_size)
        add("train_batch_size", f"micro x accumulation x {dp}",
            "as the Trainer computes it" if dp == world_size else
            f"as accelerate sets it under sequence parallelism: {world_size} ranks / sequence_parallel_size")
    if precision is not None:
        trainer_flag = "no --bf16/--fp16" if precision == "fp32" else f"--{precision}"
        add("precision", precision, f"{flag('precision')} given" if precision_given else
            f"the best the {accelerator.name} supports, as the Trainer's {trainer_flag} sets it; {flag('precision')} "
            "to change")
    defaults = ZeroKnobs()
    for key in autos:
        if not key.startswith("zero_optimization."):
            continue
        filled = lookup(concrete, key)
        if key in _HIDDEN_SIZE_FILLS and filled != AUTO:
            add(key, filled, f"{_HIDDEN_SIZE_FILLS[key]} from the model's hidden size {hidden}" if hidden else
                f"DeepSpeed's default; the Trainer fills {_HIDDEN_SIZE_FILLS[key]} from the model: give "
                f"{flag('model')}")
        else:
            name = key.split(".", 1)[1]
            value = getattr(defaults, ZERO_FIELD_TO_ALIAS.get(name, name), "DeepSpeed's default")
            add(key, value, "DeepSpeed's default: the HF Trainer does not fill this key")
    rest = [k for k in autos if k in TRAINER_FILLED_KEYS and not k.startswith("zero_optimization.")
            and k not in (micro, accum, "train_batch_size", "fp16.enabled", "bf16.enabled")]
    if rest:
        groups = sorted({k.rsplit(".", 1)[0] + ".*" if "." in k else k for k in rest})
        add(", ".join(groups), "TrainingArguments' defaults", "no effect on memory")
    return out


# Bump when lint_config, fill_auto or validate_with_deepspeed change what they decide: old entries stop matching.
_VERDICT_SCHEMA = 9  # 9: the grad_accum_dtype check on pipelined configs too; 8: data_types.grad_accum_dtype without ZeRO; 7: pipeline stages (the batch check over one stage's data-parallel ranks, lint); 6: the old "bfloat16" block read as bf16; 2: deepspeed_checked; 3: lint on other tools' keys, TP/SP, deprecated keys; 4: the batch world / sp, TP and hpZ priced; 5: "auto" train_batch_size over the data-parallel ranks under SP


def deepspeed_verdict(config: dict, world_size: int, accelerator, trainer_values: dict | None,
                      hidden_size: int | None, run_deepspeed: bool = True) -> dict:
    """What DeepSpeed's rules say of a config for `world_size` ranks: zerokit's lint findings, DeepSpeed's own
    config classes' error (None: accepted), and the config with "auto" filled as the HF Trainer would.

    Cached ($ZEROKIT_CACHE_DIR/checks), keyed by everything the answer depends on (the config, world size, the
    accelerator's precisions, the Trainer values, the hidden size, the DeepSpeed and zerokit versions): a repeated
    check or launch of the same config does not import DeepSpeed (2 s of a launch on 2 cores: importing torch).
    run_deepspeed=False on a cache miss: lint and "auto" only (lint reads DeepSpeed's key sets as data, importing
    nothing), "deepspeed_checked" False, and nothing cached."""
    from zerokit import __version__
    from zerokit.config.auto import auto_keys, fill_auto
    from zerokit.config.lint import lint_config
    from zerokit.config.read import checked_config, checked_world_size
    from zerokit.config.validate import validate_with_deepspeed

    checked_config(config)
    checked_world_size(world_size)

    material = json.dumps({"schema": _VERDICT_SCHEMA, "zerokit": __version__, "deepspeed": package_version("deepspeed"),
                           "config": config, "world_size": world_size, "trainer_values": trainer_values,
                           "hidden_size": hidden_size,
                           "accelerator": None if accelerator is None else [accelerator.name, *accelerator.precisions]},
                          sort_keys=True, separators=(",", ":"), default=str)
    path = cache_dir("checks") / f"{hashlib.sha256(material.encode()).hexdigest()}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    verdict = {"findings": [], "deepspeed_error": None, "concrete": None, "deepspeed_checked": True}
    findings = lint_config(config, world_size, accelerator)
    verdict["findings"] = [{"level": f.level, "key": f.key, "message": f.message} for f in findings]
    if not any(f.level == "error" for f in findings):
        from zerokit.config.read import with_bf16_name

        concrete = config = with_bf16_name(config)  # linted as written (its name noted); read as DeepSpeed reads it
        if auto_keys(config):
            # "auto" is filled by the HF Trainer at run time: validate what it will fill in.
            concrete = fill_auto(config, trainer_values, world_size, hidden_size)
        if not run_deepspeed:
            return {**verdict, "concrete": concrete, "deepspeed_checked": False}
        try:
            validate_with_deepspeed(concrete, world_size)
            verdict["concrete"] = concrete
        except ZerokitError as e:
            verdict["deepspeed_error"] = str(e)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(verdict), mode=0o644)
    except OSError:
        pass  # an unwritable cache only costs the check next time
    return verdict
