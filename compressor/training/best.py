"""The best epoch of a run: what best.pth.tar holds and what later steps start from.

As in Distiller, an epoch beats another by being more compressed first (fewer non-zero
parameters, then fewer parameters: a thinned epoch beats the masked one it came from) and by
validation top-1 second: during gradual pruning the early, denser epochs score higher, and
the model handed over must be the compressed one. For a run that compresses nothing this is
the epoch of highest validation top-1.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from compressor.training.checkpoint import load_checkpoint
from compressor.utils.errors import CompressorError

__all__ = ["BestEpoch", "parameter_counts"]

LOG = logging.getLogger("compressor")
Key = tuple[float, float, float]


def parameter_counts(model: nn.Module) -> tuple[int, int]:
    """(non-zero parameters, parameters) of `model`."""
    with torch.no_grad():
        nonzero = sum(int(param.count_nonzero()) for param in model.parameters())
    return nonzero, sum(param.numel() for param in model.parameters())


def _key(row: Mapping[str, Any]) -> Key:
    """The ranking of one epoch's metrics row (larger is better)."""
    if "nonzero_params" not in row:  # a row written before the counts were: top-1 alone
        return (-math.inf, -math.inf, float(row["val_top1"]))
    return (-float(row["nonzero_params"]), -float(row["params"]), float(row["val_top1"]))


class BestEpoch:
    """Tracks the best epoch (see the module docstring) and, if asked, keeps its weights to
    hand them over at the end of the run."""

    def __init__(self, history: Sequence[Mapping[str, Any]], best_epoch: int,
                 keep_weights: bool) -> None:
        row = next((r for r in history if r.get("epoch") == best_epoch), None)
        self.epoch = best_epoch
        self.top1 = float(row["val_top1"]) if row is not None else -math.inf
        self.key: Key | None = _key(row) if row is not None else None
        self.keep_weights = keep_weights
        self.weights: dict[str, torch.Tensor] | None = None

    def update(self, row: Mapping[str, Any], model: nn.Module) -> bool:
        """Whether the epoch of `row` is the new best (its weights kept if asked)."""
        key = _key(row)
        if self.key is not None and key < self.key:  # a tie goes to the later epoch
            return False
        self.key, self.epoch, self.top1 = key, int(row["epoch"]), float(row["val_top1"])
        if self.keep_weights:
            self.weights = {name: tensor.detach().to("cpu", copy=True)
                            for name, tensor in model.state_dict().items()}
        return True

    def restore(self, model: nn.Module, last_epoch: int, checkpoint_dir: Path | None) -> int:
        """Load the best epoch's weights into `model` when it is not the last one; returns the
        epoch whose weights `model` now holds. Weights of an epoch before a resume are read
        from best.pth.tar beside the checkpoint resumed from."""
        if self.epoch < 0 or self.epoch == last_epoch:
            return last_epoch
        weights = self.weights
        if weights is None and checkpoint_dir is not None:
            weights = _best_file_weights(checkpoint_dir / "best.pth.tar", self.epoch)
        if weights is None or not _same_shapes(model, weights):
            LOG.info("the best epoch's weights (epoch %d) are not at hand; the last epoch's "
                     "(%d) are used", self.epoch, last_epoch)
            return last_epoch
        model.load_state_dict(weights)
        LOG.info("the best epoch's weights (epoch %d, val top1 %.2f) are the run's model, not "
                 "the last epoch's (%d)", self.epoch, self.top1, last_epoch)
        return self.epoch


def _same_shapes(model: nn.Module, weights: Mapping[str, torch.Tensor]) -> bool:
    own = model.state_dict()
    return own.keys() == weights.keys() and all(
        own[name].shape == weights[name].shape for name in own)


def _best_file_weights(path: Path, epoch: int) -> dict[str, torch.Tensor] | None:
    """The state dict of best.pth.tar if it holds `epoch`, else None."""
    if not path.is_file():
        return None
    try:
        checkpoint = load_checkpoint(path)
    except CompressorError:  # unreadable: the last epoch's weights are used instead
        return None
    if checkpoint.get("epoch") != epoch:
        return None
    state = checkpoint.get("state_dict")
    return dict(state) if isinstance(state, Mapping) else None
