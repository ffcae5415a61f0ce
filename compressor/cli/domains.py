"""Argument domains for argparse: each type callable also says, in words, what it accepts (the
CLI reference's domain column reads it), so a flag's check and its documentation are one object."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["INT_MAX", "Domain", "finite", "real", "integer", "reals", "positive_reals",
           "gpu_list", "input_size", "path"]

INT_MAX = 2**31 - 1  # counts (batch size, epochs, print frequency, GPU index)

T = TypeVar("T")


@dataclass(frozen=True)
class Domain(Generic[T]):
    """An argparse type: `parse` turns the text into a value (argparse.ArgumentTypeError if it
    is out of the domain) and `description` says in words what it accepts."""

    parse: Callable[[str], T]
    description: str

    def __call__(self, text: str) -> T:
        return self.parse(text)


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
         high_open: bool = False) -> Domain[float]:
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

    return Domain(parse, "real" if low is None else f"real {domain}")


def integer(low: int, high: int) -> Domain[int]:
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

    return Domain(parse, f"integer in [{low}, {high}]")


def _reals(text: str) -> tuple[float, ...]:
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"'{text[:40]}' is not a comma-separated list of "
                                         "numbers, e.g. 0.5,0.5,0.5")
    return tuple(finite(part) for part in parts)


def _positive_reals(text: str) -> tuple[float, ...]:
    values = _reals(text)
    if any(value <= 0.0 for value in values):
        raise argparse.ArgumentTypeError(f"must be numbers > 0, got {text[:40]}")
    return values


_GPU_INDEX = integer(0, INT_MAX)


def _gpu_list(text: str) -> list[int]:
    try:
        gpus = [_GPU_INDEX(part.strip()) for part in text.split(",") if part.strip()]
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (expected comma-separated GPU indices, "
                                         "e.g. 0,1)") from None
    if not gpus:
        raise argparse.ArgumentTypeError("expected comma-separated GPU indices, e.g. 0,1")
    if len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"{text} lists a GPU twice; list each GPU once")
    return gpus


_CHANNELS = integer(1, 4)
_SIDE = integer(1, 4096)


def _input_size(text: str) -> tuple[int, int, int]:
    parts = text.split(",")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"'{text[:40]}' is not C,H,W (e.g. 3,224,224)")
    channels = _CHANNELS(parts[0].strip())
    height, width = (_SIDE(part.strip()) for part in parts[1:])
    if height != width:
        raise argparse.ArgumentTypeError(f"{height}x{width} is not square; give C,S,S")
    return channels, height, width


reals = Domain(_reals, "comma-separated reals")
positive_reals = Domain(_positive_reals, "comma-separated reals > 0")
gpu_list = Domain(_gpu_list, "comma-separated distinct integers in [0, 2147483647]")
input_size = Domain(_input_size, "C,H,W with C in [1, 4] and H = W in [1, 4096]")
# a file or directory name, kept as text: where it must exist, the command says so when it reads
path = Domain(str, "path")
