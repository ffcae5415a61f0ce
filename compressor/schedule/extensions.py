"""Schedule extensions: Distiller's FilterRemover / ChannelRemover (thinning during training)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["StructureRemover", "rebind_optimizer"]

LOG = logging.getLogger("compressor")


def rebind_optimizer(optimizer: torch.optim.Optimizer, old: Mapping[str, Tensor],
                     new: Mapping[str, Tensor]) -> None:
    """Point the optimizer at the model's new parameters after thinning.

    Unchanged parameters keep their state (momentum); a parameter whose shape changed starts
    with fresh state.
    """
    by_id = {id(tensor): name for name, tensor in old.items()}
    for group in optimizer.param_groups:
        params = []
        for param in group["params"]:
            name = by_id.get(id(param))
            replacement = new.get(name) if name is not None else None
            if replacement is None or replacement is param:
                params.append(param)
                continue
            state = optimizer.state.pop(param, None)
            if state is not None and replacement.shape == param.shape:
                optimizer.state[replacement] = state
            params.append(replacement)
        group["params"] = params


class StructureRemover:
    """Physically remove the zeroed filters or channels (compressor.thinning), once per epoch
    in which its policy is active, after that epoch's pruning masks are in place."""

    def __init__(self, name: str, thinning_func: str) -> None:
        self.name = name
        self.thinning_func = thinning_func

    def apply(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Thin `model` in place, rebind the optimizer; returns the composed recipe."""
        from compressor.thinning.transform import thin

        old = dict(model.named_parameters())
        recipe = thin(model)
        rebind_optimizer(optimizer, old, dict(model.named_parameters()))
        LOG.info("%s: thinned the model (%s)", self.name, self.thinning_func)
        return recipe
