"""Numbers as report tables print them: formatted once, on purpose, as text.

tabulate re-parses any cell that looks like a number and re-formats it with one format per
column (11,689,512 params would print as 1.16895e+07, a loss of 1723430.0 likewise), so tables
made of these strings pass disable_numparse=True and say their alignment themselves.
"""

from __future__ import annotations

import math

__all__ = ["integer", "significant", "percent", "fixed"]


def integer(value: float) -> str:
    """A count with thousands separators: 11,689,512."""
    return f"{round(value):,}"


def fixed(value: float, decimals: int = 2) -> str:
    """A value with a fixed number of decimals (accuracies in %: 76.13)."""
    return f"{value:,.{decimals}f}" if math.isfinite(value) else str(value)


def significant(value: float, digits: int = 4) -> str:
    """`digits` significant digits in positional notation, never scientific: 1.474,
    0.0001234, 1,723,430 (large values keep all their integer digits)."""
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    if abs(value) >= 10 ** (digits - 1):  # as many digits as the integer part has, no fraction
        return f"{value:,.0f}"
    rounded = float(f"{value:.{digits - 1}e}")  # 9.99996 -> 10.00, not 10.000
    magnitude = math.floor(math.log10(abs(rounded)))
    return f"{rounded:,.{max(digits - 1 - magnitude, 0)}f}"


def percent(fraction: float, decimals: int = 2) -> str:
    """A fraction as a percentage with fixed decimals: 0.5 -> 50.00."""
    return fixed(100.0 * fraction, decimals)
