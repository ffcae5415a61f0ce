"""Schedule extensions: Distiller's FilterRemover / ChannelRemover (thinning during training)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from compressor.models.description import described, unwrap_model
from compressor.pruning.structured import StructurePruner
from compressor.thinning.probe import rehearse_thinning
from compressor.thinning.support import check_thinnable, dependency_graph
from compressor.thinning.transform import probe_batch, thin
from compressor.utils.errors import ScheduleError, UsageError

__all__ = ["StructureRemover", "rebind_optimizer", "thinned_layers", "check_schedule_thinning",
           "THINNED_GROUPS"]

# Structure groups whose zeros thinning removes: filters (and a linear layer's rows), channels.
THINNED_GROUPS = ("Filters", "3D", "Rows", "Channels")

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
        old = dict(model.named_parameters())
        recipe = thin(model)
        rebind_optimizer(optimizer, old, dict(model.named_parameters()))
        LOG.info("%s: thinned the model (%s)", self.name, self.thinning_func)
        return recipe


def thinned_layers(policies: Sequence[Any]) -> list[tuple[str, bool]]:
    """(module, True for filters / False for input channels) of every structure pruner of a
    schedule that thins (a FilterRemover / ChannelRemover policy); [] when it does not thin."""
    if not any(isinstance(getattr(p, "extension", None), StructureRemover) for p in policies):
        return []
    layers: list[tuple[str, bool]] = []
    for policy in policies:
        pruner = getattr(policy, "pruner", None)
        if not isinstance(pruner, StructurePruner) or pruner.group_type not in THINNED_GROUPS:
            continue
        outputs = pruner.group_type != "Channels"
        layers += [(weight.rpartition(".")[0], outputs) for weight in pruner.weights]
    return list(dict.fromkeys(layers))


def _unit_blocks(model: nn.Module, policies: Sequence[Any]) -> dict[str, int]:
    """Layer -> the blocks a pruner takes its filters in: a grouped convolution's groups
    (channel_groups), or, under a leader, how many of the leader's units the layer is wide."""
    params = dict(unwrap_model(model).named_parameters())
    blocks: dict[str, int] = {}
    for policy in policies:
        pruner = getattr(policy, "pruner", None)
        weights = [w for w in getattr(pruner, "weights", ()) if w in params]
        if not isinstance(pruner, StructurePruner) or not weights:
            continue
        leader = getattr(pruner, "group_dependency", None) == "Leader"
        for weight in weights:
            # each weight ranked alone is in its own channel_groups blocks
            units = pruner.unit_count(params[(weights[0] if leader else weight)].shape[0])
            count = params[weight].shape[0] // max(1, units)
            if count > 1:
                blocks[weight.rpartition(".")[0]] = count
    return blocks


def _pruned_norms(model: nn.Module, policies: Sequence[Any]) -> dict[str, list[str]]:
    """Layer -> the batch norms its structure pruner masks with its filters: the one after
    the layer, and (under the leader's layer) the norms the pruned channels pass through."""
    found: dict[str, list[str]] = {}
    for policy in policies:
        pruner = getattr(policy, "pruner", None)
        if not isinstance(pruner, StructurePruner) or pruner.group_type != "Filters":
            continue
        try:
            following = pruner.batchnorms(unwrap_model(model))
        except ScheduleError:
            following = {}  # untraceable: the pruner refuses it itself when it attaches
        layers = [weight.rpartition(".")[0] for weight in pruner.weights]
        for layer in layers:
            if following.get(layer):
                found.setdefault(layer, []).append(str(following[layer]))
        if layers:
            found.setdefault(layers[0], []).extend(pruner.norms)
    return found


def check_schedule_thinning(model: nn.Module, policies: Sequence[Any], source: str) -> None:
    """Refuse at load a schedule that would thin channels thinning cannot remove (shared with a
    grouped convolution, behind a channel shuffle, or into a slice: a rehearsal on a copy),
    naming the layer."""
    layers = thinned_layers(policies)
    if not layers or not described(model):
        return
    blocks = _unit_blocks(model, policies)
    norms = _pruned_norms(model, policies)
    plain, inputs = unwrap_model(model), probe_batch(model)
    try:
        graph = dependency_graph(plain, inputs)  # one trace for the check and the rehearsal
        check_thinnable(plain, inputs, layers, blocks, graph)
        rehearse_thinning(plain, inputs, layers, blocks, norms, graph)
    except UsageError as exc:
        raise ScheduleError(f"{source}: {exc}") from None
