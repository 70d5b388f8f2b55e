"""`zerokit check`: validate a ds_config.json a user already has, then check that it fits.

Order: the file parses; zerokit's lint rules (what DeepSpeed silently ignores or misreads); DeepSpeed's
own config classes for the world size; then the memory model on the setup the config implies.
Exit 0 = valid and fits, 1 = valid but does not fit, 2 = invalid.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from zerokit.core.fsutil import atomic_write_text, cache_dir, package_version

from zerokit.core.errors import EXIT_DOES_NOT_FIT, EXIT_INVALID, EXIT_OK, ZerokitError


@dataclass
class CheckResult:
    config_path: str
    findings: list = field(default_factory=list)  # ds_check.Finding
    deepspeed_error: str | None = None
    evaluation: object | None = None  # planner.Evaluation when the config is valid
    world_size: int = 1
    cluster: object | None = None  # hardware.Cluster
    # False: DeepSpeed's config classes have not seen it yet (check_config(deepspeed_now=False)); the ranks will
    deepspeed_checked: bool = True

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
            "findings": [{"level": f.level, "key": f.key, "message": f.message} for f in self.findings],
            "deepspeed_error": self.deepspeed_error,
            "evaluation": None if self.evaluation is None else self.evaluation.to_dict(),
        }


def check_config(config: dict, config_path: str, model, cluster, workload, activation_checkpointing: bool | None = None,
                 memory_fraction: float | None = None, trainer_values: dict | None = None,
                 deepspeed_now: bool = True) -> CheckResult:
    """trainer_values: for an HF-profile config with "auto", what the Trainer will fill (dotted keys, e.g.
    {"train_micro_batch_size_per_gpu": 4}); the rest takes TrainingArguments' defaults, as the Trainer would.
    activation_checkpointing: None = what the config says (its activation_checkpointing block).
    deepspeed_now=False leaves DeepSpeed's config classes to whoever imports DeepSpeed next (a launch's ranks) when
    the verdict is not cached; a config zerokit cannot read a setup from is still put to DeepSpeed now."""
    from dataclasses import replace

    from zerokit.config import rules as ds_check
    from zerokit.estimate.memory import DEFAULT_MEMORY_FRACTION
    from zerokit.plan.planner import evaluate

    result = CheckResult(config_path=config_path, world_size=cluster.world_size, cluster=cluster)
    hidden = model.hidden_size if model is not None else None
    verdict = deepspeed_verdict(config, cluster.world_size, cluster.accelerator, trainer_values, hidden,
                                run_deepspeed=deepspeed_now)
    result.findings = [ds_check.Finding(**f) for f in verdict["findings"]]
    result.deepspeed_error = verdict["deepspeed_error"]
    result.deepspeed_checked = verdict.get("deepspeed_checked", True)
    if not result.valid:
        return result
    concrete = verdict["concrete"]
    if model is not None:
        try:
            setup, knobs = ds_check.setup_from_config(concrete, cluster.world_size)
        except ZerokitError:  # setup_from_config's one line for a value it cannot read (tests/test_fuzz.py)
            if result.deepspeed_checked:
                raise
            # a value of a type DeepSpeed would refuse: its own words, now
            return check_config(config, config_path, model, cluster, workload, activation_checkpointing,
                                memory_fraction, trainer_values, deepspeed_now=True)
        if activation_checkpointing is not None:
            setup = replace(setup, activation_checkpointing=activation_checkpointing)
        result.evaluation = evaluate(model, cluster, workload, setup, knobs, memory_fraction or DEFAULT_MEMORY_FRACTION)
    return result


# Bump when lint_config, fill_auto or validate_with_deepspeed change what they decide: old entries stop matching.
_VERDICT_SCHEMA = 2  # 2: deepspeed_checked


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
    from zerokit.config import rules as ds_check

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
    findings = ds_check.lint_config(config, world_size, accelerator)
    verdict["findings"] = [{"level": f.level, "key": f.key, "message": f.message} for f in findings]
    if not any(f.level == "error" for f in findings):
        concrete = config
        if ds_check.auto_keys(config):
            # "auto" is filled by the HF Trainer at run time: validate what it will fill in.
            concrete = ds_check.fill_auto(config, trainer_values, world_size, hidden_size)
        if not run_deepspeed:
            return {**verdict, "concrete": concrete, "deepspeed_checked": False}
        try:
            ds_check.validate_with_deepspeed(concrete, world_size)
            verdict["concrete"] = concrete
        except ZerokitError as e:
            verdict["deepspeed_error"] = str(e)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(verdict), mode=0o644)
    except OSError:
        pass  # an unwritable cache only costs the check next time
    return verdict
