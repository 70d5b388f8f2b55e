"""Data for the built-in loop (zerokit/launching/data.py, zerokit/launching/data_sources.py): local JSON/JSONL/CSV/Parquet
and datasets' own folders, chat and instruction records rendered with the chat template and masked, packing on and
off, the content-hash cache, and one real 2-rank launch on the bundled instruction set.

Oracles: transformers' own tokenizer (AutoTokenizer on the same documents; apply_chat_template(tokenize=True) on the
same conversations), and the assistant's content tokenized alone, which must be exactly what is left unmasked (with
the end-of-turn token the bundled template closes every turn with).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

from zerokit.core import resources
from zerokit.core.errors import ZerokitError
from zerokit.launching import data as zdata
from zerokit.launching.data_sources import DataSource, load_hub_split, resolve_source

REPO = Path(__file__).resolve().parents[1]
TOK = str(resources.bundled_tokenizer())
DOCS = [line for line in resources.bundled_corpus().read_text().splitlines() if line][:40]
DOCS[3] = DOCS[3] + "\n" + DOCS[4]  # a document of two lines
CHATS = [
    [{"role": "user", "content": "What is 12 plus 7?"}, {"role": "assistant", "content": "12 plus 7 is 19."}],
    [{"role": "system", "content": "Answer in one short sentence."},
     {"role": "user", "content": "What does a potter make?"}, {"role": "assistant", "content": "A potter makes pots."},
     {"role": "user", "content": "And a cooper?"}, {"role": "assistant", "content": "A cooper makes barrels."}],
    [{"role": "user", "content": "How many legs does a heron have?"},
     {"role": "assistant", "content": "A heron has two legs."}],
]


@pytest.fixture(autouse=True)
def _own_caches(tmp_path, monkeypatch):
    """A fresh zerokit cache per test (tokens, datasets' Arrow files of local files) and HF's datasets cache in
    tmp_path, so no test reads another's entries."""
    monkeypatch.setenv("ZEROKIT_CACHE_DIR", str(tmp_path / "zk-cache"))
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


@pytest.fixture(scope="module")
def tok():
    return zdata.load_tokenizer(TOK)


def _write_all_formats(folder: Path, records: list[dict]) -> list[Path]:
    """The same records as .jsonl, .json (an array), .csv and .parquet (pandas' writers)."""
    import pandas as pd

    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"d.{ext}" for ext in ("jsonl", "json", "csv", "parquet")]
    paths[0].write_text("".join(json.dumps(r) + "\n" for r in records))
    paths[1].write_text(json.dumps(records))
    pd.DataFrame(records).to_csv(paths[2], index=False)
    pd.DataFrame(records).to_parquet(paths[3])
    return paths


def _unmasked(data, row: int) -> list[int]:
    return [int(t) for t, lab in zip(data.tokens[row], data.labels[row]) if lab != zdata.IGNORE_INDEX]


# ----------------------------------------------------------------------------------------------
# formats


def test_every_local_format_gives_the_same_tokens_as_transformers(tmp_path, tok):
    """Oracle: AutoTokenizer on each document, followed by EOS, joined and cut into blocks (packing on); one padded
    row per document (packing off)."""
    import numpy as np

    ids = [tok(d, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for d in DOCS]
    flat = [t for e in ids for t in e]
    seq = 16
    expected = np.asarray(flat[: len(flat) // seq * seq]).reshape(-1, seq)
    for path in _write_all_formats(tmp_path, [{"text": d, "id": i} for i, d in enumerate(DOCS)]):
        packed = zdata.tokenize(resolve_source(str(path)), TOK, seq)
        assert packed.format == "text" and packed.packing and packed.labels is None and packed.attention_mask is None
        assert packed.tokens.shape == expected.shape and (packed.tokens == expected).all(), path.name
        assert packed.total_tokens == len(flat)
        padded = zdata.tokenize(resolve_source(str(path)), TOK, 64, packing=False)
        assert padded.tokens.shape == (len(DOCS), 64), path.name
        for row, e in enumerate(ids):
            n = min(len(e), 64)
            assert list(padded.tokens[row, :n]) == e[:n] and (padded.tokens[row, n:] == tok.pad_token_id).all()
            assert list(padded.attention_mask[row]) == [1] * n + [0] * (64 - n)
            assert list(padded.labels[row]) == e[:n] + [zdata.IGNORE_INDEX] * (64 - n)


def _check_chat_rows(data, chats, tok):
    """Every row is the conversation as transformers tokenizes it, and its unmasked tokens are exactly the assistant
    contents tokenized alone, each followed by the template's end-of-turn token (EOS)."""
    assert data.tokens.shape[0] == len(chats)
    for row, messages in enumerate(chats):
        whole = list(tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
        n = len(whole)
        assert list(data.tokens[row, :n]) == whole and (data.attention_mask[row, n:] == 0).all()
        replies = [t for m in messages if m["role"] == "assistant"
                   for t in tok(m["content"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]
        assert _unmasked(data, row) == replies
        assert (data.labels[row] == zdata.IGNORE_INDEX).sum() == data.tokens.shape[1] - len(replies)


def test_chat_records_train_only_the_assistant(tmp_path, tok):
    f = tmp_path / "chat.jsonl"
    f.write_text("".join(json.dumps({"messages": m, "source": "test"}) + "\n" for m in CHATS))
    data = zdata.tokenize(resolve_source(str(f)), TOK, 96)
    assert data.format == "chat" and not data.packing  # chat: padded by default (TRL's SFT default)
    _check_chat_rows(data, CHATS, tok)


@pytest.mark.parametrize("columns", [("instruction", "input", "output"), ("question", None, "answer"),
                                     ("prompt", None, "response"), ("prompt", None, "completion")])
def test_instruction_columns_are_one_user_and_one_assistant_turn(tmp_path, tok, columns):
    prompt, context, response = columns
    rows = [("Add the numbers.", "12 and 7", "12 plus 7 is 19."), ("Name a bird.", "", "The heron is a bird."),
            ("What colour is coal?", None, "Coal is black.")]
    records = [{prompt: p, response: r, **({context: c} if context else {}), "text": "ignored"} for p, c, r in rows]
    # Alpaca's input follows the instruction after a blank line when there is one
    chats = [[{"role": "user", "content": f"{p}\n\n{c}" if context and c else p}, {"role": "assistant", "content": r}]
             for p, c, r in rows]
    for path in _write_all_formats(tmp_path, records)[::3]:  # .jsonl (zerokit's reader) and .parquet (datasets')
        data = zdata.tokenize(resolve_source(str(path)), TOK, 48)
        assert data.format.startswith("instruction:"), data.format  # the instruction columns win over "text"
        _check_chat_rows(data, chats, tok)
        forced = zdata.tokenize(resolve_source(str(path)), TOK, 8, data_format="text")
        assert forced.format == "text" and forced.labels is None


def test_packing_chats_keeps_each_examples_prompt_mask(tmp_path, tok):
    """Packing on: the blocks are the conversations joined and cut, the labels the per-conversation labels joined
    and cut the same way (a block with nothing to train on is dropped)."""
    import numpy as np

    chats = CHATS * 5
    f = tmp_path / "chat.jsonl"
    f.write_text("".join(json.dumps({"messages": m}) + "\n" for m in chats))
    seq = 16
    packed = zdata.tokenize(resolve_source(str(f)), TOK, seq, packing=True)
    assert packed.packing and packed.attention_mask is None and packed.labels is not None
    ids = [zdata.encode_chat(tok, m, "test") for m in chats]
    flat_ids = np.asarray([t for e, _ in ids for t in e])
    flat_labels = np.asarray([t for _, lab in ids for t in lab])
    n = len(flat_ids) // seq
    blocks, labels = flat_ids[: n * seq].reshape(n, seq), flat_labels[: n * seq].reshape(n, seq)
    keep = (labels != zdata.IGNORE_INDEX).any(axis=1)
    assert (packed.tokens == blocks[keep]).all() and (packed.labels == labels[keep]).all()
    assert (packed.labels == zdata.IGNORE_INDEX).any() and packed.total_tokens == len(flat_ids)


def test_truncated_rows_without_a_trained_token_are_dropped(tmp_path):
    """Padding, seq 16: each row keeps its first 16 tokens; a conversation whose 16 are all prompt is dropped (HF's
    mean loss over zero tokens is NaN); none left is a one-line error."""
    f = tmp_path / "chat.jsonl"
    long_prompt = [{"role": "user", "content": "What is 12 plus 7? " * 4}, {"role": "assistant", "content": "19."}]
    f.write_text(json.dumps({"messages": long_prompt}) + "\n")
    with pytest.raises(ZerokitError, match="no example has a token to train on within --seq-len 16"):
        zdata.tokenize(resolve_source(str(f)), TOK, 16)
    short = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there, Ada."}]
    f.write_text(json.dumps({"messages": long_prompt}) + "\n" + json.dumps({"messages": short}) + "\n")
    data = zdata.tokenize(resolve_source(str(f)), TOK, 16)
    assert data.tokens.shape == (1, 16) and (data.labels != zdata.IGNORE_INDEX).any()


def test_conversations_the_masking_cannot_read_are_refused(tmp_path):
    f = tmp_path / "chat.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "assistant", "content": "Hello."}]}) + "\n")
    with pytest.raises(ZerokitError, match=r"chat.jsonl:1: the conversation starts with an assistant message"):
        zdata.tokenize(resolve_source(str(f)), TOK, 32)
    f.write_text(json.dumps({"messages": [{"role": "user", "content": 5}]}) + "\n")
    with pytest.raises(ZerokitError, match=r"chat.jsonl:1: a message .* is not a"):
        zdata.tokenize(resolve_source(str(f)), TOK, 32)
    # a template that rewrites earlier turns once a reply follows (here: the reply count in every header)
    d = tmp_path / "tok"
    shutil.copytree(TOK, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% for m in messages %}{{ m['role'] }} of {{ messages|length }}: {{ m['content'] }}"
                            "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    f.write_text(json.dumps({"messages": CHATS[0]}) + "\n")
    with pytest.raises(ZerokitError, match="renders earlier turns differently"):
        zdata.tokenize(resolve_source(str(f)), str(d), 32)
    # a directory whose files disagree on the format
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.txt").write_text("plain text " * 20)
    shutil.copy(f, tmp_path / "mixed" / "b.jsonl")
    with pytest.raises(ZerokitError, match=r"mixes formats \(text and chat"):
        zdata.tokenize(resolve_source(str(tmp_path / "mixed")), TOK, 8)


# ----------------------------------------------------------------------------------------------
# datasets' folders and the hub code path


def _repo_folder(root: Path) -> Path:
    """A folder laid out like a hub dataset repo: data/train.jsonl and data/test.jsonl (datasets' split patterns; one
    configuration, so both splits have the same columns)."""
    (root / "data").mkdir(parents=True)
    (root / "data" / "train.jsonl").write_text("".join(json.dumps({"messages": m}) + "\n" for m in CHATS))
    (root / "data" / "test.jsonl").write_text(json.dumps({"messages": CHATS[2]}) + "\n")
    return root


def test_hub_code_path_on_a_local_repo_folder(tmp_path, tok):
    """load_hub_split is what a hub id goes through: datasets.load_dataset(path, name=, split=), which takes a local
    folder laid out like a hub repo where it takes an id (LocalDatasetModuleFactory instead of
    HubDatasetModuleFactory; there is no network here). Its fingerprint keys the token cache."""
    repo = _repo_folder(tmp_path / "org-name")
    train = load_hub_split(str(repo), None, "train")
    assert train.columns == ["messages"] and len(train.rows) == 3 and train.fingerprint
    test = load_hub_split(str(repo), None, "test")
    assert len(test.rows) == 1 and test.fingerprint != train.fingerprint
    with pytest.raises(ZerokitError, match=r"cannot load dataset .*nope.*--data-split"):
        load_hub_split(str(repo), None, "nope")
    data = zdata.tokenize(DataSource("hub", (), str(repo), "train"), TOK, 96)
    _check_chat_rows(data, CHATS, tok)
    _check_chat_rows(zdata.tokenize(DataSource("hub", (), str(repo), "test"), TOK, 96), CHATS[2:], tok)


def test_saved_dataset_dict_picks_its_split(tmp_path, tok):
    import datasets

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list([{"messages": m} for m in CHATS]),
                               "test": datasets.Dataset.from_list([{"messages": CHATS[0]}])})
    dd.save_to_disk(str(tmp_path / "saved"))
    src = resolve_source(str(tmp_path / "saved"), split="test")
    assert src.kind == "saved" and src.files  # the directory's files are the content key
    _check_chat_rows(zdata.tokenize(src, TOK, 64), CHATS[:1], tok)
    with pytest.raises(ZerokitError, match=r"has no split 'validation' \(it has train, test\)"):
        zdata.tokenize(resolve_source(str(tmp_path / "saved"), split="validation"), TOK, 64)


def test_hub_id_offline_fails_in_one_line(tmp_path):
    """No network and not cached (HF_HUB_OFFLINE: datasets tries its cache only): one line, exit 2, nothing written."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), HF_DATASETS_CACHE=str(tmp_path / "hfd"),
               ZEROKIT_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "zerokit", "launch", "--model", "tiny-llama", "--gpu", "cpu",
                        "--gpus-per-node", "2", "--seq-len", "32", "--steps", "2", "--plan", "--data",
                        "some-org/not-cached-dataset", "--output-dir", str(tmp_path / "run")],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and r.stdout == "", r.stderr
    assert "some-org/not-cached-dataset" in lines[0] and "no cached copy" in lines[0]
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------------------------
# the cache, the run directory, the ranks' dataset


def test_cache_hits_without_tokenizing_and_misses_on_template_or_packing(tmp_path, monkeypatch):
    calls = []
    real = zdata.encode_chat
    monkeypatch.setattr(zdata, "encode_chat", lambda *a: calls.append(1) or real(*a))
    f = tmp_path / "chat.jsonl"
    f.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CHATS))
    src = resolve_source(str(f))
    first = zdata.tokenize(src, TOK, 64)
    assert len(calls) == 3
    again = zdata.tokenize(src, TOK, 64)
    assert len(calls) == 3  # a hit: nothing rendered or tokenized
    assert all((a == b).all() for a, b in zip(first.arrays().values(), again.arrays().values()))
    assert again.format == first.format and again.packing == first.packing
    zdata.tokenize(src, TOK, 64, packing=True)
    assert len(calls) == 6  # other packing: a miss
    d = tmp_path / "tok"
    shutil.copytree(TOK, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = cfg["chat_template"].replace("\n", ": ")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    other = zdata.tokenize(src, str(d), 64)
    assert len(calls) == 9 and not (other.tokens == first.tokens).all()  # another template: a miss


def test_plain_jsonl_text_imports_neither_datasets_nor_transformers(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    code = ("import json, sys\n"
            "from zerokit.launching.data import resolve_source, tokenize\n"
            f"d = tokenize(resolve_source({str(f)!r}), {TOK!r}, 16)\n"
            "print(json.dumps({'n': int(d.tokens.shape[0]),\n"
            "    'heavy': [m for m in ('datasets', 'transformers', 'torch') if m in sys.modules]}))\n")
    env = dict(os.environ, ZEROKIT_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["n"] > 0 and out["heavy"] == [], (out, r.stderr)


def test_run_directory_arrays_and_the_resume_check(tmp_path):
    f = tmp_path / "chat.jsonl"
    f.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CHATS))
    chat = zdata.tokenize(resolve_source(str(f)), TOK, 64)
    out = tmp_path / "run" / "data"
    zdata.write_data(chat, [f], TOK, out)
    assert sorted(p.name for p in out.iterdir()) == ["attention_mask.npy", "labels.npy", "tokens.json", "tokens.npy"]
    meta = json.loads((out / "tokens.json").read_text())
    assert meta["format"] == "chat" and meta["packing"] is False and set(meta["arrays"]) == {
        "input_ids", "labels", "attention_mask"}
    arrays = zdata.load_arrays(out / "tokens.npy")
    assert all((arrays[k] == v).all() for k, v in chat.arrays().items())
    assert zdata.written_data_matches(out, chat)
    # the same tokens with other labels: a resume would train on other targets
    import numpy as np

    relabelled = zdata.TokenizedData(chat.tokens, np.where(chat.labels < 0, chat.tokens, chat.labels),
                                     chat.attention_mask)
    assert not zdata.written_data_matches(out, relabelled)
    # plain text over it: the old labels and mask go, so no rank reads them
    text = zdata.tokenize(resolve_source(None), TOK, 64)
    zdata.write_data(text, [resources.bundled_corpus()], TOK, out)
    assert sorted(p.name for p in out.iterdir()) == ["tokens.json", "tokens.npy"]
    assert not zdata.written_data_matches(out, chat) and zdata.written_data_matches(out, text)


def test_rank_dataset_feeds_labels_and_attention_mask(tmp_path):
    """launching/train.py's make_dataset: the rows are the model's keyword arguments."""
    pytest.importorskip("torch")
    from zerokit.launching.rank_options import RankOptions
    from zerokit.launching.train import make_dataset

    f = tmp_path / "chat.jsonl"
    f.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CHATS))
    chat = zdata.tokenize(resolve_source(str(f)), TOK, 64)
    zdata.write_data(chat, [f], TOK, tmp_path / "data")
    ds = make_dataset(RankOptions(model="tiny-llama", ds_config="", output_dir="", tokens=str(tmp_path / "data" /
                                                                                              "tokens.npy")))
    row = ds[1]
    assert set(row) == {"input_ids", "labels", "attention_mask"} and len(ds) == len(CHATS)
    assert row["labels"].tolist() == chat.labels[1].tolist() and row["attention_mask"].tolist() == chat.attention_mask[
        1].tolist()
    plain = make_dataset(RankOptions(model="tiny-llama", ds_config="", output_dir="", data="", seq_len=64))
    assert set(plain[0]) == {"input_ids", "labels"} and (plain[0]["labels"] == plain[0]["input_ids"]).all()


# ----------------------------------------------------------------------------------------------
# one real run


@pytest.mark.slow
def test_chat_launch_trains_on_the_bundled_instructions(tmp_path):
    """2 CPU ranks, tiny-llama from random init, the bundled instruction set as chat: the loss falls, the run
    directory holds labels with -100s, and tokens/s counts real tokens only (fewer than micro batch x seq)."""
    pytest.importorskip("deepspeed")
    out = tmp_path / "run"
    env = dict(os.environ, ZEROKIT_CACHE_DIR=str(tmp_path / "cache"), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH", "")) if x))
    p = subprocess.run([sys.executable, "-m", "zerokit", "launch", "--model", "tiny-llama", "--gpu", "cpu",
                        "--gpus-per-node", "2", "--seq-len", "64", "--plan", "--stage", "2", "--precision", "fp32",
                        "--micro-batch", "4", "--grad-accum", "1", "--steps", "12", "--lr", "3e-3",
                        "--data", str(resources.bundled_instructions()), "--data-format", "chat",
                        "--output-dir", str(out)], capture_output=True, text=True, env=env, cwd=str(REPO), timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    import numpy as np

    labels = np.load(out / "data" / "labels.npy")
    assert (labels == zdata.IGNORE_INDEX).any() and (labels != zdata.IGNORE_INDEX).any()
    assert (out / "data" / "attention_mask.npy").is_file()
    recs = [json.loads(x) for x in (out / "metrics" / "rank0.jsonl").read_text().splitlines()]
    steps = [r for r in recs if r.get("event") == "step"]
    losses = [r["loss"] for r in steps]
    assert len(losses) == 12 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5, losses
    assert all(0 < r["tokens"] < 4 * 64 for r in steps), [r["tokens"] for r in steps]  # padding is not counted


def test_the_bundled_instruction_set_is_what_its_generator_writes(tmp_path):
    # examples/build_instructions.py is seeded: the shipped file is its output, bit for bit
    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "ti.jsonl"
    subprocess.run([sys.executable, str(repo / "examples" / "build_instructions.py"), str(out)], check=True)
    assert out.read_bytes() == (repo / "zerokit" / "data" / "corpus" / "tiny_instructions.jsonl").read_bytes()
