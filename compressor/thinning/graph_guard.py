"""Guards around Torch-Pruning's dependency graph for models beyond the ones it was written for
(timm's hybrids and attention models).

- Its index mapping can fail to converge: where reshapes and splits feed back into the same
  channels (EfficientViT's cascaded group attention, Swin's and MaxViT's window partitions),
  the indices it follows keep growing and a group is never complete (the process runs until
  it is out of memory). `check_converges` follows each group as Torch-Pruning does, with a
  bound, and sets those layers aside: their channels are kept, the rest of the model's groups
  are pruned and thinned as usual, and a schedule naming one of them is refused in one line.
- Where it follows channels into a slice or a fixed-size reshape it does not adjust, the
  thinned model no longer runs: `run_thinned` turns that into one line.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from compressor.training.losses import main_logits
from compressor.utils.errors import UsageError

__all__ = ["check_converges", "follows", "unfollowable_layers", "unfollowable_message",
           "run_thinned", "STEPS_PER_DEPENDENCY"]

# A converging group visits each dependency of the graph a few times at most (once per set of
# indices reaching it through different concatenations or splits), each index within a tensor
# dimension of the model; a group that takes many times more steps than the graph has
# dependencies, or reaches an index past every dimension, follows indices that grow forever.
STEPS_PER_DEPENDENCY = 50
LAYERS = (nn.modules.conv._ConvNd, nn.Linear)


def _group_modules(graph: Any, root: Any, function: Any, channels: int, limit: int,
                   widest: int) -> tuple[set[Any], bool]:
    """The modules whose output channels go with all of `root`'s, followed as Torch-Pruning's
    get_pruning_group does, and whether the group completes: not when following it takes more
    than `limit` steps or reaches an index beyond every tensor dimension of the model
    (`widest`; the modules found until then are returned, in the same group)."""
    from torch_pruning._helpers import _HybridIndex

    seen: set[tuple[Any, Any, tuple[int, ...]]] = set()
    stack = [(root, function, [_HybridIndex(idx=i, root_idx=i) for i in range(channels)])]
    steps = 0
    producers = {root.module}
    while stack:
        node, handler, idxs = stack.pop()
        for dep in node.dependencies:
            if not dep.is_triggered_by(handler):
                continue
            mapped = idxs
            for mapping in dep.index_mapping:
                if mapping is not None:
                    mapped = mapping(mapped)
            key = (dep.target, dep.handler, tuple(index.idx for index in mapped))
            if not mapped or key in seen:
                continue
            seen.add(key)
            steps += 1
            if steps > limit or max(index.idx for index in mapped) >= widest:
                return producers, False
            if graph.is_out_channel_pruning_fn(dep.handler):
                producers.add(dep.target.module)
            stack.append((dep.target, dep.handler, mapped))
    return producers, True


def _bounds(graph: Any, model: nn.Module) -> tuple[int, int]:
    """The steps a completing group takes at most, and the widest dimension of the model."""
    limit = STEPS_PER_DEPENDENCY * max(1, sum(len(node.dependencies)
                                              for node in graph.module2node.values()))
    widest = max((max(param.shape) for param in model.parameters() if param.dim()),
                 default=1)
    return limit, widest


def unfollowable_layers(graph: Any, model: nn.Module) -> list[nn.Module]:
    """The convolutions and linear layers whose channel groups Torch-Pruning cannot complete
    (see the module docstring), each group followed as Torch-Pruning does, with a bound."""
    from torch_pruning.dependency import index_mapping

    index_mapping.update_index_mapping(graph)  # what get_pruning_group does first
    limit, widest = _bounds(graph, model)
    covered: set[nn.Module] = set()
    unfollowable: list[nn.Module] = []
    for module, node in graph.module2node.items():
        if not isinstance(module, LAYERS) or module in covered:
            continue
        pruner = graph.get_pruner_of_module(module)
        channels = pruner.get_out_channels(module) if pruner is not None else None
        if channels is None:
            continue
        group, complete = _group_modules(graph, node, pruner.prune_out_channels, channels,
                                         limit, widest)
        covered |= group  # a group that never completes is that of every producer in it
        if not complete:
            unfollowable += [m for m in group if isinstance(m, LAYERS) and m not in unfollowable]
    return unfollowable


def follows(graph: Any, model: nn.Module, module: nn.Module, outputs: bool) -> bool:
    """Whether Torch-Pruning completes the channel group of `module`'s output (or input)
    channels: never for a layer set aside, and, for input channels, bounded as above."""
    if module in getattr(graph, "unfollowable", ()):
        return False
    pruner = graph.get_pruner_of_module(module)
    if outputs or pruner is None or pruner.get_in_channels(module) is None:
        return True
    limit, widest = _bounds(graph, model)
    return _group_modules(graph, graph.module2node[module], pruner.prune_in_channels,
                          pruner.get_in_channels(module), limit, widest)[1]


def check_converges(graph: Any, model: nn.Module) -> None:
    """Set aside the layers whose channel groups Torch-Pruning cannot complete: every later
    `get_all_groups` of `graph` skips them (their channels are kept), and `graph.unfollowable`
    names them for the checks that refuse a schedule pruning them. A model with no other
    layer is refused in one line naming the first."""
    unfollowable = unfollowable_layers(graph, model)
    graph.unfollowable = tuple(unfollowable)
    if not unfollowable:
        return
    names = {module: name for name, module in model.named_modules()}
    layers = [m for m in graph.module2node if isinstance(m, LAYERS)]
    if len(unfollowable) == len(layers):
        raise UsageError(unfollowable_message(names.get(unfollowable[0], "?"), model))
    graph.IGNORED_LAYERS_IN_TRACING.extend(unfollowable)


def unfollowable_message(layer: str, model: nn.Module) -> str:
    """The one line refusing to thin the channels of `layer`, whose group never completes."""
    return (f"thinning cannot follow the channels of '{layer}' in {type(model).__name__} "
            "(Torch-Pruning's channel groups do not converge through its reshapes and splits); "
            "keep this layer unthinned (pruning masks keep the zeros)")


def run_thinned(model: nn.Module, inputs: Tensor, recipe: dict[str, Any]) -> Tensor:
    """The main logits of `model`, thinned by `recipe`, on `inputs`; a forward that fails
    (Torch-Pruning followed the channels into a slice or a reshape of fixed sizes that it
    does not adjust: a ViT's per-head qkv view, LeViT's attention) is a UsageError
    naming the first thinned layer."""
    try:
        with torch.no_grad():
            return main_logits(model(inputs))
    except (RuntimeError, ValueError, IndexError) as exc:
        layers = list(recipe.get("modules", {}))
        where = f"with the channels of '{layers[0]}' removed" if layers else "thinned"
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        raise UsageError(f"thinning cannot follow the channels of {type(model).__name__}: "
                         f"{where}, its forward fails ({reason}); keep this model unthinned "
                         "(pruning masks keep the zeros)") from None
