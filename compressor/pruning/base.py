"""The pruner life cycle: compute masks for named weights at a step; state for exact resume."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from compressor.utils.distributed import shared_generator

__all__ = ["PruneStep", "Pruner", "LevelPruner", "agp_sparsity"]


@dataclass(frozen=True)
class PruneStep:
    """Where in its policy a pruner is asked for masks, and what it may look at.

    `seed` is the run's seed and `minibatch` the index of the minibatch within the epoch at
    which masks are computed (0 at the epoch's start): with the epoch they seed generator(),
    the only randomness a pruner may use, so every rank draws the same masks.
    """

    epoch: int
    starting_epoch: int
    ending_epoch: int
    frequency: int
    model: nn.Module | None = None
    current_masks: Mapping[str, Tensor] = field(default_factory=dict)
    fold_batchnorm: bool = False
    seed: int = 0
    minibatch: int = 0

    def generator(self, *keys: int | str) -> torch.Generator:
        """A CPU generator for this step and `keys` (pruner, weight): the same on every rank."""
        return shared_generator(self.seed, "prune", self.epoch, self.minibatch, *keys)


def agp_sparsity(initial: float, final: float, step: PruneStep) -> float:
    """Zhu & Gupta's cubic schedule: `initial` at the first pruning epoch, `final` at the last.

    The pruning epochs are starting_epoch, +frequency, ... < ending_epoch (Distiller's policy
    range); the sparsity rises as final + (initial - final) * (1 - progress)^3.
    """
    last = step.starting_epoch + ((step.ending_epoch - 1 - step.starting_epoch)
                                  // step.frequency) * step.frequency
    span = last - step.starting_epoch
    if span <= 0:
        return final
    progress = min(max((step.epoch - step.starting_epoch) / span, 0.0), 1.0)
    return final + (initial - final) * (1.0 - progress) ** 3


class Pruner:
    """A named pruner over a list of weights (fully qualified names in the unwrapped model)."""

    def __init__(self, name: str, weights: Sequence[str]) -> None:
        self.name = name
        self.weights = tuple(weights)

    def compute_masks(self, params: Mapping[str, Tensor], step: PruneStep) -> dict[str, Tensor]:
        """0/1 masks (same shape and dtype as the weights) for this step."""
        raise NotImplementedError

    def describe_target(self, step: PruneStep) -> str:
        """The target this pruner aims at in `step`, for the schedule preview."""
        return "-"

    def attach(self, model: nn.Module) -> None:
        """Start observing the model (activation statistics); most pruners need nothing."""

    def detach(self) -> None:
        """Stop observing the model."""

    def sync(self) -> None:
        """Make state gathered on this rank (statistics) identical on all ranks; a collective."""

    def state_dict(self) -> dict[str, Any]:
        """Pruner state beyond its configuration (plain values and tensors only)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what state_dict returned."""


class LevelPruner(Pruner):
    """A pruner that brings each weight to a sparsity level: fixed, or AGP's cubic schedule."""

    def __init__(self, name: str, weights: Sequence[str], *, level: float | None = None,
                 initial_sparsity: float | None = None, final_sparsity: float | None = None
                 ) -> None:
        super().__init__(name, weights)
        self.fixed_level = level
        self.initial_sparsity = initial_sparsity
        self.final_sparsity = final_sparsity

    def level(self, step: PruneStep) -> float:
        """The sparsity level for this step."""
        if self.fixed_level is not None:
            return self.fixed_level
        assert self.initial_sparsity is not None and self.final_sparsity is not None
        return agp_sparsity(self.initial_sparsity, self.final_sparsity, step)

    def describe_target(self, step: PruneStep) -> str:
        """The sparsity level, as a fraction."""
        return f"{self.level(step):.4f}"

    def compute_masks(self, params: Mapping[str, Tensor], step: PruneStep) -> dict[str, Tensor]:
        """One mask per weight at this step's level."""
        level = self.level(step)
        return {name: self.mask_for_level(name, params[name], level, step)
                for name in self.weights}

    def mask_for_level(self, name: str, weight: Tensor, level: float, step: PruneStep) -> Tensor:
        """The mask of one weight at `level`."""
        raise NotImplementedError
