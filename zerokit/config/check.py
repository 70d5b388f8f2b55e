"""`zerokit check`: validate a ds_config.json a user already has, then check that it fits.

Order: the file parses; zerokit's lint rules (what DeepSpeed silently ignores or misreads); DeepSpeed's
own config classes for the world size; then the memory model on the setup the config implies.
Exit 0 = valid and fits, 1 = valid but does not fit, 2 = invalid.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zerokit.core.errors import EXIT_DOES_NOT_FIT, EXIT_INVALID, EXIT_OK, ZerokitError


@dataclass
class CheckResult:
    config_path: str
    findings: list = field(default_factory=list)  # ds_check.Finding
    deepspeed_error: str | None = None
    evaluation: object | None = None  # planner.Evaluation when the config is valid
    world_size: int = 1
    cluster: object | None = None  # hardware.Cluster

    @property
    def valid(self) -> bool:
        return self.deepspeed_error is None and not any(f.level == "error" for f in self.findings)

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
                 memory_fraction: float | None = None, trainer_values: dict | None = None) -> CheckResult:
    """trainer_values: for an HF-profile config with "auto", what the Trainer will fill (dotted keys, e.g.
    {"train_micro_batch_size_per_gpu": 4}); the rest takes TrainingArguments' defaults, as the Trainer would.
    activation_checkpointing: None = what the config says (its activation_checkpointing block)."""
    from dataclasses import replace

    from zerokit.config import rules as ds_check
    from zerokit.estimate.memory import DEFAULT_MEMORY_FRACTION
    from zerokit.plan.planner import evaluate

    result = CheckResult(config_path=config_path, world_size=cluster.world_size, cluster=cluster)
    result.findings = ds_check.lint_config(config, cluster.world_size, cluster.accelerator)
    if any(f.level == "error" for f in result.findings):
        return result
    hidden = model.hidden_size if model is not None else None
    concrete = config
    if ds_check.auto_keys(config):
        # "auto" is filled by the HF Trainer at run time: validate what it will fill in.
        concrete = ds_check.fill_auto(config, trainer_values, cluster.world_size, hidden)
    try:
        ds_check.validate_with_deepspeed(concrete, cluster.world_size)
    except ZerokitError as e:
        result.deepspeed_error = str(e)
        return result
    if model is not None:
        setup, knobs = ds_check.setup_from_config(concrete, cluster.world_size)
        if activation_checkpointing is not None:
            setup = replace(setup, activation_checkpointing=activation_checkpointing)
        result.evaluation = evaluate(model, cluster, workload, setup, knobs, memory_fraction or DEFAULT_MEMORY_FRACTION)
    return result
