"""Batch-norm re-estimation in a run: which training batches it reads, and when an epoch's
running statistics went stale (compressor.training.batchnorm does the re-estimating)."""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from compressor.training.batchnorm import (
    Recalibration,
    recalibrate_batch_norm,
    recalibration_batches,
    settle_steps,
)
from compressor.training.best import parameter_counts
from compressor.training.dataloaders import epoch_seed, train_loader
from compressor.utils.config import TrainConfig
from compressor.utils.distributed import DistContext, all_reduce_sum

__all__ = ["Recalibrator", "recalibrator", "Fingerprint", "fingerprint", "pruned_since",
           "stale_reason", "RECALIBRATION_SEED_OFFSET"]

LOG = logging.getLogger("compressor")
# batch-norm re-estimations read the training split in an order of their own (seed + this)
RECALIBRATION_SEED_OFFSET = 7_777


class Recalibrator:
    """Re-estimates a model's batch-norm statistics on training batches (see
    compressor.training.batchnorm): the same batches for the same tag, on every rank."""

    def __init__(self, dataset: Any, batch_size: int, workers: int, seed: int,
                 ctx: DistContext, requested: int | None) -> None:
        self.dataset, self.batch_size, self.workers = dataset, batch_size, workers
        self.seed, self.ctx = seed + RECALIBRATION_SEED_OFFSET, ctx
        self.requested = requested
        self.batches = recalibration_batches(batch_size, requested)

    @property
    def enabled(self) -> bool:
        """False with --bn-recalibrate 0."""
        return self.requested != 0

    def __call__(self, model: nn.Module, reason: str, tag: int = 0, log: bool = True
                 ) -> Recalibration | None:
        """Re-estimate `model`'s statistics (logged with `reason` if `log`); None when turned
        off."""
        if not self.enabled:
            return None
        loader = train_loader(self.dataset, self.batch_size, self.workers, self.seed, tag,
                              self.ctx)
        done = recalibrate_batch_norm(model, loader, self.batches, self.ctx.device,
                                      reduce=all_reduce_sum if self.ctx.enabled else None,
                                      seed=epoch_seed(self.seed, tag, self.ctx.rank))
        if done.norms and log:
            LOG.info("%s", done.describe(reason))
        return done


def recalibrator(dataset: Any, config: TrainConfig, seed: int, ctx: DistContext
                 ) -> Recalibrator:
    """The run's batch-norm re-estimation on `dataset` (its training split)."""
    return Recalibrator(dataset, config.loader.batch_size, config.loader.workers, seed, ctx,
                        config.bn_recalibrate)


Fingerprint = tuple[tuple[tuple[int, ...], ...], tuple[int, int]]


def fingerprint(model: nn.Module) -> Fingerprint:
    """What changes when pruning or thinning changes the model: parameter shapes, and the
    (non-zero, total) parameter counts that also rank the best epoch."""
    return tuple(tuple(param.shape) for param in model.parameters()), parameter_counts(model)


def pruned_since(before: Fingerprint, after: Fingerprint) -> bool:
    """Whether thinning changed a shape or pruning zeroed more weights from `before` to
    `after`."""
    return after[0] != before[0] or after[1][0] < before[1][0]


def stale_reason(model: nn.Module, config: TrainConfig, steps: int, changed: bool,
                  last_of_fine_tune: bool) -> str | None:
    """Why the running statistics need re-estimating after an epoch (None: they do not)."""
    if config.bn_recalibrate == 0:
        return None
    if config.bn_recalibrate is not None:
        return "--bn-recalibrate"
    if changed:
        return "the model was pruned or thinned this epoch"
    settle = settle_steps(model)
    if steps < settle:
        return f"{steps} steps are too few for running statistics to settle ({settle})"
    if last_of_fine_tune:
        return "the end of a fine-tune from pretrained weights"
    return None
