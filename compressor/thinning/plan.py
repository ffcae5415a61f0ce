"""find_thinning: which zeroed filters/channels can go, and everything that depends on them.

Torch-Pruning's dependency graph finds the coupled layers of every channel (batch norms,
the next layers' inputs, residual additions that must stay aligned, the first linear layer
after a flatten, concatenations, grouped convolutions: those lose the same number of channels
in each of their groups, or none). This module decides which channels are dead, folds the
constant that a dead channel may still carry (a batch norm's shift) into the next layer, and
records everything as a plain recipe that `apply_thinning_recipe` replays.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from compressor.thinning.attention import (
    HeadLayout,
    Heads,
    attention_layouts,
    conforming_heads,
    fold_head_scale,
    head_roots,
)
from compressor.thinning.recipe import (
    RECIPE_VERSION,
    is_depthwise,
    is_thinnable,
    module_sizes,
)
from compressor.thinning.support import dependency_graph, is_grouped, pads, pads_channels
from compressor.utils.errors import UsageError

__all__ = ["find_thinning"]

CONV = nn.modules.conv._ConvNd
CONST_TOL = 1e-7  # a dead channel's value must be the same everywhere, up to rounding


def _consumer_inputs(model: nn.Module, modules: Iterable[nn.Module], inputs: Tensor,
                     attentions: Iterable[nn.Module] = ()
                     ) -> tuple[dict[nn.Module, Tensor], dict[nn.Module, Any]]:
    """The first input of each of `modules`, and the first call (args, kwargs) of each of
    `attentions`, in one forward."""
    captured: dict[nn.Module, Tensor] = {}
    calls: dict[nn.Module, tuple[tuple[Any, ...], dict[str, Any]]] = {}

    def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
        captured.setdefault(module, args[0].detach())

    def call_hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        calls.setdefault(module, (args, kwargs))

    handles = [m.register_forward_pre_hook(hook) for m in set(modules)]
    handles += [m.register_forward_pre_hook(call_hook, with_kwargs=True) for m in attentions]
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return captured, calls


def _constants(x: Tensor, dim: int) -> list[float | None]:
    """Per channel/feature along `dim`: its value if it is the same everywhere in x, else None
    (one pass over x for all channels)."""
    values = x.movedim(dim, 0).reshape(x.shape[dim], -1)
    firsts = values[:, 0]
    spreads = (values - firsts[:, None]).abs().amax(dim=1)
    return [first if spread <= CONST_TOL * max(1.0, abs(first)) else None
            for first, spread in zip(firsts.tolist(), spreads.tolist(), strict=True)]


def _all_zero_along(module: nn.Module, dim: int, idxs: list[int]) -> list[bool]:
    """Whether each listed slice of a layer's weight along `dim` (0: its filters / rows, 1: its
    input channels / columns) is all zero; reduced in place, with no |w| copy of a large layer."""
    weight = module.weight.detach()
    others = [d for d in range(weight.dim()) if d != dim]
    zero = (weight.amax(dim=others) == 0) & (weight.amin(dim=others) == 0)
    return zero[idxs].tolist()


def _zero_slices(module: nn.Module, idxs: list[int]) -> list[bool]:
    """Whether each listed filter (row) of a layer is all zero (its bias becomes a constant)."""
    return _all_zero_along(module, 0, idxs)


def _unused_roots(consumers: list[tuple[nn.Module, list[int], list[int]]]) -> set[int]:
    """Roots whose every reader has an all-zero input slice (a pruned channel/column)."""
    if any(is_depthwise(module) or is_grouped(module) for module, _, _ in consumers):
        return set()  # their input channels are not columns of the weight
    unused = {r for _, _, rs in consumers for r in rs}
    for module, idxs, rs in consumers:
        zero = _all_zero_along(module, 1, idxs)
        unused -= {r for r, z in zip(rs, zero, strict=True) if not z}
    return unused


def _is_unpadded(module: nn.Module, graph: Any) -> bool:
    """Whether a layer reads its input without padding: a constant input channel then gives a
    constant everywhere. A padding op right before it in the traced graph counts: a forward
    pre-hook sees the input before a padding inside the layer's forward (efficientnet's
    Conv2dStaticSamePadding, timm's Conv2dSame pad TF-style "same", then convolve)."""
    if isinstance(module, nn.Linear):
        return True
    own = module.padding
    if not (own == "valid" if isinstance(own, str) else all(p == 0 for p in own)):
        return False
    node = graph.module2node.get(module)
    return not any(pads(source.module, graph) for source in getattr(node, "inputs", ()))


class _Plan:
    """Removed indices and bias folds per module, built group by group."""

    def __init__(self) -> None:
        self.removed: dict[nn.Module, dict[str, set[int]]] = {}
        self.folds: list[tuple[nn.Module, list[int], list[float]]] = []
        # per-channel parameters no layer owns (layer scale): parameter -> (dim, indices)
        self.parameters: dict[nn.Parameter, tuple[int, set[int]]] = {}
        # attention modules thinned by head dimension: module -> (layout, dimensions kept)
        self.heads: dict[nn.Module, tuple[HeadLayout, int]] = {}

    def remove(self, module: nn.Module, key: str, idxs: Iterable[int]) -> None:
        entry = self.removed.setdefault(module, {"out": set(), "in": set()})
        entry[key].update(int(i) for i in idxs)

    def remove_channels(self, param: nn.Parameter, dim: int, idxs: Iterable[int]) -> None:
        _, removed = self.parameters.setdefault(param, (dim, set()))
        removed.update(int(i) for i in idxs)


def _refuse_grouped(items: list[tuple[nn.Module, bool, list[int], list[int]]],
                    names: dict[nn.Module, str]) -> None:
    """A group whose dead channels a grouped (not depthwise) convolution would lose unevenly
    keeps them: refuse when some are dead (every producer's filter zero), rather than leave
    them silently."""
    grouped = next((m for m, _, _, _ in items if is_grouped(m)), None)
    producers = [(m, i, r) for m, out, i, r in items
                 if out and isinstance(m, (CONV, nn.Linear)) and not is_depthwise(m)]
    if grouped is None or not producers:
        return
    dead = {r for _, _, rs in producers for r in rs}
    for module, idxs, rs in producers:
        dead -= {r for r, zero in zip(rs, _zero_slices(module, idxs), strict=True) if not zero}
    if not dead:
        return
    source = next((m for m, _, _ in producers if not is_grouped(m)), grouped)
    shared = ("" if source is grouped else
              f", shared with grouped convolution '{names[grouped]}' (groups={grouped.groups}),")
    kind = "grouped convolution " if source is grouped else ""
    raise UsageError(f"thinning cannot remove the {len(dead)} zeroed filters of {kind}"
                     f"'{names[source]}'{shared}: a grouped convolution can only lose the same "
                     "number of channels per group; prune other layers, or keep the model "
                     "unthinned (masks keep the zeros)")


def _blocks_of(items: list[tuple[nn.Module, bool, list[int], list[int]]], dead: set[int]
               ) -> list[list[list[int]]]:
    """Per grouped convolution of a group, the dead roots that fall in each of its groups."""
    found = []
    for module, is_out, idxs, rs in items:
        if not is_grouped(module):
            continue
        block = module_sizes(module)[0 if is_out else 1] // module.groups
        blocks: list[list[int]] = [[] for _ in range(module.groups)]
        for i, r in zip(idxs, rs, strict=True):
            if r in dead:
                blocks[i // block].append(r)
        found.append(blocks)
    return found


def _balanced(items: list[tuple[nn.Module, bool, list[int], list[int]]], dead: set[int]
              ) -> bool:
    """Whether every grouped convolution of a group loses the same number of channels in each
    of its groups (as Torch-Pruning's channel groups prune them); only then can it be thinned."""
    return all(len({len(b) for b in blocks}) == 1 for blocks in _blocks_of(items, dead))


def _even_out(items: list[tuple[nn.Module, bool, list[int], list[int]]], dead: set[int]
              ) -> set[int]:
    """`dead` less the channels that would make a grouped convolution lose more in some of its
    groups than in others (kept: keeping a dead channel is always exact)."""
    dead = set(dead)
    while not _balanced(items, dead):
        for blocks in _blocks_of(items, dead):
            fewest = min(len(b) for b in blocks)
            dead -= {r for b in blocks for r in sorted(b)[fewest:]}
    return dead


def _parameter_dims(graph: Any) -> dict[nn.Parameter, int]:
    """The per-channel parameters no layer owns (a layer scale's gamma) that the graph
    follows, with the dimension their channels are on."""
    return {unwrapped.parameters: int(unwrapped.pruning_dim)
            for unwrapped in getattr(graph, "unwrapped_parameters", ()) or ()}


def _plan_group(group: Any, graph: Any, captured: dict[nn.Module, Tensor], exact: bool,
                plan: _Plan, names: dict[nn.Module, str],
                heads: Heads) -> int:
    """Add one dependency group's dead channels to the plan; returns how many were removed."""
    items = []
    scales: list[tuple[nn.Parameter, int, list[int], list[int]]] = []
    dims = _parameter_dims(graph)
    for dep, idxs in group:
        module = dep.target.module
        if isinstance(module, nn.Parameter):
            dim = dims.get(module)
            if dim is None or max(idxs, default=-1) >= module.shape[dim]:
                return 0  # a parameter whose channels we cannot place: leave the group
            scales.append((module, dim, list(idxs), list(_root_idxs(group, dep))))
            continue
        if not isinstance(module, nn.Module) or type(module).__module__.startswith(
                "torch_pruning"):
            if type(module).__name__ == "_OutputOp":
                return 0  # the channel reaches the model's output
            if pads_channels(module, graph):
                return 0  # a channel padding shifts channels (a zero-padded shortcut)
            continue  # Torch-Pruning's stand-ins for functional ops need no change
        if not is_thinnable(module):
            return 0  # a layer we do not know how to thin
        is_out = graph.is_out_channel_pruning_fn(dep.handler)
        if max(idxs, default=-1) >= module_sizes(module)[0 if is_out else 1]:
            return 0  # the traced coupling does not fit this layer: leave the group alone
        items.append((module, is_out, list(idxs), list(_root_idxs(group, dep))))
    producers = [(m, i, r) for m, out, i, r in items
                 if out and isinstance(m, (CONV, nn.Linear)) and not is_depthwise(m)]
    consumers = [(m, i, r) for m, out, i, r in items
                 if not out and isinstance(m, (CONV, nn.Linear))]
    if not producers or not consumers:
        return 0
    unused = _unused_roots(consumers)
    # an attention kernel reads q, k and v at the same indices: they are not one channel
    same = {} if any(m in heads for m, _, _ in producers) else _same_channel_roots(group)
    live = {r for module, idxs, rs in producers
            for r, zero in zip(rs, _zero_slices(module, idxs), strict=True) if not zero}
    # a dead channel is dead under every root it has (GhostNet: a primary filter's channel
    # reaches the concatenation directly and through its depthwise copy)
    dead = {c for _, _, rs in producers for r in rs for c in same.get(r, {r})}
    dead -= {c for r in live for c in same.get(r, {r})}
    if not _balanced(items, dead):
        _refuse_grouped(items, names)  # filters zeroed unevenly: not pruned in whole units
    dead -= unused
    folds: dict[nn.Module, dict[int, float]] = {}
    for module, idxs, rs in consumers:
        if not any(r in dead and r not in unused for r in rs):
            continue
        x = captured.get(module)
        # a linear layer reads features on the last axis (channels-last blocks: ConvNeXt)
        constants = None if x is None else _constants(
            x, -1 if isinstance(module, nn.Linear) else 1)
        for i, r in zip(idxs, rs, strict=True):
            if r not in dead or r in unused:
                continue
            value = None if constants is None else constants[i]
            if value is None or (value != 0.0 and (is_grouped(module) or (
                    is_depthwise(module) and not _is_unpadded(module, graph)))):
                dead.discard(r)  # not provably constant here: keep the channel
            elif value != 0.0 and not is_depthwise(module):
                if exact and not _is_unpadded(module, graph):
                    dead.discard(r)  # zero padding makes the constant position-dependent
                else:
                    folds.setdefault(module, {})[i] = value
    dead = _whole(_even_out(items, dead | unused), same)
    head_dead, planned = head_roots(producers, dead, heads)
    if head_dead is not None:
        dead = head_dead
    if planned is not None:
        plan.heads[planned[0]] = planned[1:]
    if not dead:
        return 0
    for module, is_out, idxs, rs in items:
        chosen = [i for i, r in zip(idxs, rs, strict=True) if r in dead]
        if is_depthwise(module):
            plan.remove(module, "out", chosen)
        else:
            plan.remove(module, "out" if is_out else "in", chosen)
    for param, dim, idxs, rs in scales:
        plan.remove_channels(param, dim, [i for i, r in zip(idxs, rs, strict=True) if r in dead])
    for module, by_idx in folds.items():
        chosen = [i for i, r in zip(*_consumer_idxs(consumers, module), strict=True)
                  if r in dead and i in by_idx]
        plan.folds.append((module, chosen, [by_idx[i] for i in chosen]))
    return len(dead)


def _consumer_idxs(consumers: list[tuple[nn.Module, list[int], list[int]]], module: nn.Module
                   ) -> tuple[list[int], list[int]]:
    for m, idxs, rs in consumers:
        if m is module:
            return idxs, rs
    return [], []


def _same_channel_roots(group: Any) -> dict[int, set[int]]:
    """Root index -> every root index naming the same channel. Torch-Pruning follows a channel
    along each path it takes and keeps, per node, the root index of the last path (GhostNet's
    primary convolution gets its depthwise copy's); a node's channel i and the channel i of the
    node it reads, where both hold the same indices, are one channel."""
    by_node: dict[Any, dict[int, int]] = {}
    for item in group.items:
        by_node.setdefault(item.dep.target, {}).update(
            zip((int(i) for i in item.idxs), (int(r) for r in item.root_idxs), strict=True))
    parent: dict[int, int] = {}

    def find(root: int) -> int:
        while parent.get(root, root) != root:
            root = parent[root]
        return root

    for item in group.items:
        source = by_node.get(item.dep.source)
        target = dict(zip((int(i) for i in item.idxs), (int(r) for r in item.root_idxs),
                          strict=True))
        if source is None or set(source) != set(target):
            continue  # a concatenation, a split or a reshape: the indices differ
        for index, root in target.items():
            a, b = find(source[index]), find(root)
            if a != b:
                parent[max(a, b)] = min(a, b)
    classes: dict[int, set[int]] = {}
    for root in set(parent) | set(parent.values()):
        classes.setdefault(find(root), set()).add(root)
    return {root: members for members in classes.values() for root in members}


def _whole(dead: set[int], same: dict[int, set[int]]) -> set[int]:
    """`dead` less every channel some of whose roots are not dead (kept whole: exact)."""
    return {r for r in dead if same.get(r, {r}) <= dead}


def _root_idxs(group: Any, dep: Any) -> list[int]:
    # Torch-Pruning keeps, per group item, the index of the root layer's channel it follows.
    for item in group.items:
        if item.dep is dep:
            return list(item.root_idxs)
    raise KeyError("dependency not in group")


def _fold(module: nn.Module, idxs: list[int], values: list[float]) -> bool:
    """Add the contribution of constant inputs to the bias; True when a bias was created."""
    weight = module.weight.detach()
    k = torch.tensor(values, dtype=weight.dtype, device=weight.device)
    w = weight[:, idxs]
    shift = w @ k if w.dim() == 2 else torch.einsum("oc...,c->o", w, k)
    created = module.bias is None
    if created:
        module.bias = nn.Parameter(torch.zeros(weight.shape[0], dtype=weight.dtype,
                                               device=weight.device))
    with torch.no_grad():
        module.bias.add_(shift)
    return created


def _refuse_empty_layers(plan: _Plan, names: dict[nn.Module, str]) -> None:
    """A layer left without any filter (or input) is no layer: refuse, naming one of them.

    Emptying one layer often empties its neighbours (an all-zero layer reads nothing): the
    name given is that of a layer whose own weights are all zero where there is one.
    """
    emptied = []
    order = {module: index for index, module in enumerate(names)}
    for module, entry in plan.removed.items():
        out_size, in_size = module_sizes(module)
        weighted = isinstance(module, (CONV, nn.Linear))
        zero = weighted and not bool(module.weight.detach().any())
        if len(entry["out"]) >= out_size:
            kind = "filters" if isinstance(module, CONV) else (
                "output features" if weighted else "channels")
            what = f"all {out_size} {kind}"
        elif weighted and len(entry["in"]) >= in_size:
            what = f"all {in_size} input channels"
        else:
            continue
        emptied.append(((not zero, not weighted, order[module]), names[module], what))
    if emptied:
        _, name, what = min(emptied)
        raise UsageError(f"thinning would remove {what} of '{name}'; keep at least one "
                         f"(lower the pruner's sparsity for it)")


def find_thinning(model: nn.Module, inputs: Tensor, exact: bool = True
                  ) -> tuple[dict[str, Any], int]:
    """Fold dead channels' constants into `model` (in place) and return (recipe, channels)."""
    graph = dependency_graph(model, inputs)
    groups = list(graph.get_all_groups(root_module_types=(CONV, nn.Linear)))
    consumer_modules = [dep.target.module for g in groups for dep, _ in g
                        if isinstance(dep.target.module, (CONV, nn.Linear))]
    attentions = list(attention_layouts(model))
    captured, calls = _consumer_inputs(model, consumer_modules, inputs, attentions)
    heads = conforming_heads(calls)
    plan = _Plan()
    names = {module: name for name, module in model.named_modules()}
    removed = sum(_plan_group(g, graph, captured, exact, plan, names, heads) for g in groups)
    _refuse_empty_layers(plan, names)
    biased = {module for module, idxs, values in plan.folds if _fold(module, idxs, values)}
    for attention, (layout, kept) in plan.heads.items():
        fold_head_scale(attention, layout, kept)
    recipe_modules = {}
    for module, entry in plan.removed.items():
        recipe_modules[names[module]] = {
            "type": type(module).__name__, "sizes": module_sizes(module),
            "out": sorted(entry["out"]), "in": sorted(entry["in"]),
            "add_bias": module in biased}
    for module in biased - set(plan.removed):
        recipe_modules[names[module]] = {"type": type(module).__name__,
                                         "sizes": module_sizes(module), "out": [], "in": [],
                                         "add_bias": True}
    recipe: dict[str, Any] = {"version": RECIPE_VERSION, "modules": recipe_modules}
    parameter_names = {param: name for name, param in model.named_parameters()}
    recipe_parameters = {
        parameter_names[param]: {"dim": dim, "size": int(param.shape[dim]),
                                 "removed": sorted(idxs)}
        for param, (dim, idxs) in plan.parameters.items() if idxs and param in parameter_names}
    if recipe_parameters:
        recipe["parameters"] = recipe_parameters
    if plan.heads:
        recipe["attention"] = {names[attention]: {"heads": layout.heads,
                                                  "head_dim": [layout.head_dim, kept]}
                               for attention, (layout, kept) in plan.heads.items()}
    return recipe, removed
