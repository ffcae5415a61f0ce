"""Argument domains for argparse: finite reals in an interval, integers in a range."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["INT_MAX", "finite", "real", "integer"]

INT_MAX = 2**31 - 1  # counts (batch size, epochs, print frequency, GPU index)


def finite(text: str) -> float:
    """An argparse type: a finite float."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text[:40]}' is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def real(low: float | None, high: float | None, *, low_open: bool = False,
         high_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite float in the given interval (bounds None are unbounded)."""
    if low is not None and high is not None:
        domain = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low is not None:
        domain = f"{'>' if low_open else '>='} {low:g}"
    else:
        domain = "finite"

    def parse(text: str) -> float:
        value = finite(text)
        below = low is not None and (value <= low if low_open else value < low)
        above = high is not None and (value >= high if high_open else value > high)
        if below or above:
            raise argparse.ArgumentTypeError(f"must be a number {domain}, got {text}")
        return value

    return parse


def integer(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in low..high (both included)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text[:40]}' is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer in {low}..{high}, "
                                             f"got {text[:40]}")
        return value

    return parse
