"""Training data for `zerokit launch`: tokenize the examples (launching/data_sources.py finds them and their format),
mask what is not trained on, pack or pad to seq_len, and cache the result by content.

Formats:
* text: each document is tokenized and followed by the tokenizer's EOS token; labels are the input ids.
* chat and instruction: each conversation is rendered with the tokenizer's chat template (transformers'
  apply_chat_template) and tokenized once; everything but the assistant turns gets label -100 (the prompt, system
  and user turns, the template's headers), so the loss is the assistant's replies and their end-of-turn token.
Packing (default on for text, off for chat and instruction, as TRL's SFTConfig(packing=False)): on, the examples
are joined and cut into blocks of exactly seq_len (the tail is dropped; an example may run on into the next
block and attend to the one before it, the usual cost of packing without per-example attention masks). Off, every
example is one row, truncated to seq_len and right-padded: padding gets label -100 and attention mask 0. Rows
whose labels are all -100 are dropped: HF's mean cross-entropy over zero tokens is NaN.

The CLI tokenizes once and writes `<output_dir>/data/tokens.npy` (int32 [n, seq_len]), `labels.npy` (int32, -100
where not trained on) when any position is masked, `attention_mask.npy` (int8) when rows are padded, and
`tokens.json`; every rank memory-maps them (load_arrays). Plain text keeps tokens.npy alone, as before.

Only the standard library at module level; numpy, tokenizers and transformers inside the functions. A text source
tokenized with a plain tokenizer.json (PlainFastTokenizer), or any cache hit, imports neither datasets nor
transformers: the bundled-corpus launch stays cold-fast.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerokit.core.errors import ZerokitError
from zerokit.core.options import flag
from zerokit.launching.data_sources import (
    DataFormat,
    DataSource,
    detect_format,
    open_tables,
    resolve_source,
)

IGNORE_INDEX = -100  # what HF's loss skips: ForCausalLMLoss -> cross_entropy(ignore_index=-100)
# the arrays a rank feeds its model (engine(**batch)), and their files beside tokens.npy
ARRAY_FILES = {"input_ids": "tokens.npy", "labels": "labels.npy", "attention_mask": "attention_mask.npy"}


def resolve_data_files(data: str | os.PathLike | None) -> list[Path]:
    """The local files DATA names (a hub or saved dataset has none to list). Raises ZerokitError."""
    return list(resolve_source(data).files)


def read_documents(files: list[Path]):
    """Yield the "text" of every record of these .txt/.jsonl files (each .txt file is one document)."""
    fmt = DataFormat("text")
    for table in open_tables(DataSource("files", tuple(files))):
        for i, row in enumerate(table.rows):
            doc = fmt.example(row, table, i)
            if doc is not None:
                yield doc


def load_tokenizer(name_or_path: str):
    from zerokit.core.quiet import library_output

    try:
        with library_output():
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(name_or_path)
    except Exception as e:  # transformers raises many kinds; report one line
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ZerokitError(f"cannot load tokenizer {name_or_path!r}: {msg}") from None
    return tok


# The special-token names a tokenizer_config.json / special_tokens_map.json may set (transformers'
# SpecialTokensMixin), and the lists of extra ones.
_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_SPECIAL_TOKEN_LISTS = ("additional_special_tokens", "extra_special_tokens")
_ADDED_TOKEN_PROPERTIES = ("lstrip", "rstrip", "normalized", "single_word", "special")


def _token_text(token) -> str | None:
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


class PlainFastTokenizer:
    """A tokenizer.json read by the `tokenizers` library itself, for the tokenizers transformers would use unchanged.

    Why: loading it through AutoTokenizer imports transformers and torch (2.7-2.9 s on 2 cores, measured), the
    library alone takes 0.04 s. The ids are the same by construction, not by luck: transformers'
    TokenizersBackend.__init__ (tokenization_utils_tokenizers.py) builds the same Tokenizer.from_file and only then
    changes it where `from_tokenizer_dir` below says no (truncation or padding in the file, special tokens it must add,
    split_special_tokens, fix_mistral_regex, the only setting under which _patch_mistral_regex changes the
    pre-tokenizer rather than warning, a model-specific tokenizer class); and
    `tok(lines, add_special_tokens=False)` is `encode_batch(lines, add_special_tokens=False)` there.
    tests/test_launch_cli.py holds the two equal on the bundled corpus and shows the fallbacks.
    """

    def __init__(self, tokenizer, eos_token_id: int | None, sep_token_id: int | None, pad_token_id: int | None = None):
        self._tokenizer = tokenizer
        self.eos_token_id, self.sep_token_id, self.pad_token_id = eos_token_id, sep_token_id, pad_token_id

    def __call__(self, lines: list[str], add_special_tokens: bool = False) -> dict:
        return {"input_ids": [e.ids for e in self._tokenizer.encode_batch(lines, add_special_tokens=add_special_tokens)]}

    @classmethod
    def from_tokenizer_dir(cls, path: str | os.PathLike) -> "PlainFastTokenizer | None":
        """The tokenizer in directory `path`, or None where transformers would build something else from it."""
        folder = Path(path)
        try:
            config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
            special = folder / "special_tokens_map.json"
            special_map = json.loads(special.read_text(encoding="utf-8")) if special.is_file() else {}
            text = (folder / "tokenizer.json").read_text(encoding="utf-8")
            data = json.loads(text)
        except (OSError, ValueError):
            return None
        if not (isinstance(config, dict) and isinstance(special_map, dict) and isinstance(data, dict)):
            return None
        if (config.get("tokenizer_class") not in ("PreTrainedTokenizerFast", "TokenizersBackend") or "auto_map" in config
                or config.get("split_special_tokens") or "add_prefix_space" in config
                or config.get("fix_mistral_regex") or data.get("truncation") or data.get("padding")):
            return None
        named = {k: _token_text(config.get(k) or special_map.get(k)) for k in _SPECIAL_TOKEN_KEYS
                 if config.get(k) or special_map.get(k)}
        if any(config.get(k) and special_map.get(k) and _token_text(config[k]) != _token_text(special_map[k])
               for k in _SPECIAL_TOKEN_KEYS):
            return None  # the two files disagree: which one wins is transformers' business
        wanted = set(named.values())
        for d in (special_map, config):
            for key in _SPECIAL_TOKEN_LISTS:
                wanted.update(_token_text(t) for t in (d.get(key) or []))
        wanted.update(_token_text(t) for t in (config.get("added_tokens_decoder") or {}).values())
        added = {t.get("content"): t for t in data.get("added_tokens") or [] if isinstance(t, dict)}
        if None in wanted or not wanted <= set(added):
            return None  # transformers would add tokens the file lacks (or a value is not a token string)
        for token in (config.get("added_tokens_decoder") or {}).values():
            same = added.get(_token_text(token))
            if isinstance(token, dict) and any(token.get(k) != same.get(k) for k in _ADDED_TOKEN_PROPERTIES if k in token):
                return None  # transformers re-adds a token whose properties differ from the file's
        try:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_str(text)
        except Exception:  # no tokenizers library, or a file it cannot read: transformers decides
            return None
        ids = {k: tokenizer.token_to_id(v) for k, v in named.items()}
        return cls(tokenizer, ids.get("eos_token"), ids.get("sep_token"), ids.get("pad_token"))


def load_encoder(name_or_path: str):
    """What text tokenization needs from the tokenizer: the `tokenizers` library alone where it gives transformers'
    ids (PlainFastTokenizer), else the transformers tokenizer."""
    if Path(name_or_path).is_dir():
        plain = PlainFastTokenizer.from_tokenizer_dir(name_or_path)
        if plain is not None:
            return plain
    return load_tokenizer(name_or_path)


def load_chat_tokenizer(name_or_path: str):
    """The transformers tokenizer, which must have a chat template (chat and instruction data are rendered with it)."""
    tok = load_tokenizer(name_or_path)
    if not getattr(tok, "chat_template", None):
        raise ZerokitError(f"tokenizer {name_or_path} has no chat template, which chat and instruction data are "
                           f"rendered with: pass {flag('tokenizer')} DIR_OR_HUB_ID of one that has a chat_template "
                           "(e.g. the model's instruct version), or give data with a \"text\" column")
    return tok


def _eos_id(tok) -> int | None:
    if tok.eos_token_id is not None:
        return int(tok.eos_token_id)
    if getattr(tok, "sep_token_id", None) is not None:
        return int(tok.sep_token_id)
    return None


def _pad_id(tok) -> int:
    """Padding's id: never trained on (label -100) nor attended to (mask 0), so any id in the vocabulary does."""
    pad = getattr(tok, "pad_token_id", None)
    return int(pad) if pad is not None else (_eos_id(tok) or 0)


# ----------------------------------------------------------------------------------------------
# encoding one example


def encode_text(tok, doc: str) -> list[int]:
    """A document's ids, tokenized in line chunks so the fast tokenizer never sees one huge string."""
    ids: list[int] = []
    for piece in tok(doc.splitlines(keepends=True), add_special_tokens=False)["input_ids"]:
        ids.extend(piece)
    return ids


def encode_chat(tok, messages: list[dict], where: str) -> tuple[list[int], list[int]]:
    """(ids, labels) of one conversation: rendered once with the chat template and tokenized once; the assistant
    turns keep their ids as labels, every other token gets IGNORE_INDEX.

    An assistant turn is the text the conversation gains from `render(turns before it, add_generation_prompt=True)`
    to `render(turns up to it)`: its content and end-of-turn token(s), not the header the generation prompt already
    holds. The same prefix rule TRL's SFT tokenize_fn uses for prompt-completion data; it needs no `{% generation %}`
    markers in the template (most templates have none). Tokens are assigned by where they start in the string
    (offset_mapping), as transformers' own assistant mask does with char_to_token."""

    def render(turns, generation_prompt=False) -> str:
        try:
            return tok.apply_chat_template(turns, tokenize=False, add_generation_prompt=generation_prompt)
        except Exception as e:  # jinja errors, raise_exception() in the template
            msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ZerokitError(f"{where}: the chat template cannot render this conversation ({msg}): fix the record, "
                               f"or use a tokenizer whose template accepts it ({flag('tokenizer')})") from None

    full = render(messages)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        if i == 0:
            raise ZerokitError(f"{where}: the conversation starts with an assistant message, which has no prompt: "
                               "start it with a user (or system) message")
        before, upto = render(messages[:i], True), render(messages[: i + 1])
        if not (upto.startswith(before) and full.startswith(upto)):
            raise ZerokitError(f"{where}: the chat template renders earlier turns differently once a reply follows, so "
                               "the assistant's tokens cannot be found: use a tokenizer whose template only appends "
                               f"({flag('tokenizer')})")
        spans.append((len(before), len(upto)))
    try:
        enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)  # the template holds the specials
    except NotImplementedError:
        raise ZerokitError("the tokenizer gives no character offsets (a slow, Python tokenizer): use its fast version "
                           f"(a tokenizer.json) with {flag('tokenizer')}") from None
    ids = list(enc["input_ids"])
    labels = [t if any(a <= start < b for a, b in spans) else IGNORE_INDEX
              for t, (start, _) in zip(ids, enc["offset_mapping"])]
    return ids, labels


# ----------------------------------------------------------------------------------------------
# packing and padding


@dataclass(frozen=True, eq=False)
class TokenizedData:
    """The arrays a run trains on, all [rows, seq_len]."""

    tokens: Any  # int32 input ids
    labels: Any = None  # int32, IGNORE_INDEX where not trained on; None: the input ids themselves
    attention_mask: Any = None  # int8, 0 at padding; None: no padding
    total_tokens: int = 0  # real tokens tokenized (before truncation, padding and dropping the tail)
    format: str = "text"  # DataFormat.key
    packing: bool = True
    source: str = ""  # what --data named, for tokens.json

    @property
    def seq_len(self) -> int:
        return int(self.tokens.shape[1])

    def arrays(self) -> dict:
        """The arrays present, by the model's argument names (ARRAY_FILES)."""
        out = {"input_ids": self.tokens, "labels": self.labels, "attention_mask": self.attention_mask}
        return {k: v for k, v in out.items() if v is not None}


def pack(examples: list[tuple[list[int], list[int] | None]], seq_len: int, where: str, **meta) -> TokenizedData:
    """Join the examples and cut blocks of exactly seq_len; labels only where some example masks a position."""
    import numpy as np

    ids = np.fromiter((t for e, _ in examples for t in e), dtype=np.int32)
    total = int(ids.size)
    n = total // seq_len
    if n < 1:
        raise ZerokitError(f"data {where} has {total} tokens, fewer than one sequence of {seq_len}: add text or lower "
                           f"{flag('seq-len')}")
    tokens = ids[: n * seq_len].reshape(n, seq_len)
    if all(lab is None for _, lab in examples):
        return TokenizedData(tokens, total_tokens=total, packing=True, **meta)
    labels = np.fromiter((t for e, lab in examples for t in (e if lab is None else lab)), dtype=np.int32)
    labels = labels[: n * seq_len].reshape(n, seq_len)
    keep = (labels != IGNORE_INDEX).any(axis=1)
    if not keep.any():
        raise ZerokitError(f"data {where} has no assistant tokens within any block of {seq_len}: check the records' "
                           "assistant turns")
    return TokenizedData(tokens[keep], labels[keep], total_tokens=total, packing=True, **meta)


def pad(examples: list[tuple[list[int], list[int] | None]], seq_len: int, pad_id: int, where: str,
        **meta) -> TokenizedData:
    """One row per example: truncated to seq_len, right-padded with label IGNORE_INDEX and attention mask 0."""
    import numpy as np

    rows = [(e[:seq_len], (e if lab is None else lab)[:seq_len]) for e, lab in examples]
    rows = [(e, lab) for e, lab in rows if any(t != IGNORE_INDEX for t in lab)]
    total = sum(len(e) for e, _ in examples)
    if not rows:
        raise ZerokitError(f"data {where}: no example has a token to train on within {flag('seq-len')} {seq_len} (the "
                           f"prompts fill it): raise {flag('seq-len')}")
    tokens = np.full((len(rows), seq_len), pad_id, dtype=np.int32)
    labels = np.full((len(rows), seq_len), IGNORE_INDEX, dtype=np.int32)
    mask = np.zeros((len(rows), seq_len), dtype=np.int8)
    for r, (e, lab) in enumerate(rows):
        tokens[r, : len(e)], labels[r, : len(lab)], mask[r, : len(e)] = e, lab, 1
    return TokenizedData(tokens, None if (labels == tokens).all() else labels, None if mask.all() else mask,
                         total_tokens=total, packing=False, **meta)


def encode_source(source: DataSource, tokenizer: str, seq_len: int, data_format: str | None = None,
                  packing: bool | None = None, tables=None) -> TokenizedData:
    """Read, format-detect, tokenize, mask and pack (or pad): no cache. Raises ZerokitError."""
    tables = tables if tables is not None else open_tables(source)
    fmt, items = None, []
    for table in tables:
        this = detect_format(table.columns, data_format, table.name)
        if fmt is not None and this != fmt:
            raise ZerokitError(f"data {source.label} mixes formats ({fmt.key} and {this.key} in {table.name}): give "
                               f"files of one format, or force one with {flag('data-format')}")
        fmt = this
        items += [(table.place(i), ex) for i, row in enumerate(table.rows)
                  if (ex := fmt.example(row, table, i)) is not None]
    if not items:
        raise ZerokitError(f"data {source.label} holds no records with content: add some, or pick another "
                           f"{flag('data')}")
    if fmt.kind == "text":
        tok = load_encoder(tokenizer)
        end = [] if _eos_id(tok) is None else [_eos_id(tok)]
        examples = [(encode_text(tok, doc) + end, None) for _, doc in items]
    else:
        tok = load_chat_tokenizer(tokenizer)
        examples = [encode_chat(tok, messages, where) for where, messages in items]
    packing = fmt.kind == "text" if packing is None else packing
    meta = dict(format=fmt.key, source=source.label)
    if packing:
        return pack(examples, seq_len, source.label, **meta)
    return pad(examples, seq_len, _pad_id(tok), source.label, **meta)


def tokenize_and_pack(files: list[Path], tok, seq_len: int):
    """Plain text, packed: an int32 numpy array [n_blocks, seq_len] and the total token count (before dropping the
    tail). `tok` is a loaded tokenizer (PlainFastTokenizer or transformers')."""
    if seq_len < 2:
        raise ZerokitError(f"sequence length must be at least 2 for causal LM training, got {seq_len}")
    end = [] if _eos_id(tok) is None else [_eos_id(tok)]
    where = str(files[0]) if len(files) == 1 else f"{len(files)} files"
    data = pack([(encode_text(tok, doc) + end, None) for doc in read_documents(files)], seq_len, where)
    return data.tokens, data.total_tokens


# ----------------------------------------------------------------------------------------------
# the content-hash cache and the run directory's files


@dataclass(frozen=True)
class PreparedData:
    tokens_path: Path
    num_sequences: int
    seq_len: int
    total_tokens: int
    tokenizer: str
    max_token_id: int


def fingerprint(files: list[Path], tokenizer: str, seq_len: int) -> str:
    h = hashlib.sha256()
    h.update(f"{tokenizer}|{seq_len}".encode())
    for f in files:
        st = f.stat()
        h.update(f"|{f.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


# tokenizer files whose content decides the ids and the rendered chats (AutoTokenizer reads these; weights never
# matter): the chat template lives in tokenizer_config.json, or in chat_template.jinja / .json (transformers 4.43+)
TOKENIZER_CONTENT_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt",
                           "special_tokens_map.json", "added_tokens.json", "vocab.txt", "chat_template.jinja",
                           "chat_template.json")
# Bump when what is produced changes: old cache entries stop matching.
_TOKENS_SCHEMA = 3  # 2: the tokenizers version in the key; 3: formats, packing, labels and attention masks


def content_key(files: list[Path], tokenizer: str, seq_len: int, options: str = "") -> str | None:
    """A hash of everything the arrays depend on: the data files' bytes, the tokenizer's files' bytes (its chat
    template included), the sequence length, `options` (the format and packing asked for; a hub dataset's id, split
    and datasets' fingerprint) and the transformers, tokenizers and datasets versions. None for a hub tokenizer (its
    files can change upstream)."""
    from zerokit.core.fsutil import package_version

    tok_dir = Path(tokenizer)
    if not tok_dir.is_dir():
        return None
    versions = "|".join(package_version(p) for p in ("transformers", "tokenizers", "datasets"))
    h = hashlib.sha256(f"zerokit-tokens/{_TOKENS_SCHEMA}|{versions}|{seq_len}|{options}".encode())
    for name in TOKENIZER_CONTENT_FILES:
        f = tok_dir / name
        if f.is_file():
            h.update(f"|tok:{name}|".encode())
            h.update(f.read_bytes())
    for f in files:
        h.update(b"|data|")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _cache_files(folder: Path, key: str) -> dict:
    """The cache entry's array files (tokens keep the name they had before labels existed)."""
    return {"input_ids": folder / f"{key}.npy", "labels": folder / f"{key}.labels.npy",
            "attention_mask": folder / f"{key}.attention_mask.npy"}


def _cache_get(key: str | None) -> TokenizedData | None:
    import numpy as np

    from zerokit.core.fsutil import cache_dir

    if key is None:
        return None
    folder = cache_dir("tokens")
    try:
        meta = json.loads((folder / f"{key}.json").read_text())
        arrays = {name: np.load(path) for name, path in _cache_files(folder, key).items() if name in meta["arrays"]}
        return TokenizedData(arrays["input_ids"], arrays.get("labels"), arrays.get("attention_mask"),
                             int(meta["total_tokens"]), meta["format"], bool(meta["packing"]), meta["source"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _cache_put(key: str | None, data: TokenizedData) -> None:
    from zerokit.core.fsutil import atomic_write_text, cache_dir

    if key is None:
        return
    folder = cache_dir("tokens")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        files = _cache_files(folder, key)
        for name, arr in data.arrays().items():
            save_npy_atomic(files[name], arr)
        meta = {"total_tokens": int(data.total_tokens), "format": data.format, "packing": data.packing,
                "source": data.source, "arrays": list(data.arrays())}
        # the JSON last: an entry counts only once every array is whole
        atomic_write_text(folder / f"{key}.json", json.dumps(meta), mode=0o644)
    except OSError:
        pass  # an unwritable cache only costs the tokenization next time


def tokenize(source: DataSource, tokenizer: str, seq_len: int, data_format: str | None = None,
             packing: bool | None = None) -> TokenizedData:
    """encode_source, cached by content ($ZEROKIT_CACHE_DIR/tokens): the same data, tokenizer, options and versions
    are tokenized once. Local data is keyed by its files' bytes before anything is read, so a hit imports neither
    datasets nor transformers; a hub dataset is keyed by its id, config, split and datasets' fingerprint of the split
    (DatasetBuilder._get_dataset_fingerprint: the repo's commit hash is in it), so it is loaded (from datasets' own
    cache) before the key is known."""
    if seq_len < 2:
        raise ZerokitError(f"sequence length must be at least 2 for causal LM training, got {seq_len}")
    options = (f"format={data_format or 'auto'}|packing={'auto' if packing is None else packing}|{source.kind}|"
               f"split={source.split}|config={source.config}")
    tables = None
    if source.kind == "hub":
        tables = open_tables(source)
        options += f"|hub={source.location}|{tables[0].fingerprint}"
    key = content_key(list(source.files), tokenizer, seq_len, options)
    if source.kind == "hub" and tables[0].fingerprint is None:
        key = None
    cached = _cache_get(key)
    if cached is not None:
        return cached
    data = encode_source(source, tokenizer, seq_len, data_format, packing, tables)
    _cache_put(key, data)
    return data


def tokenize_files(files: list[Path], tokenizer: str, seq_len: int):
    """Local files, cached: (token array, total tokens), the format detected, its default packing."""
    data = tokenize(DataSource("files", tuple(files)), tokenizer, seq_len)
    return data.tokens, data.total_tokens


def save_npy_atomic(path: Path, arr) -> None:
    """np.save to a temporary file beside `path`, then rename over it: a reader sees the old file or the new one."""
    import numpy as np

    tmp = path.parent / f".{path.name}.tmp{os.getpid()}"
    with open(tmp, "wb") as fh:
        np.save(fh, arr)
    os.replace(tmp, path)


def write_data(data: TokenizedData, files: list[Path], tokenizer: str, out_dir: Path) -> PreparedData:
    """Write the arrays (ARRAY_FILES) and tokens.json atomically under out_dir (created); an array this data has not
    is removed, so a rank never reads another run's labels."""
    out_dir.mkdir(parents=True, exist_ok=True)
    arrays = data.arrays()
    for name, fname in ARRAY_FILES.items():
        if name in arrays:
            save_npy_atomic(out_dir / fname, arrays[name])
        else:
            (out_dir / fname).unlink(missing_ok=True)
    meta = {
        "fingerprint": fingerprint(files, tokenizer, data.seq_len),
        "files": [str(f) for f in files],
        "source": data.source,
        "tokenizer": tokenizer,
        "seq_len": data.seq_len,
        "num_sequences": int(data.tokens.shape[0]),
        "total_tokens": int(data.total_tokens),
        "max_token_id": int(data.tokens.max()),
        "format": data.format,
        "packing": data.packing,
        "arrays": {name: ARRAY_FILES[name] for name in arrays},
    }
    tmpj = out_dir / f".tokens.json.tmp{os.getpid()}"
    tmpj.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmpj, out_dir / "tokens.json")
    return PreparedData(out_dir / ARRAY_FILES["input_ids"], meta["num_sequences"], data.seq_len, meta["total_tokens"],
                        tokenizer, meta["max_token_id"])


def write_tokens(arr, total_tokens: int, files: list[Path], tokenizer: str, seq_len: int, out_dir: Path) -> PreparedData:
    """Plain packed tokens (no labels, no mask): write_data of them."""
    return write_data(TokenizedData(arr, total_tokens=total_tokens), files, tokenizer, out_dir)


def cached_tokens(files: list[Path], tokenizer: str, seq_len: int, out_dir: Path) -> PreparedData | None:
    """The tokens already written under out_dir for exactly these files/tokenizer/seq_len, else None."""
    meta_path, npy = out_dir / "tokens.json", out_dir / "tokens.npy"
    if not (meta_path.is_file() and npy.is_file()):
        return None
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if meta.get("fingerprint") != fingerprint(files, tokenizer, seq_len):
        return None
    return PreparedData(npy, meta["num_sequences"], seq_len, meta["total_tokens"], tokenizer, meta["max_token_id"])


def load_tokens(path: str | os.PathLike):
    """The packed [n, seq_len] int32 array (memory-mapped)."""
    import numpy as np

    return np.load(path, mmap_mode="r")


def load_arrays(tokens_path: str | os.PathLike) -> dict:
    """What a rank feeds its model: tokens.npy and, where written beside it, labels.npy and attention_mask.npy,
    memory-mapped, by the model's argument names."""
    folder = Path(tokens_path).parent
    out = {"input_ids": load_tokens(tokens_path)}
    for name in ("labels", "attention_mask"):
        if (folder / ARRAY_FILES[name]).is_file():
            out[name] = load_tokens(folder / ARRAY_FILES[name])
    return out


def written_data_matches(out_dir: Path, data: TokenizedData) -> bool:
    """Whether out_dir holds exactly these arrays (a resumed run's data position must point at the same rows)."""
    new = data.arrays()
    for name, fname in ARRAY_FILES.items():
        f = out_dir / fname
        if (name in new) != f.is_file():
            return False
        if name in new:
            old = load_tokens(f)
            if old.shape != new[name].shape or not (old == new[name]).all():
                return False
    return True
