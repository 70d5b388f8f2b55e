"""Bundled resources: model configs, the tokenizer and corpus (zerokit/data), the Jinja2 templates and their
environment. One place finds them, in a checkout and in an installed wheel alike."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path

from zerokit.core.errors import ZerokitError

TEMPLATE_PROBE = "ds_config.deepspeed.json.j2"  # a template every install has: where it is, the others are


def bundled_data(name: str = "") -> Path:
    """A file or folder under zerokit/data (gpus.json, models/, corpus/, tokenizer/)."""
    try:
        # zerokit.data has no __init__.py: files() gives a namespace MultiplexedPath, whose joinpath is a Path
        root = Path(str(resources.files("zerokit.data").joinpath("gpus.json"))).parent
    except ModuleNotFoundError:  # pragma: no cover - a broken install; fall back to the source tree
        root = Path(__file__).resolve().parent.parent / "data"
    return root / name if name else root


def bundled_models_dir() -> Path:
    return bundled_data("models")


def bundled_corpus() -> Path:
    return bundled_data("corpus") / "tiny_corpus.txt"


def bundled_instructions() -> Path:
    """A few hundred short chats in the messages format (arithmetic and simple facts): `--data-format chat` data."""
    return bundled_data("corpus") / "tiny_instructions.jsonl"


def bundled_tokenizer() -> Path:
    return bundled_data("tokenizer")


def template_dir():
    """The folder holding the .j2 templates, as an importlib Traversable (a Path in practice).

    An installed wheel ships them as the package `zerokit.templates`; a plain checkout has them at
    <repo>/templates (pyproject maps that folder onto the package only when building).
    """
    try:
        d = resources.files("zerokit.templates")
        probe = d.joinpath(TEMPLATE_PROBE)
        if probe.is_file():
            # templates/ has no __init__.py, so files() gives a namespace MultiplexedPath; the file's folder is a
            # plain Path (a zip import would give a zipfile.Path, which is as good to the loader)
            return probe.parent if isinstance(probe, Path) else d
    except ModuleNotFoundError:
        pass
    d = Path(__file__).resolve().parent.parent.parent / "templates"
    if (d / TEMPLATE_PROBE).is_file():
        return d
    raise ZerokitError(f"zerokit's templates are missing (looked in the package zerokit.templates and {d}): reinstall zerokit")


@lru_cache(maxsize=2)
def template_environment(keep_trailing_newline: bool = False):
    """The Jinja2 environment over templates/: strict (an undefined name is an error), no escaping."""
    import jinja2

    base = template_dir()

    def load(name: str) -> str | None:
        f = base.joinpath(name)
        return f.read_text(encoding="utf-8") if f.is_file() else None

    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(load),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=keep_trailing_newline,
    )
    env.filters["j"] = json.dumps  # every value goes through JSON: strings quoted, paths escaped, bools lowercase
    return env
