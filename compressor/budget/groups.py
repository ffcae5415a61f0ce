"""Channel groups a budget search may shrink: layers whose filters go together.

Torch-Pruning's dependency graph couples channels across residual additions, batch norms and
concatenations. A group here is the set of layers that produce one coupled set of channels;
pruning the same filters of all of them (ranked by the first, Distiller's `Leader`) makes the
channels dead, and thinning removes them with everything that reads them. Where a grouped
convolution shares the channels, they go as Torch-Pruning's channel groups prune them: one
unit is the same channel of every block (group) of the convolution, so every block loses the
same number; an attention's fused qkv projection goes the same way, one unit being one
dimension of every head in q, k and v (compressor.thinning.attention). Groups that thinning
leaves alone (a channel reaching the model's output, a zero-padded shortcut, a grouped
convolution reading only part of them, a layer thinning does not know) are left out, as is any
group that a probe shows thinning would not remove.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from compressor.pruning.graph import following_batchnorms
from compressor.pruning.groups import group_norms
from compressor.thinning.attention import PARTS, attention_layouts
from compressor.thinning.graph_guard import run_thinned
from compressor.thinning.plan import find_thinning
from compressor.thinning.recipe import (
    apply_thinning_recipe,
    is_channel_layer_norm,
    is_depthwise,
    is_thinnable,
    module_sizes,
)
from compressor.thinning.renormalize import renormalized, renormalized_norms
from compressor.thinning.support import dependency_graph, is_grouped, pads_channels
from compressor.training.losses import main_logits
from compressor.utils.errors import UsageError

__all__ = ["ChannelGroup", "prunable_groups", "leader_norms", "leader_ranking", "batchnorms_of",
           "mask_group_filters", "group_masked"]

CONV = nn.modules.conv._ConvNd
# A thinned probe computes what the masked one did up to float32 rounding of the folded
# constants; a channel followed wrongly changes the outputs by far more.
PROBE_TOLERANCE = 1e-3


@dataclass(frozen=True)
class ChannelGroup:
    """Layers (weight names, the ranked leader first) whose filters are pruned together, and
    every module whose channels go with them: (name, role), role "out" for the producers,
    "in" for layers reading the channels, "through" for depthwise convolutions and norms.
    `channels` counts units of `blocks` channels each: unit j is channel j of every block of
    channels // blocks (1 but where a grouped convolution shares them)."""

    weights: tuple[str, ...]
    channels: int
    members: tuple[tuple[str, str], ...] = ()
    blocks: int = 1
    # batch norms the channels pass through (RepVGG's identity branch, a pre-activation norm):
    # their weight and bias are masked with the filters, so a pruned channel carries zeros
    # through them too, not their shift (which a padded convolution would spread unevenly)
    norms: tuple[str, ...] = ()
    # each weight's blocks where the producers differ in width (GhostNet: a residual stream
    # twice as wide as the primary convolutions that make its first half, a depthwise
    # convolution making the second half from the same channels, so unit j is channel j of
    # a primary convolution and channels j and j + width of the stream): () where every
    # weight has `blocks`
    weight_blocks: tuple[int, ...] = ()
    # each member's blocks (how many of its channels one unit is), where weight_blocks is set
    member_blocks: tuple[int, ...] = ()

    def unit_channels(self, units: Tensor, size: int | None = None) -> Tensor:
        """The channel indices of `units` (every block's channel of each unit) in a layer of
        `size` channels (default: the leader's width)."""
        blocks = self.blocks if size is None else max(1, size // self.channels)
        units = torch.as_tensor(units, dtype=torch.long).reshape(-1)
        offsets = torch.arange(blocks, dtype=torch.long) * self.channels
        return (units[None, :] + offsets[:, None]).reshape(-1)

    def blocks_of(self, weight: str) -> int:
        """How many channels of `weight`'s layer one unit of the group is."""
        if not self.weight_blocks:
            return self.blocks
        return self.weight_blocks[self.weights.index(weight)]

    @property
    def min_blocks(self) -> int:
        """The fewest channels a unit is in any of the group's layers."""
        return min(self.weight_blocks or (self.blocks,))

    @property
    def leader(self) -> str:
        """The weight whose filter norms rank the group's channels."""
        return self.weights[0]

    @property
    def layer(self) -> str:
        """The leader's module name (how the group is named in reports)."""
        return self.leader.rsplit(".", 1)[0]

    def to_state(self) -> dict[str, Any]:
        """Plain values for a checkpoint."""
        return {"weights": list(self.weights), "channels": self.channels,
                "members": [list(m) for m in self.members], "blocks": self.blocks,
                "norms": list(self.norms), "weight_blocks": list(self.weight_blocks),
                "member_blocks": list(self.member_blocks)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ChannelGroup:
        """The group to_state recorded."""
        return cls(tuple(state["weights"]), int(state["channels"]),
                   tuple((m[0], m[1]) for m in state.get("members", ())),
                   int(state.get("blocks", 1)), tuple(state.get("norms", ())),
                   tuple(int(b) for b in state.get("weight_blocks", ())),
                   tuple(int(b) for b in state.get("member_blocks", ())))


def _blocks(group: Any, graph: Any) -> int | None:
    """The number of blocks a group's channels go in: the groups of every grouped convolution
    that shares them (1 where none does), or None where one reads or makes only part of them,
    or two disagree (thinning could not keep their groups even)."""
    found = {1}
    for dep, idxs in group:
        module = dep.target.module
        if not is_grouped(module):
            continue
        size = module_sizes(module)[0 if graph.is_out_channel_pruning_fn(dep.handler) else 1]
        if list(idxs) != list(range(size)) or list(_root_idxs(group, dep)) != list(idxs):
            return None
        found.add(module.groups)
    return max(found) if len(found - {1}) <= 1 else None


def _root_idxs(group: Any, dep: Any) -> list[int]:
    for item in group.items:
        if item.dep is dep:
            return list(item.root_idxs)
    return []


def _members(group: Any, graph: Any) -> list[tuple[nn.Module, str, set[int]]] | None:
    """Every module of a group with its role ("out", "in", "through") and the indices of its
    channels in the group, or None when thinning would leave the group alone."""
    members: list[tuple[nn.Module, str, set[int]]] = []
    for dep, idxs in group:
        module = dep.target.module
        if not isinstance(module, nn.Module) or type(module).__module__.startswith(
                "torch_pruning"):
            if type(module).__name__ == "_OutputOp" or pads_channels(module, graph):
                return None
            continue
        if not is_thinnable(module):
            return None
        outputs = graph.is_out_channel_pruning_fn(dep.handler)
        channels = {int(i) for i in idxs}
        if not isinstance(module, (CONV, nn.Linear)) or is_depthwise(module):
            members.append((module, "through", channels))
        elif outputs:
            if list(idxs) != list(range(module_sizes(module)[0])):
                return None  # a producer of only part of the channels: not a whole layer
            members.append((module, "out", channels))
        else:
            members.append((module, "in", channels))
    return members if any(role == "out" for _, role, _ in members) else None


def _whole_norms(members: list[tuple[nn.Module, str, set[int]]], names: dict[nn.Module, str]
                 ) -> tuple[str, ...]:
    """The batch norms (and LayerNorms over the channels) whose every channel is the group's:
    masked with the filters, so a pruned channel leaves them zero. (A batch norm over a
    concatenation holds the group's channels at an offset among others: masking its first
    channels would zero others, so it is left to the fold of the constant.)"""
    return tuple(dict.fromkeys(
        names[m] for m, role, channels in members
        if role == "through" and (isinstance(m, nn.modules.batchnorm._BatchNorm)
                                  or is_channel_layer_norm(m))
        and channels == set(range(module_sizes(m)[0]))))


def _candidates(model: nn.Module, inputs: Tensor) -> list[ChannelGroup]:
    graph = dependency_graph(model, inputs)
    names = {module: name for name, module in model.named_modules()}
    order = {module: index for index, module in enumerate(names)}
    # an attention's qkv rows go as one dimension of every head in q, k and v
    head_blocks = {m.qkv: PARTS * layout.heads for m, layout in attention_layouts(model).items()}
    found: list[ChannelGroup] = []
    seen: set[tuple[str, ...]] = set()
    for group in graph.get_all_groups(root_module_types=(CONV, nn.Linear)):
        members = _members(group, graph)
        blocks = _blocks(group, graph)
        if members is None or blocks is None:
            continue
        producers = sorted({m for m, role, _ in members if role == "out"},
                           key=order.__getitem__)
        if len(producers) == 1 and producers[0] in head_blocks:
            blocks = head_blocks[producers[0]]
        widths = [module_sizes(m)[0] for m in producers]
        weights = tuple(f"{names[m]}.weight" for m in producers)
        units = min(widths) // blocks
        # producers of different widths: each a whole multiple of the narrowest (no grouped
        # convolution among them); the thinning probe confirms the channels line up
        if weights in seen or min(widths) % blocks or (len(set(widths)) > 1 and (
                blocks > 1 or any(width % units for width in widths))):
            continue
        seen.add(weights)
        roles: dict[tuple[str, str], set[int]] = {}
        for module, role, channels in members:
            roles.setdefault((names[module], role), set()).update(channels)
        weight_blocks = tuple(width // units for width in widths)
        mixed = len(set(widths)) > 1
        # members count a unit's channels themselves where they differ (an attention's proj
        # reads one column per head of a unit that is three rows per head of qkv)
        per_member = mixed or producers[0] in head_blocks
        found.append(ChannelGroup(
            weights, units, tuple(roles), weight_blocks[0], _whole_norms(members, names),
            weight_blocks if mixed else (),
            tuple(max(1, len(c) // units) for c in roles.values()) if per_member else ()))
    return found


def leader_norms(model: nn.Module, group: ChannelGroup) -> Tensor:
    """The mean absolute weight of each of the leader's filters (rows of a linear layer), per
    unit of the group: averaged over its blocks, as Torch-Pruning ranks channel groups."""
    weight = model.get_parameter(group.leader).detach()
    norms = group_norms(weight, "Filters" if weight.dim() > 2 else "Rows", 1).cpu()
    return norms.view(-1, group.channels).mean(dim=0)


def leader_ranking(model: nn.Module, group: ChannelGroup) -> Tensor:
    """The group's channel indices, least important first (the leader's filter L1 norms)."""
    return torch.argsort(leader_norms(model, group), stable=True)


def batchnorms_of(model: nn.Module, groups: list[ChannelGroup]) -> dict[str, str | None]:
    """Layer name -> the batch norm that alone reads its output, for every layer of `groups`
    (found by torch.fx: a model it cannot trace is refused in one line)."""
    layers = [w.rsplit(".", 1)[0] for g in groups for w in g.weights]
    try:
        return following_batchnorms(model, layers)
    except ValueError as exc:
        raise UsageError(f"{exc}, so the batch norms after pruned filters cannot be found; "
                         "use a schedule with element-wise pruning (--compress) for this "
                         "model, or make its forward traceable by torch.fx") from None


def _masked_modules(model: nn.Module, group: ChannelGroup,
                    batchnorms: dict[str, str | None]) -> list[nn.Module]:
    """The group's layers and the batch norms that follow them: what masking its filters
    touches."""
    modules = []
    for weight_name in group.weights:
        layer_name = weight_name.rsplit(".", 1)[0]
        modules.append(model.get_submodule(layer_name))
        if batchnorms.get(layer_name):
            modules.append(model.get_submodule(str(batchnorms[layer_name])))
    for name in group.norms:
        norm = model.get_submodule(name)
        if all(norm is not module for module in modules):
            modules.append(norm)
    return modules


def mask_group_filters(model: nn.Module, group: ChannelGroup, channels: Tensor,
                       batchnorms: dict[str, str | None]) -> None:
    """Zero `channels` (units) of every layer of the group, with their biases and the batch
    norms that follow them (in place), so the channels carry exact zeros as the structure
    pruners leave."""
    with torch.no_grad():
        for module in _masked_modules(model, group, batchnorms):
            for name in ("weight", "bias"):
                param = getattr(module, name, None)
                if param is not None:
                    param[group.unit_channels(channels, param.shape[0])] = 0.0


@contextmanager
def group_masked(model: nn.Module, group: ChannelGroup, channels: Tensor,
                 batchnorms: dict[str, str | None]) -> Iterator[nn.Module]:
    """`model` with `channels` of the group masked (mask_group_filters) inside the block, and
    every parameter it touched restored afterwards (cheaper than masking a copy)."""
    saved = [(p, p.detach().clone()) for m in _masked_modules(model, group, batchnorms)
             for p in m.parameters(recurse=False)]
    try:
        mask_group_filters(model, group, channels, batchnorms)
        yield model
    finally:
        with torch.no_grad():
            for param, value in saved:
                param.copy_(value)


def _probe_thinning(model: nn.Module, groups: list[ChannelGroup], inputs: Tensor,
                    batchnorms: dict[str, str | None]) -> tuple[dict[str, Any], bool]:
    """Thin a copy of `model` without the least important half of each group's channels:
    the recipe, and whether the thinned copy computes what the masked one did (it does not
    where Torch-Pruning follows channels into a slice or a fixed-size reshape)."""
    probe = copy.deepcopy(model).eval()
    for group in groups:
        mask_group_filters(probe, group, leader_ranking(probe, group)[:group.channels // 2],
                           batchnorms)
    with torch.no_grad():
        reference = main_logits(probe(inputs))
    # a LayerNorm that thinning shrinks normalizes its kept channels: the reference then comes
    # from the masked model as it was before thinning folds constants into it
    masked = (copy.deepcopy(probe) if any(is_channel_layer_norm(m) for m in probe.modules())
              else None)
    recipe, _ = find_thinning(probe, inputs, exact=True)
    if masked is not None and renormalized_norms(masked, recipe):
        with torch.no_grad(), renormalized(masked, recipe):
            reference = main_logits(masked(inputs))
    apply_thinning_recipe(probe, recipe)
    try:
        error = float((run_thinned(probe, inputs, recipe) - reference).abs().max())
    except UsageError:
        return recipe, False
    return recipe, error <= PROBE_TOLERANCE * max(1.0, float(reference.abs().max()))


def prunable_groups(model: nn.Module, inputs: Tensor) -> list[ChannelGroup]:
    """The model's channel groups whose pruned filters thinning removes, every one of them.

    A probe zeroes the least important half of every candidate group's channels on a copy
    and keeps the groups whose every layer then loses exactly those: a channel that a norm
    turns into a constant before a zero-padded convolution (pre-activation blocks) cannot be
    removed exactly, and its group is left out. Where the thinned probe does not compute what
    the masked one did, each group is probed alone and kept only if it thins exactly.
    """
    candidates = [g for g in _candidates(model, inputs) if g.channels > 1]
    if not candidates:
        return []
    batchnorms = batchnorms_of(model, candidates)
    recipe, exact = _probe_thinning(model, candidates, inputs, batchnorms)
    removed = recipe["modules"]
    kept = [g for g in candidates
            if all(len(removed.get(w.rsplit(".", 1)[0], {}).get("out", []))
                   == g.channels // 2 * g.blocks_of(w) for w in g.weights)]
    if exact:
        return kept
    return [g for g in kept if _probe_thinning(model, [g], inputs, batchnorms)[1]]
