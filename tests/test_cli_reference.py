"""docs/cli.md is generated from the parser: it is up to date, shows --help's groups in --help's
order, lists every option once with a domain, and reads the same on every machine."""

from __future__ import annotations

import os
import re
import runpy
import sys
from collections import Counter

import pytest

from compressor.cli.parser import get_args_parser, option_groups
from compressor.cli.reference import GENERATE_COMMAND, cli_reference
from tests.conftest import ROOT, run_cli

PAGE = ROOT / "docs" / "cli.md"
GROUPS = ["data", "model", "training", "run", "schedule", "quantization", "distillation",
          "budget", "memory", "export", "reports"]


def _rows(page: str) -> list[list[str]]:
    """The cells of every table row but headers and rules (cells split on unescaped pipes)."""
    rows = []
    for line in page.splitlines():
        if line.startswith("| ") and not line.startswith(("| flag |", "|---")):
            rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def test_the_page_is_up_to_date() -> None:
    if not PAGE.is_file() or PAGE.read_text() != cli_reference():
        pytest.fail(f"docs/cli.md is out of date: run {GENERATE_COMMAND}")


def test_help_shows_the_groups_of_the_page_in_its_order() -> None:
    result = run_cli("--help")
    assert result.returncode == 0, result.stderr[-2000:]
    titles = [line[:-1] for line in result.stdout.splitlines()
              if re.fullmatch(r"[a-z][\w -]*:", line) and line != "options:"]
    page_titles = [line[3:] for line in cli_reference().splitlines() if line.startswith("## ")]
    assert titles == page_titles == GROUPS
    # each group says in one line what it holds, in --help and on the page
    descriptions = [description for _, description, _ in option_groups(get_args_parser())]
    assert all(description and "\n" not in description for description in descriptions)


def test_every_option_appears_once_with_help_default_and_domain() -> None:
    parser = get_args_parser()
    expected = Counter()
    for _, _, actions in option_groups(parser):
        for action in actions:
            expected.update(action.option_strings or [action.metavar])
    assert sum(len(actions) for _, _, actions in option_groups(parser)) == \
        len(parser._actions) - 1  # every action but -h is in one of our groups
    rows = _rows(cli_reference())
    shown = Counter()
    for flags, help_text, default, domain in rows:
        names = [span.strip("[]").split(" ")[0] for span in re.findall(r"`([^`]*)`", flags)]
        shown.update(name for name in names if name.startswith("-") or name == "DATASET_DIR")
        assert help_text and default and domain, flags
    assert shown == expected and max(shown.values()) == 1
    cells = {row[0]: row for row in rows}
    assert cells["`-b`, `--batch-size` `BATCH_SIZE`"][3] == "integer in [1, 2147483647]"
    assert cells["`--lr`, `--learning-rate` `LR`"][2:] == ["`0.1`", "real > 0"]
    assert cells["`--pretrained`"][2:] == ["off", "flag"]
    assert cells["`--resume-from` `CKPT`"][3] == "path"
    assert cells["`--qe-pytorch-backend` `QE_PYTORCH_BACKEND`"][3].startswith("one of `auto`")


def test_the_page_does_not_depend_on_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    here = cli_reference()
    for cpus in (1, 64):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, n=cpus: set(range(n)),
                            raising=False)
        monkeypatch.setattr(os, "cpu_count", lambda n=cpus: n)
        assert get_args_parser().parse_args([]).workers == min(4, cpus)  # the patch took
        assert cli_reference() == here


def test_the_module_prints_the_page(capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # run as `python -m` runs it: a fresh __main__, not the module imported above
    monkeypatch.delitem(sys.modules, "compressor.cli.reference")
    runpy.run_module("compressor.cli.reference", run_name="__main__")
    assert capsys.readouterr().out == cli_reference()
