"""CompressionScheduler: Distiller's training-loop callbacks over a list of policies.

The callbacks keep Distiller's names, argument order and optional `optimizer` argument, so a
training loop written for Distiller's scheduler runs unchanged; compressor's own epoch loop
(compressor.training.loop) calls the same object.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from compressor.schedule.config import unwrap_model
from compressor.schedule.policies import (
    ExtensionPolicy,
    LRPolicy,
    Policy,
    PruningPolicy,
    RegularizationPolicy,
)
from compressor.utils.distributed import verify_identical
from compressor.utils.errors import ScheduleError, UsageError

__all__ = ["CompressionScheduler", "STATE_VERSION", "LossComponent", "PolicyLoss"]

STATE_VERSION = 1
# Distiller's metric names in on_epoch_end(metrics=...) (its ReduceLROnPlateau reads the one
# named by its mode) -> ours
_DISTILLER_METRICS = {"min": "loss", "max": "top1"}


class LossComponent(NamedTuple):
    """One policy's term of the loss (Distiller's LossComponent): a name and its value."""

    name: str
    value: Tensor


class PolicyLoss(NamedTuple):
    """The loss to backpropagate and its policies' terms (Distiller's PolicyLoss), returned by
    before_backward_pass(..., return_loss_components=True)."""

    overall_loss: Tensor
    loss_components: list[LossComponent]


def _component_name(policy: Policy) -> str:
    """Distiller's name for a policy's loss term: its regularizer's class name + '_loss'."""
    owner = policy.regularizer if isinstance(policy, RegularizationPolicy) else policy
    return f"{type(owner).__name__}_loss"


class CompressionScheduler:
    """Calls each policy active in the current epoch, and enforces all masks after every step.

    Masks of different policies on one weight multiply (a weight pruned by one policy stays
    pruned when another prunes it too); a policy's new masks replace its own previous ones.
    The masks are applied in place to the plain parameters, so the model, its state_dict and
    everything that reads it (checkpoints, summaries, thinning) see ordinary tensors.
    `seed` (the run's seed) seeds the pruners' random draws, identically on every rank; under
    DDP each epoch begins by checking that every rank holds the same masks.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 policies: Sequence[Policy], source: str = "<schedule>",
                 instances: Mapping[str, Any] | None = None, *, seed: int = 0) -> None:
        self.model = unwrap_model(model)
        self.optimizer = optimizer
        self.policies = list(policies)
        self.source = source
        self.instances = dict(instances or {})
        self.seed = seed
        self.params: dict[str, Tensor] = dict(self.model.named_parameters())
        self._masks: dict[str, Tensor] | None = None
        for pruner in self._pruners():
            pruner.attach(self.model)

    # -- masks ------------------------------------------------------------------------------
    def _pruners(self) -> list[Any]:
        seen: dict[int, Any] = {}
        for policy in self.policies:
            if isinstance(policy, PruningPolicy):
                seen.setdefault(id(policy.pruner), policy.pruner)
        return list(seen.values())

    def masks_changed(self) -> None:
        """Policies call this when their masks change; the product is recomputed lazily."""
        self._masks = None

    @property
    def masks(self) -> dict[str, Tensor]:
        """The effective mask of every masked parameter (product over policies)."""
        if self._masks is None:
            combined: dict[str, Tensor] = {}
            for policy in self.policies:
                for name, mask in policy.masks().items():
                    combined[name] = mask if name not in combined else combined[name] * mask
            self._masks = combined
        return self._masks

    @torch.no_grad()
    def apply_masks(self) -> None:
        """Zero the masked elements of every parameter, in place."""
        for name, mask in self.masks.items():
            self.params[name].mul_(mask)

    def parameters_replaced(self) -> None:
        """After thinning: refresh parameters; re-derive masks of reshaped weights from zeros."""
        self.params = dict(self.model.named_parameters())
        for policy in self.policies:
            holders = [getattr(policy, attr) for attr in ("own", "kept") if hasattr(policy, attr)]
            for masks in holders:
                for name in list(masks):
                    param = self.params.get(name)
                    if param is None:
                        del masks[name]
                    elif masks[name].shape != param.shape:
                        masks[name] = param.detach().ne(0).to(param.dtype)
        for pruner in self._pruners():
            pruner.detach()
            pruner.attach(self.model)
        self.masks_changed()

    # -- callbacks --------------------------------------------------------------------------
    def _active(self, epoch: int) -> list[Policy]:
        return [policy for policy in self.policies if epoch in policy.window.epochs]

    def _check_optimizer(self, optimizer: torch.optim.Optimizer | None, callback: str) -> None:
        """Distiller's loops pass their optimizer to every callback: it must be the one the
        schedule was built with (its LR schedulers and thinning act on that one)."""
        if optimizer is None or optimizer is self.optimizer:
            return
        if not isinstance(optimizer, torch.optim.Optimizer):
            fix = ("pass metrics as a keyword (metrics=...)" if isinstance(optimizer, Mapping)
                   else "pass the schedule's optimizer or nothing")
            raise UsageError(f"{callback}: optimizer is a {type(optimizer).__name__}, not a "
                             f"torch optimizer; {fix}")
        raise UsageError(f"{callback}: this optimizer is not the one the schedule was built "
                         "with; pass that one (or none), or build the schedule with this one")

    def on_epoch_begin(self, epoch: int, optimizer: torch.optim.Optimizer | None = None, *,
                       metrics: Mapping[str, float] | float | None = None) -> None:
        """Pruners set this epoch's masks (applied at once); then extensions (thinning) run.

        Args:
            epoch: the epoch about to train (0-based).
            optimizer: Distiller's optional argument: the schedule's own optimizer, or None.
            metrics: accepted as Distiller's loops pass it; no policy here reads it.
        """
        self._check_optimizer(optimizer, "on_epoch_begin")
        active = self._active(epoch)
        for policy in active:
            if not isinstance(policy, ExtensionPolicy):
                policy.on_epoch_begin(self, epoch)
        self.apply_masks()
        for policy in active:
            if isinstance(policy, ExtensionPolicy):
                policy.on_epoch_begin(self, epoch)
        self._verify_masks(epoch)

    def _verify_masks(self, epoch: int) -> None:
        # Every policy's masks, forward-only ones included: replicas must apply the same ones.
        current: dict[str, Tensor] = {}
        for index, policy in enumerate(self.policies):
            masks = policy.own if isinstance(policy, PruningPolicy) else policy.masks()
            for name, mask in masks.items():
                current[f"{index}:{policy.instance_name}:{name}"] = mask
        device = next(iter(self.params.values())).device if self.params else torch.device("cpu")
        verify_identical(current, "masks", device, f"at epoch {epoch}")

    def on_minibatch_begin(self, epoch: int, minibatch_id: int, minibatches_per_epoch: int,
                           optimizer: torch.optim.Optimizer | None = None) -> None:
        """Before the forward pass of minibatch `minibatch_id` of `minibatches_per_epoch`."""
        self._check_optimizer(optimizer, "on_minibatch_begin")
        for policy in self._active(epoch):
            policy.on_minibatch_begin(self, epoch, minibatch_id, minibatches_per_epoch)

    def before_backward_pass(self, epoch: int, minibatch_id: int, minibatches_per_epoch: int,
                             loss: Tensor, optimizer: torch.optim.Optimizer | None = None,
                             return_loss_components: bool = False) -> Tensor | PolicyLoss:
        """The loss to backpropagate: `loss` plus the active regularizers' terms (Distiller's).

        Args:
            epoch, minibatch_id, minibatches_per_epoch: where training is.
            loss: the task loss of this minibatch.
            optimizer: Distiller's optional argument: the schedule's own optimizer, or None.
            return_loss_components: return a PolicyLoss (the overall loss and each term) instead.

        Returns:
            `loss` itself when no term is active, else `loss` + the terms' sum; with
            `return_loss_components`, a PolicyLoss of that and the terms.
        """
        self._check_optimizer(optimizer, "before_backward_pass")
        components = [LossComponent(_component_name(policy), term)
                      for policy in self._active(epoch)
                      if (term := policy.before_backward_pass(self)) is not None]
        overall = loss
        if components:
            overall = loss + torch.stack([term for _, term in components]).sum()
        return PolicyLoss(overall, components) if return_loss_components else overall

    def before_parameter_optimization(self, epoch: int, minibatch_id: int,
                                      minibatches_per_epoch: int,
                                      optimizer: torch.optim.Optimizer | None = None) -> None:
        """After backward, before the optimizer step."""
        self._check_optimizer(optimizer, "before_parameter_optimization")
        for policy in self._active(epoch):
            policy.before_parameter_optimization(self)

    def on_minibatch_end(self, epoch: int, minibatch_id: int, minibatches_per_epoch: int,
                         optimizer: torch.optim.Optimizer | None = None) -> None:
        """Re-apply the masks that the optimizer step (momentum, weight decay) disturbed."""
        self._check_optimizer(optimizer, "on_minibatch_end")
        self.apply_masks()
        for policy in self._active(epoch):
            policy.on_minibatch_end(self, epoch, minibatch_id, minibatches_per_epoch)

    def on_epoch_end(self, epoch: int, optimizer: torch.optim.Optimizer | None = None, *,
                     metrics: Mapping[str, float] | None = None) -> None:
        """Pruners sync their statistics over ranks (before the checkpoint); LR schedulers step.

        Args:
            epoch: the epoch that just ended.
            optimizer: Distiller's optional argument: the schedule's own optimizer, or None.
            metrics: the epoch's validation metrics; ReduceLROnPlateau reads 'loss' (mode min)
                or 'top1' (mode max), also under Distiller's names 'min' and 'max'.
        """
        self._check_optimizer(optimizer, "on_epoch_end")
        if metrics is not None:
            metrics = {**{ours: metrics[theirs] for theirs, ours in _DISTILLER_METRICS.items()
                          if theirs in metrics}, **metrics}
        for pruner in self._pruners():
            pruner.sync()
        for policy in self._active(epoch):
            policy.on_epoch_end(self, epoch, metrics)

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Masks, pruner and LR-scheduler state: plain values and tensors only."""
        pruners = {pruner.name: pruner.state_dict() for pruner in self._pruners()}
        lr = {policy.instance_name: policy.scheduler.state_dict()
              for policy in self.policies if isinstance(policy, LRPolicy)}
        return {"version": STATE_VERSION, "policies": [p.state_dict() for p in self.policies],
                "pruners": pruners, "lr_schedulers": lr}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what state_dict returned (the same schedule must be loaded)."""
        saved = state.get("policies", [])
        if state.get("version") != STATE_VERSION or len(saved) != len(self.policies):
            raise ScheduleError(
                f"{self.source}: the checkpoint's compression state does not match this "
                f"schedule ({len(saved)} policies saved, {len(self.policies)} here); resume "
                f"with the schedule the run started with, or use --reset-optimizer")
        for policy, policy_state in zip(self.policies, saved, strict=True):
            policy.load_state_dict(policy_state, self)
        for pruner in self._pruners():
            pruner.load_state_dict(state.get("pruners", {}).get(pruner.name, {}))
        for policy in self.policies:
            if isinstance(policy, LRPolicy) and policy.instance_name in state.get(
                    "lr_schedulers", {}):
                policy.scheduler.load_state_dict(state["lr_schedulers"][policy.instance_name])
        self.masks_changed()
        self.apply_masks()
