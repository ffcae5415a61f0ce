"""The run directory: its creation (never over another run), log.txt, args.yaml, CSV and JSON."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from compressor.models.sources import arch_dir_name
from compressor.utils.atomic_io import atomic_write_text
from compressor.utils.errors import UsageError

__all__ = ["choose_run_dir", "logging_to", "write_args_yaml", "write_metrics_csv",
           "write_results_json"]

LOG_FORMAT = "%(asctime)s %(message)s"


def choose_run_dir(output_dir: str, name: str | None, arch: str,
                   resume_dir: Path | None = None) -> Path:
    """The run directory to use; refuses one that holds another run's files."""
    if name is None:
        stamp = time.strftime("%Y.%m.%d-%H%M%S")
        base = Path(output_dir) / f"{arch_dir_name(arch)}___{stamp}"
        candidate, suffix = base, 1
        while candidate.exists():  # two runs in the same second get distinct directories
            candidate, suffix = base.with_name(f"{base.name}-{suffix}"), suffix + 1
        return candidate
    run_dir = Path(output_dir) / name
    if resume_dir is not None and run_dir.resolve() == resume_dir.resolve():
        return run_dir  # continuing a run in its own directory
    if (run_dir / "checkpoint.pth.tar").exists() or (run_dir / "results.json").exists():
        raise UsageError(f"run directory {run_dir} already holds a run; choose another -n NAME "
                         f"or resume it with --resume-from {run_dir / 'checkpoint.pth.tar'}")
    return run_dir


@contextlib.contextmanager
def logging_to(run_dir: Path | None, is_main: bool) -> Iterator[logging.Logger]:
    """Log to stdout and run_dir/log.txt (rank 0 only) for the duration of a run."""
    logger = logging.getLogger("compressor")
    handlers: list[logging.Handler] = []
    if is_main:
        handlers.append(logging.StreamHandler(sys.stdout))
        if run_dir is not None:
            handlers.append(logging.FileHandler(run_dir / "log.txt"))
    for handler in handlers:
        handler.setFormatter(logging.Formatter(LOG_FORMAT, "%H:%M:%S"))
        logger.addHandler(handler)
    previous_level, previous_propagate = logger.level, logger.propagate
    logger.setLevel(logging.INFO if is_main else logging.WARNING)
    logger.propagate = False
    try:
        yield logger
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
            handler.close()
        logger.setLevel(previous_level)
        logger.propagate = previous_propagate


def write_args_yaml(run_dir: Path, args: Mapping[str, Any]) -> None:
    """The resolved arguments, as YAML (timm's args.yaml)."""
    atomic_write_text(run_dir / "args.yaml", yaml.safe_dump(dict(args), sort_keys=True))


def write_metrics_csv(run_dir: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """One row per completed epoch (the whole history, also after a resume)."""
    if not rows:
        return
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(run_dir / "metrics.csv", text.getvalue())


def write_results_json(run_dir: Path, results: Mapping[str, Any]) -> None:
    """The final metrics of the run."""
    atomic_write_text(run_dir / "results.json", json.dumps(dict(results), indent=2) + "\n")
