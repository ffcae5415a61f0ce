"""Progress of a long step: a bar on a terminal, and a log line at least every 10 s elsewhere
(logs, CI, a notebook's captured output), so that no step runs silent for minutes."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from tqdm import tqdm

__all__ = ["PROGRESS_SECONDS", "progress", "heartbeat"]

LOG = logging.getLogger("compressor")
PROGRESS_SECONDS = 10.0  # the longest a step goes without a line
T = TypeVar("T")


def _length(items: Iterable[Any]) -> int | None:
    try:
        return len(items)  # type: ignore[arg-type]
    except TypeError:
        return None


def heartbeat(items: Iterable[T], desc: str, every: float = PROGRESS_SECONDS,
              unit: str = "batches") -> Iterator[T]:
    """`items`, logging "desc: i/n unit, t s" whenever `every` seconds passed since the last
    line (nothing for a step shorter than that)."""
    total = _length(items)
    start = last = time.perf_counter()
    for index, item in enumerate(items):
        yield item
        now = time.perf_counter()
        if now - last >= every:
            done = f"{index + 1}/{total}" if total is not None else f"{index + 1}"
            LOG.info("%s: %s %s, %.0f s", desc, done, unit, now - start)
            last = now


def progress(items: Iterable[T], desc: str, unit: str = "batches") -> Iterable[T]:
    """A progress bar on a terminal, else heartbeat lines."""
    if sys.stderr.isatty():
        return tqdm(items, desc=desc, leave=False, dynamic_ncols=True)
    return heartbeat(items, desc, unit=unit)
