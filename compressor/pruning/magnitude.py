"""Element-wise pruners: magnitude threshold, sparsity level, AGP, sensitivity and splicing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from compressor.pruning.base import LevelPruner, Pruner, PruneStep
from compressor.pruning.groups import element_mask

__all__ = [
    "MagnitudeParameterPruner", "SparsityLevelParameterPruner", "AutomatedGradualPruner",
    "SensitivityPruner", "SplicingPruner",
]


class MagnitudeParameterPruner(Pruner):
    """Zero the elements whose magnitude is at most a per-weight threshold."""

    def __init__(self, name: str, thresholds: Mapping[str, float]) -> None:
        super().__init__(name, list(thresholds))
        self.thresholds = dict(thresholds)

    def compute_masks(self, params: Mapping[str, Tensor], step: PruneStep) -> dict[str, Tensor]:
        """|w| > threshold."""
        return {name: params[name].detach().abs().gt(self.thresholds[name]).to(params[name].dtype)
                for name in self.weights}

    def describe_target(self, step: PruneStep) -> str:
        """Thresholds are magnitudes, not sparsities."""
        return "|w|>thr"


class SparsityLevelParameterPruner(Pruner):
    """Bring each weight to its own element sparsity level, by magnitude."""

    def __init__(self, name: str, levels: Mapping[str, float]) -> None:
        super().__init__(name, list(levels))
        self.levels = dict(levels)

    def compute_masks(self, params: Mapping[str, Tensor], step: PruneStep) -> dict[str, Tensor]:
        """Smallest-magnitude elements zeroed to each weight's level."""
        return {name: element_mask(params[name], self.levels[name]) for name in self.weights}

    def describe_target(self, step: PruneStep) -> str:
        """The levels (one if all are equal)."""
        levels = sorted(set(self.levels.values()))
        return f"{levels[0]:.4f}" if len(levels) == 1 else f"{levels[0]:.2f}..{levels[-1]:.2f}"


class AutomatedGradualPruner(LevelPruner):
    """Zhu & Gupta's gradual magnitude pruning: element sparsity follows the cubic AGP schedule."""

    def mask_for_level(self, name: str, weight: Tensor, level: float, step: PruneStep) -> Tensor:
        """Smallest-magnitude elements zeroed to `level`."""
        return element_mask(weight, level)


class SensitivityPruner(Pruner):
    """Han et al.'s pruning: zero |w| below sensitivity x std(w), recomputed at each step."""

    def __init__(self, name: str, sensitivities: Mapping[str, float]) -> None:
        super().__init__(name, list(sensitivities))
        self.sensitivities = dict(sensitivities)

    def compute_masks(self, params: Mapping[str, Tensor], step: PruneStep) -> dict[str, Tensor]:
        """|w| > s * std(w), on the weights as they are now (already-pruned zeros included)."""
        masks = {}
        for name in self.weights:
            weight = params[name].detach()
            threshold = self.sensitivities[name] * weight.std()
            masks[name] = weight.abs().gt(threshold).to(weight.dtype)
        return masks

    def describe_target(self, step: PruneStep) -> str:
        """Sensitivities are multiples of the std, not sparsities."""
        return "s*std"


class SplicingPruner(Pruner):
    """Guo et al.'s dynamic network surgery: prune below a low threshold, splice back above a high
    one, keep the previous decision in between. The thresholds are (mean|w| + s * std|w|) times
    low/high multipliers, with mean and std taken once, on the first call."""

    def __init__(self, name: str, sensitivities: Mapping[str, float], low_thresh_mult: float,
                 hi_thresh_mult: float, sensitivity_multiplier: float = 0.0) -> None:
        super().__init__(name, list(sensitivities))
        self.sensitivities = dict(sensitivities)
        self.low_thresh_mult = low_thresh_mult
        self.hi_thresh_mult = hi_thresh_mult
        self.sensitivity_multiplier = sensitivity_multiplier
        self.stats: dict[str, Tensor] = {}  # name -> (mean|w|, std|w|) of the dense weight

    def compute_masks(self, params: Mapping[str, Tensor], step: PruneStep) -> dict[str, Tensor]:
        """Threshold with hysteresis against the current mask."""
        masks = {}
        for name in self.weights:
            weight = params[name].detach()
            magnitude = weight.abs()
            if name not in self.stats:
                self.stats[name] = torch.stack([magnitude.mean(), magnitude.std()]).float().cpu()
            mean, std = self.stats[name].tolist()
            sensitivity = self.sensitivities[name]
            if self.sensitivity_multiplier > 0:
                sensitivity *= 1 + (step.epoch - step.starting_epoch) * self.sensitivity_multiplier
            threshold = mean + std * sensitivity
            previous = step.current_masks.get(name)
            mask = torch.ones_like(weight) if previous is None else previous.clone()
            mask[magnitude.lt(threshold * self.low_thresh_mult)] = 0.0
            mask[magnitude.gt(threshold * self.hi_thresh_mult)] = 1.0
            masks[name] = mask
        return masks

    def describe_target(self, step: PruneStep) -> str:
        """Thresholds are statistical, not sparsities."""
        return "splice"

    def state_dict(self) -> dict[str, Any]:
        """The cached weight statistics."""
        return {"stats": {name: value.clone() for name, value in self.stats.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the cached weight statistics."""
        self.stats = {name: value.clone() for name, value in state.get("stats", {}).items()}
