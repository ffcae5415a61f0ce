"""The data flow that quantization needs, found with torch.fx: conv/linear -> BN -> ReLU chains to
fold and fuse, and which quantized layer produces each input of a layer.

Folding a batch norm into the layer before it is exact in float (torch's fuse_conv_bn_eval /
fuse_linear_bn_eval); a ReLU fused into a layer is applied by the quantized layer, which then
quantizes with the ReLU's output statistics. The folded BN and fused ReLU modules are replaced by
nn.Identity, so every other module keeps its name. What was done is kept as plain data
(`Fusion`) and replayed on a freshly built model before a saved state_dict is loaded.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval, fuse_linear_bn_eval

from compressor.models.layers.eltwise import EltwiseAdd
from compressor.quantization.core.errors import QuantizationError, shown
from compressor.quantization.core.settings import ELTWISE_LAYERS, PARAM_LAYERS

__all__ = ["Fusion", "QuantTracer", "trace_model", "find_fusions", "apply_fusions",
           "fusions_to_recipe", "fusions_from_recipe", "input_sources", "FUSABLE_ACTIVATIONS"]

LOG = logging.getLogger(__name__)
FUSABLE_ACTIVATIONS = (nn.ReLU, nn.ReLU6)
# ops that keep a quantized tensor on its producer's grid (pooling rounds back onto it)
_PASS_MODULES = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d,
                 nn.AvgPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
                 nn.Flatten, nn.Dropout, nn.Identity)
_PASS_FUNCTIONS = (torch.flatten, torch.reshape, F.max_pool2d, F.avg_pool2d,
                   F.adaptive_avg_pool2d, F.dropout)
_PASS_METHODS = ("flatten", "view", "reshape", "contiguous")


@dataclass(frozen=True)
class Fusion:
    """A param layer with the batch norm folded into it and the activation fused after it."""

    layer: str
    batchnorm: str | None
    activation: str | None


class QuantTracer(torch.fx.Tracer):
    """Keeps batch norms, element-wise modules and conv / linear layers (subclasses too: a
    padding convolution is one layer) as single call_module nodes."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        """Batch norms, Eltwise modules and param layers are leaves too."""
        return (isinstance(m, (nn.modules.batchnorm._BatchNorm, *ELTWISE_LAYERS, *PARAM_LAYERS))
                or super().is_leaf_module(m, module_qualified_name))


def trace_model(model: nn.Module) -> torch.fx.Graph | None:
    """The model's fx graph, or None (logged) when torch.fx cannot trace it."""
    try:
        return QuantTracer().trace(model)
    except Exception as exc:  # data-dependent control flow and the like
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        LOG.warning("torch.fx cannot trace %s (%s): no BN folding or ReLU fusion",
                    type(model).__name__, reason)
        return None


def _module_calls(graph: torch.fx.Graph) -> dict[str, list[torch.fx.Node]]:
    """The call_module nodes of each module name."""
    calls: dict[str, list[torch.fx.Node]] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            calls.setdefault(str(node.target), []).append(node)
    return calls


def _only_user(node: torch.fx.Node, calls: Mapping[str, list[torch.fx.Node]],
               modules: Mapping[str, nn.Module], kinds: tuple[type, ...]) -> str | None:
    """The module consuming `node` if it is the node's only user, called once, of `kinds`."""
    users = list(node.users)
    if len(users) != 1 or users[0].op != "call_module":
        return None
    name = str(users[0].target)
    if not isinstance(modules.get(name), kinds) or len(calls[name]) != 1:
        return None
    return name


def find_fusions(model: nn.Module, graph: torch.fx.Graph | None = None) -> list[Fusion]:
    """Each conv/linear -> BN -> ReLU chain and element-wise add -> ReLU pair (links with one
    user each), in graph order."""
    graph = graph if graph is not None else trace_model(model)
    if graph is None:
        return []
    modules = dict(model.named_modules())
    calls = _module_calls(graph)
    fusions = []
    for name, nodes in calls.items():
        layer = modules.get(name)
        if isinstance(layer, EltwiseAdd) and len(nodes) == 1:
            # a residual add -> ReLU quantizes once, after the ReLU (int8's add_relu)
            activation = _only_user(nodes[0], calls, modules, (nn.ReLU,))
            if activation is not None:
                fusions.append(Fusion(name, None, activation))
            continue
        if not isinstance(layer, PARAM_LAYERS) or len(nodes) != 1:
            continue
        end = nodes[0]
        norm_kind = nn.BatchNorm1d if isinstance(layer, (nn.Linear, nn.Conv1d)) else (
            nn.BatchNorm2d if isinstance(layer, nn.Conv2d) else nn.BatchNorm3d)
        norm = _only_user(end, calls, modules, (norm_kind,))
        if norm is not None and not modules[norm].track_running_stats:
            norm = None  # nothing to fold without running statistics
        if norm is not None:
            end = calls[norm][0]
        activation = _only_user(end, calls, modules, FUSABLE_ACTIVATIONS)
        if norm is not None or activation is not None:
            fusions.append(Fusion(name, norm, activation))
    return fusions


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    """Replace the submodule called `name`."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def apply_fusions(model: nn.Module, fusions: Iterable[Fusion]) -> None:
    """Fold each BN into its layer (in eval form) and put nn.Identity in place of BN and ReLU."""
    modules = dict(model.named_modules())
    for fusion in fusions:
        layer = modules.get(fusion.layer)
        names = [n for n in (fusion.layer, fusion.batchnorm, fusion.activation) if n]
        missing = [n for n in names if n not in modules]
        fusable = isinstance(layer, PARAM_LAYERS) or (
            isinstance(layer, EltwiseAdd) and fusion.batchnorm is None)
        if missing or not fusable:
            raise QuantizationError(f"the quantization recipe fuses {', '.join(names)} but the "
                                    f"model lacks {', '.join(missing) or fusion.layer + ' layer'}"
                                    "; build the model with the architecture it was saved with")
        if fusion.batchnorm is not None:
            norm = modules[fusion.batchnorm]
            fuse = fuse_linear_bn_eval if isinstance(layer, nn.Linear) else fuse_conv_bn_eval
            with torch.no_grad():
                folded = fuse(layer.eval(), norm.eval())
            _set_module(model, fusion.layer, folded)
            _set_module(model, fusion.batchnorm, nn.Identity())
        if fusion.activation is not None:
            _set_module(model, fusion.activation, nn.Identity())


def fusions_to_recipe(fusions: Sequence[Fusion]) -> list[dict[str, Any]]:
    """The fusions as plain data."""
    return [{"layer": f.layer, "batchnorm": f.batchnorm, "activation": f.activation}
            for f in fusions]


def fusions_from_recipe(data: Any) -> list[Fusion]:
    """The fusions saved by `fusions_to_recipe`."""
    if not isinstance(data, (list, tuple)):
        raise QuantizationError(f"the recipe's fusions are not a list ({shown(data)}); quantize "
                                "the model again")
    try:
        return [Fusion(str(d["layer"]), d.get("batchnorm"), d.get("activation")) for d in data]
    except (TypeError, KeyError, AttributeError):
        raise QuantizationError(f"the recipe's fusions are malformed ({shown(data)}); quantize "
                                "the model again") from None


def _producer(node: Any, outputs: Mapping[torch.fx.Node, str],
              modules: Mapping[str, nn.Module]) -> str | None:
    """The layer whose output reaches `node` through grid-keeping ops only, if any."""
    while isinstance(node, torch.fx.Node):
        if node in outputs:
            return outputs[node]
        passes = (
            (node.op == "call_module" and isinstance(modules.get(str(node.target)), _PASS_MODULES))
            or (node.op == "call_function" and node.target in _PASS_FUNCTIONS)
            or (node.op == "call_method" and node.target in _PASS_METHODS))
        if not passes or not node.args:
            return None
        node = node.args[0]
    return None


def input_sources(model: nn.Module, graph: torch.fx.Graph, layers: Iterable[str],
                  fusions: Sequence[Fusion]) -> dict[str, list[str | None]]:
    """For each layer called once, the producing layer of each positional input (None: float).

    The producer of a fused chain is its param layer, seen at the chain's last node.
    """
    modules = dict(model.named_modules())
    calls = _module_calls(graph)
    wanted = list(layers)
    last = {f.layer: f.activation or f.batchnorm or f.layer for f in fusions}
    outputs = {}
    for name in wanted:
        end = last.get(name, name)
        if len(calls.get(name, ())) == 1 and len(calls.get(end, ())) == 1:
            outputs[calls[end][0]] = name
    sources = {}
    for name in wanted:
        nodes = calls.get(name, [])
        if len(nodes) != 1:
            continue
        sources[name] = [_producer(arg, outputs, modules) for arg in nodes[0].args]
    return sources
