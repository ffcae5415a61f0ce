"""Policies: when (which epochs) an instance acts, and what it does at each training callback."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from compressor.pruning import Pruner, PruneStep
from compressor.regularization import Regularizer
from compressor.schedule.lr import end_of_epoch

__all__ = ["Window", "PruningOptions", "Policy", "PruningPolicy", "RegularizationPolicy",
           "LRPolicy", "ExtensionPolicy", "QuantizationPolicy"]


class CompressionScheduler(Protocol):
    """What a policy uses of the scheduler that calls it (compressor.schedule.scheduler)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    seed: int
    params: dict[str, Tensor]

    def masks_changed(self) -> None:
        """A policy's masks changed: the effective masks are recomputed."""
        ...

    def apply_masks(self) -> None:
        """Multiply every masked parameter by its effective mask."""
        ...

    def parameters_replaced(self) -> None:
        """The model's parameters were replaced (thinning): re-read them."""
        ...


@dataclass(frozen=True)
class Window:
    """The epochs of a policy: an explicit list, or range(starting_epoch, ending_epoch, freq)."""

    epochs: frozenset[int]
    starting_epoch: int
    ending_epoch: int
    frequency: int

    @classmethod
    def from_range(cls, start: int, end: int, frequency: int) -> Window:
        """Distiller's range: the ending epoch is excluded."""
        return cls(frozenset(range(start, end, frequency)), start, end, frequency)

    @classmethod
    def from_list(cls, epochs: list[int]) -> Window:
        """An explicit list of epochs."""
        return cls(frozenset(epochs), min(epochs), max(epochs) + 1, 1)

    @property
    def last_epoch(self) -> int:
        """The last epoch in which the policy acts."""
        return max(self.epochs)


@dataclass(frozen=True)
class PruningOptions:
    """Distiller's per-policy pruning arguments."""

    keep_mask: bool = False
    mini_batch_pruning_frequency: int = 0
    mask_on_forward_only: bool = False
    use_double_copies: bool = False
    mask_gradients: bool = False
    discard_masks_at_minibatch_end: bool = False
    fold_batchnorm: bool = False
    skip_first_minibatch: bool = False


class Policy:
    """Base: does nothing at every callback; subclasses override what they need."""

    kind = "policy"

    def __init__(self, instance_name: str, window: Window) -> None:
        self.instance_name = instance_name
        self.window = window

    def on_epoch_begin(self, sched: CompressionScheduler, epoch: int) -> None:
        """Start of an active epoch."""

    def on_minibatch_begin(self, sched: CompressionScheduler, epoch: int, batch: int,
                           batches: int) -> None:
        """Before the forward pass."""

    def before_backward_pass(self, sched: CompressionScheduler) -> Tensor | None:
        """An extra loss term, or None."""
        return None

    def before_parameter_optimization(self, sched: CompressionScheduler) -> None:
        """After backward, before the optimizer step."""

    def on_minibatch_end(self, sched: CompressionScheduler, epoch: int, batch: int,
                         batches: int) -> None:
        """After the optimizer step (the scheduler has re-applied the masks)."""

    def on_epoch_end(self, sched: CompressionScheduler, epoch: int,
                     metrics: Mapping[str, float] | None) -> None:
        """End of an active epoch."""

    def masks(self) -> Mapping[str, Tensor]:
        """Masks this policy holds that must be enforced after every optimizer step."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Plain values and tensors."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any], sched: CompressionScheduler) -> None:
        """Restore what state_dict returned."""


def _to_device(masks: Mapping[str, Tensor], sched: CompressionScheduler) -> dict[str, Tensor]:
    return {name: mask.to(sched.params[name].device, sched.params[name].dtype)
            for name, mask in masks.items() if name in sched.params}


class PruningPolicy(Policy):
    """Masks from a pruner at each active epoch (and every N minibatches if asked).

    Masks are enforced in place after every optimizer step. With mask_on_forward_only the
    weights are masked before each forward pass but not after the optimizer step, so pruned
    weights can recover (splicing, DropFilter); with use_double_copies too, the dense values are
    put back before the optimizer step (Distiller's two copies). keep_mask makes the last such
    mask permanent at the policy's end. skip_first_minibatch computes the policy's first masks
    at the second minibatch of its first epoch instead of at the epoch's start.
    """

    kind = "pruner"

    def __init__(self, pruner: Pruner, window: Window, options: PruningOptions) -> None:
        super().__init__(pruner.name, window)
        self.pruner = pruner
        self.options = options
        self.forward_only = options.mask_on_forward_only
        self.own: dict[str, Tensor] = {}
        self.dense: dict[str, Tensor] = {}

    def _step(self, sched: CompressionScheduler, epoch: int, batch: int = 0) -> PruneStep:
        window = self.window
        return PruneStep(epoch, window.starting_epoch, window.ending_epoch, window.frequency,
                         sched.model, self.own, self.options.fold_batchnorm,
                         seed=sched.seed, minibatch=batch)

    def _update(self, sched: CompressionScheduler, epoch: int, batch: int = 0) -> None:
        self.own = self.pruner.compute_masks(sched.params, self._step(sched, epoch, batch))
        sched.masks_changed()

    def _skips(self, epoch: int) -> bool:
        return self.options.skip_first_minibatch and epoch == min(self.window.epochs)

    def on_epoch_begin(self, sched: CompressionScheduler, epoch: int) -> None:
        """Compute this epoch's masks."""
        if not self._skips(epoch):
            self._update(sched, epoch)

    def on_minibatch_begin(self, sched: CompressionScheduler, epoch: int, batch: int,
                           batches: int) -> None:
        """Recompute masks every N minibatches; mask the weights for the forward pass."""
        frequency = self.options.mini_batch_pruning_frequency
        if (frequency and batch > 0 and (epoch * batches + batch) % frequency == 0) or (
                batch == 1 and self._skips(epoch)):
            self._update(sched, epoch, batch)
            if not self.forward_only:
                sched.apply_masks()
        if self.forward_only and self.own:
            with torch.no_grad():
                for name, mask in self.own.items():
                    if self.options.use_double_copies:
                        self.dense[name] = sched.params[name].detach().clone()
                    sched.params[name].mul_(mask)

    def before_parameter_optimization(self, sched: CompressionScheduler) -> None:
        """Mask gradients if asked; put the dense weights back for the optimizer step."""
        if self.options.mask_gradients:
            for name, mask in self.own.items():
                grad = sched.params[name].grad
                if grad is not None:
                    grad.mul_(mask)
        if self.dense:
            with torch.no_grad():
                for name, dense in self.dense.items():
                    sched.params[name].copy_(dense)
            self.dense.clear()

    def on_minibatch_end(self, sched: CompressionScheduler, epoch: int, batch: int,
                         batches: int) -> None:
        """Drop the masks if they live for one minibatch only."""
        if self.options.discard_masks_at_minibatch_end and self.own:
            self.own = {}
            sched.masks_changed()

    def on_epoch_end(self, sched: CompressionScheduler, epoch: int,
                     metrics: Mapping[str, float] | None) -> None:
        """At the policy's last epoch, keep_mask makes forward-only masks permanent."""
        if epoch == self.window.last_epoch and self.options.keep_mask and self.forward_only:
            self.forward_only = False
            sched.masks_changed()
            sched.apply_masks()

    def masks(self) -> Mapping[str, Tensor]:
        """The permanent masks (none while masking on the forward pass only)."""
        return {} if self.forward_only else self.own

    def state_dict(self) -> dict[str, Any]:
        """Masks and whether they are still forward-only."""
        return {"masks": dict(self.own), "forward_only": self.forward_only}

    def load_state_dict(self, state: Mapping[str, Any], sched: CompressionScheduler) -> None:
        """Restore masks on the parameters' device."""
        self.own = _to_device(state.get("masks", {}), sched)
        self.forward_only = bool(state.get("forward_only", self.forward_only))


class RegularizationPolicy(Policy):
    """Add a regularizer's loss; with a threshold criterion, zero the groups below the strength
    after each step; keep_mask makes the final thresholding permanent at the policy's end."""

    kind = "regularizer"

    def __init__(self, regularizer: Regularizer, window: Window, keep_mask: bool) -> None:
        super().__init__(regularizer.name, window)
        self.regularizer = regularizer
        self.keep_mask = keep_mask
        self.kept: dict[str, Tensor] = {}

    def before_backward_pass(self, sched: CompressionScheduler) -> Tensor | None:
        """The regularization loss."""
        return self.regularizer.loss(sched.params)

    def on_minibatch_end(self, sched: CompressionScheduler, epoch: int, batch: int,
                         batches: int) -> None:
        """Zero the groups that fall below the threshold."""
        masks = self.regularizer.threshold_masks(sched.params)
        with torch.no_grad():
            for name, mask in masks.items():
                sched.params[name].mul_(mask)

    def on_epoch_end(self, sched: CompressionScheduler, epoch: int,
                     metrics: Mapping[str, float] | None) -> None:
        """At the last epoch, keep the thresholding masks for the rest of training."""
        if self.keep_mask and epoch == self.window.last_epoch:
            self.kept = self.regularizer.threshold_masks(sched.params)
            sched.masks_changed()
            sched.apply_masks()

    def masks(self) -> Mapping[str, Tensor]:
        """Kept masks."""
        return self.kept

    def state_dict(self) -> dict[str, Any]:
        """Kept masks."""
        return {"kept": dict(self.kept)}

    def load_state_dict(self, state: Mapping[str, Any], sched: CompressionScheduler) -> None:
        """Restore kept masks."""
        self.kept = _to_device(state.get("kept", {}), sched)


class LRPolicy(Policy):
    """Step a learning-rate scheduler at the end of each active epoch."""

    kind = "lr_scheduler"

    def __init__(self, instance_name: str, scheduler: Any, window: Window) -> None:
        super().__init__(instance_name, window)
        self.scheduler = scheduler

    def on_epoch_end(self, sched: CompressionScheduler, epoch: int,
                     metrics: Mapping[str, float] | None) -> None:
        """Set the next epoch's rate."""
        end_of_epoch(self.scheduler, epoch, metrics)


class ExtensionPolicy(Policy):
    """Run an extension (thinning) once, at the start of each active epoch, after pruning."""

    kind = "extension"

    def __init__(self, instance_name: str, extension: Any, window: Window) -> None:
        super().__init__(instance_name, window)
        self.extension = extension

    def on_epoch_begin(self, sched: CompressionScheduler, epoch: int) -> None:
        """Thin the model (the scheduler calls this after every pruner has set its masks)."""
        sched.apply_masks()
        self.extension.apply(sched.model, sched.optimizer)
        sched.parameters_replaced()


class QuantizationPolicy(Policy):
    """Quantization-aware training: the quantizer's fake quantization is on from the window's
    first epoch (and stays on); its state lives in the model's buffers, so resumes are exact."""

    kind = "quantizer"

    def __init__(self, instance_name: str, quantizer: Any, window: Window) -> None:
        super().__init__(instance_name, window)
        self.quantizer = quantizer

    def on_epoch_begin(self, sched: CompressionScheduler, epoch: int) -> None:
        """Turn fake quantization on (from the first active epoch on)."""
        self.quantizer.set_enabled(sched.model, True)
