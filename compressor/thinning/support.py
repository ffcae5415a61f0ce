"""What thinning cannot remove, found before anything is pruned or written.

Thinning follows each channel through Torch-Pruning's dependency graph. Two kinds of model are
beyond it, and are refused in one line naming the layer rather than thinned wrong:
- a channel shuffle (ShuffleNet: channels viewed as groups and transposed), whose interleaving
  Torch-Pruning's graph cannot follow;
- a grouped convolution that is not depthwise (ResNeXt, AlexNet's two towers): its channels can
  only go the same number per group, which zeroed filters seldom are.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.fx
from torch import Tensor, nn
from torch.fx.passes.shape_prop import ShapeProp

from compressor.thinning.recipe import is_depthwise
from compressor.utils.errors import UsageError

__all__ = ["dependency_graph", "channel_shuffles", "is_grouped", "check_thinnable"]

_RESHAPES = ("view", "reshape")


def is_grouped(module: nn.Module) -> bool:
    """A convolution with groups that is not depthwise (its channels go per group)."""
    return (isinstance(module, nn.modules.conv._ConvNd) and module.groups > 1
            and not is_depthwise(module))


def channel_shuffles(model: nn.Module, inputs: Tensor) -> list[str]:
    """The modules whose forward views channels as groups (N, C, ...) -> (N, g, C/g, ...),
    found by tracing with torch.fx; [] when the model cannot be traced."""
    try:
        traced = torch.fx.symbolic_trace(model)
        with torch.no_grad():
            ShapeProp(traced).propagate(inputs)
    except Exception:  # noqa: BLE001 - an untraceable model has no shuffle we can name
        return []
    found: list[str] = []
    for node in traced.graph.nodes:
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__",
                                                                         "")
        if node.op not in ("call_method", "call_function") or name not in _RESHAPES:
            continue
        source = node.args[0] if node.args else None
        before = getattr(source, "meta", {}).get("tensor_meta")
        after = node.meta.get("tensor_meta")
        if before is None or after is None or len(after.shape) != len(before.shape) + 1:
            continue
        if len(before.shape) >= 2 and after.shape[1] * after.shape[2] == before.shape[1]:
            stack = list(node.meta.get("nn_module_stack", {}))
            owner = stack[-1] if stack else type(model).__name__
            if owner not in found:
                found.append(owner)
    return found


def dependency_graph(model: nn.Module, inputs: Tensor) -> Any:
    """Torch-Pruning's dependency graph of `model`; a model it cannot follow is one UsageError
    naming the channel shuffle where there is one."""
    import torch_pruning as tp

    try:
        return tp.DependencyGraph().build_dependency(model, example_inputs=inputs,
                                                     verbose=False)
    except Exception as exc:  # noqa: BLE001 - Torch-Pruning fails in many ways on odd graphs
        failure = exc
    shuffles = channel_shuffles(model, inputs)  # traced only now: most models need no trace
    if shuffles:
        raise UsageError(f"thinning cannot follow the channel shuffle in '{shuffles[0]}' (its "
                         "channels are interleaved across branches); keep this model unthinned "
                         "(pruning masks keep the zeros) or thin another architecture")
    reason = (str(failure).strip().splitlines() or [type(failure).__name__])[0][:160]
    raise UsageError(f"thinning cannot follow the channels of {type(model).__name__} "
                     f"(Torch-Pruning: {type(failure).__name__}: {reason}); keep this model "
                     "unthinned (pruning masks keep the zeros)")


def _coupled_modules(graph: Any, module: nn.Module, outputs: bool) -> list[nn.Module]:
    """The modules whose channels move with `module`'s output (or input) channels."""
    pruner = graph.get_pruner_of_module(module)
    if pruner is None:
        return []
    function = pruner.prune_out_channels if outputs else pruner.prune_in_channels
    group = graph.get_pruning_group(module, function, idxs=[0])
    return [dep.target.module for dep, _ in group if isinstance(dep.target.module, nn.Module)]


def check_thinnable(model: nn.Module, inputs: Tensor,
                    layers: Iterable[tuple[str, bool]]) -> None:
    """Refuse, in one line, thinning the channels of `layers` ((module name, True for its
    filters / False for its input channels)) where a grouped convolution shares them."""
    graph = dependency_graph(model, inputs)
    names = {module: name for name, module in model.named_modules()}
    modules = dict(model.named_modules())
    for layer, outputs in layers:
        for coupled in _coupled_modules(graph, modules[layer], outputs):
            if is_grouped(coupled):
                what = "filters" if outputs else "input channels"
                raise UsageError(
                    f"thinning cannot remove the {what} of '{layer}': grouped convolution "
                    f"'{names[coupled]}' (groups={coupled.groups}) shares those channels and "
                    "can only lose the same number per group; prune other layers, or drop the "
                    "thinning (masks keep the zeros)")
