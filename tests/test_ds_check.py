"""ds_config checks: zerokit's lint rules, DeepSpeed's own validation, fill_auto, reading a setup back."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]

pytest.importorskip("deepspeed")

from zerokit.config import keys as ds_check
from zerokit.config.auto import auto_keys, fill_auto
from zerokit.config.lint import Finding, lint_config
from zerokit.config.read import load_config_file
from zerokit.config.setup import setup_from_config
from zerokit.config.validate import validate_with_deepspeed
from zerokit.core.errors import ZerokitError
from zerokit.spec.hardware import Cluster, accelerator
from zerokit.config.render import render_ds_config
from zerokit.spec.setup import ZeroKnobs, ZeroSetup

A100 = accelerator("a100-80gb")
V100 = accelerator("v100-32gb")
CPU = accelerator("cpu")


def base(**top) -> dict:
    """A small valid config for 2 ranks: ZeRO-2, bf16, AdamW."""
    cfg = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2},
    }
    cfg.update(top)
    return cfg


def with_zero(cfg: dict, **zero) -> dict:
    cfg = copy.deepcopy(cfg)
    cfg["zero_optimization"].update(zero)
    return cfg


def keys(findings: list[Finding], level: str | None = None) -> set[str]:
    return {f.key for f in findings if level is None or f.level == level}


def test_the_base_config_is_clean():
    assert lint_config(base(), 2, A100) == []
    validate_with_deepspeed(base(), 2)


# ---------------------------------------------------------------------------------------------- lint rules

# (name, config that triggers, config that does not, key, level, accelerator, message fragment)
RULES = [
    ("unknown top-level key with a close match",
     base(gradient_clippping=1.0), base(gradient_clipping=1.0), "gradient_clippping", "error", None, "gradient_clipping"),
    ("unknown top-level key without a match",
     base(my_own_setting=3), base(), "my_own_setting", "warning", None, "ignores unknown"),
    ("key DeepSpeed removed",
     base(elasticity={"enabled": True}), base(), "elasticity", "error", None, "removed"),
    ("aio inside zero_optimization",
     with_zero(base(), aio={"block_size": 1048576}), base(aio={"block_size": 1048576}),
     "zero_optimization.aio", "error", None, "top level"),
    ("fp16-only key in bf16",
     base(bf16={"enabled": True, "loss_scale": 0}), base(fp16={"enabled": True, "loss_scale": 0}, bf16={"enabled": False}),
     "bf16.loss_scale", "error", None, "fp16 setting"),
    ("offload block at top level",
     base(offload_optimizer={"device": "cpu"}), with_zero(base(), offload_optimizer={"device": "cpu"}),
     "offload_optimizer", "error", None, "inside zero_optimization"),
    ("ZeRO key at top level",
     base(stage3_max_live_parameters=1000), with_zero(base(), stage3_max_live_parameters=1000),
     "stage3_max_live_parameters", "error", None, "into zero_optimization"),
    ("unknown key inside zero_optimization",
     with_zero(base(), overlap_com=True), with_zero(base(), overlap_comm=True),
     "zero_optimization.overlap_com", "error", None, "overlap_comm"),
    ("batch triple inconsistent with world size",
     base(train_batch_size=16), base(train_batch_size=8), "train_batch_size", "error", None, "set train_batch_size to 8"),
    ("batch value not an integer",
     base(train_micro_batch_size_per_gpu=2.0), base(), "train_micro_batch_size_per_gpu", "error", None, "positive integer"),
    ("derived accumulation truncates",
     {**base(train_batch_size=10), "gradient_accumulation_steps": None}, base(), "train_batch_size", "error", None, "10 !="),
    ("no batch size at all",
     {k: v for k, v in base().items() if k not in ("train_batch_size", "train_micro_batch_size_per_gpu")}, base(),
     "train_batch_size", "error", None, "needs one"),
    ("fp16 and bf16 both enabled",
     base(fp16={"enabled": True}), base(fp16={"enabled": False}), "fp16.enabled", "error", None, "both enabled"),
    ("fp16 on the CPU",
     base(fp16={"enabled": True}, bf16={"enabled": False}), base(), "fp16.enabled", "error", CPU, "cpu does not support fp16"),
    ("bf16 on a V100",
     base(), base(fp16={"enabled": True}, bf16={"enabled": False}), "bf16.enabled", "error", V100, "does not support bf16"),
    ("offload with an optimizer that has no CPU kernel",
     with_zero(base(optimizer={"type": "Lamb", "params": {}}), offload_optimizer={"device": "cpu"}),
     with_zero(base(), offload_optimizer={"device": "cpu"}), "optimizer.type", "error", None, "CPU kernels"),
    ("offload with no optimizer block (client optimizer)",
     with_zero({k: v for k, v in base().items() if k != "optimizer"}, offload_optimizer={"device": "cpu"}),
     with_zero({k: v for k, v in base(zero_force_ds_cpu_optimizer=False).items() if k != "optimizer"},
               offload_optimizer={"device": "cpu"}),
     "optimizer", "warning", None, "DeepSpeedCPUAdam"),
    ("torch_adam with offload",
     with_zero(base(optimizer={"type": "AdamW", "params": {"torch_adam": True}}), offload_optimizer={"device": "cpu"}),
     base(optimizer={"type": "AdamW", "params": {"torch_adam": True}}),
     "optimizer.params.torch_adam", "warning", CPU, "DeepSpeedCPUAdam"),
    ("FusedAdam on a CPU-only machine",
     base(), base(optimizer={"type": "AdamW", "params": {"torch_adam": True}}),
     "optimizer.params.torch_adam", "warning", CPU, "JIT build"),
    ("max_grad_norm as an optimizer parameter",
     base(optimizer={"type": "AdamW", "params": {"max_grad_norm": 1.0}}), base(gradient_clipping=1.0),
     "optimizer.params.max_grad_norm", "error", None, "gradient_clipping"),
    ("stage 3 without gathering 16-bit weights on save",
     with_zero(base(), stage=3), with_zero(base(), stage=3, stage3_gather_16bit_weights_on_model_save=True),
     "zero_optimization.stage3_gather_16bit_weights_on_model_save", "warning", None, "empty"),
    ("NVMe optimizer offload below stage 3",
     with_zero(base(aio={}), offload_optimizer={"device": "nvme", "nvme_path": "/nvme"}),
     with_zero(base(aio={}), stage=3, stage3_gather_16bit_weights_on_model_save=True,
               offload_optimizer={"device": "nvme", "nvme_path": "/nvme"}),
     "zero_optimization.offload_optimizer.device", "warning", None, "silently offloads to CPU"),
    ("parameter offload below stage 3",
     with_zero(base(), offload_param={"device": "cpu"}),
     with_zero(base(), stage=3, stage3_gather_16bit_weights_on_model_save=True, offload_param={"device": "cpu"}),
     "zero_optimization.offload_param", "error", None, "needs ZeRO stage 3"),
    ("NVMe offload without a path",
     with_zero(base(), stage=3, stage3_gather_16bit_weights_on_model_save=True, offload_param={"device": "nvme"}),
     with_zero(base(), stage=3, stage3_gather_16bit_weights_on_model_save=True,
               offload_param={"device": "nvme", "nvme_path": "/nvme"}),
     "zero_optimization.offload_param.nvme_path", "error", None, "nvme_path"),
    ("auto on a key the HF Trainer does not fill",
     with_zero(base(), stage="auto"), with_zero(base(), reduce_bucket_size="auto"),
     "zero_optimization.stage", "warning", None, "not filled by the HF Trainer"),
]


@pytest.mark.parametrize("name,bad,good,key,level,acc,fragment", RULES, ids=[r[0] for r in RULES])
def test_lint_rule(name, bad, good, key, level, acc, fragment):
    found = [f for f in lint_config(bad, 2, acc) if f.key == key]
    assert found, f"{name}: no finding on {key}: {lint_config(bad, 2, acc)}"
    assert found[0].level == level
    assert fragment in found[0].message
    assert "\n" not in found[0].message
    assert key not in keys(lint_config(good, 2, acc)), lint_config(good, 2, acc)


def test_lint_puts_errors_first():
    findings = lint_config(with_zero(base(my_key=1, train_batch_size=3), stage=3), 2)
    levels = [f.level for f in findings]
    assert levels == sorted(levels, key=lambda level: level != "error") and "error" in levels and "warning" in levels


def test_known_top_level_keys_come_from_deepspeed():
    top = ds_check.read_deepspeed_keys().top
    assert {"train_batch_size", "zero_optimization", "aio", "bf16", "fp16", "activation_checkpointing",
            "gradient_clipping", "scheduler", "optimizer", "wandb", "zero_force_ds_cpu_optimizer"} <= top
    assert "nebula" not in top  # removed from DeepSpeed: reported as such, not as known


def test_shipped_key_sets_are_the_installed_deepspeeds():
    """zerokit/data/deepspeed_keys.json is what read_deepspeed_keys() reads from the pinned DeepSpeed; regenerate it
    with: python -c "import json; from zerokit.config.keys import read_deepspeed_keys as r;
    print(json.dumps(r().to_json(), indent=1))" > zerokit/data/deepspeed_keys.json"""
    from zerokit.core.resources import bundled_data

    shipped = json.loads(bundled_data(ds_check.SHIPPED_KEYS).read_text())
    installed = ds_check.read_deepspeed_keys()
    if shipped["deepspeed"] != installed.deepspeed:
        pytest.skip(f"DeepSpeed {installed.deepspeed} is installed; the shipped key sets are {shipped['deepspeed']}'s")
    assert shipped == installed.to_json()
    assert ds_check.deepspeed_keys() == installed


def test_lint_imports_no_deepspeed_and_other_versions_are_read_once(tmp_path):
    """The pinned version's key sets are shipped: lint imports no DeepSpeed. For a version without shipped key sets
    (the shipped file's version changed, in a copy of the package data), they are read from DeepSpeed once and
    cached per version: the second process imports no DeepSpeed either."""
    import shutil

    code = ("import json, sys\n"
            "from zerokit.config.lint import lint_config\n"
            "f = lint_config({'train_batch_size': 8, 'zero_optimization': {'stage': 2, 'reduce_bucket_sise': 1}}, 2)\n"
            "print(json.dumps({'keys': [x.key for x in f], 'deepspeed': 'deepspeed' in sys.modules}))\n")

    def run(extra_path=None):
        env = dict(os.environ, ZEROKIT_CACHE_DIR=str(tmp_path / "cache"))
        if extra_path:
            env["PYTHONPATH"] = os.pathsep.join([str(extra_path), str(REPO)])
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                           cwd=str(tmp_path))
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    assert run() == {"keys": ["zero_optimization.reduce_bucket_sise"], "deepspeed": False}
    # a copy of the package whose shipped key sets name another DeepSpeed version
    pkg = tmp_path / "pkg"
    shutil.copytree(REPO / "zerokit", pkg / "zerokit", ignore=shutil.ignore_patterns("__pycache__"))
    other = pkg / "zerokit" / "data" / ds_check.SHIPPED_KEYS
    other.write_text(json.dumps({**json.loads(other.read_text()), "deepspeed": "0.0.1"}))
    assert run(pkg) == {"keys": ["zero_optimization.reduce_bucket_sise"], "deepspeed": True}
    assert list((tmp_path / "cache" / "deepspeed_keys").glob("*.json"))
    assert run(pkg) == {"keys": ["zero_optimization.reduce_bucket_sise"], "deepspeed": False}


# ---------------------------------------------------------------------------------------------- validate

def test_validate_rejects_an_unknown_zero_key_with_deepspeeds_error():
    with pytest.raises(ZerokitError) as e:
        validate_with_deepspeed(with_zero(base(), stage3_prefetch_bucket_sise=10), 2)
    msg = str(e.value)
    assert "zero_optimization.stage3_prefetch_bucket_sise" in msg and "stage3_prefetch_bucket_size" in msg
    assert "\n" not in msg


def test_validate_rejects_an_unknown_offload_key_naming_the_full_path():
    with pytest.raises(ZerokitError, match=r"zero_optimization\.offload_optimizer\.pin_mem.*pin_memory"):
        validate_with_deepspeed(with_zero(base(), offload_optimizer={"device": "cpu", "pin_mem": True}), 2)


def test_validate_rejects_a_bad_value():
    with pytest.raises(ZerokitError, match=r"zero_optimization\.stage = 4"):
        validate_with_deepspeed(with_zero(base(), stage=4), 2)


def test_validate_reports_a_check_across_a_block():
    cfg = with_zero(base(), offload_optimizer={"device": "cpu", "ratio": 0.5})  # partial offload: ZeRO-3 only
    with pytest.raises(ZerokitError, match=r"^DeepSpeed rejects zero_optimization: .*Partial offloading") as e:
        validate_with_deepspeed(cfg, 2)
    assert "\n" not in str(e.value)


def test_validate_runs_deepspeeds_batch_check_for_the_given_world_size():
    cfg = base()  # 8 = 2 x 2 x 2
    validate_with_deepspeed(cfg, 2)
    for world in (1, 8):
        with pytest.raises(ZerokitError, match=rf"batch check fails for {world} ranks.*set train_batch_size to {4 * world}"):
            validate_with_deepspeed(cfg, world)


def test_validate_restores_deepspeeds_dist():
    import deepspeed.comm
    import deepspeed.runtime.config as dsc

    with pytest.raises(ZerokitError):
        validate_with_deepspeed(base(), 3)
    assert dsc.dist is deepspeed.comm


def test_validate_wants_auto_filled_first():
    cfg = base(train_batch_size="auto")
    with pytest.raises(ZerokitError, match="train_batch_size is \"auto\".*fill_auto"):
        validate_with_deepspeed(cfg, 2)
    validate_with_deepspeed(fill_auto(cfg, None, 2), 2)


def test_validate_does_not_modify_the_config():
    cfg = with_zero(base(), offload_optimizer={"device": "cpu"})
    before = copy.deepcopy(cfg)
    validate_with_deepspeed(cfg, 2)
    assert cfg == before


@pytest.mark.parametrize("world", [0, -1, 2.0])
def test_validate_wants_a_positive_world_size(world):
    with pytest.raises(ZerokitError, match="world size"):
        validate_with_deepspeed(base(), world)


# ---------------------------------------------------------------------------------------------- fill_auto

def test_fill_auto_matches_the_hf_trainer():
    """What transformers' own HfTrainerDeepSpeedConfig fills, for the same TrainingArguments values."""
    deepspeed_integration = pytest.importorskip("transformers.integrations.deepspeed")
    setup = ZeroSetup(zero_stage=3, offload_optimizer="cpu", micro_batch_size=2, gradient_accumulation_steps=3)
    cluster = Cluster(A100, gpus_per_node=4)
    cfg = render_ds_config(setup, cluster, None, profile="hf")
    hf = deepspeed_integration.HfTrainerDeepSpeedConfig(copy.deepcopy(cfg))
    args = SimpleNamespace(
        world_size=4, per_device_train_batch_size=2, gradient_accumulation_steps=3, max_grad_norm=0.5,
        learning_rate=3e-4, adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-6, weight_decay=0.1,
        save_on_each_node=False, fp16=False, fp16_full_eval=False, bf16=True, bf16_full_eval=False,
        get_warmup_steps=lambda total: 10,
    )
    hf.trainer_config_process(args)
    hf.trainer_config_finalize(args, SimpleNamespace(config=SimpleNamespace(hidden_size=96)), 500)
    ours = fill_auto(cfg, {
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3, "gradient_clipping": 0.5,
        "optimizer.params.lr": 3e-4, "optimizer.params.betas": [0.9, 0.95], "optimizer.params.eps": 1e-6,
        "optimizer.params.weight_decay": 0.1, "scheduler.params.warmup_num_steps": 10,
        "scheduler.params.total_num_steps": 500,
    }, world_size=4, hidden_size=96)
    assert ours == hf.config
    assert auto_keys(ours) == []


def test_fill_auto_leaves_the_input_alone_and_refuses_unknown_keys():
    cfg = base(train_batch_size="auto")
    fill_auto(cfg, ZeroSetup(micro_batch_size=2, gradient_accumulation_steps=2), 2)
    assert cfg["train_batch_size"] == "auto"
    with pytest.raises(ZerokitError, match="fills only"):
        fill_auto(cfg, {"zero_optimization.stage": 3})


# ---------------------------------------------------------------------------------------------- setup_from_config

ROUND_TRIP = [
    ZeroSetup(zero_stage=s, offload_optimizer=o, offload_param=p, precision=prec, micro_batch_size=mb,
              gradient_accumulation_steps=ga, activation_checkpointing=ck)
    for s, o, p in [(0, "none", "none"), (1, "cpu", "none"), (2, "nvme", "none"), (2, "none", "none"),
                    (3, "none", "none"), (3, "cpu", "cpu"), (3, "nvme", "nvme"), (3, "none", "nvme")]
    for prec, mb, ga, ck in [("bf16", 1, 1, False), ("fp16", 4, 8, True), ("fp32", 2, 3, False)]
]


@pytest.mark.parametrize("profile", ["deepspeed", "hf"])
@pytest.mark.parametrize("setup", ROUND_TRIP, ids=[s.label.replace(" ", "_") for s in ROUND_TRIP])
def test_setup_from_config_round_trips_render(setup, profile):
    cluster = Cluster(A100, gpus_per_node=4, nvme_path="/nvme")
    cfg = render_ds_config(setup, cluster, None, profile=profile, knobs=None)
    read, knobs = setup_from_config(cfg, 4, auto_values=setup, hidden_size=None)
    assert read == setup
    if setup.zero_stage == 3:
        expected = ZeroKnobs()
        assert (knobs.reduce_bucket_size, knobs.stage3_prefetch_bucket_size, knobs.stage3_param_persistence_threshold) == (
            expected.reduce_bucket_size, expected.stage3_prefetch_bucket_size, expected.stage3_param_persistence_threshold)


def test_setup_from_config_reads_hidden_size_buckets_for_auto():
    setup = ZeroSetup(zero_stage=3)
    cfg = render_ds_config(setup, Cluster(A100), None, profile="hf")
    _, knobs = setup_from_config(cfg, 1, auto_values=setup, hidden_size=4096)
    # stage 3 writes no allgather_bucket_size (unused there): DeepSpeed's default comes back
    assert knobs == replace(ZeroKnobs.for_hidden_size(4096), allgather_bucket_size=ZeroKnobs().allgather_bucket_size)


def test_setup_from_config_uses_deepspeeds_defaults():
    setup, knobs = setup_from_config({"train_batch_size": 8}, 2)
    assert setup == ZeroSetup(zero_stage=0, precision="fp32", micro_batch_size=4, gradient_accumulation_steps=1)
    assert knobs.overlap_comm is False  # DeepSpeedZeroConfig: overlap_comm defaults to True at stage 3 only
    assert knobs.reduce_bucket_size == 500_000_000
    setup, knobs = setup_from_config({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}}, 2)
    assert (setup.micro_batch_size, setup.gradient_accumulation_steps) == (2, 1)
    assert knobs.overlap_comm is True
    assert knobs.stage3_prefetch_bucket_size == 50_000_000


def test_setup_from_config_derives_the_batch_like_deepspeed():
    setup, _ = setup_from_config({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2}, 4)
    assert (setup.micro_batch_size, setup.gradient_accumulation_steps) == (2, 4)
    setup, _ = setup_from_config({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 4)
    assert (setup.micro_batch_size, setup.gradient_accumulation_steps) == (4, 2)
    with pytest.raises(ZerokitError, match="train_batch_size"):
        setup_from_config({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, 4)


def test_setup_from_config_reads_field_names_and_deprecated_forms():
    cfg = {"train_micro_batch_size_per_gpu": 1, "bfloat16": {"enabled": True},
           "zero_optimization": {"stage": 2, "cpu_offload": True, "max_live_parameters": 7, "prefetch_bucket_size": 9}}
    setup, knobs = setup_from_config(cfg, 1)
    assert (setup.offload_optimizer, setup.precision) == ("cpu", "bf16")
    assert (knobs.stage3_max_live_parameters, knobs.stage3_prefetch_bucket_size) == (7, 9)
    setup, _ = setup_from_config({"train_micro_batch_size_per_gpu": 1, "zero_optimization": True}, 1)
    assert setup.zero_stage == 1


def test_setup_from_config_auto_without_values_takes_trainer_defaults():
    cfg = render_ds_config(ZeroSetup(zero_stage=2), Cluster(A100, gpus_per_node=2), None, profile="hf")
    setup, _ = setup_from_config(cfg, 2)
    assert (setup.micro_batch_size, setup.gradient_accumulation_steps) == (8, 1)  # TrainingArguments' defaults


# ---------------------------------------------------------------------------------------------- load_config_file

def test_load_config_file_reads_an_object(tmp_path):
    p = tmp_path / "ds.json"
    p.write_text(json.dumps(base()))
    assert load_config_file(p) == base()


@pytest.mark.parametrize("content,match", [
    (None, "does not exist"),
    ("{\"a\": 1,}", "not valid JSON.*line 1"),
    ("[1, 2]", "holds a JSON list, not an object"),
    ("{\"a\": 1, \"a\": 2}", "key 'a' twice"),
    (b"\xff\xfe{", "not UTF-8"),
    ("", "not valid JSON"),
])
def test_load_config_file_errors_are_one_line(tmp_path, content, match):
    p = tmp_path / "ds.json"
    if isinstance(content, bytes):
        p.write_bytes(content)
    elif content is not None:
        p.write_text(content)
    with pytest.raises(ZerokitError, match=match) as e:
        load_config_file(p)
    assert "\n" not in str(e.value)


def test_load_config_file_on_a_folder(tmp_path):
    with pytest.raises(ZerokitError, match="is a folder"):
        load_config_file(tmp_path)


_ENGINE_SCRIPT = """
import os, sys
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
import torch, deepspeed
cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
       "data_types": {"grad_accum_dtype": "fp32"}, "zero_optimization": {"stage": int(sys.argv[1])},
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
if sys.argv[3] == "pipe":  # a one-stage PipelineModule: the PipelineEngine path
    from deepspeed.pipe import PipelineModule
    deepspeed.init_distributed(dist_backend="gloo")
    model = PipelineModule(layers=[torch.nn.Linear(8, 8)], num_stages=1, loss_fn=torch.nn.MSELoss())
else:
    model = torch.nn.Linear(8, 8)
try:
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    print("built", type(engine.optimizer).__name__)
except NotImplementedError as e:
    print("refused", e)
"""


@pytest.mark.parametrize("stage, port, kind", [(0, 29571, "plain"), (1, 29572, "plain"), (0, 29573, "pipe")])
def test_fp32_grad_accumulation_as_the_engine_takes_it(stage, port, kind, tmp_path):
    """bf16 with data_types.grad_accum_dtype fp32: without ZeRO DeepSpeed's engine raises NotImplementedError
    (engine._do_optimizer_sanity_check), which check reports as an error, a pipelined model too (its PipelineEngine
    runs the same check); at ZeRO-1 it builds BF16_Optimizer, whose unsharded fp32 buffer the plan prices. Both sides
    from a real deepspeed.initialize on CPU."""
    script = tmp_path / "engine.py"
    script.write_text(_ENGINE_SCRIPT)
    res = subprocess.run([sys.executable, str(script), str(stage), str(port), kind], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    said = [ln for ln in res.stdout.splitlines() if ln.startswith(("built", "refused"))]
    cfg = json.loads(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                                 "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"},
                                 "zero_optimization": {"stage": stage},
                                 **({"pipeline": {"stages": 1}} if kind == "pipe" else {})}))
    errors = [f for f in lint_config(cfg, 1) if f.level == "error"]
    if stage == 0:
        assert said and said[0].startswith("refused") and "unsupported mix" in said[0], res.stdout + res.stderr
        assert [f.key for f in errors] == ["data_types.grad_accum_dtype"] and "NotImplementedError" in errors[0].message
    else:
        assert said == ["built BF16_Optimizer"], res.stdout + res.stderr
        assert not errors
        _, knobs = setup_from_config(cfg, 1)
        assert knobs.grad_accum_dtype == "fp32"


def test_precision_is_read_as_deepspeeds_engine_reads_it():
    """config/read.py precision_of, the one reader setup and lint share: fp16 before bf16 (engine.get_data_types), the
    old "bfloat16" name, an enabled one over an "auto" beside it, and an "auto" with nothing enabled refused in one
    line unless the caller says what to read it as."""
    from zerokit.config.read import precision_of

    assert precision_of({}) == "fp32"
    assert precision_of({"bfloat16": {"enabled": True}}) == "bf16"
    assert precision_of({"fp16": {"enabled": True}, "bf16": {"enabled": False}}) == "fp16"
    assert precision_of({"fp16": {"enabled": "auto"}, "bf16": {"enabled": True}}) == "bf16"
    assert precision_of({"bf16": {"enabled": "auto"}}, auto="fp32") == "fp32"
    with pytest.raises(ZerokitError, match=r'bf16.enabled is "auto": fill it first') as e:
        precision_of({"bf16": {"enabled": "auto"}})
    assert "\n" not in str(e.value)
