"""Structure pruners: rank groups (filters, channels, rows, cols, blocks) by L1/L2 norm, at a
fixed level or on AGP's schedule, optionally sharing one ranking (Leader); random variants."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from compressor.pruning.base import LevelPruner, PruneStep
from compressor.pruning.graph import following_batchnorms
from compressor.pruning.groups import expand_group_mask, group_mask_from_scores, group_norms

__all__ = [
    "RankedStructurePruner", "RandomLevelStructureParameterPruner", "BernoulliFilterPruner",
]


class RankedStructurePruner(LevelPruner):
    """Drop the `level` fraction of groups with the lowest scores (L1 or L2 norm by default).

    With group_dependency 'Leader' the first weight is ranked and its choice of groups is applied
    to all the weights (so residual additions stay aligned). With the policy argument
    fold_batchnorm, filter scores are scaled by |gamma / sqrt(var + eps)| of the batch norm that
    follows the layer, so a filter is judged by its contribution after normalization.
    """

    def __init__(self, name: str, weights: Sequence[str], *, group_type: str, norm: int = 1,
                 group_dependency: str | None = None, block_shape: Sequence[int] = (1, 1, 1, 1),
                 level: float | None = None, initial_sparsity: float | None = None,
                 final_sparsity: float | None = None) -> None:
        super().__init__(name, weights, level=level, initial_sparsity=initial_sparsity,
                         final_sparsity=final_sparsity)
        self.group_type = group_type
        self.norm = norm
        self.group_dependency = group_dependency
        self.block_shape = tuple(block_shape)
        self._bn_of: dict[str, str | None] | None = None

    def scores(self, name: str, weight: Tensor, step: PruneStep) -> Tensor:
        """One score per group; low scores are pruned first."""
        scores = group_norms(weight, self.group_type, self.norm, self.block_shape)
        if step.fold_batchnorm and self.group_type in ("Filters", "3D") and step.model is not None:
            scores = scores * self._bn_scale(name, step.model).to(scores.device)
        return scores

    def _bn_scale(self, name: str, model: nn.Module) -> Tensor:
        if self._bn_of is None:
            layers = [weight.rsplit(".", 1)[0] for weight in self.weights]
            self._bn_of = following_batchnorms(model, layers)
        bn_name = self._bn_of.get(name.rsplit(".", 1)[0])
        if bn_name is None:
            raise ValueError(f"fold_batchnorm: no batch norm follows '{name}'")
        bn = model.get_submodule(bn_name)
        assert isinstance(bn, nn.modules.batchnorm._BatchNorm)
        gamma = bn.weight.detach() if bn.weight is not None else 1.0
        return (gamma / torch.sqrt(bn.running_var + bn.eps)).abs().float()

    def compute_masks(self, params: Mapping[str, Tensor], step: PruneStep) -> dict[str, Tensor]:
        """Rank and mask each weight, or all of them by the leader's ranking."""
        if self.group_dependency != "Leader":
            return super().compute_masks(params, step)
        level = self.level(step)
        leader = self.weights[0]
        keep = group_mask_from_scores(self.scores(leader, params[leader], step), level)
        masks = {}
        for name in self.weights:
            masks[name] = expand_group_mask(keep, params[name], self.group_type, self.block_shape)
        return masks

    def mask_for_level(self, name: str, weight: Tensor, level: float, step: PruneStep) -> Tensor:
        """Drop the lowest-scoring groups of one weight."""
        keep = group_mask_from_scores(self.scores(name, weight, step), level)
        return expand_group_mask(keep, weight, self.group_type, self.block_shape)


class RandomLevelStructureParameterPruner(RankedStructurePruner):
    """L1-ranked structure pruning at a level drawn uniformly from `sparsity_range` each time."""

    def __init__(self, name: str, weights: Sequence[str], *, group_type: str,
                 sparsity_range: Sequence[float], block_shape: Sequence[int] = (1, 1, 1, 1)
                 ) -> None:
        super().__init__(name, weights, group_type=group_type, level=0.0,
                         block_shape=block_shape)
        self.low, self.high = float(sparsity_range[0]), float(sparsity_range[1])

    def level(self, step: PruneStep) -> float:
        """A random level in the range (torch's global generator, so seeds reproduce it)."""
        return self.low + (self.high - self.low) * float(torch.rand(()))

    def describe_target(self, step: PruneStep) -> str:
        """The range the level is drawn from."""
        return f"U({self.low:.2f},{self.high:.2f})"


class BernoulliFilterPruner(LevelPruner):
    """Drop each group independently with probability `level` (DropFilter-style regularization)."""

    def __init__(self, name: str, weights: Sequence[str], *, group_type: str = "Filters",
                 level: float | None = None, initial_sparsity: float | None = None,
                 final_sparsity: float | None = None) -> None:
        super().__init__(name, weights, level=level, initial_sparsity=initial_sparsity,
                         final_sparsity=final_sparsity)
        self.group_type = group_type

    def mask_for_level(self, name: str, weight: Tensor, level: float, step: PruneStep) -> Tensor:
        """A Bernoulli(1 - level) keep-mask over the groups."""
        groups = group_norms(weight, self.group_type).numel()
        keep = torch.bernoulli(torch.full((groups,), 1.0 - level)).to(weight.device)
        return expand_group_mask(keep, weight, self.group_type)
