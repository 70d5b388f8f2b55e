"""The lint `make test` runs first (ruff, configured in pyproject.toml), also from pytest; and every noqa left in
the code says why the rule does not apply there."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# a noqa directive with its codes, then the reason: "- why" or "(why)"
NOQA = re.compile(r"#\s*noqa\b(?P<rest>.*)$")
REASONED = re.compile(r":\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*\s+(-\s*|\()\S")


def unexplained_noqa(lines: list[tuple[str, int, str]]) -> list[str]:
    return [f"{path}:{n}: {text.strip()}" for path, n, text in lines
            if (m := NOQA.search(text)) and not REASONED.match(m.group("rest"))]


def test_every_noqa_says_why():
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    lines = [(f, n, line) for f in files for n, line in enumerate((REPO / f).read_text(encoding="utf-8").splitlines(), 1)]
    assert unexplained_noqa(lines) == []
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
