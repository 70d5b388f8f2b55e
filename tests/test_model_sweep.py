"""The sweep over what transformers knows (issue 29): every model type in its CONFIG_MAPPING that has a causal LM
(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) or an image-text-to-text model (MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES), built
from its config class's defaults shrunk to a few layers and a small width, planned in-process (zerokit.cli.main, the
config from a local directory) in full, LoRA and QLoRA modes. Each answers (exit 0, or 1: does not fit) or refuses in
one clean line naming why (exit 2); never a Python exception (the CLI's generic catch prints
"error: SomeError: ... (rerun with --debug ...)", which counts as a failure here).

`python tests/test_model_sweep.py` prints the counts docs/models.md reports (answered / refused / why)."""

from __future__ import annotations

import contextlib
import io
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

MODES = ("full", "lora", "qlora")
# one setup per plan: the sweep is about reading and building every architecture, not the search over setups (pinned,
# a plan costs half: 816 plans in about a minute on one core)
PINS = ("--stage", "2", "--micro-batch", "1", "--grad-accum", "1", "--precision", "bf16", "--activation-checkpointing",
        "off", "--offload-optimizer", "none")
# the sizes a default config is shrunk to (each key only lowered, never raised): few layers, small hidden size. The
# vocabulary is left alone (token ids in the config point into it; on the meta device its size costs nothing)
_CAPS = {
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2, "decoder_layers": 2, "encoder_layers": 2,
    "hidden_size": 64, "n_embd": 64, "d_model": 64, "n_embed": 64, "dim": 64, "model_dim": 64,
    "intermediate_size": 128, "ffn_dim": 128, "n_inner": 128, "ffn_hidden_size": 128, "d_ff": 128,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "intermediate_size_mlp": 128,
    "num_attention_heads": 4, "n_head": 4, "num_heads": 4, "n_heads": 4, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "num_key_value_heads": 2, "num_kv_heads": 2, "head_dim": 16,
    "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "moe_top_k": 2, "top_k": 2,
}


def model_types() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    wanted = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
    return sorted(wanted & set(CONFIG_MAPPING_NAMES))


def _shrink(cfg, depth: int = 0) -> None:
    """Lower the config's sizes in place, sub-configs (text_config, vision_config, ...) included."""
    from transformers import PretrainedConfig

    if depth > 3:
        return
    for key, value in list(vars(cfg).items()):
        if isinstance(value, PretrainedConfig):
            _shrink(value, depth + 1)
        elif key in _CAPS and isinstance(value, int) and not isinstance(value, bool) and value > _CAPS[key]:
            setattr(cfg, key, _CAPS[key])
    layers = next((getattr(cfg, k) for k in ("num_hidden_layers", "num_layers", "n_layer")
                   if isinstance(getattr(cfg, k, None), int)), None)
    for key in ("layer_types", "mlp_layer_types", "layers_block_type", "attn_layer_indices"):
        value = getattr(cfg, key, None)
        if isinstance(value, list) and layers is not None and len(value) > layers and key != "attn_layer_indices":
            setattr(cfg, key, value[:layers])


def small_config_dir(model_type: str, root: Path) -> Path | None:
    """config.json of the model type's default config, shrunk; None when transformers cannot make or save its
    default config (nothing zerokit is given to plan)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        cfg = CONFIG_MAPPING[model_type]()
        _shrink(cfg)
        path = root / model_type
        cfg.save_pretrained(path)
    except Exception:
        return None
    return path


_GENERIC = re.compile(r"error: [A-Za-z_]*(Error|Exception|Warning|Interrupt)\b|rerun with --debug|Traceback")


def plan_once(config_dir: Path, mode: str) -> tuple[int, str]:
    """(exit code, the error line or '') of one in-process plan; AssertionError for a Python exception."""
    from zerokit.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["plan", str(config_dir), "--gpu", "a100-80gb", "--finetune", mode, *PINS])
    errors = [line for line in err.getvalue().splitlines() if line.startswith("error:")]
    assert not _GENERIC.search(err.getvalue()), f"{config_dir.name} {mode}: {err.getvalue()[-600:]}"
    assert rc in (0, 1, 2), f"{config_dir.name} {mode}: exit {rc}"
    if rc == 2:
        assert len(errors) == 1, f"{config_dir.name} {mode}: {err.getvalue()[-600:]}"
        return rc, errors[0]
    return rc, ""


def _why(line: str) -> str:
    """A refusal grouped by its reason (the message without the model's paths and numbers)."""
    text = re.sub(r"/\S+", "PATH", line.removeprefix("error: "))
    text = re.sub(r"\([^()]*\)", "(...)", text)
    return re.sub(r"\d+", "N", text)[:110]


@pytest.fixture(scope="module")
def config_root():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


@pytest.mark.parametrize("model_type", model_types())
def test_every_model_type_answers_or_refuses_cleanly(model_type, config_root):
    path = small_config_dir(model_type, config_root)
    if path is None:
        pytest.skip(f"transformers cannot make a default {model_type} config")
    for mode in MODES:
        plan_once(path, mode)


def main() -> int:
    results: Counter = Counter()
    reasons: Counter = Counter()
    with tempfile.TemporaryDirectory() as d:
        for model_type in model_types():
            path = small_config_dir(model_type, Path(d))
            if path is None:
                results["no default config"] += 1
                continue
            for mode in MODES:
                try:
                    rc, line = plan_once(path, mode)
                except AssertionError as e:
                    results[f"{mode}: FAILED"] += 1
                    print(f"FAILED {e}", file=sys.stderr)
                    continue
                results[f"{mode}: {'answered' if rc in (0, 1) else 'refused'}"] += 1
                if line:
                    reasons[f"{mode}: {_why(line)}"] += 1
    print(f"{len(model_types())} model types")
    for key, n in sorted(results.items()):
        print(f"{n:5d}  {key}")
    print("refusals by reason:")
    for key, n in reasons.most_common():
        print(f"{n:5d}  {key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
