"""Fine-tuning (issue 10, first part): what trains, counted exactly, and the model states that follow.

Oracles: peft's own get_nb_trainable_parameters() on the real (materialised) models; the elements DeepSpeed's
optimizer keeps Adam state for in a real 2-rank run (DeepSpeed drops frozen parameters from its flat groups:
deepspeed/runtime/zero/stage_1_and_2.py and stage3.py; measured, docs/measured-on-cpu.md "Fine-tuning")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zerokit.core.errors import ZerokitError
from zerokit.spec.finetune import Finetune, TrainableSplit, freeze_split, trainable_split, with_finetune

REPO = Path(__file__).resolve().parents[1]


def _config(name: str) -> str:
    from zerokit.spec.resolve import resolve_model

    return str(resolve_model(name).config_file())


def _real_model(name: str):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(_config(name)))


@pytest.mark.parametrize("targets", ["all-linear", "q_proj,v_proj", "c_attn"], ids=lambda t: t.replace(",", "+"))
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_lora_counts_equal_peft_on_the_real_model(name, targets):
    """zerokit counts on the meta device (no weights); peft counts the real model it wraps."""
    from peft import LoraConfig, get_peft_model

    model = _real_model(name)
    module_names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    wanted = [t for t in targets.split(",") if t != "all-linear"]
    if wanted and not set(wanted) <= module_names:
        with pytest.raises(ZerokitError, match="--lora-targets .*Linear modules are named"):
            trainable_split(_config(name), Finetune(mode="lora", lora_targets=targets))
        return
    ours = trainable_split(_config(name), Finetune(mode="lora", lora_r=8, lora_targets=targets))
    peft_model = get_peft_model(model, LoraConfig(r=8, target_modules=wanted or "all-linear"))
    assert (ours.trainable_params, ours.total_params) == peft_model.get_nb_trainable_parameters()
    assert ours.adapter_params == ours.trainable_params > 0 and ours.adapted_modules > 0


def test_lora_counts_a_large_registry_model_on_meta_without_weights():
    """llama-3-8b: 7 Linears per layer x 32 layers, r (in + out) each (peft lora/layer.py: lora_A r x in, lora_B
    out x r): 41,943,040 at r 16 (also what peft 0.21.2 reported for it; the 8.03B base is spec/arch_params')."""
    from zerokit.spec.model import load_model_spec

    split = trainable_split(_config("llama-3-8b"), Finetune(mode="lora"))
    h, kv, i = 4096, 1024, 14336
    per_layer = 16 * ((h + h) * 2 + (h + kv) * 2 + (h + i) * 3)
    assert split.adapter_params == 32 * per_layer == 41_943_040
    assert split.total_params == load_model_spec("llama-3-8b").params + split.adapter_params
    assert split.adapted_modules == 7 * 32


def test_freeze_counts_and_its_bad_input():
    params = [("model.embed_tokens.weight", 100), ("model.layers.0.mlp.weight", 10), ("model.layers.10.mlp.weight", 10),
              ("lm_head.weight", 100)]
    assert freeze_split(params, ("embed_tokens",)) == TrainableSplit(220, 120)
    assert freeze_split(params, ("layers.0.",)).trainable_params == 210  # layers.10. is not layers.0.
    assert freeze_split(params, ("*.mlp.weight",)).trainable_params == 200  # a glob
    with pytest.raises(ZerokitError, match="--freeze 'nope' matches no parameter"):
        freeze_split(params, ("nope",))
    with pytest.raises(ZerokitError, match="freezes every parameter"):
        freeze_split(params, ("weight",))


@pytest.mark.parametrize("kwargs, match", [
    (dict(mode="lora", lora_r=0), "--lora-r must be at least 1"),
    (dict(mode="lora", lora_dropout=1.0), "--lora-dropout"),
    (dict(mode="lora", lora_targets=" , "), "--lora-targets is empty"),
    (dict(mode="lora", freeze=("embed_tokens",)), "--freeze applies to --finetune full"),
    (dict(mode="dora"), "--finetune must be one of"),
    (dict(mode="qlora", bnb_4bit_quant_storage="int4"), "--bnb-4bit-quant-storage must be one of"),
], ids=["r0", "dropout1", "empty-targets", "freeze-with-lora", "unknown-mode", "quant-storage"])
def test_finetune_bad_input(kwargs, match):
    with pytest.raises(ZerokitError, match=match):
        Finetune(**kwargs)


def test_model_states_count_trainable_parameters_only():
    """Every weight in the training dtype; gradients, fp32 master and Adam moments (and the fp32 gradient partition)
    for trainable parameters only, partitioned as before."""
    from zerokit.estimate.memory import model_state_terms
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.setup import ZeroSetup

    base = load_model_spec("llama-3-8b")
    lora = with_finetune(base, trainable_split(_config("llama-3-8b"), Finetune(mode="lora")))
    cluster = build_cluster(gpu="a100-80gb", gpus_per_node=8)
    for stage in (1, 2, 3):
        t = model_state_terms(lora, cluster, ZeroSetup(zero_stage=stage, precision="bf16"))
        psi, tr = lora.params, lora.trainable
        assert t["parameters"] == (2 * psi // 8 if stage == 3 else 2 * psi)
        assert t["optimizer_states"] == 8 * tr // 8 and t["master_weights"] == 4 * tr // 8
        assert t["gradients"] == (2 * tr // 8 if stage >= 2 else 2 * tr)
    assert base.trainable == base.params and lora.to_dict()["trainable_params"] == lora.trainable


def _zerokit(*args):
    """`zerokit ARGS` in this process (the one-line, no-traceback guarantee of a real process is tests/test_bad_input's):
    exit code, stdout and stderr as subprocess.run returns them, without a fresh interpreter's imports each time."""
    import contextlib
    import io

    from zerokit.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def test_plan_cli_lora_json_text_and_errors():
    r = _zerokit("plan", "tiny-llama", "--gpu", "a100-80gb", "--seq-len", "256", "--finetune", "lora", "--lora-r", "8",
                 "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["choice"]["finetune"] == {"mode": "lora", "lora_r": 8, "lora_alpha": 8.0, "lora_dropout": 0.0,
                                         "lora_targets": "all-linear", "freeze": []}
    split = trainable_split(_config("tiny-llama"), Finetune(mode="lora", lora_r=8))
    assert out["model"]["trainable_params"] == split.trainable_params and out["model"]["params"] == split.total_params
    assert out["memory"]["per_gpu"]["terms"]["optimizer_states"] == 8 * split.trainable_params
    full = json.loads(_zerokit("plan", "tiny-llama", "--gpu", "a100-80gb", "--seq-len", "256", "--json").stdout)
    assert full["choice"]["finetune"] == {"mode": "full", "freeze": []}
    text = _zerokit("plan", "tiny-llama", "--gpu", "a100-80gb", "--seq-len", "256", "--freeze", "embed_tokens").stdout
    assert "finetune  full, frozen embed_tokens:" in text
    for args, msg in [(["--finetune", "lora", "--lora-r", "0"], "--lora-r must be at least 1"),
                      (["--finetune", "lora", "--lora-targets", "nope_proj"], "--lora-targets nope_proj"),
                      (["--lora-r", "8"], "--lora-r needs --finetune lora"),
                      (["--freeze", "nothing_here"], "--freeze 'nothing_here' matches no parameter")]:
        r = _zerokit("plan", "tiny-llama", "--gpu", "a100-80gb", *args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and msg in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    r = _zerokit("plan", "--params", "7B", "--gpu", "a100-80gb", "--freeze", "embed")
    assert r.returncode == 2 and "a bare --params count does not have" in r.stderr


def test_lora_on_a_bare_count_is_peft_s_count_on_its_shape():
    """LoRA r=16 on all-linear over Llama-2-7B's shape given as a count (6,738,415,616 at hidden 4096, 32 layers):
    peft's print_trainable_parameters for Llama-2-7B reads "trainable params: 39,976,960 || all params: 6,778,392,576"
    (32 layers x r (in + out) over q, k, v, o, gate, up, down). peft counts it on shape_config's Llama."""
    out = json.loads(_zerokit("plan", "--params", "6738415616", "--hidden-size", "4096", "--num-layers", "32",
                              "--vocab-size", "32000", "--gpu", "a100-80gb", "--finetune", "lora", "--lora-r", "16",
                              "--json").stdout)
    assert (out["model"]["trainable_params"], out["model"]["params"]) == (39_976_960, 6_778_392_576)
    q = json.loads(_zerokit("plan", "--params", "6738415616", "--hidden-size", "4096", "--num-layers", "32",
                            "--gpu", "a100-80gb", "--finetune", "qlora", "--json").stdout)
    assert q["model"]["trainable_params"] == 39_976_960
    assert q["memory"]["per_gpu"]["terms"]["parameters"] < out["memory"]["per_gpu"]["terms"]["parameters"] / 3


RANK_SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch, deepspeed
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg_path, stage, mode, out_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(cfg_path))
    if mode == "lora":
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear"))
    else:
        for n, p in model.named_parameters():
            p.requires_grad_(not any(k in n for k in ("embed_tokens", "layers.0.")))
    ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
          "zero_optimization": {"stage": stage, "reduce_bucket_size": 5e6, "allgather_bucket_size": 5e6}}
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    x = torch.randint(0, model.config.vocab_size, (2, 32))
    engine.backward(engine(input_ids=x, labels=x).loss)
    engine.step()
    state = [s for s in engine.optimizer.optimizer.state.values() if "exp_avg" in s]
    with open(os.path.join(out_dir, "rank%s.json" % os.environ["RANK"]), "w") as f:
        json.dump({"adam_elements": sum(s["exp_avg"].numel() + s["exp_avg_sq"].numel() for s in state),
                   "requires_grad": sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters() if p.requires_grad)}, f)
    from zerokit.core.process import finish_rank
    finish_rank(0)  # groups closed, then no interpreter teardown (its thread-pool destructors aborted a rank: -6 in CI)
''')


@pytest.mark.slow
@pytest.mark.parametrize("stage, mode", [(2, "lora"), (3, "lora"), (2, "freeze"), (3, "freeze")])
def test_deepspeed_keeps_adam_state_for_exactly_the_trainable_elements(tmp_path, stage, mode):
    """A real 2-rank DeepSpeed job (gloo, CPU): the Adam moments each rank holds are zerokit's optimizer_states
    term (8 bytes x trainable / ranks), to DeepSpeed's partition padding."""
    from zerokit.estimate.memory import model_state_terms
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.setup import ZeroSetup

    finetune = Finetune(mode="lora", lora_r=8) if mode == "lora" else Finetune(freeze=("embed_tokens", "layers.0."))
    split = trainable_split(_config("tiny-llama"), finetune)
    model = with_finetune(load_model_spec("tiny-llama"), split)
    predicted = model_state_terms(model, build_cluster(gpu="cpu", gpus_per_node=2),
                                  ZeroSetup(zero_stage=stage, precision="fp32"))["optimizer_states"]
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    from zerokit.measure.ranks import free_port

    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                        str(free_port()), str(script), _config("tiny-llama"), str(stage), mode, str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    assert len(ranks) == 2
    assert all(rk["requires_grad"] == split.trainable_params for rk in ranks)  # what peft / --freeze left trainable
    for rk in ranks:
        measured = 4 * rk["adam_elements"]  # fp32 m and v
        assert abs(measured - predicted) <= 8 * 64, (measured, predicted)  # padding to the partition alignment


def _qlora_spec(name: str = "tiny-llama"):
    from zerokit.spec.model import load_model_spec

    finetune = Finetune(mode="qlora")
    return with_finetune(load_model_spec(name), trainable_split(_config(name), finetune), finetune.mode)


@pytest.mark.parametrize("profile", ["deepspeed", "hf"])
def test_qlora_zero3_renders_persistence_threshold_zero_and_deepspeed_accepts_it(profile):
    """ZeRO-3 keeps a parameter whole when its ds_numel is under stage3_param_persistence_threshold
    (partition_parameters.py), and a packed 4-bit weight holds half (uint8) or less of its weight's elements: QLoRA
    renders 0, as a number even where the HF Trainer would fill "auto" with 10 h; a full fine-tune keeps the HF rule."""
    from zerokit.config.render import render_ds_config
    from zerokit.config.auto import fill_auto
    from zerokit.config.validate import validate_with_deepspeed
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.setup import ZeroSetup

    cluster = build_cluster(gpu="a100-80gb", gpus_per_node=2)
    setup = ZeroSetup(zero_stage=3, precision="bf16", micro_batch_size=2)
    cfg = render_ds_config(setup, cluster, _qlora_spec(), profile=profile)
    assert cfg["zero_optimization"]["stage3_param_persistence_threshold"] == 0
    full = render_ds_config(setup, cluster, load_model_spec("tiny-llama"), profile=profile)
    assert full["zero_optimization"]["stage3_param_persistence_threshold"] == ("auto" if profile == "hf" else 10 * 128)
    validate_with_deepspeed(fill_auto(cfg, setup, 2, 128) if profile == "hf" else cfg, 2)


def test_check_takes_the_finetune_options(tmp_path):
    """`check --finetune lora` judges the config with the adapters' trainable count (the Adam moments are 8 bytes per
    trainable parameter over the 2 ranks at ZeRO-2); a QLoRA ZeRO-3 config that keeps the HF threshold is warned."""
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
           "zero_optimization": {"stage": 2}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    base = ["check", str(path), "--model", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", "64",
            "--json"]
    r = _zerokit(*base, "--finetune", "lora", "--lora-r", "8")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    split = trainable_split(_config("tiny-llama"), Finetune(mode="lora", lora_r=8))
    assert out["finetune"]["mode"] == "lora" and out["finetune"]["lora_r"] == 8
    assert out["evaluation"]["memory"]["phase_terms"]["step"]["optimizer_states"] == 8 * split.trainable_params // 2
    full = json.loads(_zerokit(*base).stdout)
    assert full["finetune"] == {"mode": "full", "freeze": []}
    cfg["zero_optimization"] = {"stage": 3, "stage3_param_persistence_threshold": 1280}
    path.write_text(json.dumps(cfg))
    out = json.loads(_zerokit(*base, "--finetune", "qlora").stdout)
    warned = [f for f in out["findings"] if f["key"] == "zero_optimization.stage3_param_persistence_threshold"]
    assert warned and warned[0]["level"] == "warning" and "0 partitions them all" in warned[0]["message"]


def test_plan_suggests_lora_when_the_full_fine_tune_does_not_fit():
    """Llama-3-8B on 2 x RTX 4090 (24 GB) with 64 GB of host RAM: no full fine-tune fits (16 bytes of model states per
    parameter even fully offloaded exceed the host RAM); the suggestion names LoRA, and the memory it quotes is what
    `plan --finetune lora` gives for the same setup."""
    args = ["llama-3-8b", "--gpu", "rtx4090", "--gpus-per-node", "2", "--seq-len", "2048", "--cpu-memory", "64GB",
            "--json"]
    r = _zerokit("plan", *args)
    assert r.returncode == 1
    full = json.loads(r.stdout)
    lora_lines = [s for s in full["suggestions"] if "--finetune lora" in s]
    assert lora_lines and "fits in" in lora_lines[0], full["suggestions"]
    lora = json.loads(_zerokit("plan", *args, "--finetune", "lora").stdout)
    assert lora["fits"] and lora["choice"]["label"] in lora_lines[0]
    from zerokit.core.units import fmt_bytes

    assert f"fits in {fmt_bytes(lora['memory']['per_gpu']['total_bytes'])} per GPU" in lora_lines[0]


def test_every_memory_term_is_split_into_trainable_frozen_and_other():
    """JSON memory.per_gpu.trainable_split: the weights split by the exact counts (adapters in the training dtype),
    the optimizer's terms wholly trainable, activations and logits belong to neither; a full fine-tune freezes
    nothing. Each term's three parts add up to the term."""
    r = _zerokit("plan", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", "64", "--stage", "2",
                 "--precision", "fp32", "--finetune", "lora", "--json")
    out = json.loads(r.stdout)
    mem, trainable = out["memory"]["per_gpu"], out["model"]["trainable_params"]
    split = mem["trainable_split"]
    assert set(split) == set(mem["terms"])
    for name, parts in split.items():
        assert sum(parts.values()) == mem["terms"][name], name
    assert split["parameters"]["trainable"] == 4 * trainable  # fp32 adapters, whole at ZeRO-2
    assert split["parameters"]["frozen"] == mem["terms"]["parameters"] - 4 * trainable > 0
    assert split["optimizer_states"] == {"trainable": mem["terms"]["optimizer_states"], "frozen": 0, "other": 0}
    assert split["activations"]["other"] == mem["terms"]["activations"]
    full = json.loads(_zerokit("plan", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", "64",
                               "--json").stdout)
    assert all(p["frozen"] == 0 for p in full["memory"]["per_gpu"]["trainable_split"].values())


def test_lora_time_terms_read_the_module_tree():
    """The time model's LoRA inputs come from peft's real module tree: the trainable tensors DeepSpeed reduces (in
    backward order: fewer buckets than the full model's gradients) and the modules peft adds to each decoder layer,
    which ZeRO-3 hooks one by one (tiny-llama all-linear: a LlamaDecoderLayer's 13 modules become 83; counted on the
    real model here)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from zerokit.estimate.timing import collective_calls_per_step
    from zerokit.spec.hardware import build_cluster
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.setup import ZeroSetup

    base = load_model_spec("tiny-llama")
    lora = with_finetune(base, trainable_split(_config("tiny-llama"), Finetune(mode="lora")), "lora")
    peft_model = get_peft_model(_real_model("tiny-llama"), LoraConfig(r=16, target_modules="all-linear"))
    layer = next(m for m in peft_model.modules() if isinstance(m, torch.nn.ModuleList))[0]
    assert lora.trained.extra_modules_per_layer == len(list(layer.modules())) - 13 == 70
    # the adapters' element-wise width: every adapted Linear's base in + out features, from the real wrapped layer
    cfg = peft_model.config
    h, i, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    assert lora.trained.lora_io_per_layer == sum(m.base_layer.in_features + m.base_layer.out_features
                                         for m in layer.modules() if hasattr(m, "lora_A")) \
        == (h + h) + 2 * (h + kv) + (h + h) + 2 * (h + i) + (i + h)
    assert sorted(lora.trained.trainable_tensors) == sorted(p.numel() for p in peft_model.parameters() if p.requires_grad)
    cluster = build_cluster(gpu="cpu", gpus_per_node=2)
    setup = ZeroSetup(zero_stage=2, precision="fp32")
    assert collective_calls_per_step(lora, cluster, setup).reduces < collective_calls_per_step(base, cluster, setup).reduces
