"""`evaluate`: top-1, top-5 and loss of a model on a loader, as the command line measures them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from compressor.api.identity import check_module, model_device
from compressor.training.loop import evaluate as evaluate_loop
from compressor.utils.errors import UsageError
from compressor.utils.precision import AMP_DTYPES, Precision

__all__ = ["evaluate"]


def evaluate(model: nn.Module, loader: Iterable[Any],
             device: torch.device | str | None = None, amp: str | None = None
             ) -> dict[str, float]:
    """Evaluate `model` in eval mode on `loader`'s (inputs, targets) batches.

    Args:
        model: a classifier (float, thinned or int8).
        loader: batches of (inputs, targets), e.g. a DataLoader.
        device: where to compute; by default where the model's tensors are.
        amp: "bf16" or "fp16" to evaluate under autocast in that dtype, as a model trained
            with --amp is validated (bf16 runs on the CPU too); None: fp32.

    Returns:
        `top1` and `top5` (percent; top5 only with more than 5 classes), `loss` (mean
        cross-entropy) and `samples`: what compress_to_budget's evaluate_fn returns.
    """
    check_module(model, "evaluate")
    if amp is not None and amp not in AMP_DTYPES:
        raise UsageError(f"evaluate: amp is {amp!r}; use one of "
                         f"{', '.join(map(repr, AMP_DTYPES))}, or None for fp32")
    where = torch.device(device) if device is not None else model_device(model)
    return evaluate_loop(model, _checked_batches(loader), where, desc="evaluate",
                         precision=Precision(amp=amp))


def _checked_batches(loader: Iterable[Any]) -> Iterator[tuple[Tensor, Tensor]]:
    """`loader`'s batches, each checked to be an (inputs, targets) pair of tensors."""
    try:
        batches = iter(loader)
    except TypeError:
        raise UsageError(f"evaluate: the loader is of type {type(loader).__name__}, not an "
                         "iterable of batches; pass a DataLoader or a list of (inputs, "
                         "targets) batches") from None
    count = 0
    for batch in batches:
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2
                and all(isinstance(part, Tensor) for part in batch)):
            shown = (f"a {type(batch).__name__} of {len(batch)} items"
                     if isinstance(batch, (tuple, list)) else f"of type {type(batch).__name__}")
            raise UsageError(f"evaluate: batch {count} of the loader is {shown}, not an "
                             "(inputs, targets) pair of tensors; give a loader of labelled "
                             "batches, as a DataLoader over an ImageFolder yields")
        count += 1
        yield batch[0], batch[1]
    if count == 0:
        raise UsageError("evaluate: the loader is empty; give it the held-out batches")
