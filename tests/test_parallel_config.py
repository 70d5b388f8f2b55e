"""Parallelism beyond data parallelism in a ds_config (AutoTP, Ulysses SP, ZeRO++ hpZ/qwZ/qgZ, MiCS): what `check`
reads and what it refuses, each rule against DeepSpeed 0.19.8's own code where it can run here."""

from __future__ import annotations

import copy
import json

import pytest

pytest.importorskip("deepspeed")

from zerokit.cli import main
from zerokit.config.lint import lint_config
from zerokit.config.read import parallelism_from_config
from zerokit.spec.hardware import accelerator
from zerokit.spec.setup import Parallelism

CPU = accelerator("cpu")
A100 = accelerator("a100-80gb")


def cfg(stage: int = 3, top: dict | None = None, **zero) -> dict:
    """A valid config for any world size (no train_batch_size), ZeRO at `stage`."""
    out = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
           "zero_optimization": {"stage": stage, **({"stage3_gather_16bit_weights_on_model_save": True}
                                                    if stage == 3 else {}), **zero}}
    out.update(copy.deepcopy(top or {}))
    return out


def found(config: dict, world: int, key: str, acc=None):
    return [f for f in lint_config(config, world, acc) if f.key == key]


def test_parallelism_reads_the_degrees_deepspeed_acts_on():
    """autotp_size and zero_hpz_partition_size act above 1 (engine._configure_tensor_parallel,
    stage3._set_zero_group_parallelism); 0 and 1 are off."""
    c = cfg(zero_hpz_partition_size=2, top={"tensor_parallel": {"autotp_size": 2}, "sequence_parallel_size": 2})
    assert parallelism_from_config(c) == Parallelism(2, 2, 2)
    assert parallelism_from_config(c).data_parallel(8) == 2
    assert parallelism_from_config(cfg(zero_hpz_partition_size=0, top={"tensor_parallel": {"autotp_size": 0}})) \
        == Parallelism()
    with pytest.raises(Exception, match="at least 1"):
        Parallelism(tensor_parallel=0)


def test_mics_is_refused_in_deepspeeds_words_with_the_hpz_fix():
    """DeepSpeed 0.19.8 removed MiCS: DeepSpeedConfig raises DeepSpeedConfigError on mics_shard_size (runtime/config.py
    _reject_removed_config_keys). `check` says so in DeepSpeed's message and names hpZ, which shards parameters
    within a node as MiCS did."""
    from deepspeed.runtime import config as ds_config

    bad = cfg(mics_shard_size=8)
    with pytest.raises(ds_config.DeepSpeedConfigError, match="MiCS"):
        ds_config.DeepSpeedConfig(bad)
    (f,) = found(bad, 16, "zero_optimization.mics_shard_size")
    assert f.level == "error" and ds_config._REMOVED_ZERO_CONFIG_KEYS["mics_shard_size"] in f.message
    assert "zero_hpz_partition_size" in f.message and "\n" not in f.message


@pytest.mark.parametrize("key", ["zero_quantized_weights", "zero_quantized_gradients"])
def test_quantized_collectives_need_deepspeeds_cuda_quantizer(key):
    """qwZ and qgZ load DeepSpeed's QuantizerBuilder; on this machine (no GPU) that raises, as DeepSpeed itself shows
    here. `check --gpu cpu` refuses the key in one line; on a GPU it is accepted and priced (no finding: its buffers and
    bytes, tests/test_parallel_memory.py), and below stage 3 DeepSpeed ignores it."""
    from deepspeed.ops.op_builder import QuantizerBuilder

    with pytest.raises(ValueError, match="not been implemented on CPU"):
        QuantizerBuilder().load()
    where = f"zero_optimization.{key}"
    (f,) = found(cfg(**{key: True}), 2, where, CPU)
    assert f.level == "error" and "remove it" in f.message
    assert found(cfg(**{key: True}), 16, where, A100) == []
    (f,) = found(cfg(stage=2, **{key: True}), 16, where, A100)
    assert f.level == "warning" and "ZeRO-3 only" in f.message


def test_hpz_as_deepspeed_groups_it():
    """utils/groups.py _create_zero_param_parallel_group asserts world % min(size, world) == 0: 4 of 6 ranks is
    refused, 4 of 2 is clamped to 2 and runs; at stage 2 the key is ignored (only stage3.py reads it)."""
    from deepspeed.utils.groups import _ensure_divisibility

    key = "zero_optimization.zero_hpz_partition_size"
    with pytest.raises(AssertionError):
        _ensure_divisibility(6, min(4, 6))
    _ensure_divisibility(2, min(4, 2))
    assert [f.level for f in found(cfg(zero_hpz_partition_size=4), 6, key)] == ["error"]
    assert found(cfg(zero_hpz_partition_size=4), 2, key) == []  # runs, and the memory and time models price it
    (f,) = found(cfg(stage=2, zero_hpz_partition_size=2), 8, key)
    assert f.level == "warning" and "ZeRO-3 only" in f.message


@pytest.mark.parametrize("top,key", [({"tensor_parallel": {"autotp_size": 3}}, "tensor_parallel.autotp_size"),
                                     ({"sequence_parallel_size": 3}, "sequence_parallel_size")],
                         ids=["tp", "sp"])
def test_tp_and_sp_degrees_must_divide_the_world(top, key):
    assert [f.level for f in found(cfg(top=top), 4, key)][0] == "error"
    # divides: runs; SP keeps a warning that the key alone does not split the sequence (the script's Ulysses does)
    assert [f.level for f in found(cfg(top=top), 6, key)] == ([] if key.startswith("tensor") else ["warning"])


def test_tp_size_must_agree_with_autotp_size():
    """engine._apply_autotp_partitioning raises when tensor_parallel.tp.tp_size is neither 1 nor autotp_size."""
    assert found(cfg(top={"tensor_parallel": {"autotp_size": 2, "tp": {"tp_size": 4}}}), 4,
                 "tensor_parallel.tp.tp_size")[0].level == "error"
    assert not found(cfg(top={"tensor_parallel": {"autotp_size": 2, "tp": {"tp_size": 2}}}), 4,
                     "tensor_parallel.tp.tp_size")


def _check(tmp_path, capsys, config: dict, *extra) -> tuple[int, dict]:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    code = main(["check", str(path), "--model", "tiny-llama", "--gpu", "a100-80gb", "--gpus-per-node", "4",
                 "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def test_check_reports_the_split_the_config_implies(tmp_path, capsys):
    """`check --json` gives parallelism: data x tensor x sequence ranks and the hpZ partition (1 where unused)."""
    code, out = _check(tmp_path, capsys, cfg(zero_hpz_partition_size=4, top={"tensor_parallel": {"autotp_size": 2}}),
                       "--seq-len", "128")
    assert code in (0, 1), out
    assert out["parallelism"] == {"data_parallel": 2, "tensor_parallel": 2, "sequence_parallel": 1,
                                  "hpz_partition_size": 4, "pipeline_parallel": 1}
    code, out = _check(tmp_path, capsys, cfg(), "--seq-len", "128")
    assert out["parallelism"] == {"data_parallel": 4, "tensor_parallel": 1, "sequence_parallel": 1,
                                  "hpz_partition_size": 1, "pipeline_parallel": 1}


@pytest.mark.parametrize("sp,seq,fragment", [(4, 130, "--seq-len"), (3, 129, "attention heads")],
                         ids=["sequence-not-divisible", "heads-not-divisible"])
def test_check_refuses_what_ulysses_refuses_for_the_model(tmp_path, capsys, sp, seq, fragment):
    """tiny-llama has 4 attention heads and 2 KV heads. UlyssesSPAttentionHF.__init__ raises unless heads % sp == 0
    and kv heads and sp divide one another; UlyssesSPDataLoaderAdapter unless sp divides the sequence
    (deepspeed/runtime/sequence_parallel/ulysses_sp.py). sp 4 with 2 KV heads replicates them: accepted."""
    world = ["--gpus-per-node", str(sp)] if sp != 4 else []
    code, out = _check(tmp_path, capsys, cfg(top={"sequence_parallel_size": sp}), "--seq-len", str(seq), *world)
    assert code == 2
    errors = [f for f in out["findings"] if f["level"] == "error"]
    assert errors[0]["key"] == "sequence_parallel_size" and fragment in errors[0]["message"]
    code, out = _check(tmp_path, capsys, cfg(top={"sequence_parallel_size": 4}), "--seq-len", "128")
    assert code in (0, 1) and out["parallelism"]["sequence_parallel"] == 4


ZEROPP_PLAN = ["llama-3-8b", "--gpu", "h100-80gb", "--gpus-per-node", "8", "--nodes", "4", "--seq-len", "2048",
               "--global-batch", "64", "--micro-batch", "2"]


def test_zeropp_pins_plan_zero3_render_deepspeeds_keys_and_pass_check(tmp_path, capsys):
    """--zero-quantized-weights/-gradients pin ZeRO-3 (only stage3.py reads the keys), render them as DeepSpeed reads
    them, and the rendered config passes `check` (DeepSpeed's own config classes) with the same priced bytes."""
    assert main(["plan", *ZEROPP_PLAN, "--zero-quantized-weights", "on", "--zero-quantized-gradients", "on",
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    choice = plan["choice"]
    assert choice["zero_stage"] == 3 and choice["quantized_weights"] and choice["quantized_gradients"]
    assert "qwZ qgZ" in choice["label"]
    zero = plan["ds_config"]["zero_optimization"]
    assert zero["zero_quantized_weights"] is True and zero["zero_quantized_gradients"] is True
    out = tmp_path / "ds_config.json"
    assert main(["render", *ZEROPP_PLAN, "--zero-quantized-weights", "on", "--zero-quantized-gradients", "on",
                 "-o", str(out)]) == 0
    capsys.readouterr()
    assert json.loads(out.read_text())["zero_optimization"] == zero
    assert main(["check", str(out), "--model", "llama-3-8b", "--gpu", "h100-80gb", "--gpus-per-node", "8",
                 "--nodes", "4", "--seq-len", "2048", "--json"]) == 0
    checked = json.loads(capsys.readouterr().out)["evaluation"]
    for key in ("communication_seconds", "communication_hidden_seconds"):
        assert checked["time"][key] == pytest.approx(plan["time"][key])


def test_qwz_halves_the_gathers_and_qgz_quarters_the_gradients_across_nodes():
    """ZeRO++ (Wang et al. 2023, section 3): qwZ gathers int8 weights, half of fp16's bytes (plus a 4-byte scale per
    QWZ_GROUP_ELEMENTS); qgZ sends int4 gradients across nodes, a quarter of fp16's, reduced within the node first."""
    from zerokit.estimate.timing import collective_bytes
    from zerokit.spec.hardware import Cluster
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.setup import QWZ_BYTES_PER_ELEMENT, ZeroSetup

    model = load_model_spec("llama-3-8b")
    cluster = Cluster(accelerator=accelerator("h100-80gb"), gpus_per_node=8, nodes=4)
    base = ZeroSetup(zero_stage=3, precision="bf16")
    plain = collective_bytes(model, cluster, base)
    qwz = collective_bytes(model, cluster, base.with_(quantized_weights=True))
    qgz = collective_bytes(model, cluster, base.with_(quantized_gradients=True))
    assert qwz.parameters / plain.parameters == pytest.approx(QWZ_BYTES_PER_ELEMENT / 2, rel=1e-3)
    assert qwz.gradients == plain.gradients
    assert qgz.gradients < plain.gradients / 4 and qgz.intra_node > 0 and qgz.parameters == plain.parameters


@pytest.mark.parametrize("extra,said", [
    (["--gpu", "cpu", "--gpus-per-node", "2"], "CUDA quantizer kernels, not on cpu"),
    (["--stage", "2"], "hpZ, qwZ, qgZ and SuperOffload need ZeRO-3"),
])
def test_zeropp_pins_where_deepspeed_cannot_run_them_are_refused_in_one_line(extra, said, tmp_path, capsys):
    args = ["render", *ZEROPP_PLAN, *extra, "--zero-quantized-weights", "on", "-o", str(tmp_path / "c.json")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "c.json").exists()
