"""Rendering ds_configs from the Jinja2 templates, validated by DeepSpeed's own config classes.

Golden files: tests/golden/*.json. Regenerate with ZEROKIT_UPDATE_GOLDEN=1 after an intended template change
(and read the diff); otherwise they are compared exactly.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from zerokit.config import render
from zerokit.config.auto import TRAINER_FILLED_KEYS, auto_keys, fill_auto
from zerokit.config.lint import lint_config
from zerokit.config.setup import setup_from_config
from zerokit.config.validate import validate_with_deepspeed
from zerokit.core.errors import ZerokitError
from zerokit.spec.hardware import Cluster, accelerator
from zerokit.spec.model import ModelSpec
from zerokit.config.render import render_ds_config, write_json_atomic
from zerokit.core.resources import template_dir
from zerokit.spec.setup import Workload, ZeroKnobs, ZeroSetup

needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed (zerokit[train])")

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
WORLD_SIZES = (1, 2, 8)

MODEL = ModelSpec(
    name="tiny-llama", params=1_000_000, largest_layer_params=64_000, hidden_size=64, num_layers=2,
    num_attention_heads=4, num_kv_heads=4, head_dim=16, intermediate_size=128, vocab_size=1000,
)
LLAMA_7B = ModelSpec(
    name="llama-7b", params=6_738_415_616, largest_layer_params=131_072_000, hidden_size=4096, num_layers=32,
    num_attention_heads=32, num_kv_heads=32, head_dim=128, intermediate_size=11008, vocab_size=32000,
)

HF_AUTO_ALWAYS = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps", "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps",
    "scheduler.params.total_num_steps",
}


def _offload_variants():
    out = [(0, "none", "none")]
    for stage in (1, 2):
        out += [(stage, opt, "none") for opt in ("none", "cpu", "nvme")]
    out += [(3, opt, par) for opt in ("none", "cpu", "nvme") for par in ("none", "cpu", "nvme")]
    return out


# (accelerator, precision): fp16 only where the accelerator has it (not on the CPU).
HARDWARE_PRECISION = [("cpu", "bf16"), ("cpu", "fp32"), ("a100-80gb", "fp16"), ("a100-80gb", "bf16")]


def _cluster(gpu: str, world: int, nvme: str | None = "/local_nvme/zerokit") -> Cluster:
    return Cluster(accelerator(gpu), gpus_per_node=world, nvme_path=nvme)


@needs_deepspeed
@pytest.mark.parametrize("ckpt", [False, True], ids=["nockpt", "ckpt"])
@pytest.mark.parametrize("gpu,precision", HARDWARE_PRECISION, ids=[f"{g}-{p}" for g, p in HARDWARE_PRECISION])
@pytest.mark.parametrize("stage,opt,param", _offload_variants(), ids=[f"z{s}-opt{o}-par{p}" for s, o, p in _offload_variants()])
@pytest.mark.parametrize("profile", render.PROFILES)
def test_every_setup_renders_and_deepspeed_accepts_it(profile, stage, opt, param, gpu, precision, ckpt):
    setup = ZeroSetup(zero_stage=stage, offload_optimizer=opt, offload_param=param, precision=precision,
                      micro_batch_size=2, gradient_accumulation_steps=3, activation_checkpointing=ckpt)
    for world in WORLD_SIZES:
        cluster = _cluster(gpu, world)
        cfg = render_ds_config(setup, cluster, MODEL, profile=profile, total_steps=50, warmup_steps=5)
        assert json.loads(json.dumps(cfg)) == cfg

        autos = set(auto_keys(cfg))
        if profile == "deepspeed":
            assert autos == set()
            assert cfg["train_batch_size"] == 2 * 3 * world
        else:
            assert HF_AUTO_ALWAYS <= autos <= set(TRAINER_FILLED_KEYS)
            assert ("zero_optimization.reduce_bucket_size" in autos) == (stage >= 1)
            assert ("zero_optimization.stage3_prefetch_bucket_size" in autos) == (stage == 3)
            assert ("zero_optimization.stage3_param_persistence_threshold" in autos) == (stage == 3)
        filled = fill_auto(cfg, setup, world, MODEL.hidden_size)
        validate_with_deepspeed(filled, world)

        zero = cfg["zero_optimization"]
        assert zero["stage"] == stage
        assert "aio" not in zero
        assert ("aio" in cfg) == ("nvme" in (opt, param))
        assert zero.get("offload_optimizer", {}).get("device", "none") == opt
        assert zero.get("offload_param", {}).get("device", "none") == param
        for block, dev in (("offload_optimizer", opt), ("offload_param", param)):
            if dev == "nvme":
                assert zero[block]["nvme_path"] == "/local_nvme/zerokit"
        if stage == 3:
            assert zero["stage3_gather_16bit_weights_on_model_save"] is True
        assert ("bf16" in cfg) == (precision == "bf16")
        assert ("fp16" in cfg) == (precision == "fp16")
        if precision == "fp16":
            assert cfg["fp16"]["loss_scale"] == 0 and cfg["fp16"]["initial_scale_power"] == 16
        assert cfg["optimizer"]["type"] == "AdamW"
        assert cfg["optimizer"]["params"].get("torch_adam", False) == (gpu == "cpu" and opt == "none")
        assert ("activation_checkpointing" in cfg) == ckpt

        # The only findings are the expected warning: NVMe optimizer offload below stage 3.
        findings = lint_config(cfg, world, cluster.accelerator)
        expected = {"zero_optimization.offload_optimizer.device"} if (opt == "nvme" and stage < 3) else set()
        assert {f.key for f in findings} == expected, findings
        assert all(f.level == "warning" for f in findings)

        assert setup_from_config(cfg, world, auto_values=setup, hidden_size=MODEL.hidden_size)[0] == setup


def test_deepspeed_profile_values_are_concrete_and_follow_the_hidden_size():
    cluster = _cluster("a100-80gb", 8)
    setup = ZeroSetup(zero_stage=3, micro_batch_size=4, gradient_accumulation_steps=2)
    cfg = render_ds_config(setup, cluster, LLAMA_7B, lr=1e-4, weight_decay=0.1, warmup_steps=0, total_steps=None,
                           gradient_clipping=0.5, steps_per_print=7)
    h = LLAMA_7B.hidden_size
    zero = cfg["zero_optimization"]
    assert zero["reduce_bucket_size"] == h * h
    assert zero["stage3_prefetch_bucket_size"] == int(0.9 * h * h)
    assert zero["stage3_param_persistence_threshold"] == 10 * h
    assert cfg["train_batch_size"] == 64
    assert cfg["gradient_clipping"] == 0.5 and cfg["steps_per_print"] == 7
    assert cfg["optimizer"]["params"]["lr"] == 1e-4 and cfg["optimizer"]["params"]["weight_decay"] == 0.1
    # no known length: constant after warm-up; DeepSpeed rejects warmup_num_steps 0, so 1
    assert cfg["scheduler"] == {"type": "WarmupLR", "params": {
        "warmup_min_lr": 0, "warmup_max_lr": 1e-4, "warmup_num_steps": 1, "warmup_type": "linear"}}


def test_total_steps_come_from_the_workload():
    cluster = _cluster("a100-80gb", 2)
    setup = ZeroSetup(zero_stage=2, micro_batch_size=4, gradient_accumulation_steps=1)  # global batch 8
    cfg = render_ds_config(setup, cluster, MODEL, Workload(samples=100, epochs=2, global_batch=8), warmup_steps=3)
    assert cfg["scheduler"]["type"] == "WarmupDecayLR"
    assert cfg["scheduler"]["params"]["total_num_steps"] == 26  # ceil(100 / 8) x 2
    assert cfg["scheduler"]["params"]["warmup_num_steps"] == 3


def test_explicit_knobs_are_written_as_given_in_both_profiles():
    knobs = ZeroKnobs(reduce_bucket_size=123, allgather_bucket_size=456, overlap_comm=False,
                      stage3_prefetch_bucket_size=789, stage3_param_persistence_threshold=10)
    for profile in render.PROFILES:
        cfg = render_ds_config(ZeroSetup(zero_stage=3), _cluster("a100-80gb", 1), MODEL, profile=profile, knobs=knobs)
        zero = cfg["zero_optimization"]
        assert (zero["reduce_bucket_size"], zero["stage3_prefetch_bucket_size"]) == (123, 789)
        assert zero["stage3_param_persistence_threshold"] == 10 and zero["overlap_comm"] is False
        # stage 3 has no use for allgather_bucket_size (it prefetches instead), so the config does not carry it
        read_back = setup_from_config(cfg, 1, auto_values=ZeroSetup(zero_stage=3))[1]
        assert read_back == replace(knobs, allgather_bucket_size=ZeroKnobs().allgather_bucket_size)


@pytest.mark.parametrize("kwargs,match", [
    ({"setup": ZeroSetup(precision="fp16"), "gpu": "cpu"}, "cpu does not support fp16"),
    ({"setup": ZeroSetup(precision="bf16"), "gpu": "v100-32gb"}, "does not support bf16"),
    ({"setup": ZeroSetup(zero_stage=3, offload_param="nvme"), "nvme": None}, "--nvme-path"),
    ({"profile": "megatron"}, "unknown config profile"),
    ({"workload": Workload(global_batch=10)}, "global batch 10 != micro batch 1"),
    ({"total_steps": 0}, "total steps must be a positive"),
    ({"warmup_steps": -1}, "warmup steps"),
])
def test_render_refuses_what_cannot_run(kwargs, match):
    setup = kwargs.pop("setup", ZeroSetup())
    cluster = _cluster(kwargs.pop("gpu", "a100-80gb"), 1, kwargs.pop("nvme", "/nvme"))
    with pytest.raises(ZerokitError, match=match):
        render_ds_config(setup, cluster, MODEL, **kwargs)


# ---------------------------------------------------------------------------------------------- golden files

GOLDEN_CASES = {
    "deepspeed_z2_cpuoffload_bf16_a100x8": dict(
        setup=ZeroSetup(zero_stage=2, offload_optimizer="cpu", micro_batch_size=4, gradient_accumulation_steps=2),
        cluster=("a100-80gb", 8), model=LLAMA_7B, profile="deepspeed", total_steps=1000, warmup_steps=100),
    "hf_z3_nvme_ckpt_bf16_h100x8": dict(
        setup=ZeroSetup(zero_stage=3, offload_optimizer="nvme", offload_param="nvme", micro_batch_size=1,
                        gradient_accumulation_steps=16, activation_checkpointing=True),
        cluster=("h100-80gb", 8), model=LLAMA_7B, profile="hf"),
    "deepspeed_z3_paramcpu_fp32_cpux2": dict(
        setup=ZeroSetup(zero_stage=3, offload_param="cpu", precision="fp32", micro_batch_size=2),
        cluster=("cpu", 2), model=MODEL, profile="deepspeed", total_steps=20),
    "deepspeed_z1_bf16_cpux2": dict(
        setup=ZeroSetup(zero_stage=1, micro_batch_size=4, gradient_accumulation_steps=4),
        cluster=("cpu", 2), model=MODEL, profile="deepspeed", total_steps=20),
    "hf_z0_fp16_v100x4": dict(
        setup=ZeroSetup(zero_stage=0, precision="fp16", micro_batch_size=8), cluster=("v100-32gb", 4),
        model=None, profile="hf"),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden(name):
    case = dict(GOLDEN_CASES[name])
    gpu, world = case.pop("cluster")
    cfg = render_ds_config(case.pop("setup"), _cluster(gpu, world), case.pop("model"), **case)
    path = GOLDEN / f"{name}.json"
    if os.environ.get("ZEROKIT_UPDATE_GOLDEN") == "1":
        write_json_atomic(path, cfg)
    assert path.is_file(), f"{path} missing: run with ZEROKIT_UPDATE_GOLDEN=1 to create it"
    assert json.loads(path.read_text()) == cfg, f"{name} differs from {path}: if intended, regenerate with ZEROKIT_UPDATE_GOLDEN=1"


def test_golden_folder_has_no_strays():
    assert {p.stem for p in GOLDEN.glob("*.json")} == set(GOLDEN_CASES)


# ---------------------------------------------------------------------------------------------- files

def test_write_json_atomic_writes_and_leaves_no_temp_files(tmp_path):
    target = tmp_path / "ds_config.json"
    write_json_atomic(target, {"a": 1})
    write_json_atomic(target, {"b": [1, 2]})
    assert json.loads(target.read_text()) == {"b": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["ds_config.json"]


def test_write_json_atomic_gives_ordinary_permissions(tmp_path):
    target = tmp_path / "ds_config.json"
    write_json_atomic(target, {})
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600
    target.chmod(0o640)
    write_json_atomic(target, {"a": 1})
    assert target.stat().st_mode & 0o777 == 0o640  # a rewrite keeps the file's mode


def test_write_json_atomic_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    target = tmp_path / "ds_config.json"
    write_json_atomic(target, {"old": True})
    with pytest.raises(TypeError):
        write_json_atomic(target, {"bad": object()})  # not JSON: fails before any file is touched

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(ZerokitError, match="No space left"):
        write_json_atomic(target, {"new": True})
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["ds_config.json"]


def test_write_json_atomic_creates_missing_folders_or_is_one_line_error(tmp_path):
    write_json_atomic(tmp_path / "a" / "b" / "ds.json", {})  # mkdir -p, as every writer
    assert json.loads((tmp_path / "a" / "b" / "ds.json").read_text()) == {}
    (tmp_path / "f").write_text("x")
    with pytest.raises(ZerokitError, match="cannot write"):
        write_json_atomic(tmp_path / "f" / "nope" / "ds.json", {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "f"]


# ---------------------------------------------------------------------------------------------- templates

def test_template_dir_in_a_checkout_holds_both_profiles():
    d = template_dir()
    for name in render.TEMPLATE_NAMES.values():
        assert d.joinpath(name).is_file()


RENDER_FROM_WHEEL = """
import json, zerokit, zerokit.config.render as r, zerokit.core.resources as res
from zerokit.spec.hardware import Cluster, accelerator
from zerokit.spec.setup import ZeroSetup
cfg = r.render_ds_config(ZeroSetup(zero_stage=3, offload_optimizer="nvme"), Cluster(accelerator("a100-80gb"), nvme_path="/n"), None, profile="hf")
print(json.dumps({"file": zerokit.__file__, "templates": str(res.template_dir()), "cfg": cfg}))
"""


def test_template_dir_from_an_installed_wheel(tmp_path):
    """Build a wheel of the repository, install it into a bare folder and render from there, far from the checkout.

    About 4 s (pip wheel + pip install --target), so not marked slow."""
    start = time.monotonic()
    src = tmp_path / "src"  # a copy, so the build's build/ and *.egg-info never land in the checkout
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".venv", ".git", ".cache", "__pycache__", "build", "dist",
                                                             "*.egg-info", "runs", "out", ".pytest_cache", "tests"))
    wheels, target, elsewhere = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = wheels.glob("zerokit-*.whl")
    inst = subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)],
                          capture_output=True, text=True)
    assert inst.returncode == 0, inst.stdout + inst.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(target)}
    run = subprocess.run([sys.executable, "-c", RENDER_FROM_WHEEL], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(str(target))
    assert out["templates"].startswith(str(target))
    assert out["cfg"]["aio"]["block_size"] == 1048576
    assert out["cfg"]["zero_optimization"]["reduce_bucket_size"] == "auto"
    print(f"wheel round trip: {time.monotonic() - start:.1f} s")


# ---------------------------------------------------------------------------------------------- --profile accelerate

@pytest.mark.parametrize("hw,nodes,world,precision,stage3", [
    (["--gpu", "a100-80gb", "--gpus-per-node", "8", "--stage", "1"], 1, 8, "bf16", False),
    (["--gpu", "v100-32gb", "--gpus-per-node", "4", "--nodes", "2", "--stage", "3"], 2, 8, "fp16", True),
    (["--gpu", "cpu", "--gpus-per-node", "2", "--stage", "2"], 1, 2, "no", False),
], ids=["a100-zero1", "v100-2-nodes-zero3", "cpu-zero2"])
def test_render_accelerate_profile_is_read_by_accelerate(tmp_path, hw, nodes, world, precision, stage3):
    """The YAML beside the ds_config, read back by accelerate's own ClusterConfig (what `accelerate launch
    --config_file` loads), and its ds_config accepted by accelerate's DeepSpeedPlugin ("auto" left to it)."""
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.utils import DeepSpeedPlugin

    out = tmp_path / "ds_config.json"
    r = subprocess.run([sys.executable, "-m", "zerokit", "render", "tiny-llama", "--seq-len", "64", *hw,
                        "--global-batch", str(2 * world), "--profile", "accelerate", "-o", str(out)],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert r.returncode == 0, r.stderr
    cfg = ClusterConfig.from_yaml_file(str(tmp_path / "accelerate_config.yaml"))
    assert cfg.distributed_type.value == "DEEPSPEED" and cfg.num_processes == world and cfg.num_machines == nodes
    assert cfg.mixed_precision == precision and cfg.use_cpu == (hw[1] == "cpu")
    ds = cfg.deepspeed_config
    assert ds["deepspeed_config_file"] == str(out.resolve()) and ds["zero3_init_flag"] == stage3
    assert ("deepspeed_multinode_launcher" in ds) == (nodes > 1)
    written = json.loads(out.read_text())
    assert written["train_micro_batch_size_per_gpu"] == "auto"  # the hf profile: accelerate fills it
    plugin = DeepSpeedPlugin(hf_ds_config=ds["deepspeed_config_file"])
    assert plugin.zero_stage == (3 if stage3 else int(hw[-1]))


def test_render_accelerate_profile_needs_a_file(tmp_path):
    r = subprocess.run([sys.executable, "-m", "zerokit", "render", "--params", "7e9", "--profile", "accelerate",
                        "-o", "-"], capture_output=True, text=True, cwd=str(tmp_path),
                       env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "-o FILE" in r.stderr and not list(tmp_path.iterdir())
