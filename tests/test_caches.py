"""The caches that keep a repeated `zerokit launch` / `check` from importing DeepSpeed and transformers in the
parent process (bench/results/launch_overhead.txt): same answer as the uncached path, and recomputed whenever
anything the answer depends on changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytest.importorskip("deepspeed")

CONFIG = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
          "zero_optimization": {"stage": 2}}


def _run(code: str, cache: Path) -> dict:
    env = dict(os.environ, ZEROKIT_CACHE_DIR=str(cache), PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


CHECK = """
import json, sys
from zerokit.config.check import deepspeed_verdict
from zerokit.spec.hardware import accelerator
v = deepspeed_verdict(json.loads(sys.argv[1] if len(sys.argv) > 1 else {config!r}), {world}, accelerator("cpu"), None, 256)
print(json.dumps({{"verdict": v, "deepspeed": "deepspeed" in sys.modules}}))
"""


def test_a_repeated_check_does_not_import_deepspeed(tmp_path):
    first = _run(CHECK.format(config=json.dumps(CONFIG), world=2), tmp_path)
    again = _run(CHECK.format(config=json.dumps(CONFIG), world=2), tmp_path)
    assert first["deepspeed"] and not again["deepspeed"]
    assert again["verdict"] == first["verdict"] and first["verdict"]["deepspeed_error"] is None
    # another world size is another question: DeepSpeed's batch check fails for 4 ranks (2 x 2 x 4 != 8)
    # (zerokit's lint finds it from DeepSpeed's key sets, importing nothing: the new entry shows it was recomputed)
    other = _run(CHECK.format(config=json.dumps(CONFIG), world=4), tmp_path)
    said = [f["message"] for f in other["verdict"]["findings"] if f["level"] == "error"] + [other["verdict"]["deepspeed_error"] or ""]
    assert any("train_batch_size" in m for m in said), said
    assert len(list((tmp_path / "checks").glob("*.json"))) == 2


TOKENS = """
import json, sys
from pathlib import Path
from zerokit.core.resources import bundled_tokenizer
from zerokit.launching.data import tokenize_files
arr, total = tokenize_files([Path({data!r})], str(bundled_tokenizer()), 16)
print(json.dumps({{"rows": arr.tolist(), "total": total, "tokenized": "tokenizers" in sys.modules,
                  "transformers": "transformers" in sys.modules}}))
"""


def test_tokens_are_cached_by_content(tmp_path):
    data = tmp_path / "d.txt"
    data.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    first = _run(TOKENS.format(data=str(data)), tmp_path / "cache")
    again = _run(TOKENS.format(data=str(data)), tmp_path / "cache")
    # tokenizing imports the tokenizers library (the bundled tokenizer needs no transformers: PlainFastTokenizer);
    # a cache hit imports neither
    assert first["tokenized"] and not again["tokenized"] and not again["transformers"]
    assert (again["rows"], again["total"]) == (first["rows"], first["total"])
    data.write_text("a different text, so different tokens. " * 40)  # same name, new content: recomputed
    changed = _run(TOKENS.format(data=str(data)), tmp_path / "cache")
    assert changed["tokenized"] and changed["rows"] != first["rows"]
