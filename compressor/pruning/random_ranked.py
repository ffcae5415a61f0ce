"""Distiller's RandomRankedFilterPruner(_AGP): groups ranked at random, the baseline that a
meaningful ranking (L1, APoZ) must beat."""

from __future__ import annotations

import torch
from torch import Tensor

from compressor.pruning.base import PruneStep
from compressor.pruning.groups import group_norms
from compressor.pruning.structured import RankedStructurePruner

__all__ = ["RandomRankedFilterPruner"]


class RandomRankedFilterPruner(RankedStructurePruner):
    """Drop a random `level` fraction of the groups (filters by default) at each step.

    Groups already all zero rank first: a filter pruned at an earlier step (its batch norm is
    masked with it, so it cannot grow back) stays pruned, and AGP's sparsity is met exactly.
    The rest are ranked by draws from the step's generator, seeded by (seed, epoch, minibatch,
    pruner, weight) and never by rank: every torchrun rank and every rerun prunes the same.
    """

    def scores(self, name: str, weight: Tensor, step: PruneStep) -> Tensor:
        """A random score in [0, 1) per group, -1 for an all-zero group; the lowest go."""
        norms = group_norms(weight, self.group_type, block_shape=self.block_shape)
        draws = torch.rand(norms.numel(), generator=step.generator(self.name, name))
        return torch.where(norms.cpu() == 0, -1.0, draws).to(weight.device)
