"""Quantization follows the graph: what a model's forward computes, functional ops included.

`explicit_graph` traces a model with torch.fx (eval mode: aux heads, which evaluation never
runs, are not in the graph) and gives every functional add, multiply and concatenation of two
tensors a module of its own (`EltwiseAdd`, `EltwiseMult`, `Concat`, named after the module whose
forward does it: `features.2.add`, `features.3.block.2.mul`), so that statistics, overrides,
the simulation and the int8 model treat `x + y` in a forward as they treat a residual
`layer1.0.add` module. Only modules the graph calls are quantized: a Linear inside a leaf such
as nn.MultiheadAttention, which reads its weight directly, stays float.

`float_functional_inputs` is the int8 side: every other functional op (a mean, a sigmoid, a
matmul...) gets its inputs dequantized, so it computes in float as the simulation does; the
ops that are exact on quantized tensors (views, flattens, shuffles, max pooling) run on them.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

from compressor.models.description import describe, described, description_of
from compressor.models.layers.eltwise import Concat, EltwiseAdd, EltwiseMult
from compressor.quantization.core.errors import QuantizationError
from compressor.quantization.simulated.fusion import QuantTracer

__all__ = ["GRAPH_VERSION", "explicit_graph", "float_functional_inputs", "ensure_float",
           "exact_on_quantized"]

GRAPH_VERSION = 1  # recorded in a quantization recipe that was made on the explicit graph
_ADDS = (operator.add, operator.iadd, torch.add)
_MULS = (operator.mul, operator.imul, torch.mul)
_CATS = (torch.cat, torch.concat, torch.concatenate)
# functional ops that compute exactly on quantized tensors (they move or pick values)
_EXACT_FUNCTIONS = (operator.getitem, getattr, torch.flatten, torch.reshape, torch.transpose,
                    torch.permute, torch.squeeze, torch.unsqueeze, torch.chunk, torch.split,
                    F.max_pool1d, F.max_pool2d, F.max_pool3d, F.relu, torch.relu)
_EXACT_METHODS = ("view", "reshape", "flatten", "contiguous", "permute", "transpose", "size",
                  "dim", "chunk", "split", "squeeze", "unsqueeze", "relu")


def _is_activation(node: Any) -> bool:
    """Whether `node` computed one tensor when the graph ran (ShapeProp's record) that is not
    a parameter or buffer read as it is (ConvNeXt's layer scale stays a functional multiply)."""
    return (isinstance(node, torch.fx.Node) and node.op != "get_attr"
            and isinstance(node.meta.get("tensor_meta"), TensorMetadata))


def _owner(node: torch.fx.Node) -> str:
    """The qualified name of the module whose forward holds `node` ('' at the top)."""
    stack = list(node.meta.get("nn_module_stack", {}))
    return stack[-1] if stack else ""


def _eltwise_of(node: torch.fx.Node) -> tuple[str, nn.Module, list[Any]] | None:
    """(kind, module, inputs) when `node` is a functional add/mul/cat of tensors, else None."""
    target = node.target
    args = list(node.args)
    if node.op == "call_function" and target in _CATS:
        tensors = args[0] if args else node.kwargs.get("tensors")
        dim = args[1] if len(args) > 1 else node.kwargs.get("dim", 0)
        if (isinstance(tensors, (list, tuple)) and len(tensors) > 1
                and all(_is_activation(t) for t in tensors) and isinstance(dim, int)):
            return "cat", Concat(dim), list(tensors)
        return None
    is_add = (node.op == "call_function" and target in _ADDS) or (
        node.op == "call_method" and target in ("add", "add_"))
    is_mul = (node.op == "call_function" and target in _MULS) or (
        node.op == "call_method" and target in ("mul", "mul_"))
    if not (is_add or is_mul) or node.kwargs or len(args) != 2:
        return None
    if not all(_is_activation(a) for a in args):
        return None  # a scalar operand (x + 3, x * 0.5) stays a functional op
    return ("add", EltwiseAdd(), args) if is_add else ("mul", EltwiseMult(), args)


def _unique(name: str, taken: set[str]) -> str:
    candidate, index = name, 1
    while candidate in taken:
        candidate, index = f"{name}_{index}", index + 1
    taken.add(candidate)
    return candidate


def _device_of(model: nn.Module) -> torch.device:
    """Where the model's first parameter or buffer is (the CPU for a model without any)."""
    tensor = next(itertools.chain(model.parameters(), model.buffers()), None)
    return tensor.device if tensor is not None else torch.device("cpu")


def explicit_graph(model: nn.Module, sample: Tensor | None = None) -> torch.fx.GraphModule:
    """`model` (eval mode) as a GraphModule whose functional add/mul/cat of tensors are named
    Eltwise modules; its description comes along. Raises QuantizationError when torch.fx
    cannot trace it, naming why."""
    model.eval()
    try:
        graph = QuantTracer().trace(model)
    except Exception as exc:  # noqa: BLE001 - data-dependent control flow and the like
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise QuantizationError(f"torch.fx cannot trace {type(model).__name__} ({reason}), and "
                                "quantizing its graph needs a trace") from None
    module = torch.fx.GraphModule(model, graph, class_name=type(model).__name__)
    if sample is None:
        if not described(model):
            raise QuantizationError("explicit_graph needs a sample batch for a model without a "
                                    "ModelDescription; pass one, or build it with create_model")
        # on the model's device: tracing a model on an accelerator runs there
        sample = torch.zeros(1, *description_of(model).input_spec.input_size,
                             device=_device_of(model))
    try:
        with torch.no_grad():
            ShapeProp(module).propagate(sample)
    except Exception as exc:  # noqa: BLE001
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise QuantizationError(f"the traced graph of {type(model).__name__} does not run "
                                f"({reason}); quantizing its graph needs a trace that runs") \
            from None
    taken = {name for name, _ in module.named_modules()}
    for node in list(module.graph.nodes):
        found = _eltwise_of(node)
        if found is None:
            continue
        kind, eltwise, inputs = found
        owner = _owner(node)
        name = _unique(f"{owner}.{kind}" if owner else kind, taken)
        module.add_submodule(name, eltwise)
        with module.graph.inserting_after(node):
            call = module.graph.call_module(name, tuple(inputs))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        module.graph.erase_node(node)
    module.graph.lint()
    module.recompile()
    if described(model):
        describe(module, description_of(model))
    return module.eval()


def ensure_float(value: Any) -> Any:
    """A quantized tensor dequantized; anything else as it is."""
    return value.dequantize() if isinstance(value, Tensor) and value.is_quantized else value


def exact_on_quantized(node: torch.fx.Node) -> bool:
    """Whether a functional op computes exactly on quantized tensors (moves or picks values,
    leaving them on their grid); modules are not judged here (True)."""
    if node.op == "call_function":
        return node.target in _EXACT_FUNCTIONS
    if node.op == "call_method":
        return node.target in _EXACT_METHODS
    return True  # modules are converted (or wrapped to take float) one by one


def float_functional_inputs(module: torch.fx.GraphModule) -> list[str]:
    """Dequantize the inputs of every functional op that is not exact on quantized tensors;
    returns those ops' names (they compute in float, as in the simulation)."""
    changed = []
    for node in list(module.graph.nodes):
        if node.op not in ("call_function", "call_method") or exact_on_quantized(node):
            continue
        with module.graph.inserting_before(node):
            def wrap(arg: torch.fx.Node) -> torch.fx.Node:
                return module.graph.call_function(ensure_float, (arg,))

            node.args = torch.fx.node.map_arg(node.args, wrap)
            node.kwargs = torch.fx.node.map_arg(node.kwargs, wrap)
        changed.append(node.name)
    module.graph.lint()
    module.recompile()
    return changed
