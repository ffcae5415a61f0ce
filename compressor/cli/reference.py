"""docs/cli.md, generated from the parser itself: per --help group, a table of every flag with
its help, default and domain, so the page cannot drift from the code.

    python -m compressor.cli.reference > docs/cli.md
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import Any

from compressor.cli.domains import Domain
from compressor.cli.parser import MACHINE_DEFAULTS, get_args_parser, option_groups

__all__ = ["cli_reference", "GENERATE_COMMAND"]

GENERATE_COMMAND = "python -m compressor.cli.reference > docs/cli.md"
_MARKDOWN_SPECIALS = "\\`*_<|"  # what GitHub Markdown could read as markup in a cell


def _escape(text: str) -> str:
    """Text for a Markdown table cell: no character is read as emphasis, HTML or a cell rule."""
    return "".join(f"\\{char}" if char in _MARKDOWN_SPECIALS else char for char in text)


def _code(text: str) -> str:
    # a code span keeps the text as is, except a pipe, which would still end the cell
    escaped = text.replace("|", "\\|")
    return f"`{escaped}`"


def _metavar(action: argparse.Action) -> str:
    """The value part of the flag as --help writes it (FILE, [FILE], LAYER [LAYER ...])."""
    if action.nargs == 0:
        return ""
    names = action.metavar if action.metavar is not None else action.dest.upper()
    if isinstance(names, tuple):
        return " ".join(names)
    if action.nargs == "?":
        return f"[{names}]"
    if action.nargs in ("+", "*"):
        return f"{names} [{names} ...]"
    if isinstance(action.nargs, int):
        return " ".join([names] * action.nargs)
    return names


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:  # a positional: its name is its metavar
        return f"{_code(_metavar(action))} (positional, optional)" if action.nargs == "?" \
            else _code(_metavar(action))
    flags = ", ".join(_code(flag) for flag in action.option_strings)
    value = _metavar(action)
    return f"{flags} {_code(value)}" if value else flags


def _help(action: argparse.Action, prog: str) -> str:
    """The help text with argparse's %(name)s fields filled in, as --help shows it."""
    text = action.help or ""
    if "%" in text:
        fields: dict[str, Any] = {**vars(action), "prog": prog}
        if action.choices is not None:
            fields["choices"] = ", ".join(str(choice) for choice in action.choices)
        text = text % fields
    return _escape(text)


def _value(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _default(action: argparse.Action) -> str:
    if action.dest in MACHINE_DEFAULTS:  # the page must read the same on every machine
        return _escape(MACHINE_DEFAULTS[action.dest])
    value = action.default
    if action.nargs == 0 and isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return _code(" ".join(_value(item) for item in value)) if value else "none"
    return _code(_value(value))


def _choices(choices: Iterable[Any]) -> str:
    return "one of " + ", ".join(_code(str(choice)) for choice in choices)


def _domain(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "flag"
    if action.choices is not None:
        text = _choices(action.choices)
    elif isinstance(action.type, Domain):
        text = _escape(action.type.description)
    else:
        text = "text"
    if isinstance(action, argparse._AppendAction):  # argparse names no public append class
        return f"{text}; repeatable"
    if action.nargs == "?":
        return f"{text}; the value may be left out"
    if action.nargs in ("+", "*"):
        return f"{text}; one or more"
    if isinstance(action.nargs, int):
        return f"{action.nargs} values, each {text}"
    return text


def _exclusive(parser: argparse.ArgumentParser, actions: list[argparse.Action]) -> list[str]:
    """A line per mutually exclusive set of this group's flags."""
    lines = []
    for group in parser._mutually_exclusive_groups:  # no public accessor in argparse
        flags = [action.option_strings[0] for action in group._group_actions]
        if group._group_actions and group._group_actions[0] in actions:
            lines.append("At most one of " + ", ".join(_code(flag) for flag in flags) + ".")
    return lines


def cli_reference() -> str:
    """The Markdown of docs/cli.md: a title, how it is generated, then one table per group."""
    parser = get_args_parser()
    lines = ["# Command-line reference", "",
             f"Generated from the parser by `{GENERATE_COMMAND}`; do not edit it by hand.", "",
             "`python compress_classifier.py [DATASET_DIR] -a ARCH [options]`. The flags are "
             "grouped as `--help` shows them; a value outside its domain is refused with one "
             "line and exit status 2. A default of - means the flag is unset; its help says what "
             "applies then.", ""]
    for title, description, actions in option_groups(parser):
        lines += [f"## {title}", "", _escape(description), "",
                  "| flag | help | default | domain |", "|---|---|---|---|"]
        lines += [f"| {_flags(action)} | {_help(action, parser.prog)} | {_default(action)} | "
                  f"{_domain(action)} |" for action in actions]
        exclusive = _exclusive(parser, actions)
        lines += ["", *exclusive] if exclusive else []
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(cli_reference())
