"""The lint `make test` runs first (ruff, configured in pyproject.toml), also from pytest; and every noqa left in
the code says why the rule does not apply there."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# a noqa directive with its codes, then the reason: "- why" or "(why)"
NOQA = re.compile(r"#\s*noqa\b(?P<rest>.*)$")
REASONED = re.compile(r":\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*\s+(-\s*|\()\S")


def unexplained_noqa(comments: list[tuple[str, int, str]]) -> list[str]:
    return [f"{path}:{n}: {text.strip()}" for path, n, text in comments
            if (m := NOQA.search(text)) and not REASONED.match(m.group("rest"))]


def comments_of(path: Path) -> list[tuple[str, int, str]]:
    """(file, line, comment) for every comment of a Python file (tokenize: a "# noqa" inside a string is no comment)."""
    with path.open("rb") as f:
        return [(str(path.relative_to(REPO)), tok.start[0], tok.string) for tok in tokenize.tokenize(f.readline)
                if tok.type == tokenize.COMMENT]


def test_every_noqa_says_why():
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert unexplained_noqa([c for f in files for c in comments_of(REPO / f)]) == []
    # the check fails where it should
    assert unexplained_noqa([("a.py", 1, "import x  # noqa: F401"), ("a.py", 2, "import y  # noqa"),
                             ("a.py", 3, "import z  # noqa: F401 - the import is the check")]) == [
        "a.py:1: import x  # noqa: F401", "a.py:2: import y  # noqa"]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    r = subprocess.run([ruff, "check", "--no-cache", "."], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
