"""The documentation holds together: every relative link of README.md and docs/ reaches a file
(and a heading, where it names one), the README stays a page, and no prose names the project's
tracker numbers, which mean nothing to a reader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
README_MAX_LINES = 200
# prose: the repository's Markdown, and the comments and docstrings of what users run and read
PROSE = [*PAGES, *sorted(ROOT.glob("compressor/**/*.py")), *sorted(ROOT.glob("benchmarks/*.py")),
         *sorted(ROOT.glob("examples/*")), *sorted(ROOT.glob("scripts/*.sh")),
         *sorted(ROOT.glob("configs/**/*.yaml"))]
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*$", re.M)
TRACKER_NUMBER = re.compile(r"\b(?:issue|task)s?\s*#?\d+|(?<![\w/&'\"])#\d{1,4}\b", re.I)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings (GitHub numbers repeats: name, name-1, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        anchor = github_anchor(heading)
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    """The relative links of `page` (outside code blocks) whose file or heading is missing."""
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target} (no heading with that anchor)")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_reaches_its_file_and_heading(page: Path) -> None:
    assert not broken_links(page), f"{page.relative_to(ROOT)}: {broken_links(page)}"


def test_a_missing_file_or_heading_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## The `--qe` flags, **bold**\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n[ok](other.md#the---qe-flags-bold) [self](#page) "
                    "[gone](missing.md) [wrong](other.md#nothing) ![img](x.png)\n"
                    "```bash\n[in code](nowhere.md)\n```\n[web](https://example.com/a)\n")
    assert broken_links(page) == ["missing.md (no such file)",
                                  "other.md#nothing (no heading with that anchor)"]


def test_repeated_headings_get_numbered_anchors(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Notes\n## Notes\n```\n# not a heading\n```\n")
    assert anchors(page) == {"notes", "notes-1"}


def test_the_readme_is_one_page() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines; move detail into docs/ and link it (at most "
        f"{README_MAX_LINES})")


def test_no_prose_names_a_tracker_number() -> None:
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()[:80]}"
             for path in PROSE if path.is_file()
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if TRACKER_NUMBER.search(line)]
    assert not found, "tracker numbers mean nothing to a reader; say what was meant:\n" + \
        "\n".join(found)


@pytest.mark.parametrize("line,named", [
    ("the three families of issue 14", True), ("see task #7", True), ("as in #12", True),
    ("tasks 3 and 4", True), ("color: #fff", False), ("layer 14 of 20", False),
    ("https://github.com/pytorch/pytorch/issues/184982", False), ("a['#3']", False)])
def test_the_tracker_pattern_tells_numbers_from_other_text(line: str, named: bool) -> None:
    assert bool(TRACKER_NUMBER.search(line)) is named
