"""Element-wise pruners: magnitude threshold, sparsity level, AGP, sensitivity and splicing."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from compressor.pruning.base import LevelPruner, Pruner, PruneStep
from compressor.pruning.groups import element_mask

__all__ = [
    "PerWeightPruner", "MagnitudeParameterPruner", "SparsityLevelParameterPruner",
    "AutomatedGradualPruner", "SensitivityPruner", "SplicingPruner",
]


class PerWeightPruner(Pruner):
    """Base of Distiller's element-wise pruners that take one value per weight (a threshold, a
    level, a sensitivity), written in the schedule as the mapping named by `argument`.

    Pruners whose thresholds come from weight statistics take them once, from the weight as it
    is on the first call (dense), as Distiller does; they are kept in the state for resume.
    """

    argument: ClassVar[str] = "values"
    zero_is_noop: ClassVar[bool] = False  # a value of 0 leaves the weight alone (levels)

    def __init__(self, name: str, values: Mapping[str, float]) -> None:
        super().__init__(name, list(values))
        self.values = dict(values)
        self.stats: dict[str, Tensor] = {}

    def with_values(self, values: Mapping[str, float]) -> PerWeightPruner:
        """A copy of this pruner with other per-weight values (a policy's `levels` override)."""
        clone = copy.copy(self)
        clone.values, clone.weights, clone.stats = dict(values), tuple(values), {}
        return clone

    def compute_masks(self, params: Mapping[str, Tensor], step: PruneStep) -> dict[str, Tensor]:
        """One mask per weight, from its own value."""
        return {name: self.mask_for(name, params[name].detach(), self.values[name], step)
                for name in self.weights}

    def mask_for(self, name: str, weight: Tensor, value: float, step: PruneStep) -> Tensor:
        """The 0/1 mask of one weight (same shape and dtype)."""
        raise NotImplementedError

    def statistics(self, weight: Tensor) -> Tensor:
        """The weight statistics the thresholds of this pruner are built on."""
        raise NotImplementedError

    def cached_statistics(self, name: str, weight: Tensor) -> list[float]:
        """statistics(weight) of the first call for `name`, reused afterwards."""
        if name not in self.stats:
            self.stats[name] = self.statistics(weight).float().cpu()
        return self.stats[name].tolist()

    def state_dict(self) -> dict[str, Any]:
        """The cached weight statistics."""
        return {"stats": {name: value.clone() for name, value in self.stats.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the cached weight statistics."""
        self.stats = {name: value.clone() for name, value in state.get("stats", {}).items()}


class MagnitudeParameterPruner(PerWeightPruner):
    """Zero the elements whose magnitude is at most a per-weight threshold."""

    argument = "thresholds"

    def mask_for(self, name: str, weight: Tensor, value: float, step: PruneStep) -> Tensor:
        """|w| > threshold."""
        return weight.abs().gt(value).to(weight.dtype)

    def describe_target(self, step: PruneStep) -> str:
        """Thresholds are magnitudes, not sparsities."""
        return "|w|>thr"


class SparsityLevelParameterPruner(PerWeightPruner):
    """Bring each weight to its own element sparsity level, by magnitude."""

    argument = "levels"
    zero_is_noop = True

    def mask_for(self, name: str, weight: Tensor, value: float, step: PruneStep) -> Tensor:
        """Smallest-magnitude elements zeroed to the weight's level."""
        return element_mask(weight, value)

    def describe_target(self, step: PruneStep) -> str:
        """The levels (one if all are equal)."""
        levels = sorted(set(self.values.values()))
        if not levels:
            return "-"
        return f"{levels[0]:.4f}" if len(levels) == 1 else f"{levels[0]:.2f}..{levels[-1]:.2f}"


class AutomatedGradualPruner(LevelPruner):
    """Zhu & Gupta's gradual magnitude pruning: element sparsity follows the cubic AGP schedule."""

    def mask_for_level(self, name: str, weight: Tensor, level: float, step: PruneStep) -> Tensor:
        """Smallest-magnitude elements zeroed to `level`."""
        return element_mask(weight, level)


class SensitivityPruner(PerWeightPruner):
    """Han et al.'s pruning: zero |w| <= sensitivity x std(w), with std taken once, on the first
    call (as Distiller: pruning pulls more weights under the fixed threshold as training goes)."""

    argument = "sensitivities"

    def statistics(self, weight: Tensor) -> Tensor:
        """std(w) of the dense weight."""
        return weight.std().reshape(1)

    def mask_for(self, name: str, weight: Tensor, value: float, step: PruneStep) -> Tensor:
        """|w| > s * std(w)."""
        (std,) = self.cached_statistics(name, weight)
        return weight.abs().gt(value * std).to(weight.dtype)

    def describe_target(self, step: PruneStep) -> str:
        """Sensitivities are multiples of the std, not sparsities."""
        return "s*std"


class SplicingPruner(PerWeightPruner):
    """Guo et al.'s dynamic network surgery: prune below a low threshold, splice back at or above a
    high one, keep the previous decision in between. The thresholds are (mean|w| + s * std|w|)
    times low/high multipliers, with mean and std taken once, on the first call."""

    argument = "sensitivities"

    def __init__(self, name: str, sensitivities: Mapping[str, float], low_thresh_mult: float,
                 hi_thresh_mult: float, sensitivity_multiplier: float = 0.0) -> None:
        super().__init__(name, sensitivities)
        self.low_thresh_mult = low_thresh_mult
        self.hi_thresh_mult = hi_thresh_mult
        self.sensitivity_multiplier = sensitivity_multiplier

    def statistics(self, weight: Tensor) -> Tensor:
        """mean|w| and std|w| of the dense weight."""
        magnitude = weight.abs()
        return torch.stack([magnitude.mean(), magnitude.std()])

    def mask_for(self, name: str, weight: Tensor, value: float, step: PruneStep) -> Tensor:
        """Threshold with hysteresis against the current mask."""
        mean, std = self.cached_statistics(name, weight)
        sensitivity = value
        if self.sensitivity_multiplier > 0:
            sensitivity *= 1 + (step.epoch - step.starting_epoch) * self.sensitivity_multiplier
        threshold = mean + std * sensitivity
        magnitude = weight.abs()
        previous = step.current_masks.get(name)
        mask = torch.ones_like(weight) if previous is None else previous.clone()
        mask[magnitude.lt(threshold * self.low_thresh_mult)] = 0.0
        mask[magnitude.ge(threshold * self.hi_thresh_mult)] = 1.0
        return mask

    def describe_target(self, step: PruneStep) -> str:
        """Thresholds are statistical, not sparsities."""
        return "splice"
