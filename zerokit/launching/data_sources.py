"""Where `zerokit launch --data` finds its records, and which format they are in.

A source is one of:
* local files: .txt (a file is one document), .jsonl (one JSON object per line, read here with the standard library:
  the fast path of the bundled corpus and of plain "text" files, importing nothing heavy), .json/.csv/.parquet (read by
  the `datasets` library's own packaged builders, `load_dataset("json"|"csv"|"parquet", data_files=...)`), or a
  directory of them (searched recursively, sorted by path);
* a directory written by datasets' `save_to_disk` (a Dataset, or a DatasetDict of which --data-split picks one);
* a HuggingFace hub dataset id `org/name`: `load_dataset(id, name=--data-config, split=--data-split)`.
With no DATA the bundled tiny corpus is used, so the main command runs without a download.

The format follows from the columns (--data-format forces one), the most structured first:
  "messages" (a list of {role, content})                            -> chat
  prompt/response, prompt/completion, instruction/(input)/output, question/answer -> instruction (one user turn,
                                                                        one assistant turn)
  "text"                                                            -> text (plain language modelling)
Alpaca-style records also carry a "text" column (the rendered prompt): the instruction columns win.

Only the standard library at module level; `datasets` and huggingface_hub inside the functions that need them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerokit.core.errors import ZerokitError
from zerokit.core.options import flag
from zerokit.core.resources import bundled_corpus

# the files a directory may hold, and how each is read (None: by zerokit itself, no `datasets` import)
READERS = {".txt": None, ".jsonl": None, ".json": "json", ".csv": "csv", ".parquet": "parquet"}
DATA_SUFFIXES = tuple(READERS)
# (prompt column, optional context column, response column), the first pair a dataset has wins. prompt/completion is
# TRL's prompt-completion format; instruction/input/output is Stanford Alpaca's (its "input" is optional context).
INSTRUCTION_COLUMNS = (("prompt", None, "response"), ("prompt", None, "completion"),
                       ("instruction", "input", "output"), ("question", None, "answer"))
_EXPECTED = ('"messages" (chat), ' + ", ".join(f"{p}/{r}" for p, _, r in INSTRUCTION_COLUMNS)
             + ' (instruction) or "text"')
# what datasets' save_to_disk leaves in the folder (Dataset.save_to_disk / DatasetDict.save_to_disk)
SAVED_MARKERS = ("dataset_dict.json", "state.json")


@dataclass(frozen=True)
class DataSource:
    """What --data names, resolved (nothing read yet)."""

    kind: str  # "files" | "saved" (a save_to_disk directory) | "hub"
    files: tuple[Path, ...] = ()  # files: the data files; saved: every file of the directory (the content key)
    location: str = ""  # saved: the directory; hub: the dataset id
    split: str = "train"
    config: str | None = None

    @property
    def label(self) -> str:
        if self.kind == "files":
            return str(self.files[0]) if len(self.files) == 1 else f"{len(self.files)} files"
        return self.location


@dataclass
class Table:
    """One readable part of a source: a name for messages, its columns, its rows (dicts)."""

    name: str
    columns: list[str]
    rows: Any  # a list of dicts, or a datasets.Dataset (iterates as dicts)
    lines: list[int] | None = None  # .jsonl: each row's line number, for messages
    fingerprint: str | None = None  # hub: datasets' fingerprint of the split (its revision is in it)

    def place(self, i: int) -> str:
        return f"{self.name}:{self.lines[i]}" if self.lines else f"{self.name} row {i + 1}"


@dataclass(frozen=True)
class DataFormat:
    """How a row becomes a training example: text (a document), chat (messages), instruction (columns -> a chat)."""

    kind: str  # text | chat | instruction
    prompt: str | None = None  # instruction: the columns
    context: str | None = None
    response: str | None = None

    @property
    def key(self) -> str:
        """What the tokens depend on (the cache key, tokens.json)."""
        if self.kind != "instruction":
            return self.kind
        return f"instruction:{self.prompt}+{self.context or ''}->{self.response}"

    def example(self, row: dict, table: Table, i: int):
        """A document (text) or a list of messages (chat, instruction); None for an empty row (skipped)."""
        if self.kind == "text":
            if "text" not in row or not isinstance(row["text"], (str, type(None))):
                raise ZerokitError(f'{table.place(i)}: expected an object with a "text" string field')
            text = row["text"]
            return text if text and text.strip() else None
        if self.kind == "chat":
            return _messages(row.get("messages"), table, i)
        parts = []
        for col in (self.prompt, self.context, self.response):
            value = row.get(col) if col else None
            if not isinstance(value, (str, type(None))):
                raise ZerokitError(f'{table.place(i)}: "{col}" is {type(value).__name__}, not a string')
            parts.append(value or "")
        prompt, context, response = parts
        if not (prompt.strip() or response.strip()):
            return None
        # Alpaca's optional input is context for the instruction: it follows it after a blank line, as in
        # stanford_alpaca's PROMPT_DICT, without its "### Input:" headers (the chat template frames the turns)
        user = f"{prompt}\n\n{context}" if context.strip() else prompt
        return [{"role": "user", "content": user}, {"role": "assistant", "content": response}]


def _messages(value, table: Table, i: int):
    """The messages of a chat row, checked: a list of {role: str, content: str} objects."""
    if value is None:
        return None
    fix = 'a list of {"role": ..., "content": ...} objects'
    if not isinstance(value, list):
        raise ZerokitError(f'{table.place(i)}: "messages" is {type(value).__name__}, not {fix}')
    if not value:
        return None
    for m in value:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise ZerokitError(f'{table.place(i)}: a message {str(m)[:60]!r} is not a {{"role": str, "content": str}} '
                               f"object: \"messages\" must be {fix}")
    return value


def detect_format(columns: list[str], forced: str | None, where: str) -> DataFormat:
    """The format the columns allow (rules in the module docstring); --data-format picks one of the possible ones."""
    have = set(columns)
    chat = DataFormat("chat") if "messages" in have else None
    pair = next((DataFormat("instruction", p, c if c in have else None, r) for p, c, r in INSTRUCTION_COLUMNS
                 if p in have and r in have), None)
    text = DataFormat("text") if "text" in have else None
    found = {"chat": chat, "instruction": pair, "text": text}
    fmt = found[forced] if forced else (chat or pair or text)
    if fmt is None:
        cols = ", ".join(columns) or "none"
        want = _EXPECTED if not forced else {"chat": '"messages"', "text": '"text"'}.get(
            forced, " or ".join(f"{p}/{r}" for p, _, r in INSTRUCTION_COLUMNS))
        forced_as = f" for {flag('data-format')} {forced}" if forced else ""
        raise ZerokitError(f"data {where} has columns {cols}, none of which is {want}{forced_as}: rename the columns "
                           f"(e.g. with datasets' rename_column) or pick another {flag('data')}")
    return fmt


# ----------------------------------------------------------------------------------------------
# sources


def _looks_like_hub_id(data: str) -> bool:
    from zerokit.spec.resolve import HUB_ID

    return (data.count("/") == 1 and not data.startswith((".", "/", "~"))
            and Path(data).suffix.lower() not in DATA_SUFFIXES and bool(HUB_ID.match(data)))


def resolve_source(data: str | os.PathLike | None, split: str | None = None, config: str | None = None) -> DataSource:
    """What DATA names (rules in the module docstring). Raises ZerokitError with a one-line reason; reads nothing."""
    if data is None or str(data) == "":
        return DataSource("files", (bundled_corpus(),))
    p = Path(data).expanduser()
    if p.is_dir() and any((p / m).is_file() for m in SAVED_MARKERS):
        if config:
            raise ZerokitError(f"{flag('data-config')} names a configuration of a hub dataset; {data} is a saved "
                               "dataset: drop it")
        files = tuple(sorted(f for f in p.rglob("*") if f.is_file()))
        return DataSource("saved", files, str(p), split or "train")
    if not p.exists() and _looks_like_hub_id(str(data)):
        return DataSource("hub", (), str(data), split or "train", config)
    if split or config:
        raise ZerokitError(f"{flag('data-split')}/{flag('data-config')} pick part of a hub or saved dataset; {data} is "
                           "local files (one split): drop them")
    names = "/".join(DATA_SUFFIXES)
    if not p.exists():
        raise ZerokitError(f"data {str(data)!r} does not exist: give a {names} file, a directory of them, "
                           "or a hub dataset id org/name")
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in READERS)
        if not files:
            raise ZerokitError(f"data directory {str(data)!r} holds no {names} files")
        return DataSource("files", tuple(files))
    if p.suffix.lower() not in READERS:
        raise ZerokitError(f"data file {str(data)!r} is not {names}: convert it, or give a directory of such files")
    return DataSource("files", (p,))


def open_tables(source: DataSource) -> list[Table]:
    """The source's tables, read: one per local file, one for a saved or hub dataset. Raises ZerokitError."""
    if source.kind == "hub":
        return [load_hub_split(source.location, source.config, source.split)]
    if source.kind == "saved":
        return [_load_saved(source.location, source.split)]
    tables = []
    for f in source.files:
        reader = READERS[f.suffix.lower()]
        if reader is None:
            tables.append(_read_txt(f) if f.suffix.lower() == ".txt" else _read_jsonl(f))
        else:
            tables.append(_load_file(reader, f))
    return tables


def _read_txt(f: Path) -> Table:
    try:
        text = f.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ZerokitError(f"data file {f} is not UTF-8 text") from None
    return Table(str(f), ["text"], [{"text": text}])


def _read_jsonl(f: Path) -> Table:
    rows, lines, columns = [], [], {}
    with open(f, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ZerokitError(f"{f}:{lineno}: not valid JSON ({e.msg}): one JSON object per line") from None
            if not isinstance(rec, dict):
                raise ZerokitError(f"{f}:{lineno}: expected a JSON object, got {type(rec).__name__}")
            columns.update(dict.fromkeys(rec))
            rows.append(rec)
            lines.append(lineno)
    return Table(str(f), list(columns), rows, lines)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _load_file(reader: str, f: Path) -> Table:
    """A .json/.csv/.parquet file through datasets' packaged builder. Its Arrow conversion is cached under zerokit's
    cache (tokens are cached there anyway), not in HF's shared datasets cache: it is an intermediate of zerokit's."""
    from zerokit.core.fsutil import cache_dir
    from zerokit.core.quiet import library_output

    try:
        with library_output():
            import datasets

            ds = datasets.load_dataset(reader, data_files=[str(f)], split="train", cache_dir=str(cache_dir("datasets")))
    except ImportError:
        raise ZerokitError(f"reading {f} needs the datasets library: pip install 'zerokit[train]'") from None
    except Exception as e:  # Arrow, pandas and datasets raise many kinds; report one line
        cause = e.__cause__ or e
        if "corresponds to no data" in str(e):  # datasets' words for a split without rows (an empty file)
            raise ZerokitError(f"data file {f} holds no records: add some, or pick another {flag('data')}") from None
        raise ZerokitError(f"cannot read {f} as {reader.upper()} ({_first_line(cause)}): fix the file") from None
    return Table(str(f), list(ds.column_names), ds)


def _load_saved(location: str, split: str) -> Table:
    from zerokit.core.quiet import library_output

    try:
        with library_output():
            import datasets

            ds = datasets.load_from_disk(location)
    except ImportError:
        raise ZerokitError(f"reading {location} needs the datasets library: pip install 'zerokit[train]'") from None
    except Exception as e:
        raise ZerokitError(f"cannot read the saved dataset {location} ({_first_line(e)}): save it again") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ZerokitError(f"saved dataset {location} has no split {split!r} (it has {', '.join(ds)}): "
                               f"pick one with {flag('data-split')}")
        ds = ds[split]
    return Table(location, list(ds.column_names), ds)


def check_hub_reachable(dataset_id: str) -> None:
    """One request of at most HUB_PROBE_SECONDS, as for a hub model (spec/resolve.py): without a network the launch
    fails here in a moment rather than after the hub client's retries. Skipped under HF_HUB_OFFLINE, where datasets
    itself answers from its cache or fails at once."""
    from zerokit.core.quiet import library_output
    from zerokit.spec.resolve import HUB_PROBE_SECONDS, _hub_offline

    if _hub_offline():
        return
    with library_output():
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
        from huggingface_hub.errors import HfHubHTTPError

        try:
            get_hf_file_metadata(hf_hub_url(dataset_id, "README.md", repo_type="dataset"), timeout=HUB_PROBE_SECONDS,
                                 retry_on_errors=False)
        except HfHubHTTPError:
            return  # the hub answered (no card, not found, gated): load_dataset says which
        except Exception as exc:  # no network: DNS, refused connection, timeout
            raise ZerokitError(
                f"cannot reach the HuggingFace hub to fetch dataset {dataset_id} within {HUB_PROBE_SECONDS:g} s "
                f"({_first_line(exc)}): connect to the internet, set HF_HUB_OFFLINE=1 to use a copy datasets cached "
                "before, or pass local files") from None


def load_hub_split(path: str, config: str | None, split: str) -> Table:
    """load_dataset(path, name=config, split=split): a hub id (HubDatasetModuleFactory), or a local folder laid out
    like a hub repo, which datasets reads through the same call (LocalDatasetModuleFactory); HF's own datasets cache."""
    from zerokit.core.quiet import library_output

    if not Path(path).is_dir():
        check_hub_reachable(path)
    try:
        with library_output():
            import datasets

            ds = datasets.load_dataset(path, name=config, split=split)
    except ImportError:
        raise ZerokitError(f"loading dataset {path} needs the datasets library: pip install 'zerokit[train]'") from None
    except ConnectionError:
        raise ZerokitError(f"cannot reach the HuggingFace hub for dataset {path} and datasets has no cached copy: "
                           "connect to the internet, or pass local files") from None
    except Exception as e:  # not found, gated, unknown split or config: datasets' message says which
        raise ZerokitError(f"cannot load dataset {path} ({_first_line(e.__cause__ or e)}): check the id, "
                           f"{flag('data-config')} and {flag('data-split')} (`hf auth login` for a gated or private "
                           "one)") from None
    return Table(path, list(ds.column_names), ds, fingerprint=getattr(ds, "_fingerprint", None))

