"""The converted int8 graph made lean: every tensor's grid is known where the graph is built.

`convert_to_int8` gives each quantized layer a module that checks, on every call, whether each
input already lies on the grid it needs and requantizes it if not. Which grid a tensor lies on
depends on the graph alone (the layer that produced it, through ops that move values without
arithmetic), so the check is made once here: inputs known to be on their grid go straight to
the int8 kernel, the others get an explicit requantize (or dequantize) node, and each layer's
call becomes its kernel's (as torch.ao's FX conversion emits). A standalone batch norm on a
quantized tensor followed by a quantized ReLU becomes torch's fused quantized BNReLU2d on the
ReLU's grid. The arithmetic is the module's own: only the per-call Python is gone.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.ao.nn.intrinsic.quantized as nniq
import torch.fx
from torch import Tensor, nn

from compressor.quantization.simulated.graph import ensure_float, exact_on_quantized

__all__ = ["lower_int8_graph", "requantize", "QUANTIZED_SAFE_MODULES", "flatten_calls"]

_UNKNOWN = object()  # a value whose grid the graph does not tell
# modules exact on quantized tensors (they move or pick values; a ReLU clamps at the zero
# point), which run on them as they are and keep their grid; average pooling is not: on quint8
# it rounds its means to the grid, which the simulation (pooling in float) does not, and where
# a float op follows (DenseNet's transition pool, then a batch norm) that rounding was the int8
# model's largest departure from it; it runs in float
QUANTIZED_SAFE_MODULES = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.Flatten, nn.Dropout,
                          nn.Identity, nn.ReLU)


def requantize(x: Tensor, scale: float, zero_point: int, low: float | None,
               high: float | None) -> Tensor:
    """x as quint8 on (scale, zero_point), clamped to [low, high] where the grid is narrower;
    a tensor already on that grid as it is."""
    if x.is_quantized:
        if x.q_scale() == scale and x.q_zero_point() == zero_point:
            return x
        x = x.dequantize()
    quantized = torch.quantize_per_tensor(x, scale, zero_point, torch.quint8)
    return quantized if low is None else torch.clamp(quantized, low, high)


def _grid_of(node: Any, grids: dict[torch.fx.Node, Any], modules: dict[str, nn.Module],
             int8_module: type) -> Any:
    """The grid the value of `node` lies on: a Grid, None (float) or _UNKNOWN."""
    if not isinstance(node, torch.fx.Node):
        return _UNKNOWN
    if node.op == "placeholder":
        return None
    first = grids.get(node.args[0], _UNKNOWN) if node.args else _UNKNOWN
    if node.op == "call_module":
        module = modules.get(str(node.target))
        if isinstance(module, int8_module):
            return module.output
        return first if isinstance(module, QUANTIZED_SAFE_MODULES) else _UNKNOWN
    if node.op == "call_function" and node.target is ensure_float:
        return None
    if node.op in ("call_function", "call_method") and exact_on_quantized(node):
        return first
    return _UNKNOWN  # requantize nodes' grids are set where they are made


def _onto(graph: torch.fx.Graph, value: Any, grid: Any, known: Any,
          converted: dict[torch.fx.Node, list[tuple[Any, torch.fx.Node]]]) -> Any:
    """`value` brought onto `grid` (None: float), by a node added only where needed and only
    once (`converted`: the conversions made so far, per value)."""
    if known is not _UNKNOWN and known == grid:
        return value
    done = [call for target, call in converted.get(value, []) if target == grid]
    if done:
        return done[0]  # DenseNet's block input: concatenated by every layer, quantized once
    if grid is None:
        call = graph.call_function(ensure_float, (value,))
    else:
        bounds = grid.bounds() or (None, None)
        call = graph.call_function(requantize, (value, grid.scale, grid.zero_point, *bounds))
    converted.setdefault(value, []).append((grid, call))
    return call


def _kernel_call(graph: torch.fx.Graph, node: torch.fx.Node, module: Any,
                 inputs: list[Any]) -> torch.fx.Node:
    """The int8 kernel of one converted module, called on inputs already on their grids."""
    kind = module.kind
    if kind == "param":
        return graph.call_module(f"{node.target}.op", tuple(inputs))
    scale, zero_point = module.output.scale, module.output.zero_point
    if kind == "cat":
        if all(grid == module.output for grid in module.inputs):
            return graph.call_function(torch.cat, (inputs,), {"dim": module.cat_dim})
        return graph.call_function(torch.ops.quantized.cat, (inputs,),
                                   {"scale": scale, "zero_point": zero_point,
                                    "dim": module.cat_dim})
    ops = {"add": torch.ops.quantized.add, "mul": torch.ops.quantized.mul}
    result = inputs[0]
    for position, other in enumerate(inputs[1:], start=2):
        op = ops.get(kind, torch.ops.quantized.add)
        if kind == "add_relu" and position == len(inputs):
            op = torch.ops.quantized.add_relu
        result = graph.call_function(op, (result, other),
                                     {"scale": scale, "zero_point": zero_point})
    return result


def _bn_relu(norm: nn.Module, relu: Any) -> nn.Module | None:
    """torch's quantized BNReLU2d computing relu(norm(x)) onto the ReLU's grid, or None where
    the batch norm is not one it takes."""
    if (type(norm) is not nn.BatchNorm2d or not norm.affine or not norm.track_running_stats
            or type(relu.op) is not nn.ReLU):
        return None
    fused = nniq.BNReLU2d(norm.num_features, norm.eps, norm.momentum)
    with torch.no_grad():
        fused.weight.copy_(norm.weight.detach().float())
        fused.bias.copy_(norm.bias.detach().float())
        fused.running_mean.copy_(norm.running_mean.float())
        fused.running_var.copy_(norm.running_var.float())
    fused.scale = torch.tensor(relu.output.scale, dtype=torch.float64)
    fused.zero_point = torch.tensor(relu.output.zero_point)
    return fused


def lower_int8_graph(module: torch.fx.GraphModule, int8_module: type,
                     dequantized_module: type) -> torch.fx.GraphModule:
    """Replace each converted module's call by its kernel's, with requantize nodes only where
    an input is not known to lie on its grid (`int8_module` / `dequantized_module`: int8.py's
    classes). In place; returns `module`."""
    graph = module.graph
    modules = dict(module.named_modules())
    grids: dict[torch.fx.Node, Any] = {}
    converted: dict[torch.fx.Node, list[tuple[Any, torch.fx.Node]]] = {}
    erased: set[torch.fx.Node] = set()
    for node in list(graph.nodes):
        if node in erased:
            continue
        target = modules.get(str(node.target)) if node.op == "call_module" else None
        if isinstance(target, dequantized_module):
            relu = _lower_bn_relu(module, node, target, grids, modules)
            if relu is not None:
                erased.update((node, relu))
                continue
        if (not isinstance(target, int8_module) or target.pre_pad is not None
                or target.kind == "activation"):
            grids[node] = _grid_of(node, grids, modules, int8_module)
            continue
        required = list(target.inputs)
        with graph.inserting_before(node):
            inputs = [_onto(graph, arg, required[min(i, len(required) - 1)],
                            grids.get(arg, _UNKNOWN), converted)
                      if isinstance(arg, torch.fx.Node) else arg
                      for i, arg in enumerate(node.args)]
            call = _kernel_call(graph, node, target, inputs)
            if target.clamp is not None:
                call = graph.call_function(torch.clamp, (call, *target.clamp))
        node.replace_all_uses_with(call)
        graph.erase_node(node)
        grids[call] = target.output
    return flatten_calls(module)


def flatten_calls(module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Drop the calls of identities (folded batch norms, fused ReLUs) and call every other
    module by a name on the root (a nested name costs an attribute lookup per level per call).
    In place; returns `module`."""
    graph = module.graph
    for node in list(graph.nodes):
        if node.op != "call_module":
            continue
        called = module.get_submodule(str(node.target))
        if type(called) is nn.Identity and len(node.args) == 1 and not node.kwargs:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
        elif "." in str(node.target):
            flat = "_" + str(node.target).replace(".", "_")
            if not hasattr(module, flat):
                module.add_module(flat, called)
            node.target = flat
    graph.lint()
    module.recompile()
    return module


def _lower_bn_relu(module: torch.fx.GraphModule, node: torch.fx.Node, wrapper: Any,
                   grids: dict[torch.fx.Node, Any], modules: dict[str, nn.Module]
                   ) -> torch.fx.Node | None:
    """A float batch norm fed a quantized tensor whose only user is a quantized ReLU: both
    become one quantized BNReLU2d on the ReLU's grid; the ReLU's (erased) node, or None."""
    users = list(node.users)
    if len(node.args) != 1 or len(users) != 1 or users[0].op != "call_module":
        return None
    relu = modules.get(str(users[0].target))
    if getattr(relu, "kind", None) != "activation" or relu.pre_pad is not None:
        return None
    source = grids.get(node.args[0], _UNKNOWN)
    if source is _UNKNOWN or source is None:
        return None
    fused = _bn_relu(wrapper.module, relu)
    if fused is None:
        return None
    name = f"{node.target}_relu".replace(".", "_")
    module.add_module(name, fused)
    graph = module.graph
    with graph.inserting_before(users[0]):
        call = graph.call_module(name, (node.args[0],))
        if relu.clamp is not None:
            call = graph.call_function(torch.clamp, (call, *relu.clamp))
    users[0].replace_all_uses_with(call)
    graph.erase_node(users[0])
    graph.erase_node(node)
    grids[call] = relu.output
    return users[0]
