"""Structure pruners: rank groups (filters, channels, rows, cols, blocks) by L1/L2 norm, at a
fixed level or on AGP's schedule, optionally sharing one ranking (Leader); random variants."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from compressor.models import description_of
from compressor.pruning.base import LevelPruner, PruneStep
from compressor.pruning.graph import following_batchnorms
from compressor.pruning.groups import (
    expand_group_mask,
    group_mask_from_scores,
    group_norms,
    tile_units,
)
from compressor.utils.errors import ScheduleError

__all__ = [
    "StructurePruner", "RankedStructurePruner", "RandomLevelStructureParameterPruner",
    "BernoulliFilterPruner", "OUTPUT_GROUPS",
]

# Group types whose groups are a layer's outputs (conv filters, linear rows).
OUTPUT_GROUPS = ("Filters", "3D", "Rows")


class StructurePruner(LevelPruner):
    """A level pruner over structure groups; pruning a layer's outputs silences them entirely.

    A filter whose weights are zero still emits a constant: the layer's bias, or the shift of
    the batch norm that follows it. So with filter (row) groups the same output channels of
    the layer's bias and of the following batch norm's weight and bias are masked too, as
    Distiller's and Torch-Pruning's filter removal do; the channel then carries exact zeros,
    and thinning can remove it without changing the model's outputs.
    """

    def __init__(self, name: str, weights: Sequence[str], *, group_type: str,
                 block_shape: Sequence[int] = (1, 1, 1, 1), level: float | None = None,
                 initial_sparsity: float | None = None, final_sparsity: float | None = None,
                 norms: Sequence[str] = ()) -> None:
        super().__init__(name, weights, level=level, initial_sparsity=initial_sparsity,
                         final_sparsity=final_sparsity)
        self.group_type = group_type
        self.block_shape = tuple(block_shape)
        self._bn_of: dict[str, str | None] | None = None
        # batch norms the pruned channels pass through (not after a pruned layer: RepVGG's
        # identity branch): masked with the first weight's filters
        self.norms = tuple(norms)

    channel_groups = 1  # blocks of the leader's filters one unit spans (RankedStructurePruner)

    def unit_count(self, leader_groups: int) -> int:
        """How many units the leader's `leader_groups` filters are (channel_groups blocks)."""
        return leader_groups // max(1, self.channel_groups)

    def attach(self, model: nn.Module) -> None:
        """Filter (row) pruners find their batch norms now: an untraceable model fails at load."""
        if self.group_type in OUTPUT_GROUPS:
            self.batchnorms(model)

    def batchnorms(self, model: nn.Module) -> dict[str, str | None]:
        """Layer name -> the batch norm that alone reads its output (traced once, then cached).

        Raises:
            ScheduleError: when torch.fx cannot trace the model (data-dependent control flow).
        """
        if self._bn_of is None:
            layers = [weight.rsplit(".", 1)[0] for weight in self.weights]
            try:
                self._bn_of = following_batchnorms(model, layers)
            except ValueError as exc:
                raise ScheduleError(
                    f"pruner '{self.name}' ({self.group_type}): {exc}, so the batch norms after "
                    f"pruned filters cannot be found in arch {_arch_of(model)}; use element-wise"
                    f" pruning (AutomatedGradualPruner) for this arch, or make its forward "
                    f"traceable by torch.fx") from exc
        return self._bn_of

    def compute_masks(self, params: Mapping[str, Tensor], step: PruneStep) -> dict[str, Tensor]:
        """The group masks, plus the masks of what pruned outputs would still carry."""
        masks = self.group_masks(params, step)
        if self.group_type in OUTPUT_GROUPS and step.model is not None:
            masks.update(self.output_masks(masks, params, step.model))
        return masks

    def group_masks(self, params: Mapping[str, Tensor], step: PruneStep) -> dict[str, Tensor]:
        """One mask per weight, over its groups."""
        return super().compute_masks(params, step)

    def output_masks(self, masks: Mapping[str, Tensor], params: Mapping[str, Tensor],
                     model: nn.Module) -> dict[str, Tensor]:
        """Masks for the bias and the following batch norm of each layer's pruned outputs."""
        bn_of = self.batchnorms(model)
        coupled: dict[str, Tensor] = {}
        for name in self.weights:
            layer = name.rsplit(".", 1)[0]
            keep = masks[name].detach().flatten(1).amax(dim=1)  # 1 where a filter survives
            targets = [f"{layer}.bias"]
            bn = bn_of.get(layer)
            if bn is not None:
                targets += [f"{bn}.weight", f"{bn}.bias"]
            for key in targets:
                param = params.get(key)
                if param is not None and param.shape == keep.shape:
                    coupled[key] = keep.to(param.device, param.dtype)
        if self.norms:
            keep = masks[self.weights[0]].detach().flatten(1).amax(dim=1)
            for key in (f"{norm}.{attr}" for norm in self.norms for attr in ("weight", "bias")):
                param = params.get(key)
                tiled = None if param is None else tile_units(keep, param.shape[0],
                                                               self.unit_count(keep.numel()))
                if tiled is not None:
                    coupled[key] = tiled.to(param.device, param.dtype)
        return coupled


class RankedStructurePruner(StructurePruner):
    """Drop the `level` fraction of groups with the lowest scores (L1 or L2 norm by default).

    With group_dependency 'Leader' the first weight is ranked and its choice of groups is applied
    to all the weights (so residual additions stay aligned). With `channel_groups` G > 1 (filter
    groups shared with a grouped convolution of G groups) the filters go in units, as
    Torch-Pruning prunes channel groups: unit j is filter j of each of the G blocks, scored by
    their mean, so every block loses the same number. With the policy argument
    fold_batchnorm, filter scores are scaled by |gamma / sqrt(var + eps)| of the batch norm that
    follows the layer, so a filter is judged by its contribution after normalization.
    """

    def __init__(self, name: str, weights: Sequence[str], *, group_type: str, norm: int = 1,
                 group_dependency: str | None = None, block_shape: Sequence[int] = (1, 1, 1, 1),
                 level: float | None = None, initial_sparsity: float | None = None,
                 final_sparsity: float | None = None, channel_groups: int = 1,
                 norms: Sequence[str] = ()) -> None:
        super().__init__(name, weights, group_type=group_type, block_shape=block_shape,
                         level=level, initial_sparsity=initial_sparsity,
                         final_sparsity=final_sparsity, norms=norms)
        self.norm = norm
        self.group_dependency = group_dependency
        self.channel_groups = channel_groups

    def _keep(self, scores: Tensor, level: float) -> Tensor:
        """The keep-mask over groups: by units of `channel_groups` blocks where G > 1."""
        blocks = self.channel_groups
        if blocks == 1:
            return group_mask_from_scores(scores, level)
        return group_mask_from_scores(scores.view(blocks, -1).mean(dim=0), level).repeat(blocks)

    def scores(self, name: str, weight: Tensor, step: PruneStep) -> Tensor:
        """One score per group; low scores are pruned first."""
        scores = group_norms(weight, self.group_type, self.norm, self.block_shape)
        if step.fold_batchnorm and self.group_type in ("Filters", "3D") and step.model is not None:
            scores = scores * self._bn_scale(name, step.model).to(scores.device)
        return scores

    def _bn_scale(self, name: str, model: nn.Module) -> Tensor:
        bn_name = self.batchnorms(model).get(name.rsplit(".", 1)[0])
        if bn_name is None:
            raise ValueError(f"fold_batchnorm: no batch norm follows '{name}'")
        bn = model.get_submodule(bn_name)
        assert isinstance(bn, nn.modules.batchnorm._BatchNorm)
        gamma = bn.weight.detach() if bn.weight is not None else 1.0
        return (gamma / torch.sqrt(bn.running_var + bn.eps)).abs().float()

    def group_masks(self, params: Mapping[str, Tensor], step: PruneStep) -> dict[str, Tensor]:
        """Rank and mask each weight, or all of them by the leader's ranking."""
        if self.group_dependency != "Leader":
            return super().group_masks(params, step)
        level = self.level(step)
        leader = self.weights[0]
        keep = self._keep(self.scores(leader, params[leader], step), level)
        units = self.unit_count(keep.numel())
        masks = {}
        for name in self.weights:
            # a weight wider than the leader (GhostNet's stream) loses every block's channel
            tiled = tile_units(keep, group_norms(params[name], self.group_type, 1,
                                                 self.block_shape).numel(), units)
            if tiled is None:
                raise ValueError(f"pruner '{self.name}': '{name}' has a width that is no "
                                 f"multiple of the leader's {units} units")
            masks[name] = expand_group_mask(tiled, params[name], self.group_type,
                                            self.block_shape)
        return masks

    def mask_for_level(self, name: str, weight: Tensor, level: float, step: PruneStep) -> Tensor:
        """Drop the lowest-scoring groups of one weight."""
        keep = self._keep(self.scores(name, weight, step), level)
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
        """A random level in the range, drawn from the step's generator (the same on all ranks)."""
        return self.low + (self.high - self.low) * float(
            torch.rand((), generator=step.generator(self.name)))

    def describe_target(self, step: PruneStep) -> str:
        """The range the level is drawn from."""
        return f"U({self.low:.2f},{self.high:.2f})"


class BernoulliFilterPruner(StructurePruner):
    """Drop each group independently with probability `level` (DropFilter-style regularization)."""

    def __init__(self, name: str, weights: Sequence[str], *, group_type: str = "Filters",
                 level: float | None = None, initial_sparsity: float | None = None,
                 final_sparsity: float | None = None) -> None:
        super().__init__(name, weights, group_type=group_type, level=level,
                         initial_sparsity=initial_sparsity, final_sparsity=final_sparsity)

    def mask_for_level(self, name: str, weight: Tensor, level: float, step: PruneStep) -> Tensor:
        """A Bernoulli(1 - level) keep-mask over the groups (the step's generator: rank-free)."""
        groups = group_norms(weight, self.group_type).numel()
        keep = torch.bernoulli(torch.full((groups,), 1.0 - level),
                               generator=step.generator(self.name, name)).to(weight.device)
        return expand_group_mask(keep, weight, self.group_type)


def _arch_of(model: nn.Module) -> str:
    """The model's registry arch name when it carries a description, else its class name."""
    try:
        return description_of(model).arch
    except ValueError:
        return type(model).__name__
