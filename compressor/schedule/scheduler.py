"""CompressionScheduler: Distiller's training-loop callbacks over a list of policies."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from compressor.schedule.config import unwrap_model
from compressor.schedule.policies import ExtensionPolicy, LRPolicy, Policy, PruningPolicy
from compressor.utils.distributed import verify_identical
from compressor.utils.errors import ScheduleError

__all__ = ["CompressionScheduler", "STATE_VERSION"]

STATE_VERSION = 1


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

    def on_epoch_begin(self, epoch: int) -> None:
        """Pruners set this epoch's masks (applied at once); then extensions (thinning) run."""
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

    def on_minibatch_begin(self, epoch: int, batch_idx: int, batches_per_epoch: int) -> None:
        """Before the forward pass."""
        for policy in self._active(epoch):
            policy.on_minibatch_begin(self, epoch, batch_idx, batches_per_epoch)

    def before_backward_pass(self, epoch: int, batch_idx: int, batches_per_epoch: int,
                             loss: Tensor) -> Tensor | None:
        """The sum of the active regularizers' terms (None when there is none)."""
        terms = [term for policy in self._active(epoch)
                 if (term := policy.before_backward_pass(self)) is not None]
        return torch.stack(terms).sum() if terms else None

    def before_parameter_optimization(self, epoch: int, batch_idx: int,
                                      batches_per_epoch: int) -> None:
        """After backward, before the optimizer step."""
        for policy in self._active(epoch):
            policy.before_parameter_optimization(self)

    def on_minibatch_end(self, epoch: int, batch_idx: int, batches_per_epoch: int) -> None:
        """Re-apply the masks that the optimizer step (momentum, weight decay) disturbed."""
        self.apply_masks()
        for policy in self._active(epoch):
            policy.on_minibatch_end(self, epoch, batch_idx, batches_per_epoch)

    def on_epoch_end(self, epoch: int, metrics: Mapping[str, float] | None = None) -> None:
        """Pruners sync their statistics over ranks (before the checkpoint); LR schedulers step
        (ReduceLROnPlateau reads metrics['loss'] or ['top1'])."""
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
