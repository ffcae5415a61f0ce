"""A run's directory and record, made one way for every command that writes one (training,
evaluation, budget runs, export): the directory chosen and made, the log opened with the lines
the run collected before it, args.yaml, and at the end results.json with the model's facts.

    with open_run(setup, ctx, arguments, class_names, output_dir=..., name=...) as opened:
        results = ...  # the command's work, writing under opened.writer_dir
        results = opened.finish(model, results)  # results.json (main rank), returned
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from compressor.assembly.setup import RunSetup
from compressor.commands.common import model_facts, run_record
from compressor.training.run_dir import (
    choose_run_dir,
    logging_to,
    write_args_yaml,
    write_results_json,
)
from compressor.utils.distributed import DistContext, barrier

__all__ = ["OpenRun", "open_run"]


@dataclass(frozen=True)
class OpenRun:
    """A run whose directory, log and args.yaml are in place."""

    run_dir: Path
    writer_dir: Path | None  # where this rank writes: the run directory on the main rank only
    record: dict[str, Any]  # the resolved arguments (args.yaml, the checkpoints' `args`)
    log: logging.Logger
    started: float

    def finish(self, model: nn.Module, results: Mapping[str, Any],
               first: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """results.json: the model's facts, `first`, the command's results and the run's time
        (written on the main rank only; the other ranks' results come back as they are)."""
        if self.writer_dir is None:
            return dict(results)
        merged = {**model_facts(model, self.run_dir), **(first or {}), **results,
                  "time": time.perf_counter() - self.started}
        write_results_json(self.run_dir, merged)
        return merged


@contextmanager
def open_run(setup: RunSetup, ctx: DistContext, arguments: Mapping[str, Any],
             class_names: Sequence[str], *, output_dir: str, name: str | None,
             resume_dir: Path | None = None, notes: Sequence[str | None] = (),
             started: float | None = None) -> Iterator[OpenRun]:
    """Choose and make the run directory (the resumed run's own when `resume_dir`), open its
    log with the run directory, the pretrained weights' source and `notes`, and write
    args.yaml; every rank agrees on the directory before any writes in it."""
    run_dir = choose_run_dir(output_dir, name, setup.arch, resume_dir)
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    barrier()
    record = run_record(arguments, setup, tuple(class_names))
    writer_dir = run_dir if ctx.is_main else None
    with logging_to(writer_dir, ctx.is_main) as log:
        log.info("run directory %s", run_dir)
        if setup.model.pretrained_source is not None:
            log.info("%s", setup.model.pretrained_source.describe())
        for note in notes:
            if note is not None:
                log.info("%s", note)
        if ctx.is_main:
            write_args_yaml(run_dir, record)
        yield OpenRun(run_dir, writer_dir, record, log,
                      time.perf_counter() if started is None else started)
