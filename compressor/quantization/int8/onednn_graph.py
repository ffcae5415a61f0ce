"""The converted graph rewritten onto oneDNN's int8 kernels and plain uint8 tensors.

`convert_to_int8` replaces each wrapper of the traced simulated model by a module that knows its
input and output grids. Here every value of the graph gets a grid where the graph is built (the
layer that produced it, through ops that move values without arithmetic) or stays float, and
each node becomes the kernel computing it on those grids:

- a conv / linear layer: its OnednnLayer, uint8 in, uint8 out;
- a requantization between grids, a two-input add (a ReLU after it included), an activation on
  a quantized tensor (ReLU, ReLU6, Hardswish, SiLU), and an inference batch norm with such an
  activation after it (DenseNet's and pre-activation ResNets' BN-ReLU): one OnednnPointwise, a
  depthwise 1x1 int8 kernel, as the simulation computes them between two quantizations;
- a concatenation of inputs on its grid: torch.cat of the integers;
- max pooling, flattens, views and shuffles on the integers; a ReLU clamps at the zero point;
- everything else (multiplies, other activations, float leaves such as average pooling) in
  float from dequantized inputs, quantized where a grid follows, as simulated.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from compressor.quantization.int8.onednn import (
    OnednnLayer,
    OnednnPointwise,
    dequantize_uint8,
    eltwise_uint8,
    quantize_uint8,
    relu_uint8,
    supported_post_op,
)
from compressor.quantization.simulated.graph import ensure_float, exact_on_quantized

__all__ = ["lower_onednn_graph"]

_RELUS = (F.relu, torch.relu)
_MAX_POOLS = (nn.MaxPool2d, nn.MaxPool3d)
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
# values the graph computes that are not tensors: they never lie on a grid
_NOT_TENSORS = {("call_function", getattr), ("call_method", "size"), ("call_method", "dim")}
# functions returning a new uint8 tensor (a kernel may write its result into it)
_FRESH_FUNCTIONS = (quantize_uint8, eltwise_uint8, relu_uint8, torch.cat)


class _Lowering:
    """Rewrites a converted graph (int8.py's modules in place of the wrappers) onto oneDNN."""

    def __init__(self, module: torch.fx.GraphModule, int8_module: type,
                 dequantized_module: type, safe_modules: tuple[type, ...]) -> None:
        self.module, self.graph = module, module.graph
        self.modules = dict(module.named_modules())
        self.int8_module, self.dequantized_module = int8_module, dequantized_module
        self.safe_modules = safe_modules
        self.grids: dict[torch.fx.Node, Any] = {}  # a Grid: uint8 on it; absent / None: float
        # value -> [(grid, the node bringing it there)]: a value read on one grid by several
        # nodes (DenseNet's block input, concatenated by every layer) is converted once
        self.converted: dict[torch.fx.Node, list[tuple[Any, torch.fx.Node]]] = {}
        self.added = 0

    def call_new(self, module: nn.Module, args: tuple[Any, ...]) -> torch.fx.Node:
        """A call of `module`, added to the root under a new name."""
        name = f"_onednn_{self.added}"
        self.added += 1
        self.module.add_module(name, module)
        return self.graph.call_module(name, args)

    def onto(self, value: Any, grid: Any) -> Any:
        """`value` (a node's) brought onto `grid` (None: float) by a node added before the
        node being rewritten, only where it is not there already."""
        if not isinstance(value, torch.fx.Node):
            return value
        known = self.grids.get(value)
        if known == grid:
            return value
        done = [call for target, call in self.converted.get(value, []) if target == grid]
        if done:
            return done[0]
        if grid is None:
            call = self.graph.call_function(dequantize_uint8, (value, *known.dequantize_args()))
        elif known is None:
            call = self.graph.call_function(quantize_uint8, (value, *grid.quantize_args()))
        else:
            call = self.call_new(OnednnPointwise(known, grid), (value,))
        self.grids[call] = grid
        self.converted.setdefault(value, []).append((grid, call))
        return call

    def floats(self, node: torch.fx.Node) -> None:
        """Every input of `node` dequantized."""
        with self.graph.inserting_before(node):
            node.args = torch.fx.node.map_arg(node.args, lambda a: self.onto(a, None))
            node.kwargs = torch.fx.node.map_arg(node.kwargs, lambda a: self.onto(a, None))

    def replace(self, node: torch.fx.Node, call: torch.fx.Node, grid: Any) -> None:
        """`call` in place of `node`, its value on `grid`."""
        node.replace_all_uses_with(call)
        self.graph.erase_node(node)
        self.grids[call] = grid

    def run(self) -> None:
        """Rewrite every node, in order."""
        for node in list(self.graph.nodes):
            if getattr(node, "_erased", False):
                continue  # erased with the node before it (a fused batch norm's activation)
            if node.op == "call_module":
                self.lower_module(node, self.modules[str(node.target)])
            elif node.op in ("call_function", "call_method"):
                self.lower_function(node)
            elif node.op == "output":
                self.floats(node)

    def lower_module(self, node: torch.fx.Node, target: nn.Module) -> None:
        """A converted wrapper, a float leaf, or a module exact on integers."""
        first = self.grids.get(node.args[0]) if node.args else None
        if type(target) in (nn.Identity, nn.Dropout) and len(node.args) == 1 and not node.kwargs:
            node.replace_all_uses_with(node.args[0])  # folded batch norms, fused ReLUs
            self.graph.erase_node(node)
        elif isinstance(target, self.int8_module):
            self.lower_int8(node, target)
        elif isinstance(target, self.dequantized_module):
            if first is None or not self.lower_norm_activation(node, target.module, first):
                self.floats(node)
                node.target = f"{node.target}.module"
        elif first is not None and isinstance(target, nn.ReLU) and len(node.args) == 1:
            with self.graph.inserting_before(node):
                call = self.graph.call_function(relu_uint8, (node.args[0], first.zero_point))
            self.replace(node, call, first)
        elif (first is not None and len(node.args) == 1 and isinstance(target, self.safe_modules)
              and not isinstance(target, nn.MaxPool1d)):  # torch has no uint8 max_pool1d
            if isinstance(target, _MAX_POOLS):
                self.contiguous_input(node)
            self.grids[node] = first
        else:
            self.floats(node)

    def lower_norm_activation(self, node: torch.fx.Node, norm: nn.Module, grid: Any) -> bool:
        """An inference batch norm of a quantized tensor read only by a quantized activation
        oneDNN has a post-op for, as one OnednnPointwise onto the activation's grid; whether
        it was."""
        users = list(node.users)
        if (not isinstance(norm, _BATCH_NORMS) or norm.running_mean is None
                or norm.running_var is None or len(node.args) != 1 or node.kwargs
                or len(users) != 1 or users[0].op != "call_module"):
            return False
        activation = self.modules.get(str(users[0].target))
        if (not isinstance(activation, self.int8_module) or activation.kind != "activation"
                or activation.pre_pad is not None or not supported_post_op(activation.op)):
            return False
        gain = torch.rsqrt(norm.running_var.detach().float() + norm.eps)
        shift = -norm.running_mean.detach().float() * gain
        if norm.affine:
            gain = gain * norm.weight.detach().float()
            shift = shift * norm.weight.detach().float() + norm.bias.detach().float()
        fused = OnednnPointwise(grid, activation.output, gain, shift, activation.op)
        with self.graph.inserting_before(users[0]):
            call = self.call_new(fused, (node.args[0],))
        self.replace(users[0], call, activation.output)
        self.graph.erase_node(node)
        return True

    def lower_function(self, node: torch.fx.Node) -> None:
        """A dequantization, an op exact on integers, or a float op."""
        if node.op == "call_function" and node.target is ensure_float:
            with self.graph.inserting_before(node):
                call = self.onto(node.args[0], None)
            node.replace_all_uses_with(call)
            self.graph.erase_node(node)
            return
        if (node.op, node.target) in _NOT_TENSORS:
            return  # a shape or attribute: the integers' own
        on_grids = [a for a in node.all_input_nodes if self.grids.get(a) is not None]
        first = self.grids.get(node.args[0]) if node.args else None
        exact = exact_on_quantized(node) and node.target is not F.max_pool1d
        if not exact or len(on_grids) > 1 or (on_grids and first is None):
            self.floats(node)
        elif first is not None and (node.target in _RELUS or node.target == "relu"):
            with self.graph.inserting_before(node):
                call = self.graph.call_function(relu_uint8, (node.args[0], first.zero_point))
            self.replace(node, call, first)
        elif first is not None:
            if node.target in (F.max_pool2d, F.max_pool3d):
                self.contiguous_input(node)
            self.grids[node] = first

    def contiguous_input(self, node: torch.fx.Node) -> None:
        """A max pool's uint8 input made contiguous first: torch's channels-last uint8 max
        pooling refuses more than 127 positions (it counts them in the element type), and
        oneDNN's kernels return channels-last tensors."""
        with self.graph.inserting_before(node):
            contiguous = self.graph.call_method("contiguous", (node.args[0],))
        self.grids[contiguous] = self.grids.get(node.args[0])
        node.args = (contiguous, *node.args[1:])

    def lower_int8(self, node: torch.fx.Node, target: Any) -> None:
        """One converted wrapper as oneDNN kernels and uint8 ops; inputs first onto the grids
        the wrapper quantizes them to."""
        name = str(node.target)
        required = list(target.inputs)
        grid = target.output
        with self.graph.inserting_before(node):
            source = self.grids.get(node.args[0]) if node.args else None
            if (target.kind == "activation" and source is not None
                    and supported_post_op(target.op)):  # on the integers it is given
                call = self.call_new(OnednnPointwise(source, grid, activation=target.op),
                                     (node.args[0],))
                self.replace(node, call, grid)
                return
            inputs = [self.onto(arg, required[min(i, len(required) - 1)])
                      for i, arg in enumerate(node.args)]
            if target.kind == "param":
                x = inputs[0]
                if target.pre_pad is not None:  # zeros of the quantized input: its zero point
                    x = self.graph.call_function(
                        F.pad, (x, target.pre_pad), {"value": required[0].zero_point})
                call = self.graph.call_module(f"{name}.op", (x,))
            elif target.kind == "cat":  # each input on its grid, then all on the output's
                inputs = [self.onto(x, grid) for x in inputs]
                call = self.graph.call_function(torch.cat, (inputs,), {"dim": target.cat_dim})
            elif target.kind in ("add", "add_relu") and len(inputs) == 2:
                call = self.add(node, target, inputs)
            else:
                floats = [self.onto(x, None) for x in inputs]
                if target.kind == "activation":
                    result = self.graph.call_module(f"{name}.op", (floats[0],))
                    call = self.graph.call_function(quantize_uint8,
                                                    (result, *grid.quantize_args()))
                else:
                    call = self.graph.call_function(eltwise_uint8, (
                        target.kind, *grid.quantize_args(), *floats))
        self.replace(node, call, grid)

    def add(self, node: torch.fx.Node, target: Any, inputs: list[Any]) -> torch.fx.Node:
        """A two-input add (+ ReLU) of quantized tensors as one OnednnPointwise, the kernel
        writing into the input no other node reads where there is one."""
        order = [0, 1] if self.fresh(inputs[1], node) or not self.fresh(inputs[0], node) \
            else [1, 0]
        x, accum = (inputs[i] for i in order)
        x_grid, accum_grid = (target.inputs[i] for i in order)
        relu = nn.ReLU() if target.kind == "add_relu" else None
        shared = x is accum or not self.fresh(accum, node)
        if not shared:  # the kernel writes into it: no later reader may be given it
            for conversions in self.converted.values():
                conversions[:] = [(grid, call) for grid, call in conversions if call is not accum]
        fused = OnednnPointwise(x_grid, target.output, activation=relu, accum_grid=accum_grid,
                                accum_shared=shared)
        return self.call_new(fused, (x, accum))

    def fresh(self, value: Any, reader: torch.fx.Node) -> bool:
        """Whether `value` is a tensor of its own (no view of another) that nothing but
        `reader` reads, so a kernel may write its result into it."""
        if not isinstance(value, torch.fx.Node) or not set(value.users) <= {reader}:
            return False
        if value.op == "call_module":
            return isinstance(self.module.get_submodule(str(value.target)),
                              (OnednnLayer, OnednnPointwise))
        return value.op == "call_function" and value.target in _FRESH_FUNCTIONS


def lower_onednn_graph(module: torch.fx.GraphModule, int8_module: type,
                       dequantized_module: type, safe_modules: tuple[type, ...]
                       ) -> torch.fx.GraphModule:
    """Rewrite the converted graph onto oneDNN's kernels and uint8 ops (int8.py's classes,
    each param wrapper's `op` an OnednnLayer; `safe_modules`: exact on integers). In place."""
    _Lowering(module, int8_module, dequantized_module, safe_modules).run()
    module.graph.eliminate_dead_code()
    module.graph.lint()
    module.recompile()
    return module
