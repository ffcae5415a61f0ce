"""How much of a model the budget search can shrink, beside Torch-Pruning's own reach: the
share of the output channels of the convolutions and linear layers (the classifier aside) that
lie in prunable channel groups.

Both sides count the same layers: every convolution and linear layer the forward reaches, less
Torch-Pruning's usual ignored layers, the classifier (the layers whose outputs are the
model's). Linear layers count because channels-last blocks (ConvNeXt's MLP, a transformer's)
are linear layers acting on the channels. Torch-Pruning's share counts every such channel of
its DependencyGraph's groups (`get_all_groups`); ours counts the channels of the same groups
rooted at the leader of every group that `prunable_groups` keeps (groups thinning removes
exactly: the thinned model computes what the masked one did). `Coverage.gaps` says, per
reason, how many of Torch-Pruning's channels are not ours: a LayerNorm over the channels (its
statistics change when a channel goes, where Torch-Pruning prunes it anyway), a layer thinning
cannot slice, a zero-padded shortcut, a grouped convolution sharing only part of them (one with
more filters than inputs, as FastViT's downsampling), or channels that the probe shows are not
removed exactly (a norm making a pruned channel a constant before a zero-padded convolution, a
fixed slice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from compressor.budget.groups import prunable_groups
from compressor.thinning.recipe import is_thinnable, module_sizes
from compressor.thinning.support import dependency_graph, is_grouped, pads_channels

__all__ = ["Coverage", "pruning_coverage"]

CONV = nn.modules.conv._ConvNd
LAYERS = (CONV, nn.Linear)
CHANNEL_NORMS = (nn.LayerNorm, nn.GroupNorm)
NORM_GAP = "LayerNorm over channels (its statistics change when one goes)"
EXACT_GAP = "not removed exactly (thinned != masked)"


@dataclass(frozen=True)
class Coverage:
    """Output channels of a model's convolutions and linear layers, how many are in prunable
    groups (ours, Torch-Pruning's), and why Torch-Pruning's others are not ours."""

    channels: int
    ours: int
    torch_pruning: int
    gaps: tuple[tuple[str, int], ...] = ()

    @property
    def ours_share(self) -> float:
        """Our share of the channels."""
        return self.ours / max(1, self.channels)

    @property
    def torch_pruning_share(self) -> float:
        """Torch-Pruning's share of the channels."""
        return self.torch_pruning / max(1, self.channels)

    @property
    def note(self) -> str:
        """The gaps in one line: reason and channels, the largest first."""
        return "; ".join(f"{reason}: {count}" for reason, count in self.gaps)


def _reaches_output(graph: Any, module: nn.Module) -> bool:
    pruner = graph.get_pruner_of_module(module)
    channels = pruner.get_out_channels(module) if pruner is not None else None
    if not channels:
        return False
    group = graph.get_pruning_group(module, pruner.prune_out_channels, list(range(channels)))
    # the model's outputs: Torch-Pruning's output op, or a node nothing reads (the classifier)
    return any(type(dep.target.module).__name__ == "_OutputOp" or (
        not dep.target.outputs and graph.is_out_channel_pruning_fn(dep.handler))
        for dep, _ in group)


def _layer_channels(graph: Any, group: Any, ignored: set[nn.Module]
                    ) -> dict[nn.Module, set[int]]:
    """The output channels of the convolutions and linear layers of a Torch-Pruning group
    (module -> indices)."""
    found: dict[nn.Module, set[int]] = {}
    for dep, idxs in group:
        module = dep.target.module
        if (isinstance(module, LAYERS) and module not in ignored
                and graph.is_out_channel_pruning_fn(dep.handler)):
            # indices past the layer's channels follow a zero-padded shortcut: not its own
            size = module_sizes(module)[0]
            found.setdefault(module, set()).update(int(i) for i in idxs if int(i) < size)
    return found


def _gap_reason(graph: Any, group: Any) -> str:
    """Why thinning leaves a Torch-Pruning group (or part of it) alone, in a few words."""
    modules = [dep.target.module for dep, _ in group]
    if any(isinstance(m, CHANNEL_NORMS) and not is_thinnable(m) for m in modules):
        return NORM_GAP
    for module in modules:
        if isinstance(module, nn.Parameter):
            continue  # a layer scale is sliced with its channels
        if not isinstance(module, nn.Module) or type(module).__module__.startswith(
                "torch_pruning"):
            if pads_channels(module, graph):
                return "zero-padded shortcut"
            continue
        if not is_thinnable(module):
            return f"{type(module).__name__} not thinnable"
    if any(is_grouped(m) for m in modules):
        return "grouped convolution (part of its channels, or one unit)"
    return EXACT_GAP


def _merge(into: dict[nn.Module, set[int]], found: dict[nn.Module, set[int]]) -> None:
    for module, idxs in found.items():
        into.setdefault(module, set()).update(idxs)


def pruning_coverage(model: nn.Module, inputs: Tensor) -> Coverage:
    """Output channels of `model`'s convolutions and linear layers (its classifier aside), how
    many of them lie in groups `prunable_groups` keeps and in Torch-Pruning's groups, and why
    the rest of Torch-Pruning's are not ours."""
    model.eval()
    graph = dependency_graph(model, inputs)
    # layers the forward never reaches (auxiliary heads in eval mode) are no part of it
    layers = [m for m in model.modules() if isinstance(m, LAYERS) and m in graph.module2node]
    # layers whose groups never complete are set aside: neither ours nor Torch-Pruning's
    unfollowable = set(getattr(graph, "unfollowable", ()))
    ignored = {m for m in layers if m not in unfollowable and _reaches_output(graph, m)}
    total = sum(module_sizes(m)[0] for m in layers if m not in ignored)
    ours: dict[nn.Module, set[int]] = {}
    for kept in prunable_groups(model, inputs):
        leader = model.get_submodule(kept.layer)
        pruner = graph.get_pruner_of_module(leader)
        channels = list(range(pruner.get_out_channels(leader)))
        _merge(ours, _layer_channels(graph, graph.get_pruning_group(
            leader, pruner.prune_out_channels, channels), ignored))
    theirs: dict[nn.Module, set[int]] = {}
    gaps: dict[str, int] = {}
    for group in graph.get_all_groups(ignored_layers=list(ignored), root_module_types=LAYERS):
        found = _layer_channels(graph, group, ignored)
        missing = sum(len(idxs - ours.get(m, set()) - theirs.get(m, set()))
                      for m, idxs in found.items())
        if missing:
            reason = _gap_reason(graph, group)
            gaps[reason] = gaps.get(reason, 0) + missing
        _merge(theirs, found)
    ordered = tuple(sorted(gaps.items(), key=lambda item: (-item[1], item[0])))
    return Coverage(total, sum(map(len, ours.values())), sum(map(len, theirs.values())),
                    ordered)
