"""The training and evaluation loops: small functions that know nothing of YAML or files."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from compressor.training.losses import LossFn, main_logits
from compressor.utils.precision import Precision
from compressor.utils.progress import progress

__all__ = ["TrainHooks", "NoHooks", "MetricSums", "reports_top5", "count_correct",
           "train_one_epoch", "evaluate"]

LOG = logging.getLogger("compressor")

Reduce = Callable[[Tensor], Tensor]


class TrainHooks(Protocol):
    """The minibatch callbacks of Distiller's CompressionScheduler, called by train_one_epoch
    (compressor.schedule.CompressionScheduler is one, with Distiller's signatures)."""

    def on_minibatch_begin(self, epoch: int, minibatch_id: int,
                           minibatches_per_epoch: int) -> None: ...

    def before_backward_pass(self, epoch: int, minibatch_id: int, minibatches_per_epoch: int,
                             loss: Tensor) -> Tensor: ...

    def before_parameter_optimization(self, epoch: int, minibatch_id: int,
                                      minibatches_per_epoch: int) -> None: ...

    def on_minibatch_end(self, epoch: int, minibatch_id: int,
                         minibatches_per_epoch: int) -> None: ...


class NoHooks:
    """Hooks that do nothing: plain training."""

    def on_minibatch_begin(self, epoch: int, minibatch_id: int,
                           minibatches_per_epoch: int) -> None:
        """Nothing to do."""

    def before_backward_pass(self, epoch: int, minibatch_id: int, minibatches_per_epoch: int,
                             loss: Tensor) -> Tensor:
        """The loss itself: no extra term."""
        return loss

    def before_parameter_optimization(self, epoch: int, minibatch_id: int,
                                      minibatches_per_epoch: int) -> None:
        """Nothing to do."""

    def on_minibatch_end(self, epoch: int, minibatch_id: int,
                         minibatches_per_epoch: int) -> None:
        """Nothing to do."""


def reports_top5(num_classes: int) -> bool:
    """Whether top-5 accuracy says anything: with 5 classes or fewer it is always 100 %, so the
    metrics (and every table, CSV and JSON made of them) leave it out."""
    return num_classes > 5


def count_correct(logits: Tensor, target: Tensor, topk: tuple[int, ...] = (1, 5)) -> list[Tensor]:
    """Number of samples whose target is among the top-k predictions, for each k."""
    maxk = min(max(topk), logits.shape[1])
    hits = logits.topk(maxk, dim=1).indices.eq(target.unsqueeze(1))
    return [hits[:, :min(k, maxk)].any(dim=1).sum() for k in topk]


class MetricSums:
    """Sums of loss, top-1/top-5 hits and samples; reduced across processes before reading."""

    def __init__(self, device: torch.device) -> None:
        self.sums = torch.zeros(4, dtype=torch.float64, device=device)
        self.num_classes: int | None = None  # the model's outputs, known from the first batch

    def update(self, logits: Tensor, target: Tensor, loss: Tensor) -> None:
        """Add one batch."""
        self.num_classes = logits.shape[1]
        top1, top5 = count_correct(logits.detach(), target)
        batch = target.shape[0]
        self.sums += torch.stack([loss.detach().double() * batch, top1.double(), top5.double(),
                                  torch.tensor(batch, dtype=torch.float64, device=target.device)])

    def result(self, reduce: Reduce | None = None) -> dict[str, float]:
        """loss (mean), top1 and top5 (percent; top5 only where reports_top5) and samples,
        summed over all processes."""
        sums = reduce(self.sums.clone()) if reduce is not None else self.sums
        loss, top1, top5, samples = sums.tolist()
        samples = max(samples, 1.0)
        metrics = {"loss": loss / samples, "top1": 100.0 * top1 / samples,
                   "top5": 100.0 * top5 / samples, "samples": int(samples)}
        if self.num_classes is not None and not reports_top5(self.num_classes):
            del metrics["top5"]
        return metrics


def _to_device(batch: tuple[Tensor, Tensor], device: torch.device,
               precision: Precision) -> tuple[Tensor, Tensor]:
    inputs, target = batch
    inputs = precision.inputs(inputs.to(device, non_blocking=True))
    return inputs, target.to(device, non_blocking=True)


def _step(total: Tensor, optimizer: torch.optim.Optimizer, hooks: TrainHooks,
          scaler: torch.amp.GradScaler | None, where: tuple[int, int, int]) -> None:
    """Backward and the optimizer step; with a gradient scaler (fp16) the hooks see unscaled
    gradients, and a step the scaler skips (inf/NaN gradients) leaves the weights as they were
    (the masks the schedule re-applies after it keep pruned weights at zero either way)."""
    optimizer.zero_grad(set_to_none=True)
    if scaler is None:
        total.backward()
        hooks.before_parameter_optimization(*where)
        optimizer.step()
        return
    scaler.scale(total).backward()
    scaler.unscale_(optimizer)
    hooks.before_parameter_optimization(*where)
    scaler.step(optimizer)
    scaler.update()


def train_one_epoch(model: nn.Module, loader: Iterable[Any], loss_fn: LossFn,
                    optimizer: torch.optim.Optimizer, device: torch.device, epoch: int,
                    hooks: TrainHooks | None = None, print_freq: int = 0,
                    reduce: Reduce | None = None, precision: Precision | None = None,
                    scaler: torch.amp.GradScaler | None = None) -> dict[str, float]:
    """Train for one epoch; returns loss, top1, top5 (main head; see reports_top5), samples,
    wall and CPU seconds.

    `precision`: the forward pass and its loss (a teacher's too) under autocast, inputs in its
    memory format; regularizers' terms, the optimizer and the masks stay fp32. `scaler`: fp16's
    gradient scaler (Precision.grad_scaler), kept by the caller across epochs.
    """
    hooks = hooks or NoHooks()
    precision = precision or Precision()
    model.train()
    sums = MetricSums(device)
    batches = len(loader)  # type: ignore[arg-type]
    start, start_cpu = time.perf_counter(), time.process_time()
    for batch_idx, batch in enumerate(progress(loader, f"epoch {epoch}")):
        inputs, target = _to_device(batch, device, precision)
        hooks.on_minibatch_begin(epoch, batch_idx, batches)
        with precision.autocast(device):
            output = model(inputs)
            loss = loss_fn(output, target).float()
        total = hooks.before_backward_pass(epoch, batch_idx, batches, loss)  # + regularizers
        _step(total, optimizer, hooks, scaler, (epoch, batch_idx, batches))
        hooks.on_minibatch_end(epoch, batch_idx, batches)
        sums.update(main_logits(output), target, loss)
        if print_freq and (batch_idx + 1) % print_freq == 0:
            LOG.info("epoch %d [%d/%d] loss %.4f", epoch, batch_idx + 1, batches, loss.item())
    metrics = sums.result(reduce)
    metrics["time"] = time.perf_counter() - start
    metrics["cpu_time"] = time.process_time() - start_cpu
    return metrics


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable[Any], device: torch.device,
             reduce: Reduce | None = None, desc: str = "eval",
             precision: Precision | None = None) -> dict[str, float]:
    """Evaluate in eval mode (under `precision`'s autocast and memory format, as trained);
    returns cross-entropy loss, top1, top5 (see reports_top5) and samples."""
    precision = precision or Precision()
    model.eval()
    sums = MetricSums(device)
    for batch in progress(loader, desc):
        inputs, target = _to_device(batch, device, precision)
        with precision.autocast(device):
            logits = main_logits(model(inputs))
        logits = logits.float()
        sums.update(logits, target, F.cross_entropy(logits, target))
    return sums.result(reduce)
