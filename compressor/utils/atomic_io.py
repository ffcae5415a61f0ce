"""Atomic file writes: every file the project writes goes to a temporary file beside its target,
is fsynced, then renamed into place, so a crash never leaves a half-written file."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["atomic_write", "atomic_write_text", "atomic_duplicate"]


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], None]) -> None:
    """Call `write(handle)` on a temporary file beside `path`, fsync it, rename it into place."""
    _publish(Path(path), lambda tmp: _write_synced(tmp, write))


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write a UTF-8 text file atomically."""
    atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))


def atomic_duplicate(source: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Make `path` hold `source`'s bytes: a hard link where the file system has them, else a copy.

    The link costs no disk; it stays right because every write here replaces its file with a
    new one instead of writing into it, so `path` keeps the bytes it was given.
    """
    def link_or_copy(tmp: Path) -> None:
        try:
            os.link(source, tmp)
        except OSError:
            _write_synced(tmp, lambda handle: _copy_into(source, handle))

    _publish(Path(path), link_or_copy)


def _publish(path: Path, create: Callable[[Path], None]) -> None:
    """Have `create` make the file at a temporary name beside `path`, rename it into place and
    fsync the directory; the temporary file never outlives a failure."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)  # a crashed run's leftover would stop os.link
    try:
        create(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _write_synced(tmp: Path, write: Callable[[IO[bytes]], None]) -> None:
    with open(tmp, "wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())


def _copy_into(source: str | os.PathLike[str], handle: IO[bytes]) -> None:
    with open(source, "rb") as source_handle:
        shutil.copyfileobj(source_handle, handle)
