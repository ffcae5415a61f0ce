"""What the tool says, checked where a wording was wrong once: install hints a shell accepts as
given."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `pip install -e .[extra]` is a glob to zsh ("no matches found"): the extra must be quoted
UNQUOTED_EXTRA = re.compile(r"pip install (?:-e )?\.\[")


def test_every_install_hint_quotes_its_extras() -> None:
    files = [*ROOT.glob("compressor/**/*.py"), *ROOT.glob("docs/*.md"), ROOT / "README.md",
             *ROOT.glob("benchmarks/*.py"), *ROOT.glob("examples/*.py"), *ROOT.glob("scripts/*")]
    unquoted = [f"{path.relative_to(ROOT)}:{number}" for path in files if path.is_file()
                for number, line in enumerate(path.read_text().splitlines(), 1)
                if UNQUOTED_EXTRA.search(line)]
    assert not unquoted, unquoted
