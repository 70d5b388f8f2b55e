"""Property tests on every reader of user input: whatever it is given, it returns or raises ZerokitError (one
line), never another exception. Hypothesis generates the input, derandomized so CI sees the same examples every
run; 12,700 examples in all (EXAMPLES), ~1.5 min on 2 cores.

Targets: hostfile parser and --include/--exclude filters, .deepspeed_env formatting, size and parameter-count
parsers, the strict JSON reader, model config bounds and the torch-free counter on mutated real configs and on every
architecture's config (a ModelSpec or one line), zerokit.config's public functions called with any value, and on
ds_configs mutated from real ones (zerokit's render, the HF Trainer's "auto" pattern, the benchmark's): lint, fill
"auto", setup extraction, DeepSpeed's own validation and the whole `check`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from zerokit.core.errors import ZerokitError

REPO = Path(__file__).resolve().parents[1]

EXAMPLES = {"hostfile": 2000, "filters": 1500, "env": 500, "sizes": 1500, "counts": 1000, "json": 1000,
            "model_config": 1400, "architecture": 1200, "ds_config": 1000, "check": 1000, "library": 600}


def fuzz(name):
    return settings(max_examples=EXAMPLES[name], deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


def only_zerokit_errors(fn, *args, **kwargs):
    """Call fn; a ZerokitError must be one line. Any other exception fails the test (hypothesis shrinks it)."""
    try:
        return fn(*args, **kwargs)
    except ZerokitError as e:
        assert "\n" not in str(e) and str(e).strip(), repr(str(e))
        return None


# ------------------------------------------------------------------------------------------------ hostfiles

HOST_WORDS = st.sampled_from(["worker-0", "worker-1", "localhost", "10.0.0.1", "w@x", "a:b", "slots=8", "slots=0",
                              "slots=4abc", "slots=99999999999999999999", "max_slots=8", "#", "# note", "=", "slots",
                              "slots=-1", "slots= 2", "\t", "", "ü", "\x00", "slots=1024", "slots=1025"])
HOSTFILE_TEXT = st.lists(st.lists(HOST_WORDS | st.text(max_size=6), max_size=4).map(" ".join), max_size=6).map("\n".join)


@fuzz("hostfile")
@given(HOSTFILE_TEXT | st.text(max_size=60))
def test_hostfile_parser(text):
    from zerokit.spec.hostfile import parse_hostfile_text

    hosts = only_zerokit_errors(parse_hostfile_text, text)
    if hosts is not None:
        assert hosts and all(1 <= n <= 1024 for n in hosts.values())


FILTER_PART = st.sampled_from(["worker-0", "worker-1", "worker-2", "w0", "", ":", ",", "@", "0", "1", "7", "-1",
                               "x", "worker-0:0", "worker-1:0,1", "worker-0:", "\n", "99999999999999999999"])


@fuzz("filters")
@given(st.lists(FILTER_PART | st.text(max_size=4), max_size=5).map("".join), st.booleans())
def test_include_exclude_filters(spec, include):
    from zerokit.spec.hostfile import apply_filters

    hosts = {"worker-0": 2, "worker-1": 4}
    kw = {"include": spec} if include else {"exclude": spec}
    only_zerokit_errors(apply_filters, hosts, **kw)


@fuzz("env")
@given(st.dictionaries(st.text(max_size=8), st.text(max_size=12), max_size=4))
def test_deepspeed_env_format(env):
    from zerokit.spec.hostfile import format_deepspeed_env

    only_zerokit_errors(format_deepspeed_env, env)


# ------------------------------------------------------------------------------------------------ numbers

NUMBERISH = st.sampled_from(["80GB", "2TiB", "1e400", "inf", "-inf", "nan", "NaN", "1e18TB", "-5GB", "0", "0.5",
                             "7B", "125M", "1e15", "1e16", "2T", "GB", "", " ", "1.5e-300", "9" * 400, "7e9 GB",
                             "1 KiB", "+3", "--3", "0x10", "1_000"])


@fuzz("sizes")
@given(NUMBERISH | st.text(max_size=10) | st.floats() | st.integers(-(2**80), 2**80))
def test_size_parser(text):
    from zerokit.core.units import parse_size

    n = only_zerokit_errors(parse_size, text, "--gpu-memory")
    if n is not None:
        assert 0 <= n <= 2**60


@fuzz("counts")
@given(NUMBERISH | st.text(max_size=10) | st.floats() | st.integers(-(2**80), 2**80))
def test_param_count_parser(text):
    from zerokit.core.units import parse_param_count

    n = only_zerokit_errors(parse_param_count, text)
    if n is not None:
        assert 1 <= n <= 10**15


@fuzz("json")
@given(st.text(alphabet='{}[]":,0123456789.eE+-aNInfitynul \\\n', max_size=80) | st.text(max_size=40))
def test_strict_json_reader(text):
    from zerokit.core.fsutil import parse_json_text

    only_zerokit_errors(parse_json_text, text, "config file x.json", reject_duplicates=True)


# ------------------------------------------------------------------------------------------------ JSON values

SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.sampled_from([0, 1, -1, 2, 10**12, 2**31])
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8) | st.just("auto"))
JSON_VALUES = st.recursive(SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                           max_leaves=6)


def paths(obj, prefix=()):
    """Every key path in a nested dict."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append(prefix + (k,))
            out += paths(v, prefix + (k,))
    return out


@st.composite
def mutated(draw, originals, key_names):
    """One of `originals`, with 1-3 mutations: a value replaced by any JSON value, a key removed, a key added."""
    config = copy.deepcopy(draw(st.sampled_from(originals)))
    for _ in range(draw(st.integers(1, 3))):
        where = paths(config)
        op = draw(st.sampled_from(["set", "delete", "add"]))
        if op in ("set", "delete") and where:
            path = draw(st.sampled_from(where))
            parent = config
            for k in path[:-1]:
                parent = parent[k]
            if op == "set":
                parent[path[-1]] = draw(JSON_VALUES)
            else:
                del parent[path[-1]]
        else:
            blocks = [config] + [v for p in where for v in [_get(config, p)] if isinstance(v, dict)]
            block = draw(st.sampled_from(blocks))
            block[draw(st.sampled_from(key_names) | st.text(max_size=8))] = draw(JSON_VALUES)
    return config


def _get(obj, path):
    for k in path:
        obj = obj[k]
    return obj


# ------------------------------------------------------------------------------------------------ model configs

MODEL_CONFIGS = [json.loads(p.read_text()) for p in sorted((REPO / "zerokit/data/models").glob("*/config.json"))]
MODEL_KEYS = sorted({k for c in MODEL_CONFIGS for k in c} | {"text_config", "vision_config", "num_experts"})


@fuzz("model_config")
@given(mutated(MODEL_CONFIGS, MODEL_KEYS))
def test_model_config_bounds_and_count(config):
    """check_config_bounds refuses in one line; what it lets through the torch-free counter counts or declines
    (None: the meta device decides), never raising."""
    from zerokit.spec.arch_params import count_params_from_config
    from zerokit.spec.model import check_config_bounds

    if only_zerokit_errors(check_config_bounds, config, "config.json") is None and _bounds_ok(config):
        counted = count_params_from_config(config)
        assert counted is None or counted["params"] > 0


def _architecture_seeds() -> list[dict]:
    """A config.json of every architecture the torch-free reader counts (arch_params.SUPPORTED_MODEL_TYPES, so one
    added there is fuzzed too): its config class's defaults (arch_params._DEFAULTS, the sizes transformers' class
    gives a config that omits them), shrunk to a few layers; the multimodal gemma3 nests its text model's."""
    from zerokit.spec.arch_params import _DEFAULTS, SUPPORTED_MODEL_TYPES

    def one(model_type):
        values = json.loads(json.dumps(_DEFAULTS[model_type]))  # JSON, as read from a file
        for layers in ("num_hidden_layers", "n_layer", "num_layers"):
            if layers in values:
                values[layers] = 2
        return {"model_type": model_type, **values}

    return [{"model_type": "gemma3", "text_config": one("gemma3_text")} if t == "gemma3" else one(t)
            for t in SUPPORTED_MODEL_TYPES if t in _DEFAULTS or t == "gemma3"]


ARCH_CONFIGS = _architecture_seeds()
ARCH_KEYS = sorted({k for c in ARCH_CONFIGS for k in c} | {"head_dim", "text_config", "num_experts", "tie_word_embeddings"})


def test_every_architecture_has_a_seed():
    """Each seed is itself read: the mutations start from a config the reader counts."""
    from zerokit.spec.arch_params import SUPPORTED_MODEL_TYPES, count_params_from_config

    assert {c["model_type"] for c in ARCH_CONFIGS} == set(SUPPORTED_MODEL_TYPES)
    assert all(count_params_from_config(c) is not None for c in ARCH_CONFIGS)


@fuzz("architecture")
@given(mutated(ARCH_CONFIGS, ARCH_KEYS))
def test_every_architecture_config_gives_a_spec_or_one_line(config):
    """Every architecture's config reader, on mutated config.json values: a ModelSpec (what load_model_spec builds
    from the torch-free count) or a one-line ZerokitError, never another exception; None from the counter hands the
    config to the meta device, whose errors spec/model.py _count_on_meta words."""
    from zerokit.spec.arch_params import count_params_from_config
    from zerokit.spec.model import ModelSpec, check_config_bounds

    event(str(config.get("model_type"))[:20])
    if only_zerokit_errors(check_config_bounds, config, "config.json") is None and _bounds_ok(config):
        counted = count_params_from_config(config)
        if counted is not None:
            spec = only_zerokit_errors(lambda: ModelSpec(name="fuzzed", **counted))
            assert spec is None or spec.params > 0


def _bounds_ok(config) -> bool:
    from zerokit.spec.model import check_config_bounds

    try:
        check_config_bounds(config, "config.json")
        return True
    except ZerokitError:
        return False


# ------------------------------------------------------------------------------------------------ ds_configs

DS_CONFIGS = [
    # the benchmark's (bench/launch_overhead.py)
    {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
     "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0, "torch_adam": True}},
     "gradient_clipping": 1.0, "zero_optimization": {"stage": 2, "reduce_bucket_size": 16384,
                                                     "allgather_bucket_size": 16384}, "steps_per_print": 1000000},
    # the HF Trainer's pattern (transformers' DeepSpeed docs, ZeRO-3 with offload): "auto" everywhere it fills
    {"bf16": {"enabled": "auto"}, "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto",
                                                                          "eps": "auto", "weight_decay": "auto"}},
     "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                  "warmup_num_steps": "auto"}},
     "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                           "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
                           "contiguous_gradients": True, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
                           "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
                           "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                           "stage3_gather_16bit_weights_on_model_save": True},
     "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
     "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False},
    # LLaMA-Factory / axolotl style ZeRO-1 and ZeRO-2 with fp16 "auto"
    {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
     "gradient_clipping": "auto", "zero_allow_untested_optimizer": True,
     "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
              "hysteresis": 2, "min_loss_scale": 1},
     "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2, "allgather_partitions": True,
                                                        "allgather_bucket_size": 5e8, "overlap_comm": False,
                                                        "reduce_scatter": True, "reduce_bucket_size": 5e8,
                                                        "contiguous_gradients": True, "round_robin_gradients": True}},
    {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1},
     "communication_data_type": "fp32", "activation_checkpointing": {"partition_activations": True}},
    # transformers' own tests/deepspeed/ds_config_zero3_bf16.json: the old name of the bf16 block, which DeepSpeed reads
    json.loads((Path(__file__).parent / "data" / "user_configs" / "transformers_ds_config_zero3_bf16.json").read_text()),
]


def _ds_keys():
    from zerokit.config.keys import deepspeed_keys

    k = deepspeed_keys()
    return sorted(k.top | k.zero | {"enabled", "device", "stage", "type", "params", "lr"})


@pytest.fixture(scope="module")
def deepspeed():
    return pytest.importorskip("deepspeed")


@fuzz("ds_config")
@given(mutated(DS_CONFIGS, _ds_keys()), st.sampled_from([1, 2, 4, 3]))
def test_ds_config_rules(deepspeed, config, world):
    """lint, fill "auto", setup extraction and DeepSpeed's own validation: one line or an answer, nothing else."""
    from zerokit.config.auto import fill_auto
    from zerokit.config.lint import lint_config
    from zerokit.config.setup import setup_from_config
    from zerokit.config.validate import validate_with_deepspeed

    findings = only_zerokit_errors(lint_config, config, world)
    if findings is None or any(f.level == "error" for f in findings):
        return
    filled = only_zerokit_errors(fill_auto, config, None, world, 4096)
    if filled is None:
        return
    only_zerokit_errors(setup_from_config, filled, world)
    event("reached DeepSpeed's validation")
    only_zerokit_errors(validate_with_deepspeed, filled, world)


@pytest.fixture(scope="module")
def check_inputs(tmp_path_factory):
    import os

    os.environ["ZEROKIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("fuzz-cache"))  # verdicts of mutants: not kept
    from zerokit.spec.hardware import HardwareOptions
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.setup import Workload

    return load_model_spec("tiny-llama"), HardwareOptions(gpu="cpu", gpus_per_node=2).build(), Workload(seq_len=64)


@fuzz("check")
@given(mutated(DS_CONFIGS, _ds_keys()))
def test_check_on_mutated_configs(deepspeed, check_inputs, config):
    """The whole `check` (lint, "auto", DeepSpeed, the memory model on the setup the config implies)."""
    from zerokit.config.check import check_config

    model, cluster, workload = check_inputs
    result = only_zerokit_errors(check_config, config, "ds.json", model, cluster, workload)
    if result is not None:
        assert result.exit_code in (0, 1, 2)
        event(f"check exit {result.exit_code}")


LIBRARY_CONFIGS = st.sampled_from(DS_CONFIGS) | mutated(DS_CONFIGS, _ds_keys()) | JSON_VALUES
WORLD_SIZES = st.sampled_from([0, -1, 1, 2, 3, 2.5, True, None, "2", 2**70]) | st.integers(-5, 9)


@fuzz("library")
@given(LIBRARY_CONFIGS, WORLD_SIZES)
def test_library_entry_points(config, world):
    """zerokit.config's public functions called from Python with any value (a config that is not an object, a world
    size of 0, a float, None): an answer or a one-line ZerokitError at the boundary, never ZeroDivisionError,
    AttributeError or TypeError from inside (DeepSpeed itself is not called: test_ds_config_rules does that)."""
    from zerokit.config import auto, lint, read, setup

    for fn, args in ((lint.lint_config, (config, world)), (auto.fill_auto, (config, None, world)),
                     (auto.auto_keys, (config,)), (setup.setup_from_config, (config, world)),
                     (setup.optimizer_of, (config,)), (read.batch_world_size, (config, world)),
                     (read.batch_fix, (config, world)), (read.parallelism_from_config, (config,)),
                     (read.with_bf16_name, (config,)), (read.derive_batch, (8, 2, None, world))):
        only_zerokit_errors(fn, *args)


def test_the_suite_runs_ten_thousand_examples():
    """The issue's bar: >= 10,000 fuzzed examples in CI."""
    assert sum(EXAMPLES.values()) >= 10_000
