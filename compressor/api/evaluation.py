"""`evaluate`: top-1, top-5 and loss of a model on a loader, as the command line measures them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from compressor.api.identity import check_module, model_device
from compressor.training.loop import evaluate as evaluate_loop

__all__ = ["evaluate"]


def evaluate(model: nn.Module, loader: Iterable[Any],
             device: torch.device | str | None = None) -> dict[str, float]:
    """Evaluate `model` in eval mode on `loader`'s (inputs, targets) batches.

    Args:
        model: a classifier (float, thinned or int8).
        loader: batches of (inputs, targets), e.g. a DataLoader.
        device: where to compute; by default where the model's tensors are.

    Returns:
        `top1` and `top5` (percent; top5 only with more than 5 classes), `loss` (mean
        cross-entropy) and `samples`: what compress_to_budget's evaluate_fn returns.
    """
    check_module(model, "evaluate")
    where = torch.device(device) if device is not None else model_device(model)
    return evaluate_loop(model, loader, where, desc="evaluate")
