"""Atomic file writes: every file the project writes goes to a temporary file beside its target,
is fsynced, then renamed into place, so a crash never leaves a half-written file."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["atomic_write", "atomic_write_text"]


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], None]) -> None:
    """Call `write(handle)` on a temporary file beside `path`, fsync it, rename it into place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write a UTF-8 text file atomically."""
    atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))
