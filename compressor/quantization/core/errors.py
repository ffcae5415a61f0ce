"""The typed error of the quantization package (the command line turns it into exit status 2)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from compressor.utils.errors import CompressorError

__all__ = ["QuantizationError", "MissingStatisticsError", "shown", "unknown_choice"]


class QuantizationError(CompressorError):
    """Bad quantization settings or statistics: one line naming the problem and the fix."""

    def __init__(self, message: str) -> None:
        # one line, whatever the pieces it was built from contained
        super().__init__(" ".join(str(message).split()))


class MissingStatisticsError(QuantizationError):
    """The activation statistics lack a range a quantized layer needs (callers that hold other
    ranges, such as QAT's conversion, calibrate for it)."""


def shown(value: Any, limit: int = 80) -> str:
    """A short one-line repr of a user's value for an error message."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def unknown_choice(what: str, value: Any, choices: Iterable[str]) -> QuantizationError:
    """The error for a name that matches none of `choices`, suggesting the closest one."""
    names = list(choices)
    close = difflib.get_close_matches(str(value).lower(), [n.lower() for n in names], n=1)
    hint = ""
    if close:
        hint = f" (did you mean '{next(n for n in names if n.lower() == close[0])}'?)"
    return QuantizationError(f"unknown {what} {shown(value)}{hint}; use one of {', '.join(names)}")
