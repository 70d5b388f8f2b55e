"""The fine-tune split cache (spec/finetune.py trainable_split): a cached or bundled split is the split a fresh count
gives, a key changes with anything that decides the count, and the bundled table is current for the code and the
pinned versions (else scripts/bundle_finetune_splits.py must be run)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from zerokit.core.resources import bundled_data
from zerokit.planning.planner import FINETUNE_ALTERNATIVES
from zerokit.spec import finetune as ft
from zerokit.spec.finetune import Finetune

pytest.importorskip("peft")

BUNDLED = sorted(bundled_data("models").glob("*/config.json"))


def _table() -> dict:
    return json.loads(bundled_data(ft.BUNDLED_SPLITS).read_text())


def test_bundled_table_is_current():
    """Every bundled model's suggested LoRA and QLoRA split is in the table under today's key (the counting code's
    bytes and the installed torch/transformers/peft are in it): a change to spec/finetune.py or a version bump
    without a regenerated table fails here."""
    table = _table()
    counted = set(table["counted"])
    missing = [f"{c.parent.name}/{f.mode}" for c in BUNDLED for f in FINETUNE_ALTERNATIVES
               if f"{c.parent.name}/{f.mode}" in counted and ft._split_key(str(c), f) not in table["splits"]]
    assert not missing, (f"zerokit/data/{ft.BUNDLED_SPLITS} is stale for {missing[:4]} (spec/finetune.py or the "
                         f"pinned versions changed): run python scripts/bundle_finetune_splits.py")
    # every bundled model is counted, save the ones transformers or peft cannot build (the script says which)
    assert len(counted) >= len(BUNDLED) * len(FINETUNE_ALTERNATIVES) - 4


@pytest.mark.parametrize("name,mode", [("tiny-llama", "lora"), ("qwen3-30b-a3b", "qlora"), ("gpt2", "qlora")])
def test_bundled_split_equals_a_fresh_count(name, mode):
    """The bundled entry is what peft's own count and module_layout give now, field for field (a dense Llama, a
    fused-expert MoE whose experts peft's ParamWrapper adapts, GPT-2's Conv1D under bitsandbytes' rules)."""
    config = bundled_data(f"models/{name}/config.json")
    finetune = Finetune(mode=mode)
    stored = _table()["splits"][ft._split_key(str(config), finetune)]
    assert ft.split_from_dict(stored) == ft.count_split(str(config), finetune)


def test_cache_round_trip_and_keys(tmp_path, monkeypatch):
    """A count is written once and read back equal (tuples and all) without counting again; another rank, another
    config or another library version is another key."""
    monkeypatch.setenv("ZEROKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ft, "_bundled_splits", dict)  # no bundled table: the user cache alone
    monkeypatch.setattr(ft, "_SPLITS", {})
    config = tmp_path / "config.json"
    config.write_text(bundled_data("models/tiny-llama/config.json").read_text())
    lora = Finetune(mode="lora", lora_r=8)
    first = ft.trainable_split(str(config), lora)
    files = list((tmp_path / "cache" / "finetune_splits").glob("*.json"))
    assert len(files) == 1

    def no_count(*_):
        raise AssertionError("counted again despite the cache")

    monkeypatch.setattr(ft, "count_split", no_count)
    ft._SPLITS.clear()
    again = ft.trainable_split(str(tmp_path), lora)  # the folder names the same config.json
    assert again == first and isinstance(again.layout["lora_slots"], tuple)
    assert again.layout == first.layout
    key = ft._split_key(str(config), lora)
    assert ft._split_key(str(config), Finetune(mode="lora", lora_r=16)) != key
    import zerokit.core.fsutil as fsutil

    monkeypatch.setattr(fsutil, "package_version", lambda p: "0.0")
    assert ft._split_key(str(config), lora) != key
    monkeypatch.undo()
    data = json.loads(config.read_text())
    data["num_hidden_layers"] += 1
    config.write_text(json.dumps(data))
    assert ft._split_key(str(config), lora) != key


def test_corrupt_cache_entry_recounts(tmp_path, monkeypatch):
    """A truncated cache file costs a recount, never a wrong answer or a traceback."""
    monkeypatch.setenv("ZEROKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ft, "_bundled_splits", dict)
    monkeypatch.setattr(ft, "_SPLITS", {})
    config = str(bundled_data("models/tiny-llama/config.json"))
    lora = Finetune(mode="lora", lora_r=4)
    path = tmp_path / "finetune_splits" / f"{ft._split_key(config, lora)}.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"key": "' + ft._split_key(config, lora) + '", "split": {"total_params": 1')
    split = ft.trainable_split(config, lora)
    assert asdict(split) == asdict(ft.count_split(config, lora))
