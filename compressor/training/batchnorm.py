"""Batch-norm re-estimation (adaptive batch norm, precise batch norm).

A batch norm's running statistics describe the model they were collected on. After pruning,
thinning, a new head, a short fine-tune or a change of dataset they describe another model,
and a network evaluated with them can predict one class while it scores well in train mode.
Re-estimating them from a few training batches (EagleEye's adaptive batch norm; pycls' precise
batch norm) makes eval-mode accuracy a faithful measure again.

The statistics are recomputed as a cumulative average over the batches (every batch weighs the
same), with only the batch norms in train mode (dropout and every quantization observer stay in
eval mode), without gradients; under torchrun each rank's averages are averaged across ranks,
so every rank ends with the same statistics.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from compressor.utils.progress import heartbeat

__all__ = ["Recalibration", "batch_norms", "recalibrate_batch_norm", "settle_steps",
           "recalibration_batches", "RECALIBRATION_IMAGES"]

BatchNorm = nn.modules.batchnorm._BatchNorm
Reduce = Callable[[Tensor], Tensor]
# The automatic re-estimations read about this many training images (pycls reads 8192 for
# ImageNet; EagleEye 50 batches): the statistics' sampling noise is then well below the
# difference between stale and fresh statistics.
RECALIBRATION_IMAGES = 1024
# A running statistic has settled once what it held before weighs less than this
SETTLED_WEIGHT = 0.01


@dataclass(frozen=True)
class Recalibration:
    """What one re-estimation did: batch norms updated, batches and images read, seconds."""

    norms: int
    batches: int
    images: int
    seconds: float

    def describe(self, reason: str) -> str:
        """One log line: what was re-estimated, on what, why and at what cost."""
        if self.norms == 0:
            return f"batch-norm statistics: none to re-estimate ({reason})"
        return (f"batch-norm statistics of {self.norms} layers re-estimated on {self.batches} "
                f"training batches ({self.images} images, {reason}) in {self.seconds:.1f}s")


def batch_norms(model: nn.Module) -> list[BatchNorm]:
    """The batch norms of `model` that keep running statistics (QAT's folded ones included)."""
    return [module for module in model.modules() if isinstance(module, BatchNorm)
            and module.track_running_stats and module.running_mean is not None]


def settle_steps(model: nn.Module) -> int:
    """Training steps after which every batch norm's running statistics have (nearly) forgotten
    their start: (1 - momentum)^steps < SETTLED_WEIGHT for the smallest momentum; 0 without
    batch norms, a very large number for a cumulative average (momentum None)."""
    momenta = [norm.momentum for norm in batch_norms(model)]
    if not momenta:
        return 0
    if any(momentum is None or momentum <= 0 for momentum in momenta):
        return 2**31 - 1
    smallest = min(float(momentum) for momentum in momenta)  # type: ignore[arg-type]
    if smallest >= 1.0:
        return 1
    return math.ceil(math.log(SETTLED_WEIGHT) / math.log(1.0 - smallest))


def recalibration_batches(batch_size: int, requested: int | None = None) -> int:
    """How many batches a re-estimation reads: `requested` (--bn-recalibrate N), else about
    RECALIBRATION_IMAGES images."""
    if requested is not None:
        return requested
    return max(1, math.ceil(RECALIBRATION_IMAGES / max(batch_size, 1)))


@contextmanager
def _only_norms_training(model: nn.Module, norms: list[BatchNorm]) -> Iterator[None]:
    """Every module in eval mode but the batch norms (dropout off, observers frozen); each
    module's mode restored afterwards."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    for norm in norms:
        norm.train()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _inputs_of(batch: Any) -> Any:
    """The inputs of a loader's batch: (inputs, targets) pairs or bare input tensors."""
    if isinstance(batch, (tuple, list)):
        return batch[0]
    return batch


@torch.no_grad()
def recalibrate_batch_norm(model: nn.Module, loader: Iterable[Any], num_batches: int,
                           device: torch.device | str | None = None,
                           reduce: Reduce | None = None,
                           seed: int | None = None) -> Recalibration:
    """Recompute every batch norm's running mean and variance of `model` from the first
    `num_batches` batches of `loader` (a cumulative average; see the module docstring).

    Args:
        model: any module; only its batch norms' running statistics change.
        loader: batches of (inputs, targets), or of inputs alone (training images).
        num_batches: how many batches to read (fewer if the loader has fewer), at least 1.
        device: where the inputs go (default: the model's parameters' device).
        reduce: a sum across processes (torchrun): the ranks' averages are averaged.
        seed: seeds torch's random numbers while reading (augmentations drawn in this
            process), restored afterwards, so a rerun or a resume re-estimates the same.
    Returns:
        What was re-estimated and at what cost.
    """
    if num_batches < 1:
        raise ValueError(f"num_batches must be at least 1, got {num_batches}")
    norms = batch_norms(model)
    started = time.perf_counter()
    if not norms:
        return Recalibration(0, 0, 0, 0.0)
    if device is None:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
    momenta = [norm.momentum for norm in norms]
    counts = [norm.num_batches_tracked.clone() if norm.num_batches_tracked is not None
              else None for norm in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # cumulative average: every batch weighs the same
    batches = images = 0
    fork_devices: list[int] = []
    try:
        with torch.random.fork_rng(devices=fork_devices, enabled=seed is not None), \
                _only_norms_training(model, norms):
            if seed is not None:
                torch.manual_seed(seed)
            for batch in heartbeat(loader, "re-estimating batch-norm statistics"):
                inputs = _inputs_of(batch).to(device, non_blocking=True)
                model(inputs)
                batches += 1
                images += int(inputs.shape[0])
                if batches >= num_batches:
                    break
    finally:
        for norm, momentum, count in zip(norms, momenta, counts, strict=True):
            norm.momentum = momentum
            if count is not None:
                norm.num_batches_tracked.copy_(count)
    if batches == 0:
        raise ValueError("the loader gave no batch to re-estimate batch-norm statistics on")
    if reduce is not None:
        _average_across_ranks(norms, reduce)
    return Recalibration(len(norms), batches, images, time.perf_counter() - started)


def _average_across_ranks(norms: list[BatchNorm], reduce: Reduce) -> None:
    """Every rank's statistics replaced by their mean over the ranks (one flat all-reduce)."""
    tensors = [t for norm in norms for t in (norm.running_mean, norm.running_var)]
    flat = torch.cat([t.reshape(-1).double() for t in tensors])
    ones = torch.ones(1, dtype=flat.dtype, device=flat.device)
    summed = reduce(torch.cat([flat, ones]))
    averaged = summed[:-1] / summed[-1]
    offset = 0
    for tensor in tensors:
        count = tensor.numel()
        tensor.copy_(averaged[offset:offset + count].view_as(tensor).to(tensor.dtype))
        offset += count
