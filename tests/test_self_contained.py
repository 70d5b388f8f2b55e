"""The repository stands alone, and its guide stays a guide.

1. No tracked file points outside the repository: none holds the path of the notes the project was started from
   (what they recorded lives in docs/measured-on-cpu.md), and no markdown link climbs out of the repository root.
2. README.md is at most 150 lines, and every relative link in README.md and docs/*.md reaches an existing file (and,
   for a link into a markdown file with a #fragment, a heading of that file).

The files are what `git ls-files` lists, read from the working tree; binary files are skipped. The last tests prove
the checkers fail on what they are meant to catch.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Built in two parts so that this file does not hold the string it looks for.
OUTSIDE_POINTERS = ("shared" + "/reference",)
README_MAX_LINES = 150

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"                          # [text], one level of nested brackets
    r"\(\s*(<[^>]*>|[^()\s]*(?:\([^()\s]*\)[^()\s]*)*)"         # (target: <...>, or balanced parentheses
    r"(?:\s+[\"'(][^)]*)?\)")                                 #  and an optional "title")
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing to list")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / name for name in out.decode("utf-8", "surrogateescape").split("\0") if name]


def read_text(path: Path) -> str | None:
    """The file's text, or None for a binary file or one missing from the working tree."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def outside_pointers(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line naming a path outside the repository."""
    return [(i, line.strip()) for i, line in enumerate(text.splitlines(), 1)
            if any(p in line for p in OUTSIDE_POINTERS)]


def markdown_links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every inline link, image and reference definition outside code."""
    links, fenced = [], False
    for i, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        prose = _CODE_SPAN.sub("", line)
        for m in _INLINE_LINK.finditer(prose):
            links.append((i, m.group(1).strip("<>")))
        m = _REF_DEF.match(prose)
        if m:
            links.append((i, m.group(1).strip("<>")))
    return links


def heading_anchors(text: str) -> set[str]:
    """GitHub's anchors for a markdown file's headings: lower case, punctuation dropped, spaces to hyphens, and
    -1, -2, ... for repeats."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else _HEADING.match(line)
        if not m:
            continue
        title = re.sub(r"[`*_]|<[^>]+>", "", m.group(2))
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def link_problems(md: Path, text: str, must_exist: bool) -> list[str]:
    """What is wrong with md's relative links: a target outside the repository root, and (must_exist) a target that
    is not there or a #fragment that is no heading of the markdown file it names."""
    problems = []
    for line, target in markdown_links(text):
        if not target or _EXTERNAL.match(target) or target.startswith("//"):
            continue
        path_part, _, fragment = target.partition("#")
        path_part = path_part.split("?", 1)[0]
        if path_part.startswith("/"):
            dest = (REPO / path_part.lstrip("/")).resolve()
        elif path_part:
            dest = (md.parent / path_part).resolve()
        else:
            dest = md.resolve()
        where = f"{md.relative_to(REPO)}:{line}: ({target})"
        if dest != REPO and REPO not in dest.parents:
            problems.append(f"{where} points outside the repository")
            continue
        if not must_exist:
            continue
        if not dest.exists():
            problems.append(f"{where}: {dest.relative_to(REPO)} does not exist")
        elif fragment and dest.suffix == ".md" and dest.is_file():
            dest_text = text if dest == md.resolve() else dest.read_text(encoding="utf-8")
            if fragment.lower() not in heading_anchors(dest_text):
                problems.append(f"{where}: no heading #{fragment} in {dest.relative_to(REPO)}")
    return problems


def guide_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


# ----------------------------------------------------------------------------------------------------------------


def test_no_tracked_file_points_outside_the_repository():
    found = []
    for path in tracked_files():
        text = read_text(path)
        if text is None:
            continue
        found += [f"{path.relative_to(REPO)}:{i}: {line[:120]}" for i, line in outside_pointers(text)]
    assert not found, ("files outside the repository are named; cite the public source (a DeepSpeed, transformers or "
                       "peft function, a paper, an issue) or write the fact into docs/ (docs/measured-on-cpu.md):\n"
                       + "\n".join(found))


def test_no_markdown_link_climbs_out_of_the_repository():
    problems = []
    for path in tracked_files():
        if path.suffix != ".md":
            continue
        text = read_text(path)
        if text is not None:
            problems += link_problems(path, text, must_exist=False)
    assert not problems, "\n".join(problems)


def test_readme_is_a_guide_of_at_most_150_lines():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move the detail into a docs/ page and link it")


def test_every_relative_link_in_the_readme_and_docs_resolves():
    pages = guide_pages()
    assert len(pages) > 1, "docs/ has no pages"
    problems = []
    for page in pages:
        problems += link_problems(page, page.read_text(encoding="utf-8"), must_exist=True)
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------- the checkers fail


def test_the_checkers_catch_what_they_are_meant_to():
    assert outside_pointers("see ../" + OUTSIDE_POINTERS[0] + "/notes.md\nfine line") == [
        (1, "see ../" + OUTSIDE_POINTERS[0] + "/notes.md")]
    readme = REPO / "README.md"
    escaping = "[notes](../../elsewhere/notes.md) and ![img](../x.png)\n[ref]: ../outside.md\n"
    assert len(link_problems(readme, escaping, must_exist=False)) == 3
    missing = "[a](docs/no-such-page.md) [b](docs/memory-model.md#no-such-heading) [c](#nowhere)\n"
    assert len(link_problems(readme, missing, must_exist=True)) == 3
    fine = ("# Top\n[ok](docs/memory-model.md) [web](https://example.org/x) [top](#top)\n"
            "`[not a link](../../x)`\n```\n[in code](../../x)\n```\n")
    assert link_problems(readme, fine, must_exist=True) == []


def test_github_anchors():
    text = ("## Beyond data parallelism: Ulysses SP, AutoTP, ZeRO++ hpZ, tiled loss and MLP (issue 11)\n"
            "## What nvidia-smi shows (zerokit/estimate/reserved.py)\n## Notes\n## Notes\n```\n# not a heading\n```\n")
    assert heading_anchors(text) == {
        "beyond-data-parallelism-ulysses-sp-autotp-zero-hpz-tiled-loss-and-mlp-issue-11",
        "what-nvidia-smi-shows-zerokitestimatereservedpy", "notes", "notes-1"}
