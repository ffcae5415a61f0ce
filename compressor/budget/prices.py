"""What one channel of a group costs: the MACs and parameters its removal saves, to first order
(every layer producing, reading or passing the channel, at the model's InputSpec)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from compressor.budget.groups import ChannelGroup
from compressor.reports.metrics import layer_costs
from compressor.thinning.recipe import module_sizes

__all__ = ["channel_prices"]


def _own_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters(recurse=False))


def _member_price(module: nn.Module, role: str, macs: int) -> tuple[float, float]:
    """(MACs, parameters) per channel of `module` in `role`."""
    out_size, in_size = module_sizes(module)
    if role == "in":
        return macs / in_size, module.weight.numel() / in_size
    return macs / out_size, _own_params(module) / out_size


def channel_prices(model: nn.Module, groups: Sequence[ChannelGroup]) -> dict[str, list[float]]:
    """quantity ("macs", "params") -> per group, what removing one of its channels saves."""
    macs = {cost.name: cost.macs for cost in layer_costs(model)}
    prices: dict[str, list[float]] = {"macs": [], "params": []}
    for group in groups:
        saved_macs = saved_params = 0.0
        # a unit is one channel per block: of every block of a grouped convolution that
        # shares the group, or of a layer wider than the group's narrowest producer
        member_blocks = group.member_blocks or (group.blocks,) * len(group.members)
        for (name, role), blocks in zip(group.members, member_blocks, strict=True):
            module = model.get_submodule(name)
            layer_macs, layer_params = _member_price(module, role, macs.get(name, 0))
            saved_macs += layer_macs * blocks
            saved_params += layer_params * blocks
        prices["macs"].append(saved_macs)
        prices["params"].append(saved_params)
    return prices
