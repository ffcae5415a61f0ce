"""Sparsity-inducing loss terms: L1, group lasso and group variance, with Distiller's thresholds."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from compressor.pruning.groups import expand_group_mask

__all__ = ["Regularizer", "L1Regularizer", "GroupLassoRegularizer", "GroupVarianceRegularizer",
           "group_rows", "THRESHOLD_CRITERIA",
           "REGULARIZER_GROUPS"]

THRESHOLD_CRITERIA = ("Mean_Abs", "Max")
REGULARIZER_GROUPS = ("Filters", "3D", "Rows", "Channels", "Cols", "2D", "Kernels", "4D")


def group_rows(weight: Tensor, group_type: str) -> Tensor:
    """A differentiable [groups, group_size] view of `weight`, one row per group."""
    if group_type in ("Filters", "3D", "Rows"):
        return weight.reshape(weight.shape[0], -1)
    if group_type in ("Channels", "Cols"):
        return weight.transpose(0, 1).reshape(weight.shape[1], -1)
    if group_type in ("2D", "Kernels"):
        return weight.reshape(weight.shape[0] * weight.shape[1], -1)
    if group_type == "4D":
        return weight.reshape(1, -1)
    raise ValueError(f"group type '{group_type}' is not supported by group regularizers "
                     f"(use one of {', '.join(REGULARIZER_GROUPS)})")


class Regularizer:
    """A named loss term over weights, each with a strength and (for group terms) a group type."""

    def __init__(self, name: str, regims: Mapping[str, tuple[float, str | None]],
                 threshold_criteria: str | None = None) -> None:
        self.name = name
        self.regims = dict(regims)
        self.weights = tuple(self.regims)
        self.threshold_criteria = threshold_criteria

    def term(self, weight: Tensor, strength: float, group_type: str | None) -> Tensor:
        """The loss term of one weight."""
        raise NotImplementedError

    def loss(self, params: Mapping[str, Tensor]) -> Tensor:
        """The sum of the terms of all weights."""
        terms = [self.term(params[name], strength, group)
                 for name, (strength, group) in self.regims.items()]
        return torch.stack(terms).sum()

    def threshold_masks(self, params: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Masks zeroing the groups whose mean |w| (or max |w|) is at most the strength.

        A group is kept only when its value is strictly greater than the strength, as in
        Distiller's threshold_mask / group_threshold_mask.
        """
        if self.threshold_criteria is None:
            return {}
        masks = {}
        for name, (strength, group) in self.regims.items():
            weight = params[name].detach()
            rows = group_rows(weight.abs(), group) if group else weight.abs().reshape(-1, 1)
            value = rows.mean(dim=1) if self.threshold_criteria == "Mean_Abs" else rows.amax(dim=1)
            keep = value.gt(strength).to(weight.dtype)
            masks[name] = keep.view_as(weight) if group is None else expand_group_mask(
                keep, weight, group)
        return masks


class L1Regularizer(Regularizer):
    """strength * sum |w|: drives individual weights (e.g. batch-norm scales) to zero."""

    def term(self, weight: Tensor, strength: float, group_type: str | None) -> Tensor:
        """The L1 norm, scaled."""
        return strength * weight.abs().sum()


class GroupLassoRegularizer(Regularizer):
    """strength * sum over groups of ||group||_2: drives whole structures to zero (Wen et al.)."""

    def term(self, weight: Tensor, strength: float, group_type: str | None) -> Tensor:
        """The sum of group L2 norms, scaled."""
        return strength * group_rows(weight, group_type or "4D").norm(p=2, dim=1).sum()


class GroupVarianceRegularizer(Regularizer):
    """strength * variance of the group L2 norms: pushes groups towards equal magnitude."""

    def term(self, weight: Tensor, strength: float, group_type: str | None) -> Tensor:
        """The variance of the group norms, scaled."""
        norms = group_rows(weight, group_type or "4D").norm(p=2, dim=1)
        if norms.numel() < 2:
            return norms.sum() * 0.0
        return strength * norms.var()
