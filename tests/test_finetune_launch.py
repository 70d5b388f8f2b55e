"""`zerokit launch --finetune lora|qlora|--freeze` for real (issue 10, the launch part): 2 CPU ranks over gloo through
`python -m zerokit launch`, the bundled tiny random-init Llama, seq 64, micro batch 2 x accumulation 2, 4-6 steps.

Oracles: peft's own get_nb_trainable_parameters() on the same model for the trainable count the ranks report; an
interrupted LoRA run (rank 1 SIGKILLed, restarted from its checkpoint) gives the uninterrupted run's fp32 losses and
adapter exactly; the merged weights give the logits of base + adapter (peft PeftModel over the base) to float32
rounding, for QLoRA over the same 4-bit base; --freeze leaves the frozen weights bit-identical to the deterministic
initial model (launching/train.py build_model: the same weights at any ZeRO stage). Bad input: one line, exit 2, nothing
written. Six real jobs (~3 min on 2 cores), each run once and shared by the tests that read it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zerokit.core.errors import ZerokitError
from zerokit.spec.finetune import Finetune

REPO = Path(__file__).resolve().parents[1]
STEPS = 6
LORA = ("--finetune", "lora", "--lora-r", "8")
QLORA = ("--finetune", "qlora", "--lora-r", "8")
FROZEN = ("embed_tokens", "layers.0.")


def ds_config(stage: int, persistence: int | None = None) -> dict:
    """fp32 (losses exact within a stage), no clipping, a constant LR (every step trains: the loss must fall within
    a few steps), small buckets. ZeRO-3: stage3_param_persistence_threshold 0 partitions every parameter, the packed
    4-bit weights included (measured: docs/measured-on-cpu.md "Fine-tuning")."""
    zero: dict = {"stage": stage, "reduce_bucket_size": 128 * 128, "allgather_bucket_size": 128 * 128,
                  "overlap_comm": False, "contiguous_gradients": True}
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=int(0.9 * 128 * 128),
                    stage3_param_persistence_threshold=1280 if persistence is None else persistence)
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.999], "eps": 1e-8,
                                                      "weight_decay": 0.0, "torch_adam": True}},
            "gradient_clipping": 0.0, "zero_optimization": zero, "steps_per_print": 10**6}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("finetune_launch")
    corpus = (REPO / "zerokit" / "data" / "corpus" / "tiny_corpus.txt").read_text()
    (d / "data.txt").write_text((corpus[:1500] + "\n") * 12)  # short and repeated: the loss falls in a few steps
    for name, cfg in (("z2", ds_config(2)), ("z3", ds_config(3)), ("z3p0", ds_config(3, persistence=0))):
        (d / f"{name}.json").write_text(json.dumps(cfg))
    return d


def zk(*args, env_extra: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    env["PYTHONPATH"] = os.pathsep.join(x for x in (env.pop("ZK_PREPEND", ""), str(REPO), env.get("PYTHONPATH", "")) if x)
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run([sys.executable, "-m", "zerokit", "launch", *map(str, args)], capture_output=True, text=True,
                          cwd=str(REPO), env=env, timeout=timeout)


def train(workdir: Path, out: Path, config: str, *extra, steps: int = STEPS, env_extra: dict | None = None):
    p = zk("--model", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", "64", "--steps", steps,
           "--data", workdir / "data.txt", "--config", workdir / f"{config}.json", "--output-dir", out, *extra,
           env_extra=env_extra)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out


_RUNS: dict[str, Path] = {}


def cached(workdir: Path, name: str, config: str, *extra, **kw) -> Path:
    if name not in _RUNS:
        _RUNS[name] = train(workdir, workdir / name, config, *extra, **kw)
    return _RUNS[name]


def lora_run(workdir):  # ZeRO-2, checkpoints every 2 steps, merged weights at the end
    return cached(workdir, "lora", "z2", *LORA, "--save-every", "2", "--merge")


def qlora_run(workdir, stage: int):
    if stage == 2:
        return cached(workdir, "qlora_z2", "z2", *QLORA, "--merge", steps=4)
    return cached(workdir, "qlora_z3", "z3p0", *QLORA, "--activation-checkpointing", "on", steps=4)


def records(out: Path, rank: int = 0) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics" / f"rank{rank}.jsonl").read_text().splitlines() if x.strip()]


def losses(out: Path) -> dict[int, float]:
    """step -> loss (a redone step's last record wins)."""
    return {r["step"]: r["loss"] for r in records(out) if r.get("event") == "step"}


def assert_loss_falls(out: Path, by: float = 0.15) -> None:
    ls = losses(out)
    n = max(ls)
    assert sorted(ls) == list(range(1, n + 1)), ls
    assert (ls[n - 1] + ls[n]) / 2 < (ls[1] + ls[2]) / 2 - by, ls


def load_adapter(out: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(out / "final" / "adapter_model.safetensors"))


def logits(model, x):
    import torch

    with torch.no_grad():
        return model(input_ids=x).logits


def quantized_base(path: Path):
    """The base 4-bit as the ranks loaded it (launching/train.py bnb_config with fp32 compute)."""
    import torch
    from transformers import AutoModelForCausalLM

    from zerokit.launching.train import bnb_config

    return AutoModelForCausalLM.from_pretrained(str(path), quantization_config=bnb_config(Finetune(mode="qlora"),
                                                                                          torch.float32),
                                                device_map="cpu", dtype=torch.float32)


# ----------------------------------------------------------------------------------------------
# LoRA


@pytest.mark.slow
def test_lora_trains_and_counts_like_peft(workdir):
    """(a) The loss falls; every rank's start record carries the fine-tune and the trainable count peft gives for the
    same model; final/ is the adapter alone; checkpoints hold no base weights."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from zerokit.spec.finetune import trainable_split
    from zerokit.spec.resolve import resolve_model

    out = lora_run(workdir)
    assert_loss_falls(out)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(out / "base")),
                                LoraConfig(r=8, target_modules="all-linear"))
    trainable, _ = peft_model.get_nb_trainable_parameters()
    assert trainable == trainable_split(str(resolve_model("tiny-llama").config_file()),
                                        Finetune(mode="lora", lora_r=8)).trainable_params  # what the plan counted
    for rank in (0, 1):
        start = next(r for r in records(out, rank) if r["event"] == "start")
        assert start["finetune"] == Finetune(mode="lora", lora_r=8).to_dict()
        assert start["trainable_params"] == trainable > 0
    final = out / "final"
    assert (final / "adapter_config.json").is_file() and not (final / "model.safetensors").exists()
    adapter = load_adapter(out)
    assert sum(t.numel() for t in adapter.values()) == trainable and all(".lora_" in k for k in adapter)
    assert json.loads((final / "adapter_config.json").read_text())["base_model_name_or_path"] == str(out / "base")
    module = torch.load(out / "checkpoints" / "step2" / "mp_rank_00_model_states.pt", map_location="cpu",
                        weights_only=False)["module"]
    assert module and all(".lora_" in k for k in module), sorted(module)[:5]  # exclude_frozen_parameters


@pytest.mark.slow
def test_lora_restart_reproduces_the_uninterrupted_run(workdir):
    """(b) Rank 1 SIGKILLed after step 3 (checkpoint at 2): one restart from step 2, then the same fp32 losses and
    the same adapter, bit for bit, as the uninterrupted run."""
    import torch

    ref = lora_run(workdir)
    out = train(workdir, workdir / "lora_crash", "z2", *LORA, "--save-every", "2", "--max-restarts", "1",
                env_extra={"ZEROKIT_TEST_CRASH_AT_STEP": "3", "ZEROKIT_TEST_CRASH_RANK": "1"})
    report = json.loads((out / "report.json").read_text())
    assert report["restarts"] == 1
    starts = [r for r in records(out) if r["event"] == "start"]
    assert [s["resumed_from"] for s in starts] == [0, 2]
    assert losses(out) == losses(ref)
    a, b = load_adapter(ref), load_adapter(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # a --resume asking for another fine-tune is refused before anything changes (its checkpoint holds r=8 adapters)
    before = sorted((str(x), x.stat().st_mtime_ns) for x in out.rglob("*"))
    p = zk("--model", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", "64", "--steps", STEPS + 2,
           "--data", workdir / "data.txt", "--config", workdir / "z2.json", "--output-dir", out, "--resume",
           "--finetune", "lora", "--lora-r", "4")
    _one_line_error(p, "--resume: the run in", "lora_r 4 (the run's: 8)")
    assert sorted((str(x), x.stat().st_mtime_ns) for x in out.rglob("*")) == before


@pytest.mark.slow
def test_merged_weights_give_base_plus_adapter_logits(workdir):
    """(c) final/merged reloads in transformers and computes what base + adapter (PeftModel over final/) computes."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = lora_run(workdir)
    x = torch.randint(0, 2048, (2, 64), generator=torch.Generator().manual_seed(0))
    base = logits(AutoModelForCausalLM.from_pretrained(str(out / "base")).eval(), x)
    adapted = logits(PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(out / "base")),
                                               str(out / "final")).eval(), x)
    merged_model = AutoModelForCausalLM.from_pretrained(str(out / "final" / "merged")).eval()
    merged = logits(merged_model, x)
    assert (adapted - base).abs().max() > 1e-2  # the adapter trained
    assert torch.allclose(merged, adapted, atol=1e-5, rtol=0), float((merged - adapted).abs().max())
    assert not any("lora" in n for n, _ in merged_model.named_parameters())
    assert len(AutoTokenizer.from_pretrained(str(out / "final" / "merged"))) == 2048


@pytest.mark.slow
def test_lora_zero3_gathers_the_adapter_and_merges(workdir):
    """ZeRO-3 with activation checkpointing: the base built under deepspeed.zero.Init (transformers, HfDeepSpeedConfig)
    then wrapped by peft; the partitioned adapter gathered for final/, and the merge (rank 0 alone) builds its base
    outside zero.Init. The same losses as ZeRO-2 (the first bit-identical), the same adapter to rounding."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ref = lora_run(workdir)
    out = cached(workdir, "lora_z3", "z3", *LORA, "--merge", "--activation-checkpointing", "on")
    got, want = losses(out), losses(ref)
    assert sorted(got) == sorted(want) and got[1] == want[1]
    for s, v in got.items():
        assert v == pytest.approx(want[s], rel=1e-4), (s, v, want[s])
    a, b = load_adapter(ref), load_adapter(out)
    assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert diff < 1e-3, diff
    x = torch.randint(0, 2048, (2, 64), generator=torch.Generator().manual_seed(0))
    adapted = logits(PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(out / "base")),
                                               str(out / "final")).eval(), x)
    merged = logits(AutoModelForCausalLM.from_pretrained(str(out / "final" / "merged")).eval(), x)
    assert torch.allclose(merged, adapted, atol=1e-5, rtol=0), float((merged - adapted).abs().max())


# ----------------------------------------------------------------------------------------------
# QLoRA (bitsandbytes 4-bit NF4 on CPU)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_qlora_trains(workdir, stage):
    """(d) ZeRO-2, and ZeRO-3 with every parameter partitioned and activation checkpointing: the loss falls, the
    adapters are LoRA's, and the base really is 4-bit (its first loss is not the fp32 base's)."""
    out = qlora_run(workdir, stage)
    assert_loss_falls(out, by=0.1)
    start = next(r for r in records(out) if r["event"] == "start")
    assert start["finetune"]["mode"] == "qlora" and start["finetune"]["bnb_4bit_quant_storage"] == "uint8"
    lora_start = next(r for r in records(lora_run(workdir)) if r["event"] == "start")
    assert start["trainable_params"] == lora_start["trainable_params"]
    first = losses(out)[1]
    assert first != losses(lora_run(workdir))[1] and first == pytest.approx(losses(lora_run(workdir))[1], abs=0.05)
    if stage == 3:  # the same model and data at another stage (and recomputed activations): the first loss is
        # bit-identical (the same 4-bit weights, gathered exactly), later ones equal to fp32 rounding
        z2 = losses(qlora_run(workdir, 2))
        got = losses(out)
        assert got[1] == z2[1]
        for s, v in got.items():
            assert v == pytest.approx(z2[s], rel=1e-4), (s, v, z2[s])
        a, b = load_adapter(qlora_run(workdir, 2)), load_adapter(out)
        assert a.keys() == b.keys()  # gathered whole from the ZeRO-3 partitions
        diff = max(float((a[k] - b[k]).abs().max()) for k in a)
        assert all(a[k].shape == b[k].shape for k in a) and diff < 1e-3, diff


@pytest.mark.slow
def test_qlora_merge_is_the_dequantized_base_plus_adapter(workdir):
    """(c) for QLoRA: the merged fp32 weights compute what the 4-bit base + adapter computes. The reference runs in
    train mode (no dropout here): bitsandbytes 0.50.2 on an AVX512-BF16 CPU repacks 4-bit weights for a bf16 kernel
    in eval mode without grad, which fails for in_features 352 (not a multiple of its 64 block)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = qlora_run(workdir, 2)
    x = torch.randint(0, 2048, (2, 64), generator=torch.Generator().manual_seed(0))
    adapted = logits(PeftModel.from_pretrained(quantized_base(out / "base"), str(out / "final")).train(), x)
    merged_model = AutoModelForCausalLM.from_pretrained(str(out / "final" / "merged")).eval()
    assert "quantization_config" not in json.loads((out / "final" / "merged" / "config.json").read_text())
    merged = logits(merged_model, x)
    assert torch.allclose(merged, adapted, atol=1e-5, rtol=0), float((merged - adapted).abs().max())


# ----------------------------------------------------------------------------------------------
# --freeze


@pytest.mark.slow
def test_frozen_parameters_are_bit_identical_after_training(workdir):
    """(e) ZeRO-3 (the export consolidates through zero_to_fp32, frozen fragments included): the frozen weights come
    out exactly as the deterministic initial model had them, every other weight moved."""
    import torch
    from safetensors.torch import load_file

    from zerokit.launching.train import build_model
    from zerokit.spec.finetune import is_frozen

    flags = [a for p in FROZEN for a in ("--freeze", p)]
    out = cached(workdir, "freeze_z3", "z3", *flags, steps=4)
    assert_loss_falls(out, by=0.1)
    initial = {n: p.detach() for n, p in build_model("tiny-llama", {}, 1234).named_parameters()}
    final = load_file(str(out / "final" / "model.safetensors"))
    assert final.keys() == initial.keys()
    frozen = [n for n in initial if is_frozen(n, FROZEN)]
    assert frozen and len(frozen) < len(initial)
    for n in initial:
        assert torch.equal(final[n], initial[n]) == (n in frozen), n
    start = next(r for r in records(out) if r["event"] == "start")
    assert start["trainable_params"] == sum(p.numel() for n, p in initial.items() if n not in frozen)


# ----------------------------------------------------------------------------------------------
# planning and bad input (no ranks)


def test_ranks_get_the_finetune_and_the_plan_counts_it(tmp_path):
    from zerokit.launching.prepare import LaunchRequest, prepare_launch
    from zerokit.launching.rank_options import RankOptions
    from zerokit.spec.hardware import HardwareOptions
    from zerokit.spec.model import load_model_spec
    from zerokit.spec.resolve import resolve_model

    hw = HardwareOptions(gpu="cpu", gpus_per_node=2)
    ft = Finetune(mode="lora", lora_r=8, lora_targets="q_proj,v_proj")
    plan = prepare_launch(LaunchRequest(model="tiny-llama", hardware=hw, seq_len=32, steps=2, finetune=ft, merge=True,
                                        output_dir=str(tmp_path / "run"), dry_run=True))
    opts = plan.rank_options(False)  # what rank_options.json carries to the ranks
    assert opts.finetune == ft and opts.merge is True
    assert RankOptions.from_dict(json.loads(json.dumps(opts.to_dict()))).finetune == ft  # and reads back
    assert plan.spec.trained.trainable_params < plan.spec.params // 50  # the plan sized the adapters, not the model
    assert plan.spec.params > load_model_spec(resolve_model("tiny-llama")).params
    full = prepare_launch(LaunchRequest(model="tiny-llama", hardware=hw, seq_len=32, steps=2,
                                        output_dir=str(tmp_path / "run"), dry_run=True))
    assert full.rank_options(False).finetune.is_full and full.rank_options(False).merge is False
    # a user's script builds its own model: the fine-tune only sizes the plan, nothing is passed to the script
    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    own = prepare_launch(LaunchRequest(model="tiny-llama", hardware=hw, seq_len=32, steps=2, finetune=ft,
                                       script_command=("python", str(script), "--deepspeed", "{ds_config}"),
                                       output_dir=str(tmp_path / "run"), dry_run=True))
    assert own.spec.trained.trainable_params == plan.spec.trained.trainable_params
    assert own.script_args(False)[-2:] == ["--deepspeed", str(own.cfg_path)]  # the script's own arguments only
    with pytest.raises(ZerokitError, match="--bnb-4bit-quant-storage fp32 in a bf16 run"):
        prepare_launch(LaunchRequest(model="tiny-llama", hardware=hw, seq_len=32, steps=2, pins={"precision": "bf16"},
                                     finetune=Finetune(mode="qlora", bnb_4bit_quant_storage="fp32"),
                                     output_dir=str(tmp_path / "run"), dry_run=True))
    assert not (tmp_path / "run").exists()


def _one_line_error(p: subprocess.CompletedProcess, *needles: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert "Traceback" not in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("error: ")
    for n in needles:
        assert n in p.stderr, p.stderr
    return p.stderr.strip()


BASE = ("--model", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", "64", "--steps", "2")


def test_qlora_without_bitsandbytes_is_one_line(tmp_path):
    stub = tmp_path / "stub" / "bitsandbytes"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('bitsandbytes disabled for this test')\n")
    out = tmp_path / "run"
    p = zk(*BASE, "--plan", "--finetune", "qlora", "--output-dir", out, env_extra={"ZK_PREPEND": str(stub.parent)})
    _one_line_error(p, "--finetune qlora", "bitsandbytes disabled for this test", "pip install bitsandbytes")
    assert not out.exists()


def test_merge_without_lora_or_with_own_script_is_one_line(tmp_path):
    out = tmp_path / "run"
    p = zk(*BASE, "--plan", "--merge", "--output-dir", out)
    _one_line_error(p, "--merge", "needs --finetune lora or qlora")
    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    p = zk(*BASE, "--finetune", "lora", "--merge", "--output-dir", out, "--", "python", script, "--deepspeed",
           "{ds_config}")
    _one_line_error(p, "--merge is for zerokit's own training loop")
    assert not out.exists()
