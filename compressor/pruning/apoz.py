"""Hu et al.'s network trimming: rank filters by the average percentage of zeros (APoZ) of their
activations during training, and prune the most often inactive ones on AGP's schedule."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from compressor.pruning.base import PruneStep
from compressor.pruning.groups import expand_group_mask, group_mask_from_scores, group_norms
from compressor.pruning.structured import RankedStructurePruner

__all__ = ["ActivationAPoZRankedFilterPruner"]

LOG = logging.getLogger("compressor")


class ActivationAPoZRankedFilterPruner(RankedStructurePruner):
    """Filters whose post-ReLU activations are most often zero are pruned first.

    A forward hook on the batch norm that follows each layer (or on the layer itself) counts,
    per channel, how often the pre-ReLU value is <= 0 while training. Masks computed at an epoch
    use the counts gathered since the previous computation; with none yet, L1 norms rank.
    """

    def __init__(self, name: str, weights: Sequence[str], *, initial_sparsity: float,
                 final_sparsity: float, group_type: str = "Filters") -> None:
        super().__init__(name, weights, group_type=group_type, initial_sparsity=initial_sparsity,
                         final_sparsity=final_sparsity)
        self.zeros: dict[str, Tensor] = {}
        self.counts: dict[str, Tensor] = {}
        self._handles: list[RemovableHandle] = []

    def attach(self, model: nn.Module) -> None:
        """Hook the module whose output feeds each layer's ReLU."""
        layers = [weight.rsplit(".", 1)[0] for weight in self.weights]
        bn_of = self.batchnorms(model)
        for weight, layer in zip(self.weights, layers, strict=True):
            observed = bn_of.get(layer) or layer
            hook = self._make_hook(weight)
            self._handles.append(model.get_submodule(observed).register_forward_hook(hook))

    def _make_hook(self, weight: str):  # noqa: ANN202 - a closure for register_forward_hook
        def hook(module: nn.Module, inputs: Any, output: Tensor) -> None:
            if not module.training:
                return
            with torch.no_grad():
                dims = [d for d in range(output.dim()) if d != 1]
                zeros = output.detach().le(0).sum(dim=dims).double().cpu()
                count = torch.tensor(output.numel() // output.shape[1], dtype=torch.float64)
                self.zeros[weight] = self.zeros.get(weight, torch.zeros_like(zeros)) + zeros
                self.counts[weight] = self.counts.get(weight, torch.zeros(())) + count

        return hook

    def detach(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def scores(self, name: str, weight: Tensor, step: PruneStep) -> Tensor:
        """1 - APoZ per filter (low is pruned first); L1 norms before any statistics exist."""
        if name not in self.counts:
            return group_norms(weight, self.group_type)
        apoz = self.zeros[name] / self.counts[name]
        return (1.0 - apoz).float().to(weight.device)

    def group_masks(self, params: Mapping[str, Tensor], step: PruneStep) -> dict[str, Tensor]:
        """Rank by APoZ, then start counting afresh for the next computation."""
        level = self.level(step)
        missing = [name for name in self.weights if name not in self.counts]
        if missing:
            LOG.info("%s: no activation statistics yet for %d weights (first pruning step); "
                     "ranking them by L1 norm", self.name, len(missing))
        masks = {}
        for name in self.weights:
            keep = group_mask_from_scores(self.scores(name, params[name], step), level)
            masks[name] = expand_group_mask(keep, params[name], self.group_type)
        self.zeros.clear()
        self.counts.clear()
        return masks

    def state_dict(self) -> dict[str, Any]:
        """The statistics gathered so far."""
        return {"zeros": dict(self.zeros), "counts": dict(self.counts)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the gathered statistics."""
        self.zeros = dict(state.get("zeros", {}))
        self.counts = dict(state.get("counts", {}))
