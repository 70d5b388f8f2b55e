"""The one model resolver (zerokit.spec.resolve): plan, check, launch, the rank entrypoint and the tokenizer
all take a model the same way. `launch --model gpt2-medium` used to fail where `plan gpt2-medium` worked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zerokit.core.errors import ZerokitError
from zerokit.core.resources import bundled_tokenizer
from zerokit.spec.resolve import resolve_model

REPO = Path(__file__).resolve().parents[1]


def test_bundled_name(tmp_path):
    r = resolve_model("tiny-llama")
    assert (r.kind, r.name, r.init) == ("bundled", "tiny-llama", "config")
    assert r.read_config()["model_type"] == "llama" and r.tokenizer == str(bundled_tokenizer())


def test_directory_with_weights_and_tokenizer(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert resolve_model(str(tmp_path)).init == "config"
    assert resolve_model(str(tmp_path)).tokenizer == str(bundled_tokenizer())
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "tokenizer.json").write_text("{}")
    r = resolve_model(str(tmp_path))
    assert (r.kind, r.init, r.tokenizer, r.source) == ("directory", "weights", str(tmp_path), str(tmp_path))


def test_config_file_path(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "gpt2"}))
    r = resolve_model(str(cfg))
    assert (r.kind, r.name, r.init, r.local_config_path) == ("file", tmp_path.name, "config", cfg)


@pytest.mark.parametrize("hub_id", ["distilgpt2", "meta-llama/Llama-3.1-8B"])
def test_hub_ids_with_and_without_an_org(hub_id):
    r = resolve_model(hub_id)
    assert (r.kind, r.hub_id, r.source, r.tokenizer, r.init) == ("hub", hub_id, hub_id, hub_id, "weights")


@pytest.mark.parametrize("bad", ["", "./missing", "/no/such/dir", "x.json", "a/b/c"])
def test_what_is_none_of_them_is_one_clear_error(bad):
    with pytest.raises(ZerokitError) as e:
        resolve_model(bad)
    assert "\n" not in str(e.value) and ("bundled" in str(e.value) or "no model given" in str(e.value))


def _zerokit(*args):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "zerokit", *args], capture_output=True, text=True, env=env,
                          cwd=str(REPO), timeout=300)


def test_launch_resolves_a_bare_hub_id_like_plan():
    """Offline, both commands get as far as fetching the config of distilgpt2 (a bare hub id, not bundled) and say the
    same thing."""
    plan = _zerokit("plan", "distilgpt2")
    launch = _zerokit("launch", "--model", "distilgpt2", "--plan", "--gpu", "cpu", "--dry-run")
    for r in (plan, launch):
        assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "cannot reach the HuggingFace hub to fetch distilgpt2" in plan.stderr.strip().splitlines()[-1]
    assert plan.stderr.strip().splitlines()[-1] == launch.stderr.strip().splitlines()[-1]
