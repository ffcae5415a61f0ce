"""docs/troubleshooting.md quotes the code's own messages: each one it lists is found, as a
fixed fragment of one string literal, in compressor/'s source, so the page cannot drift."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "troubleshooting.md"
SOURCE = ROOT / "compressor"
PLACEHOLDER = "…"  # on the page: a part of the message that the code fills in
HOLE = "\x00"  # in a rendered f-string: where a value is formatted in
# the groups the page promises, in its order
GROUPS = ("Command line", "Data", "Models and checkpoints", "Schedules, pruning and thinning",
          "Quantization", "Distillation", "Budget", "Export", "Distributed")
# a quoted message names its problem with fixed text: one piece at least MIN_PIECE long, and
# MIN_FIXED characters in all (enough that a quote cannot match by chance)
MIN_PIECE, MIN_FIXED = 10, 12
# a table row whose first cell is one code span: `message` | what to do |
ROW = re.compile(r"^\|\s*`(?P<message>[^`]+)`\s*\|(?P<rest>.*)\|\s*$")


def page_messages() -> list[tuple[str, str]]:
    """(group heading, message) for every error row of the page, in page order."""
    rows: list[tuple[str, str]] = []
    group = ""
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            group = line[3:].strip()
        match = ROW.match(line)
        if match:
            rows.append((group, match["message"]))
    return rows


def _rendered(node: ast.AST) -> str | None:
    """A string literal's text; an f-string's, with a HOLE where each value goes."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else HOLE
                       for part in node.values)
    return None


@cache
def source_literals() -> tuple[str, ...]:
    """Every string literal of compressor/ (implicitly concatenated ones joined, as Python
    joins them), f-strings rendered with holes."""
    literals: set[str] = set()
    for path in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            text = _rendered(node)
            if text and (len(text) >= MIN_PIECE or HOLE in text):
                literals.add(text)
    return tuple(sorted(literals))


def pieces(message: str) -> list[str]:
    """The fixed pieces of a quoted message, between its placeholders."""
    return [piece.strip() for piece in message.split(PLACEHOLDER) if piece.strip()]


def pattern(message: str) -> re.Pattern[str]:
    """The message's fixed pieces in order, anything (a placeholder's value) between them."""
    return re.compile(".*?".join(re.escape(piece) for piece in pieces(message)), re.DOTALL)


def found_in_source(message: str) -> bool:
    """Whether one string literal of compressor/ holds the message's pieces, in order."""
    regex = pattern(message)
    return any(regex.search(literal) for literal in source_literals())


def test_the_page_lists_every_group_with_its_errors() -> None:
    rows = page_messages()
    headings = [group for group in dict.fromkeys(group for group, _ in rows)]
    assert headings == list(GROUPS), headings
    assert len(rows) >= 150, len(rows)


def test_no_message_is_listed_twice() -> None:
    messages = [message for _, message in page_messages()]
    assert len(messages) == len(set(messages)), sorted(
        m for m in set(messages) if messages.count(m) > 1)


@pytest.mark.parametrize("group,message", page_messages(),
                         ids=[f"{g[:12]}:{m[:40]}" for g, m in page_messages()])
def test_each_quoted_error_is_in_the_source(group: str, message: str) -> None:
    fixed = pieces(message)
    assert max(map(len, fixed), default=0) >= MIN_PIECE and sum(map(len, fixed)) >= MIN_FIXED, (
        f"{message!r}: quote more of the message's fixed text")
    assert found_in_source(message), (
        f"[{group}] {message!r} is in no string literal of compressor/: the code's message "
        "changed; quote it again from the code (… where the code formats a value in)")


def test_the_matcher_needs_the_pieces_in_one_literal_and_in_order() -> None:
    assert found_in_source("weights file not found: …; check the path given")
    assert not found_in_source("check the path given …; weights file not found:")
    assert not found_in_source("weights file not found: … and the moon is made of cheese")
