"""The per-epoch reports of a training run: --tensorboard and --masks-sparsity.

compressor.training opens them before its epoch loop (so a missing tensorboard package stops
the run before any training) and calls `epoch_end` after each epoch. Only rank 0 (the one
with a run directory) writes or logs; the other ranks' reports do nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from torch import nn

from compressor.reports.sparsity import layer_sparsities, masks_sparsity_table, schedule_masks
from compressor.reports.tensorboard import (
    TensorBoardLog,
    compression_scalars,
    require_tensorboard,
    row_scalars,
    sparsity_scalars,
)
from compressor.utils.config import ReportConfig

__all__ = ["EpochReports", "open_epoch_reports", "TENSORBOARD_DIR"]

LOG = logging.getLogger("compressor")
TENSORBOARD_DIR = "tensorboard"


class EpochReports:
    """Reports written at the end of every epoch; a context manager that closes them."""

    def __init__(self, masks_sparsity: bool = False,
                 tensorboard: TensorBoardLog | None = None) -> None:
        self.masks_sparsity = masks_sparsity
        self.tensorboard = tensorboard

    def __enter__(self) -> EpochReports:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def epoch_end(self, epoch: int, row: Mapping[str, Any], model: nn.Module,
                  compression: Any = None) -> None:
        """Log the sparsity table and/or write the epoch's scalars (row: its metrics.csv row)."""
        if not self.masks_sparsity and self.tensorboard is None:
            return
        layers = layer_sparsities(model, schedule_masks(compression))
        if self.masks_sparsity:
            kind = "mask" if compression is not None else "weight"
            LOG.info("epoch %d: %s sparsity per layer\n%s", epoch, kind,
                     masks_sparsity_table(layers, with_masks=compression is not None))
        if self.tensorboard is not None:
            self.tensorboard.write(epoch, {**row_scalars(row), **sparsity_scalars(layers),
                                           **compression_scalars(compression)})

    def close(self) -> None:
        """Close the TensorBoard event file, if one is open."""
        if self.tensorboard is not None:
            self.tensorboard.close()


def open_epoch_reports(config: ReportConfig, run_dir: Path | None,
                       model: nn.Module) -> EpochReports:
    """The reports a run asked for; run_dir None (ranks other than 0) writes nothing.

    Args:
        config: which reports (--tensorboard, --masks-sparsity; --confusion is not per epoch).
        run_dir: the run directory on rank 0, None on the other ranks.
        model: the model being trained (unwrapped); its layers are read at each epoch's end.

    Raises:
        UsageError: --tensorboard without the tensorboard package, on every rank alike.
    """
    del model  # read at each epoch's end: thinning may reshape it between epochs
    writer_class = require_tensorboard() if config.tensorboard else None
    if run_dir is None:
        return EpochReports()
    tensorboard = None
    if writer_class is not None:
        tensorboard = TensorBoardLog(writer_class, run_dir / TENSORBOARD_DIR)
        LOG.info("TensorBoard scalars in %s", run_dir / TENSORBOARD_DIR)
    return EpochReports(masks_sparsity=config.masks_sparsity, tensorboard=tensorboard)
