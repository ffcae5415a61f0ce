"""What thinning cannot remove, found before anything is pruned or written.

Thinning follows each channel through Torch-Pruning's dependency graph. Two kinds of model are
beyond it, and are refused in one line naming the layer rather than thinned wrong:
- a channel shuffle (ShuffleNet: channels viewed as groups and transposed), whose interleaving
  Torch-Pruning's graph cannot follow;
- a grouped convolution that is not depthwise (ResNeXt, AlexNet's two towers): its channels can
  only go the same number per group, which zeroed filters seldom are unless a pruner takes
  them in units of its groups (`channel_groups`, as Torch-Pruning prunes channel groups).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.fx
from torch import Tensor, nn
from torch.fx.passes.shape_prop import ShapeProp

from compressor.models.eval_caches import drop_eval_caches
from compressor.thinning.attention import PARTS, attention_layouts
from compressor.thinning.graph_guard import check_converges, follows, unfollowable_message
from compressor.thinning.recipe import is_depthwise
from compressor.utils.errors import UsageError

__all__ = ["dependency_graph", "channel_shuffles", "is_grouped", "pads_channels", "pads",
           "check_thinnable"]

_RESHAPES = ("view", "reshape")


def is_grouped(module: nn.Module) -> bool:
    """A convolution with groups that is not depthwise (its channels go per group)."""
    return (isinstance(module, nn.modules.conv._ConvNd) and module.groups > 1
            and not is_depthwise(module))


def _pad_widths(op: Any, graph: Any) -> tuple[int, ...] | None:
    """A traced padding op's widths, in F.pad's order ((left, right) from the last dimension
    back); None when the op does not record them (a reflection or replication pad)."""
    node = graph.module2node.get(op)
    pad = getattr(getattr(node, "grad_fn", None), "_saved_pad", None)
    return None if pad is None else tuple(int(value) for value in pad)


def _is_pad(op: Any) -> bool:
    return "Pad" in str(getattr(op, "_grad_fn", ""))


def pads_channels(op: Any, graph: Any) -> bool:
    """Whether a traced op pads the channel dimension (a zero-padded shortcut, whose channels
    thinning cannot follow); a spatial pad (TF-style "same" padding) keeps every channel."""
    if not _is_pad(op):
        return False
    widths = _pad_widths(op, graph)
    # entries past the fourth reach the channels of an N x C x H x W tensor
    return widths is None or any(widths[4:])


def pads(op: Any, graph: Any) -> bool:
    """Whether a traced op pads its input at all (a pad of zero widths does not)."""
    if not _is_pad(op):
        return False
    widths = _pad_widths(op, graph)
    return widths is None or any(widths)


def channel_shuffles(model: nn.Module, inputs: Tensor) -> list[str]:
    """The modules whose forward views channels as groups (N, C, ...) -> (N, g, C/g, ...),
    found by tracing with torch.fx; [] when the model cannot be traced."""
    try:
        traced = torch.fx.symbolic_trace(model)
        with torch.no_grad():
            ShapeProp(traced).propagate(inputs)
    except Exception:  # noqa: BLE001 - an untraceable model has no shuffle we can name
        return []
    finally:
        drop_eval_caches(model)  # the trace left Proxy objects in them
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
    naming the channel shuffle where there is one; layers whose groups never complete are set
    aside on the graph (compressor.thinning.graph_guard), a model of nothing else refused."""
    import torch_pruning as tp

    try:
        graph = tp.DependencyGraph().build_dependency(model, example_inputs=inputs,
                                                      verbose=False)
    except Exception as exc:  # noqa: BLE001 - Torch-Pruning fails in many ways on odd graphs
        failure = exc
    else:
        drop_eval_caches(model)  # its forward with gradients left autograd history in them
        check_converges(graph, model)
        return graph
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


def check_thinnable(model: nn.Module, inputs: Tensor, layers: Iterable[tuple[str, bool]],
                    blocks: Mapping[str, int] | None = None, graph: Any = None) -> None:
    """Refuse, in one line, thinning the channels of `layers` ((module name, True for its
    filters / False for its input channels)) where a grouped convolution shares them, unless
    they go in units of its groups (`blocks`: layer -> the pruner's channel_groups), and an
    attention's qkv rows unless they go in units of its heads' q, k and v. `graph`: the
    model's dependency_graph, where the caller has it."""
    blocks = blocks or {}
    graph = graph if graph is not None else dependency_graph(model, inputs)
    names = {module: name for name, module in model.named_modules()}
    modules = dict(model.named_modules())
    heads = {m.qkv: layout.heads for m, layout in attention_layouts(model).items()}
    for layer, outputs in layers:
        if not follows(graph, model, modules[layer], outputs):
            raise UsageError(unfollowable_message(layer, model))
        units = PARTS * heads.get(modules[layer], 0)
        if outputs and units and blocks.get(layer, 1) != units:
            raise UsageError(
                f"thinning cannot remove single rows of '{layer}': its attention's "
                f"{units // PARTS} heads lose the same dimensions in q, k and v; prune it with "
                f"channel_groups: {units} (one dimension of each head's q, k and v a unit), "
                "or drop the thinning (masks keep the zeros)")
        for coupled in _coupled_modules(graph, modules[layer], outputs):
            if is_grouped(coupled) and blocks.get(layer, 1) != coupled.groups:
                what = "filters" if outputs else "input channels"
                raise UsageError(
                    f"thinning cannot remove the {what} of '{layer}': grouped convolution "
                    f"'{names[coupled]}' (groups={coupled.groups}) shares those channels and "
                    "can only lose the same number per group; prune other layers, or drop the "
                    "thinning (masks keep the zeros)")
