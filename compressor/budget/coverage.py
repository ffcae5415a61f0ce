"""How much of a model the budget search can shrink, beside Torch-Pruning's own reach: the
share of the convolutions' output channels that lie in prunable channel groups.

Torch-Pruning's share counts every channel of its DependencyGraph's groups (`get_all_groups`)
with its usual ignored layers, the classifier (the layers whose outputs are the model's); ours
counts the channels of the same groups rooted at the leader of every group that
`prunable_groups` keeps (groups thinning removes exactly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from compressor.budget.groups import prunable_groups
from compressor.thinning.support import dependency_graph

__all__ = ["Coverage", "pruning_coverage"]

CONV = nn.modules.conv._ConvNd


@dataclass(frozen=True)
class Coverage:
    """Conv output channels of a model, and how many are in prunable groups (ours, TP's)."""

    channels: int
    ours: int
    torch_pruning: int

    @property
    def ours_share(self) -> float:
        """Our share of the conv channels."""
        return self.ours / max(1, self.channels)

    @property
    def torch_pruning_share(self) -> float:
        """Torch-Pruning's share of the conv channels."""
        return self.torch_pruning / max(1, self.channels)


def _reaches_output(graph: Any, module: nn.Module) -> bool:
    pruner = graph.get_pruner_of_module(module)
    channels = pruner.get_out_channels(module) if pruner is not None else None
    if not channels:
        return False
    group = graph.get_pruning_group(module, pruner.prune_out_channels, list(range(channels)))
    return any(type(dep.target.module).__name__ == "_OutputOp" for dep, _ in group)


def _conv_channels(graph: Any, group: Any, ignored: set[nn.Module],
                   into: dict[nn.Module, set[int]]) -> None:
    """Add the conv output channels of a Torch-Pruning group to `into` (module -> indices)."""
    for dep, idxs in group:
        module = dep.target.module
        if (isinstance(module, CONV) and module not in ignored
                and graph.is_out_channel_pruning_fn(dep.handler)):
            # indices past the layer's channels follow a zero-padded shortcut: not its own
            into.setdefault(module, set()).update(
                int(i) for i in idxs if int(i) < module.out_channels)


def pruning_coverage(model: nn.Module, inputs: Tensor) -> Coverage:
    """Conv output channels of `model` (its classifier aside), and how many of them lie in
    groups `prunable_groups` keeps and in Torch-Pruning's groups."""
    model.eval()
    graph = dependency_graph(model, inputs)
    # layers the forward never reaches (auxiliary heads in eval mode) are no part of it
    layers = [m for m in model.modules()
              if isinstance(m, (CONV, nn.Linear)) and m in graph.module2node]
    ignored = {m for m in layers if _reaches_output(graph, m)}
    total = sum(m.out_channels for m in layers if isinstance(m, CONV) and m not in ignored)
    theirs: dict[nn.Module, set[int]] = {}
    for group in graph.get_all_groups(ignored_layers=list(ignored),
                                      root_module_types=(CONV, nn.Linear)):
        _conv_channels(graph, group, ignored, theirs)
    ours: dict[nn.Module, set[int]] = {}
    for kept in prunable_groups(model, inputs):
        leader = model.get_submodule(kept.layer)
        pruner = graph.get_pruner_of_module(leader)
        channels = list(range(pruner.get_out_channels(leader)))
        _conv_channels(graph, graph.get_pruning_group(leader, pruner.prune_out_channels,
                                                      channels), ignored, ours)
    return Coverage(total, sum(map(len, ours.values())), sum(map(len, theirs.values())))
