"""`zerokit check` of the "auto" configs fine-tuning tools ship (issue 14): the largest micro batch that fits, at the
precision the hardware supports best, with the values it assumed listed; every key DeepSpeed reads (aliases too)
understood by the memory model; keys DeepSpeed ignores reported as warnings that leave the exit code alone.

tests/data/user_configs/ holds faithful copies of public configs (JSON has no comments, so their sources are here):
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("deepspeed")

from zerokit.cli import main
from zerokit.config.auto import fill_auto
from zerokit.config.keys import ZERO_DEPRECATED
from zerokit.config.lint import lint_config
from zerokit.config.read import load_config_file
from zerokit.config.setup import setup_from_config
from zerokit.config.validate import validate_with_deepspeed
from zerokit.config.check import check_config, largest_fitting_micro_batch
from zerokit.planning.planner import evaluate
from zerokit.spec.hardware import HardwareOptions, accelerator
from zerokit.spec.model import load_model_spec
from zerokit.spec.setup import Workload, ZeroSetup

DATA = Path(__file__).resolve().parent / "data" / "user_configs"

# id -> (file, the public config it copies)
CONFIGS = {
    "hf-zero2-auto": ("hf_ds_config_zero2.json", "huggingface/transformers tests/deepspeed/ds_config_zero2.json: "
                      "the ZeRO-2 config the DeepSpeed guide (docs/source/en/deepspeed.md, Deployment) runs"),
    "hf-zero3-auto": ("hf_ds_config_zero3.json", "huggingface/transformers tests/deepspeed/ds_config_zero3.json: the "
                      "guide's ZeRO-3 config (fp16 block only, deprecated stage3_gather_fp16_weights_on_model_save)"),
    "llamafactory-z0": ("llamafactory_ds_z0_config.json", "hiyouga/LLaMA-Factory examples/deepspeed/ds_z0_config.json"),
    "llamafactory-z2": ("llamafactory_ds_z2_config.json", "hiyouga/LLaMA-Factory examples/deepspeed/ds_z2_config.json"),
    "llamafactory-z2-offload": ("llamafactory_ds_z2_offload_config.json",
                                "hiyouga/LLaMA-Factory examples/deepspeed/ds_z2_offload_config.json"),
    "llamafactory-z2-autotp": ("llamafactory_ds_z2_autotp_config.json",
                               "hiyouga/LLaMA-Factory examples/deepspeed/ds_z2_autotp_config.json (TP block, _comment)"),
    "llamafactory-z3": ("llamafactory_ds_z3_config.json", "hiyouga/LLaMA-Factory examples/deepspeed/ds_z3_config.json"),
    "llamafactory-z3-offload": ("llamafactory_ds_z3_offload_config.json",
                                "hiyouga/LLaMA-Factory examples/deepspeed/ds_z3_offload_config.json"),
    "axolotl-zero1": ("axolotl_zero1.json", "axolotl-ai-cloud/axolotl deepspeed_configs/zero1.json"),
    "axolotl-zero2": ("axolotl_zero2.json", "axolotl-ai-cloud/axolotl deepspeed_configs/zero2.json (offload, no "
                      "optimizer block)"),
    "axolotl-zero3-bf16": ("axolotl_zero3_bf16.json", "axolotl-ai-cloud/axolotl deepspeed_configs/zero3_bf16.json "
                           "(the short aliases prefetch_bucket_size, param_persistence_threshold, max_live_parameters)"),
    "axolotl-zero3-bf16-cpuoffload-all": ("axolotl_zero3_bf16_cpuoffload_all.json",
                                          "axolotl-ai-cloud/axolotl deepspeed_configs/zero3_bf16_cpuoffload_all.json "
                                          "(zero_force_ds_cpu_optimizer false, offload without an optimizer block)"),
}
__doc__ += "".join(f"  {file}: {source}\n" for file, source in CONFIGS.values())

# The case: Llama-3-8B (bundled config: hidden 4096, from meta-llama/Meta-Llama-3-8B) on 2 nodes x 8
# A100-80GB at seq 4096.
HW = ["--model", "llama-3-8b", "--gpu", "a100-80gb", "--gpus-per-node", "8", "--nodes", "2", "--seq-len", "4096"]
SEQ = 4096


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("check-auto-cache")


@pytest.fixture(autouse=True)
def _own_cache(cache, monkeypatch):
    monkeypatch.setenv("ZEROKIT_CACHE_DIR", str(cache))


@pytest.fixture(scope="module")
def llama():
    return load_model_spec("llama-3-8b")


@pytest.fixture(scope="module")
def cluster():
    return HardwareOptions(gpu="a100-80gb", gpus_per_node=8, nodes=2).build()


def run_check(capsys, path, *extra) -> tuple[int, dict]:
    code = main(["check", str(path), *HW, *extra, "--json"])
    return code, json.loads(capsys.readouterr().out)


def load(name: str) -> dict:
    return load_config_file(DATA / CONFIGS[name][0])


# ---------------------------------------------------------------------------------------------- the shipped configs

@pytest.mark.parametrize("name", list(CONFIGS))
def test_shipped_auto_configs_are_valid_and_answered(name, capsys, llama, cluster):
    """Each is valid (exit 0 or 1, never 2); the answer is a searched micro batch, N fits and N + 1 does not per the
    planner's own evaluate at exactly those values (the oracle), and ZeRO-3 fits Llama-3-8B at micro batch >= 1."""
    code, out = run_check(capsys, DATA / CONFIGS[name][0])
    assert code in (0, 1) and out["valid"], out["findings"]
    assert not [f for f in out["findings"] if f["level"] == "error"]
    search = out["micro_batch_search"]
    assert search is not None
    largest = search["largest_micro_batch_size"]
    assert code == (0 if largest >= 1 else 1)
    if load(name)["zero_optimization"]["stage"] == 3:
        assert code == 0 and largest >= 1, out["evaluation"]["reasons"]

    # the oracle: evaluate() at the setup the check reports, with the knobs the config implies
    reported = ZeroSetup(**out["evaluation"]["setup"])
    _, knobs = setup_from_config(load(name), cluster.world_size, auto_values=reported,
                                       hidden_size=llama.hidden_size)
    workload = Workload(seq_len=SEQ)
    if largest >= 1:
        assert reported.micro_batch_size == largest
        assert evaluate(llama, cluster, workload, reported, knobs).fits
    assert not evaluate(llama, cluster, workload, reported.with_(micro_batch_size=largest + 1), knobs).fits
    assert search["next"]["micro_batch_size"] == largest + 1


def test_search_finds_the_exact_boundary_between_powers_of_two():
    """Bisection, not only doubling: a judge that fits up to 37 gives 37 (and 38 as the first that does not)."""
    judged = []

    def judge(m):
        judged.append(m)
        return SimpleNamespace(fits=m <= 37, m=m)

    largest, at, too_big = largest_fitting_micro_batch(judge, limit=1024)
    assert (largest, at.m, too_big.m) == (37, 37, 38)
    assert len(judged) <= 2 * 10 + 1  # doubling to 64, then bisecting 32..64: not a linear scan
    assert largest_fitting_micro_batch(judge, limit=16)[::2] == (16, None)  # the limit fits: stop there
    assert largest_fitting_micro_batch(lambda m: SimpleNamespace(fits=False, m=m))[0] == 0


def test_precision_auto_is_the_best_the_hardware_supports(capsys):
    """fp16/bf16 "auto": bf16 on an A100, fp16 on a V100 (no bf16 in Volta: NVIDIA V100 datasheet; the catalog's
    flags), as the Trainer's --bf16/--fp16 would set them; --precision overrides."""
    path = DATA / CONFIGS["llamafactory-z3"][0]
    for gpu in ("a100-80gb", "v100-32gb"):
        code, out = run_check(capsys, path, "--gpu", gpu)
        precision = out["evaluation"]["setup"]["precision"]
        assert precision == accelerator(gpu).precisions[0] == ("bf16" if gpu == "a100-80gb" else "fp16")
        assumed = {a["key"]: a for a in out["assumed"]}
        assert assumed["precision"]["value"] == precision and gpu in assumed["precision"]["why"]
    code, out = run_check(capsys, path, "--precision", "fp16")
    assert out["evaluation"]["setup"]["precision"] == "fp16"
    # only the fp16 block is "auto" (the HF guide's ZeRO-3): --bf16 makes accelerate add the bf16 block
    code, out = run_check(capsys, DATA / CONFIGS["hf-zero3-auto"][0])
    assert out["evaluation"]["setup"]["precision"] == "bf16"


def test_assumed_values_are_what_the_hf_trainer_fills(capsys):
    """The bucket sizes reported as assumed are what transformers' own HfTrainerDeepSpeedConfig fills for Llama-3-8B's
    hidden size, as DeepSpeed's DeepSpeedZeroConfig then reads them (the short alias "auto"s, which the Trainer does
    not fill, as DeepSpeed's defaults)."""
    integration = pytest.importorskip("transformers.integrations.deepspeed")
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    field_of = {(f.alias or n): n for n, f in DeepSpeedZeroConfig.model_fields.items()} | {
        n: n for n in DeepSpeedZeroConfig.model_fields}
    llama_hidden = load_model_spec("llama-3-8b").hidden_size
    checked = 0
    for name in ("llamafactory-z3", "axolotl-zero3-bf16", "hf-zero3-auto"):
        code, out = run_check(capsys, DATA / CONFIGS[name][0])
        micro = out["micro_batch_search"]["largest_micro_batch_size"]
        hf = integration.HfTrainerDeepSpeedConfig(copy.deepcopy(load(name)))
        args = SimpleNamespace(world_size=16, per_device_train_batch_size=micro, gradient_accumulation_steps=1,
                               max_grad_norm=1.0, learning_rate=5e-5, adam_beta1=0.9, adam_beta2=0.999,
                               adam_epsilon=1e-8, weight_decay=0.0, save_on_each_node=False, fp16=False,
                               fp16_full_eval=False, bf16=True, bf16_full_eval=False, get_warmup_steps=lambda n: 1)
        hf.trainer_config_process(args)
        hf.trainer_config_finalize(args, SimpleNamespace(config=SimpleNamespace(hidden_size=llama_hidden)), 100)
        deepspeed_reads = DeepSpeedZeroConfig(**hf.config["zero_optimization"])
        for a in out["assumed"]:
            if a["key"].startswith("zero_optimization."):
                assert a["value"] == getattr(deepspeed_reads, field_of[a["key"].split(".", 1)[1]]), (name, a)
                checked += 1
    assert checked >= 9  # three bucket keys in each


def test_without_a_model_the_config_is_only_validated(capsys):
    """No --model: nothing to search; DeepSpeed's checks run at micro batch 1 and the check says how to get more."""
    code = main(["check", str(DATA / CONFIGS["llamafactory-z3"][0]), "--gpus-per-node", "8", "--nodes", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assumed = {a["key"]: a for a in out["assumed"]}
    assert code == 0 and out["valid"] and out["evaluation"] is None and out["micro_batch_search"] is None
    assert assumed["train_micro_batch_size_per_gpu"]["value"] == 1
    assert "--model" in assumed["train_micro_batch_size_per_gpu"]["why"]
    assert "--model" in assumed["zero_optimization.reduce_bucket_size"]["why"]


def test_micro_batch_8_fp32_reproduces_the_old_verdict(capsys, llama, cluster):
    """--micro-batch 8 --precision fp32 judges exactly that: TrainingArguments' defaults, which is what check_config
    without answer_auto (launch) still assumes; Llama-3-8B does not fit it on 80 GB."""
    path = DATA / CONFIGS["llamafactory-z3"][0]
    code, out = run_check(capsys, path, "--micro-batch", "8", "--precision", "fp32")
    assert code == 1 and out["micro_batch_search"] is None
    setup = out["evaluation"]["setup"]
    assert (setup["micro_batch_size"], setup["precision"]) == (8, "fp32")
    old = check_config(load("llamafactory-z3"), str(path), llama, cluster, Workload(seq_len=SEQ))
    assert old.exit_code == 1 and old.evaluation.setup.to_dict() == setup
    assert old.evaluation.memory.per_gpu_total == out["evaluation"]["memory"]["per_gpu"]["total_bytes"]


def test_text_output_lists_the_assumptions_and_the_largest_micro_batch(capsys, llama):
    code = main(["check", str(DATA / CONFIGS["llamafactory-z3"][0]), *HW])
    text = capsys.readouterr().out
    assert code == 0
    assert f"reduce_bucket_size = {llama.hidden_size ** 2:,}" in text
    assert f"stage3_prefetch_bucket_size = {int(0.9 * llama.hidden_size ** 2):,}" in text
    assert "assumed: precision = bf16" in text and "train_micro_batch_size_per_gpu = searched" in text
    line = next(x for x in text.splitlines() if x.startswith("FITS up to micro batch "))
    n = int(line.split()[5])
    assert f"({n + 1} does not: needs " in line and f"mb={n}x1" in line


# ---------------------------------------------------------------------------------------------- keys and aliases

def test_zero3_short_aliases_are_understood_by_the_memory_model(llama, cluster):
    """DeepSpeedZeroConfig's fields and their stage3_ aliases are the same setting (pydantic populate_by_name):
    the memory is the same either way, and not the default's."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    settings = {"prefetch_bucket_size": 200_000_000, "param_persistence_threshold": 1_000_000,
                "max_live_parameters": 300_000_000}
    base = load("llamafactory-z3")

    def with_zero(zero_extra):
        cfg = copy.deepcopy(base)
        for k in ("stage3_prefetch_bucket_size", "stage3_param_persistence_threshold", "stage3_max_live_parameters"):
            cfg["zero_optimization"].pop(k)
        cfg["zero_optimization"].update(zero_extra)
        return cfg

    short, long = with_zero(settings), with_zero({f"stage3_{k}": v for k, v in settings.items()})
    assert DeepSpeedZeroConfig(**short["zero_optimization"]) == DeepSpeedZeroConfig(**long["zero_optimization"])

    def per_gpu(cfg):
        r = check_config(cfg, "c.json", llama, cluster, Workload(seq_len=SEQ),
                         trainer_values={"train_micro_batch_size_per_gpu": 1}, answer_auto=True)
        assert r.valid, r.problem()
        return r.evaluation.memory.per_gpu

    assert per_gpu(short) == per_gpu(long) != per_gpu(with_zero({}))


@pytest.mark.parametrize("extra", [{"my_tool": {"verbose": True}}, {"_comment": "a note"},
                                   {"sequence_parallel": {"enabled": True, "size": 4}}],
                         ids=["other-tools-block", "comment-key", "llamafactory-sequence-parallel-block"])
def test_a_key_deepspeed_ignores_is_a_warning_and_keeps_the_exit_code(extra, capsys, tmp_path):
    """Unknown top-level keys DeepSpeed ignores, among them close misses of its own keys whose value it could not read
    there ("_comment" ~ comet, LLaMA-Factory's own "sequence_parallel" object ~ the integer sequence_parallel_size)."""
    plain_code, plain = run_check(capsys, DATA / CONFIGS["llamafactory-z3"][0])
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**load("llamafactory-z3"), **extra}))
    code, out = run_check(capsys, path)
    (key,) = extra
    found = [f for f in out["findings"] if f["key"] == key]
    assert found and found[0]["level"] == "warning" and "ignores" in found[0]["message"], out["findings"]
    assert code == plain_code and out["evaluation"] == plain["evaluation"]


@pytest.mark.parametrize("name,key", [("axolotl-zero3-bf16-cpuoffload-all", "zero_force_ds_cpu_optimizer"),
                                      ("hf-zero3-auto", "zero_optimization.stage3_gather_fp16_weights_on_model_save"),
                                      ("llamafactory-z2-autotp", "_comment")])
def test_what_deepspeed_does_with_a_key_is_a_warning(name, key, capsys):
    code, out = run_check(capsys, DATA / CONFIGS[name][0])
    found = [f for f in out["findings"] if f["key"] == key]
    assert code in (0, 1) and found and found[0]["level"] == "warning", out["findings"]
    if key == "zero_optimization.stage3_gather_fp16_weights_on_model_save":
        # DeepSpeed moves it to gather_16bit_weights_on_model_save: the "empty weights on save" warning is not due
        assert not [f for f in out["findings"] if f["key"].endswith("stage3_gather_16bit_weights_on_model_save")]


def test_deprecated_zero_keys_are_deepspeeds_own():
    """ZERO_DEPRECATED is DeepSpeedZeroConfig's list of deprecated fields, each with the field it becomes."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    deprecated = {}
    for name, f in DeepSpeedZeroConfig.model_fields.items():
        extra = f.json_schema_extra or {}
        if extra.get("deprecated"):
            deprecated[name] = extra.get("new_param") if extra.get("set_new_param", True) else None
    assert ZERO_DEPRECATED == deprecated


def test_the_hf_guides_nvme_example_is_refused_as_deepspeed_refuses_it(capsys):
    """docs/source/en/deepspeed.md's ZeRO-3/Infinity example (copied in hf_docs_zero3_nvme.json) nests "aio" inside
    zero_optimization, where DeepSpeed's DeepSpeedZeroConfig forbids unknown keys: exit 2, in DeepSpeed's own words
    too (its config classes on the filled config)."""
    from zerokit.core.errors import ZerokitError

    path = DATA / "hf_docs_zero3_nvme.json"
    assert main(["check", str(path), *HW]) == 2
    err = capsys.readouterr().err
    assert "zero_optimization.aio" in err and "top level" in err
    filled = fill_auto(load_config_file(path), None, 16, 4096)
    with pytest.raises(ZerokitError, match="zero_optimization.aio"):
        validate_with_deepspeed(filled, 16)


def test_sequence_parallel_is_a_warning_not_an_unknown_key():
    cfg = {**load("llamafactory-z3"), "sequence_parallel_size": 2}
    found = {f.key: f for f in lint_config(cfg, 16)}
    assert found["sequence_parallel_size"].level == "warning"
    assert "prices the split sequence" in found["sequence_parallel_size"].message


def test_sequence_parallel_auto_config_is_checked(capsys, tmp_path):
    """An "auto" config with Ulysses SP 2 on 16 ranks: the Trainer's train_batch_size (micro x accumulation x 16
    processes) would fail DeepSpeed's batch check, which counts world / sp = 8; accelerate overrides it with
    x parallelism_config.data_parallel_size (Accelerator._prepare_deepspeed, sp_backend "deepspeed"), and so does
    fill_auto. DeepSpeed's own config classes then accept the filled config for 16 ranks."""
    cfg = {**load("llamafactory-z3"), "sequence_parallel_size": 2}
    path = tmp_path / "sp.json"
    path.write_text(json.dumps(cfg))
    code, out = run_check(capsys, path, "--micro-batch", "2", "--grad-accum", "3")
    assert code in (0, 1) and out["valid"], out
    assumed = {a["key"]: a for a in out["assumed"]}
    assert assumed["train_batch_size"]["value"] == "micro x accumulation x 8"
    filled = fill_auto(cfg, {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3}, 16, 4096)
    assert filled["train_batch_size"] == 2 * 3 * 8
    validate_with_deepspeed(filled, 16)  # DeepSpeed's batch assertion, at 16 ranks (raises on a mismatch)
    no_sp = fill_auto(load("llamafactory-z3"), {"train_micro_batch_size_per_gpu": 2,
                                                      "gradient_accumulation_steps": 3}, 16, 4096)
    assert no_sp["train_batch_size"] == 2 * 3 * 16  # without SP: every process, as the Trainer computes it
