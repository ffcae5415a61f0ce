"""One error boundary for the dataset files a user names: any failure becomes one DataError line."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from compressor.utils.errors import CompressorError, DataError

__all__ = ["reading", "one_line_reason"]


def one_line_reason(exc: BaseException) -> str:
    """The exception's message squeezed onto one line (its type name when it has none)."""
    text = " ".join(str(exc).split())
    if len(text) > 200:
        text = text[:197] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextmanager
def reading(path: Path, what: str) -> Iterator[None]:
    """Turn any failure while reading or parsing `path` into a DataError that names it.

    Our own typed errors pass through unchanged: they already say what is wrong with the file.
    Damaged files make parsers raise anything (OSError, EOFError, zlib.error, ValueError,
    IndexError, MemoryError, RecursionError ...), so everything else is caught here.
    """
    try:
        yield
    except CompressorError:
        raise
    except Exception as exc:
        raise DataError(f"cannot read {what} {path} ({one_line_reason(exc)}); replace it with an "
                        "intact copy") from None
