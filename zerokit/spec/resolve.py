"""The one model resolver: what the `model` a user gives names, for plan, check, launch, the rank entrypoint
and the tokenizer alike.

A model is, in this order:
* a local directory holding config.json (its weights are loaded when it has weight files, else random init);
* a path to a config.json file (or any HF config JSON: random init);
* a bundled name (zerokit/data/models/<name>/config.json: random init, the bundled tokenizer);
* a HuggingFace hub id, `org/name` or a bare `distilgpt2` (only config.json is fetched for planning; launch
  loads the weights and tokenizer from the hub).
Anything else is a one-line ZerokitError naming the accepted forms. Pure Python: huggingface_hub is imported
only to fetch a hub config.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from zerokit.core.errors import ZerokitError
from zerokit.core.fsutil import parse_json_text
from zerokit.core.options import flag
from zerokit.core.resources import bundled_models_dir, bundled_tokenizer

CONFIG_NAME = "config.json"
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
HINT = f"pass a directory containing a HuggingFace config.json, a bundled name, a hub id, or {flag('params')} N"
# what makes a directory a pretrained model rather than a config to initialise randomly
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model*.safetensors.index.json", "pytorch_model.bin.index.json")
# what makes a directory hold its own tokenizer (AutoTokenizer.from_pretrained reads one of these)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def bundled_models() -> list[str]:
    """Names of the bundled model configs (``zerokit/data/models/<name>/config.json``)."""
    root = bundled_models_dir()
    try:
        return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / CONFIG_NAME).is_file())
    except OSError:
        return []


def has_weights(path: Path) -> bool:
    return any(any(Path(path).glob(p)) for p in WEIGHT_PATTERNS)


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model comes from. `source` is what transformers loads (a path or a hub id)."""

    query: str  # what the user typed
    name: str  # display name (the directory's or bundled name, or the hub id)
    kind: Literal["directory", "file", "bundled", "hub"]
    path: Path | None  # the model directory, or the config file for kind "file"; None for a hub id

    @property
    def hub_id(self) -> str | None:
        return self.query if self.kind == "hub" else None

    @property
    def source(self) -> str:
        return self.query if self.kind == "hub" else str(self.path)

    @property
    def local_config_path(self) -> Path | None:
        if self.kind == "hub":
            return None
        return self.path if self.kind == "file" else self.path / CONFIG_NAME

    @property
    def init(self) -> Literal["weights", "config"]:
        """'weights' to load pretrained weights, 'config' for random init from the config."""
        if self.kind == "hub":
            return "weights"
        return "weights" if self.kind == "directory" and has_weights(self.path) else "config"

    @property
    def tokenizer(self) -> str:
        """The model's own tokenizer (a directory with tokenizer files, or the hub id), else the bundled one for a
        model trained from random init (a bundled name, a config file, a directory with a config only). Pretrained
        weights without their tokenizer are refused: the bundled one would feed them ids they never saw."""
        if self.kind == "hub":
            return self.query
        if self.kind == "directory" and any((self.path / f).exists() for f in TOKENIZER_FILES):
            return str(self.path)
        if self.init == "weights":
            raise ZerokitError(f"model directory {self.path} has weights but no tokenizer files "
                               f"({', '.join(TOKENIZER_FILES[:2])}, ...): copy the model's tokenizer into it, or pass "
                               f"{flag('tokenizer')} DIR_OR_HUB_ID")
        return str(bundled_tokenizer())

    def config_file(self) -> Path:
        """A config.json transformers can read: the local one, or the hub's (downloaded, or HF's local cache)."""
        return self.local_config_path or fetch_hub_config(self.query)[0]

    def load_config(self) -> tuple[Path, dict]:
        """(config.json path, its contents): one fetch for a hub id."""
        if self.kind == "hub":
            return fetch_hub_config(self.query)
        return self.local_config_path, read_config_file(self.local_config_path)

    def read_config(self) -> dict:
        return self.load_config()[1]


def resolve_model(model: str) -> ResolvedModel:
    """The ResolvedModel for what the user typed (rules in the module docstring); ZerokitError otherwise.
    Nothing is fetched here: a hub id is recognised by its form."""
    if not isinstance(model, str) or not model.strip():
        raise ZerokitError(f"no model given: {HINT}")
    model = model.strip()
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / CONFIG_NAME).is_file():
            raise ZerokitError(f"model directory {model} has no config.json: {HINT}")
        return ResolvedModel(model, path.resolve().name or model, "directory", path)
    if path.is_file():
        name = path.resolve().parent.name if path.name == CONFIG_NAME else path.stem
        return ResolvedModel(model, name, "file", path)
    if "/" not in model and "\\" not in model and (bundled_models_dir() / model / CONFIG_NAME).is_file():
        return ResolvedModel(model, model, "bundled", bundled_models_dir() / model)
    if model.startswith((".", "/", "~")) or model.endswith(".json") or not HUB_ID.match(model):
        names = ", ".join(bundled_models())
        raise ZerokitError(f"model directory {model} does not exist: {HINT} (bundled: {names})")
    return ResolvedModel(model, model, "hub", None)


def read_config_file(path: Path) -> dict:
    """A HF config.json as a dict; one-line ZerokitError if unreadable, not JSON, or without model_type."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ZerokitError(f"cannot read {path}: {exc.__class__.__name__}: {exc}; {HINT}") from None
    config = parse_json_text(text, str(path))
    if not isinstance(config, dict):
        raise ZerokitError(f"{path} does not hold a JSON object: a HuggingFace config.json is a mapping; {HINT}")
    if not config.get("model_type") or not isinstance(config["model_type"], str):
        raise ZerokitError(
            f"{path} has no model_type: it is not a HuggingFace transformers config.json; {HINT}"
        )
    return config



# One HEAD request of at most this long decides whether the hub answers (huggingface_hub's own download retries
# 5 times with backoff: 23 s measured here without a network before its error).
HUB_PROBE_SECONDS = 2.0


def _hub_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it (1/ON/YES/TRUE)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def fetch_hub_config(model: str) -> tuple[Path, dict]:
    """config.json for a hub id, without transformers: HF's local cache first (so HF_HUB_OFFLINE and a machine
    without network still plan a model fetched once), else one short request, then the download."""
    from zerokit.core.quiet import library_output

    try:
        with library_output():
            from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
            from huggingface_hub import errors as hf_errors
    except ImportError:
        raise ZerokitError(
            f"{model} is not a bundled name or a local path, and huggingface_hub is not installed to fetch it: "
            f"pip install 'zerokit[train]', or {HINT}"
        ) from None
    names = ", ".join(bundled_models())
    try:
        with library_output():  # the hub client's warnings (zerokit -v shows them)
            try:
                path = Path(hf_hub_download(repo_id=model, filename=CONFIG_NAME, local_files_only=True))
            except hf_errors.LocalEntryNotFoundError:
                if not _hub_offline():
                    # one try, a short timeout: no network fails here in a moment, not after the client's retries
                    try:
                        get_hf_file_metadata(hf_hub_url(model, CONFIG_NAME), timeout=HUB_PROBE_SECONDS,
                                             retry_on_errors=False)
                    except hf_errors.HfHubHTTPError:
                        raise  # the hub answered (not found, gated, ...): the handlers below say which
                    except Exception as exc:  # no network: DNS, refused connection, timeout
                        why = (str(exc).strip().splitlines() or ["no answer"])[0]
                        raise ZerokitError(
                            f"cannot reach the HuggingFace hub to fetch {model} within {HUB_PROBE_SECONDS:g} s ({why}) "
                            f"and it is not cached locally: connect to the internet, or pass a local directory / "
                            f"bundled name ({names})") from None
                path = Path(hf_hub_download(repo_id=model, filename=CONFIG_NAME))
    except ZerokitError:
        raise
    except hf_errors.GatedRepoError:
        raise ZerokitError(
            f"hub model {model} is gated: accept its license on huggingface.co and run `hf auth login`, "
            f"or use a local copy / bundled name ({names})"
        ) from None
    except hf_errors.RepositoryNotFoundError:
        raise ZerokitError(
            f"no model {model} on the HuggingFace hub (nor a local path or bundled name): check the id, "
            f"log in for private repos, or use one of: {names}"
        ) from None
    except (hf_errors.LocalEntryNotFoundError, hf_errors.OfflineModeIsEnabled):
        # LocalEntryNotFoundError subclasses EntryNotFoundError: it must be caught first.
        raise ZerokitError(
            f"cannot reach the HuggingFace hub to fetch {model} and it is not cached locally: "
            f"connect to the internet, or pass a local directory / bundled name ({names})"
        ) from None
    except hf_errors.EntryNotFoundError:
        raise ZerokitError(f"hub model {model} has no config.json: {HINT}") from None
    except hf_errors.HfHubHTTPError as exc:
        msg = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
        raise ZerokitError(f"fetching {model} from the HuggingFace hub failed ({msg}): {HINT}") from None
    except Exception as exc:  # network stack errors, invalid ids, ...
        msg = (str(exc).strip().splitlines() or ["no reason given"])[0]
        raise ZerokitError(f"cannot fetch {model} from the HuggingFace hub ({msg}): {HINT}") from None
    return path, read_config_file(path)
