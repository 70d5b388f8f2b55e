"""Training data for `zerokit launch`: find the files, pick the tokenizer, tokenize and pack to seq_len.

DATA is a .txt or .jsonl file (one JSON object per line with a "text" field) or a directory of them
(searched recursively, sorted by path). With no DATA the bundled tiny corpus is used, so the main
command runs without a download. Documents are tokenized, joined with the tokenizer's EOS token and cut
into blocks of exactly seq_len tokens (the remainder is dropped).

The tokenized blocks are written once by the CLI to `<output_dir>/data/tokens.npy` (with a JSON
fingerprint beside it) and every rank memory-maps that file: ranks do not tokenize.

Only the standard library is imported at module level; numpy/transformers inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from zerokit.core.errors import ZerokitError
from zerokit.core.resources import bundled_corpus

DATA_SUFFIXES = (".txt", ".jsonl")


def resolve_data_files(data: str | os.PathLike | None) -> list[Path]:
    """The list of text files DATA names. Raises ZerokitError with a one-line reason."""
    if data is None or str(data) == "":
        return [bundled_corpus()]
    p = Path(data).expanduser()
    if not p.exists():
        raise ZerokitError(f"data {str(data)!r} does not exist: give a .txt/.jsonl file or a directory of them")
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in DATA_SUFFIXES)
        if not files:
            raise ZerokitError(f"data directory {str(data)!r} holds no .txt or .jsonl files")
        return files
    if p.suffix.lower() not in DATA_SUFFIXES:
        raise ZerokitError(f"data file {str(data)!r} is not .txt or .jsonl: convert it, or give a directory of such files")
    return [p]


def read_documents(files: list[Path]):
    """Yield documents: each .txt file is one document; each .jsonl line's "text" is one."""
    for f in files:
        if f.suffix.lower() == ".txt":
            try:
                text = f.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise ZerokitError(f"data file {f} is not UTF-8 text") from None
            if text.strip():
                yield text
            continue
        with open(f, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ZerokitError(f"{f}:{lineno}: not valid JSON ({e.msg}): one JSON object per line") from None
                if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                    raise ZerokitError(f'{f}:{lineno}: expected an object with a "text" string field')
                if rec["text"].strip():
                    yield rec["text"]


def load_tokenizer(name_or_path: str):
    from zerokit.core.quiet import library_output

    try:
        with library_output():
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(name_or_path)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds; report one line
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

    def __init__(self, tokenizer, eos_token_id: int | None, sep_token_id: int | None):
        self._tokenizer = tokenizer
        self.eos_token_id, self.sep_token_id = eos_token_id, sep_token_id

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
        except Exception:  # noqa: BLE001 - no tokenizers library, or a file it cannot read: transformers decides
            return None
        ids = {k: tokenizer.token_to_id(v) for k, v in named.items()}
        return cls(tokenizer, ids.get("eos_token"), ids.get("sep_token"))


def load_encoder(name_or_path: str):
    """What tokenize_and_pack needs from the tokenizer: the `tokenizers` library alone where it gives transformers'
    ids (PlainFastTokenizer), else the transformers tokenizer."""
    if Path(name_or_path).is_dir():
        plain = PlainFastTokenizer.from_tokenizer_dir(name_or_path)
        if plain is not None:
            return plain
    return load_tokenizer(name_or_path)


def _eos_id(tok) -> int | None:
    if tok.eos_token_id is not None:
        return int(tok.eos_token_id)
    if getattr(tok, "sep_token_id", None) is not None:
        return int(tok.sep_token_id)
    return None


def tokenize_and_pack(files: list[Path], tok, seq_len: int):
    """An int32 numpy array [n_blocks, seq_len] and the total token count (before dropping the tail)."""
    import numpy as np

    if seq_len < 2:
        raise ZerokitError(f"sequence length must be at least 2 for causal LM training, got {seq_len}")
    eos = _eos_id(tok)
    ids: list[int] = []
    for doc in read_documents(files):
        # long documents: tokenize in line chunks so the fast tokenizer never sees one huge string
        out = tok(doc.splitlines(keepends=True), add_special_tokens=False)["input_ids"]
        for piece in out:
            ids.extend(piece)
        if eos is not None:
            ids.append(eos)
    total = len(ids)
    n = total // seq_len
    if n < 1:
        where = files[0] if len(files) == 1 else f"{len(files)} files"
        raise ZerokitError(
            f"data {where} has {total} tokens, fewer than one sequence of {seq_len}: add text or lower --seq-len"
        )
    arr = np.asarray(ids[: n * seq_len], dtype=np.int32).reshape(n, seq_len)
    return arr, total


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


# tokenizer files whose content decides the ids (AutoTokenizer reads these; weights never matter)
TOKENIZER_CONTENT_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt",
                           "special_tokens_map.json", "added_tokens.json", "vocab.txt")
# Bump when tokenize_and_pack changes what it produces: old cache entries stop matching.
_TOKENS_SCHEMA = 2  # 2: the tokenizers version in the key


def content_key(files: list[Path], tokenizer: str, seq_len: int) -> str | None:
    """A hash of everything the packed tokens depend on: the data files' bytes, the tokenizer's files' bytes, the
    sequence length and the transformers and tokenizers versions. None for a hub tokenizer (its files can change
    upstream)."""
    from zerokit.core.fsutil import package_version

    tok_dir = Path(tokenizer)
    if not tok_dir.is_dir():
        return None
    versions = f"{package_version('transformers')}|{package_version('tokenizers')}"
    h = hashlib.sha256(f"zerokit-tokens/{_TOKENS_SCHEMA}|{versions}|{seq_len}".encode())
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


def tokenize_files(files: list[Path], tokenizer: str, seq_len: int):
    """Tokenize and pack in memory (validation step; nothing written in the run directory). Returns
    (array, total_tokens). Cached by content ($ZEROKIT_CACHE_DIR/tokens): the same data and tokenizer are
    tokenized once; a cache hit, and a plain tokenizer.json (PlainFastTokenizer), import no transformers."""
    import numpy as np

    from zerokit.core.fsutil import atomic_write_text, cache_dir

    key = content_key(files, tokenizer, seq_len)
    folder = cache_dir("tokens")
    if key is not None:
        try:
            meta = json.loads((folder / f"{key}.json").read_text())
            return np.load(folder / f"{key}.npy"), int(meta["total_tokens"])
        except (OSError, ValueError, KeyError):
            pass
    arr, total = tokenize_and_pack(files, load_encoder(tokenizer), seq_len)
    if key is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            save_npy_atomic(folder / f"{key}.npy", arr)
            # the JSON last: an entry counts only once both files are whole
            atomic_write_text(folder / f"{key}.json", json.dumps({"total_tokens": int(total)}), mode=0o644)
        except OSError:
            pass  # an unwritable cache only costs the tokenization next time
    return arr, total


def save_npy_atomic(path: Path, arr) -> None:
    """np.save to a temporary file beside `path`, then rename over it: a reader sees the old file or the new one."""
    import numpy as np

    tmp = path.parent / f".{path.name}.tmp{os.getpid()}"
    with open(tmp, "wb") as fh:
        np.save(fh, arr)
    os.replace(tmp, path)


def write_tokens(arr, total_tokens: int, files: list[Path], tokenizer: str, seq_len: int, out_dir: Path) -> PreparedData:
    """Write tokens.npy + tokens.json atomically under out_dir (created)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    save_npy_atomic(out_dir / "tokens.npy", arr)
    meta = {
        "fingerprint": fingerprint(files, tokenizer, seq_len),
        "files": [str(f) for f in files],
        "tokenizer": tokenizer,
        "seq_len": seq_len,
        "num_sequences": int(arr.shape[0]),
        "total_tokens": int(total_tokens),
        "max_token_id": int(arr.max()),
    }
    tmpj = out_dir / f".tokens.json.tmp{os.getpid()}"
    tmpj.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmpj, out_dir / "tokens.json")
    return PreparedData(out_dir / "tokens.npy", meta["num_sequences"], seq_len, meta["total_tokens"], tokenizer,
                        meta["max_token_id"])


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
