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
from compressor.utils.distributed import all_reduce_sum

__all__ = ["ActivationAPoZRankedFilterPruner"]

LOG = logging.getLogger("compressor")


class ActivationAPoZRankedFilterPruner(RankedStructurePruner):
    """Filters whose post-ReLU activations are most often zero are pruned first.

    A forward hook on the batch norm that follows each layer (or on the layer itself) counts,
    per channel, how often the pre-ReLU value is <= 0 while training. The counts stay on the
    device (no host sync per batch) and on this rank until sync() sums them over all ranks in
    one all-reduce: before masks are computed and at each epoch's end (so a checkpoint holds
    every rank's counts). Masks computed at an epoch use the counts gathered since the previous
    computation; with none yet, L1 norms rank.
    """

    def __init__(self, name: str, weights: Sequence[str], *, initial_sparsity: float,
                 final_sparsity: float, group_type: str = "Filters") -> None:
        super().__init__(name, weights, group_type=group_type, initial_sparsity=initial_sparsity,
                         final_sparsity=final_sparsity)
        self.zeros: dict[str, Tensor] = {}  # summed over ranks: identical on every rank
        self.counts: dict[str, Tensor] = {}
        self._local_zeros: dict[str, Tensor] = {}  # this rank's, since the last sync
        self._local_counts: dict[str, int] = {}
        self._channels: dict[str, int] = {}
        self._anchor: Tensor | None = None  # a watched weight: its device is the stats' device
        self._handles: list[RemovableHandle] = []

    def attach(self, model: nn.Module) -> None:
        """Hook the module whose output feeds each layer's ReLU."""
        super().attach(model)
        bn_of = self.batchnorms(model)
        for weight in self.weights:
            layer = weight.rsplit(".", 1)[0]
            param = model.get_parameter(weight)
            if self._channels.get(weight, param.shape[0]) != param.shape[0]:
                # Thinned since the counts were taken: they no longer match its filters.
                for stats in (self.zeros, self.counts, self._local_zeros, self._local_counts):
                    stats.pop(weight, None)
            self._channels[weight] = int(param.shape[0])
            self._anchor = param
            observed = bn_of.get(layer) or layer
            hook = self._make_hook(weight, model)
            self._handles.append(model.get_submodule(observed).register_forward_hook(hook))

    def _make_hook(self, weight: str, model: nn.Module):  # noqa: ANN202 - a forward hook
        def hook(module: nn.Module, inputs: Any, output: Tensor) -> None:
            # while the model trains: a batch-norm re-estimation runs its batch norms alone in
            # train mode (the model in eval mode), and its batches are no training statistics
            if not (module.training and model.training):
                return
            with torch.no_grad():
                dims = [d for d in range(output.dim()) if d != 1]
                zeros = output.detach().le(0).sum(dim=dims, dtype=torch.float64)
                previous = self._local_zeros.get(weight)
                self._local_zeros[weight] = zeros if previous is None else previous.add_(zeros)
                self._local_counts[weight] = (self._local_counts.get(weight, 0)
                                              + output.numel() // output.shape[1])

        return hook

    def detach(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def sync(self) -> None:
        """Add every rank's new counts to the shared statistics (one all-reduce of all layers)."""
        if not self._channels:  # never attached: no hooks, nothing gathered
            return
        device = self._device()
        parts = []
        for name, channels in self._channels.items():
            zeros = self._local_zeros.get(name)
            parts.append(zeros.to(device) if zeros is not None
                         else torch.zeros(channels, dtype=torch.float64, device=device))
            parts.append(torch.full((1,), float(self._local_counts.get(name, 0)),
                                    dtype=torch.float64, device=device))
        packed = all_reduce_sum(torch.cat(parts))
        self._local_zeros.clear()
        self._local_counts.clear()
        positions, end = [], 0
        for channels in self._channels.values():
            positions.append(end + channels)
            end += channels + 1
        totals = packed[positions].tolist()  # one host sync per call, not per batch
        offset = 0
        for (name, channels), total in zip(self._channels.items(), totals, strict=True):
            zeros, count = packed[offset:offset + channels], packed[offset + channels]
            offset += channels + 1
            if total == 0:
                continue
            if name in self.counts:
                zeros = zeros + self.zeros[name].to(device)
                count = count + self.counts[name].to(device)
            self.zeros[name], self.counts[name] = zeros, count

    def _device(self) -> torch.device:
        # Read at each use: the model may have moved since attach (module.to keeps parameters).
        return self._anchor.device if self._anchor is not None else torch.device("cpu")

    def scores(self, name: str, weight: Tensor, step: PruneStep) -> Tensor:
        """1 - APoZ per filter (low is pruned first); L1 norms before any statistics exist."""
        if name not in self.counts:
            return group_norms(weight, self.group_type)
        apoz = self.zeros[name] / self.counts[name]
        return (1.0 - apoz).float().to(weight.device)

    def group_masks(self, params: Mapping[str, Tensor], step: PruneStep) -> dict[str, Tensor]:
        """Rank by APoZ summed over ranks, then start counting afresh for the next computation."""
        self.sync()
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
        """The statistics gathered so far (shared plus this rank's unsynced ones), on the CPU."""
        zeros = {name: value.detach().cpu() for name, value in self.zeros.items()}
        counts = {name: value.detach().cpu() for name, value in self.counts.items()}
        for name, local in self._local_zeros.items():
            zeros[name] = zeros[name] + local.cpu() if name in zeros else local.cpu()
            count = torch.tensor(float(self._local_counts.get(name, 0)), dtype=torch.float64)
            counts[name] = counts[name] + count if name in counts else count
        return {"zeros": zeros, "counts": counts}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the gathered statistics (as shared ones: a checkpoint holds every rank's)."""
        device = self._device()
        self.zeros = {name: value.to(device, torch.float64)
                      for name, value in state.get("zeros", {}).items()}
        self.counts = {name: value.to(device, torch.float64)
                       for name, value in state.get("counts", {}).items()}
        self._local_zeros.clear()
        self._local_counts.clear()
