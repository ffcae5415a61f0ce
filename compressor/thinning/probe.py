"""A thinning rehearsal: thin a copy of the model in which each layer a schedule will thin has
lost one filter (or input channel), so that what thinning refuses on this architecture (a
slice or a fixed-size reshape its channel graph does not adjust, groups that never complete)
is refused when the schedule is loaded, before any epoch runs or any file is written."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from compressor.thinning.support import dependency_graph
from compressor.thinning.thin import thin_model

__all__ = ["rehearse_thinning"]


def rehearse_thinning(model: nn.Module, inputs: Tensor, layers: Iterable[tuple[str, bool]],
                      blocks: Mapping[str, int] | None = None,
                      norms: Mapping[str, Sequence[str]] | None = None,
                      graph: Any = None) -> None:
    """Thin a copy of `model` whose `layers` ((module name, True for its filters / False for
    its input channels)) each have their first filter or input channel zeroed (the first of
    each block where `blocks` names how many blocks the layer's filters go in), with the
    batch norms `norms` names for the layer zeroed at the same channels (as a structure
    pruner masks them); thinning's refusals (UsageError) pass through, `model` is left as it
    was. `graph`: the model's dependency_graph, where the caller has it."""
    blocks = blocks or {}
    norms = norms or {}
    layers = list(layers)
    if graph is None and any(out for _, out in layers):
        graph = dependency_graph(model, inputs)
    rehearsal = copy.deepcopy(model)
    with torch.no_grad():
        for name, outputs in layers:
            module = rehearsal.get_submodule(name)
            weight = getattr(module, "weight", None)
            if not isinstance(weight, Tensor) or weight.dim() < 2 or (
                    weight.shape[0 if outputs else 1] < 2):
                continue  # a layer of one filter is kept whole
            if outputs:
                units = max(1, weight.shape[0] // blocks.get(name, 1))
                rows = _coupled_rows(graph, model.get_submodule(name),
                                     list(range(0, weight.shape[0], units)))
                weight[rows] = 0.0
                if isinstance(getattr(module, "bias", None), Tensor):
                    module.bias[rows] = 0.0
                for norm_name in norms.get(name, ()):
                    _zero_units(rehearsal.get_submodule(norm_name), units)
            else:
                weight[:, 0] = 0.0
    thin_model(rehearsal, inputs=inputs)


def _coupled_rows(graph: Any, module: nn.Module, rows: list[int]) -> list[int]:
    """`rows` and the other filters of `module` that Torch-Pruning couples with them, which
    thinning removes only together (a ViT's qkv: one head channel's query, key and value)."""
    pruner = graph.get_pruner_of_module(module) if graph is not None else None
    if pruner is None:
        return rows
    found = set(rows)
    for dep, idxs in graph.get_pruning_group(module, pruner.prune_out_channels, rows):
        if dep.target.module is module and graph.is_out_channel_pruning_fn(dep.handler):
            found.update(int(i) for i in idxs)
    return sorted(found)


def _zero_units(norm: nn.Module, units: int) -> None:
    """A batch norm's weight and bias zeroed at channel 0 of every block of `units`."""
    for param in (getattr(norm, "weight", None), getattr(norm, "bias", None)):
        if isinstance(param, Tensor) and param.dim() == 1 and param.shape[0] % units == 0:
            param[0::units] = 0.0
