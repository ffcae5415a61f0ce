"""`recalibrate_batch_norm`: re-estimate a model's batch-norm statistics in one's own loop
(after pruning, thinning, a new head or a short fine-tune), as the command line does."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from compressor.training.batchnorm import Recalibration
from compressor.training.batchnorm import recalibrate_batch_norm as _recalibrate
from compressor.utils.distributed import all_reduce_sum, is_distributed
from compressor.utils.errors import UsageError

__all__ = ["recalibrate_batch_norm", "Recalibration"]


def recalibrate_batch_norm(model: nn.Module, loader: Iterable[Any], num_batches: int = 20
                           ) -> Recalibration:
    """Recompute every batch norm's running statistics of `model` from `num_batches` batches
    of `loader` (training images; (inputs, targets) pairs or inputs alone).

    A cumulative average over the batches, with only the batch norms in train mode (dropout
    and QAT's observers stay in eval mode) and no gradients; under torchrun the ranks' results
    are averaged. The model's modes are restored afterwards. Returns what was re-estimated
    (layers, batches, images, seconds).
    """
    if not isinstance(model, nn.Module):
        raise UsageError(f"recalibrate_batch_norm: model is a {type(model).__name__}, not a "
                         "torch.nn.Module")
    if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 1:
        raise UsageError(f"recalibrate_batch_norm: num_batches={num_batches!r}; give a "
                         "positive number of batches (20 to 50 is usual)")
    if not isinstance(loader, Iterable):
        raise UsageError(f"recalibrate_batch_norm: loader is a {type(loader).__name__}; give "
                         "a DataLoader (or any iterable) of training batches")
    try:
        return _recalibrate(model, loader, num_batches,
                            reduce=all_reduce_sum if is_distributed() else None)
    except ValueError as exc:
        raise UsageError(f"recalibrate_batch_norm: {exc}; give a loader with batches") from None
