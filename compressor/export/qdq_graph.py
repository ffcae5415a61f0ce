"""Integer-domain rewrites of an exported QDQ graph, so that runtimes compute it in integers.

torch.onnx writes each quantization wrapper's QuantizeLinear / DequantizeLinear nodes where
the wrapper sits. So a value passed from one wrapper to the next is quantized twice on one
grid; a concatenation dequantizes every input and quantizes the result on the grid its inputs
already share; and a batch norm between two grids (DenseNet's pre-activation BN -> ReLU) runs
in float between a DequantizeLinear and a QuantizeLinear. Runtimes do not all see through
that: OpenVINO requantized every input of DenseNet-BC's concatenations in float at every
layer, and ran each batch norm as a float FakeQuantize behind a reference u8 -> f32 Convert
(1.8x the time of NNCF's own int8 model of the same network). Three rewrites:

- a QuantizeLinear of a DequantizeLinear on the same grid is the integers it started from
  (exact);
- a Concat of DequantizeLinears on one per-tensor grid, quantized on that grid and read by
  nothing else, is a Concat of their integers (ONNX's Concat takes any type), dequantized by
  the nodes that dequantized the quantized result (exact);
- a 4-d BatchNormalization of a DequantizeLinear, quantized afterwards (through at most one
  Relu), is a depthwise 1x1 convolution: int8 weights of +-127 whose per-channel scales
  |gain| / 127 give back the gains (to float32's rounding) and an int32 bias on the
  accumulator's grid, which runtimes fuse into an integer convolution (ONNX Runtime's
  QLinearConv). Where a plain average pooling (no padding) stands between the
  DequantizeLinear and the norm (DenseNet's transitions), the pooling window is the conv's
  kernel and stride, each weight gain / window. Rounding the shift to the accumulator's grid
  moves a value by at most |gain| * input scale / 254, under 1/127 of an input step before the
  output is rounded; the export's check against ONNX Runtime and its comparison with the int8
  kernels measure it.

Nothing else changes; nodes and initializers left unread are removed.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

__all__ = ["REWRITES", "integer_rewrites"]

REWRITES = ("requantize_folded", "integer_concat", "batch_norm_as_int8_conv")
_INT8_GAIN = 127  # the weight integer that holds a gain: its scale is |gain| / 127
_INT32_MAX = 2 ** 31 - 1
_QDQ = ("QuantizeLinear", "DequantizeLinear")


def _attribute(node: Any, name: str, field: str, default: Any) -> Any:
    """The `field` (i, f, s, ints) of `node`'s attribute `name`, or `default` where it has none."""
    return next((getattr(a, field) for a in node.attribute if a.name == name), default)


class _Graph:
    """One ONNX graph's producers, consumers, constants and known ranks, rebuilt on demand."""

    def __init__(self, graph: Any, numpy_helper: Any) -> None:
        self.graph = graph
        self.constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant" and [a.name for a in node.attribute] == ["value"]:
                self.constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        self.ranks = {value.name: len(value.type.tensor_type.shape.dim)
                      for value in [*graph.input, *graph.value_info, *graph.output]
                      if value.type.tensor_type.HasField("shape")}
        self.outputs = {value.name for value in graph.output}
        self.producer: dict[str, Any] = {}
        self.consumers: dict[str, list[Any]] = {}
        self.refresh()

    def refresh(self) -> None:
        """Recompute producers and consumers after nodes changed."""
        self.producer = {name: node for node in self.graph.node for name in node.output}
        consumers = defaultdict(list)
        for node in self.graph.node:
            for name in node.input:
                consumers[name].append(node)
        self.consumers = dict(consumers)

    def grid(self, node: Any | None) -> tuple | None:
        """A hashable (scale, zero point, axis) of a Q or DQ node with constant parameters."""
        if node is None or node.op_type not in _QDQ or len(node.input) != 3:
            return None
        if any(attribute.name != "axis" for attribute in node.attribute):
            return None  # block sizes, saturation, output types: not rewritten
        scale, zero_point = self.constants.get(node.input[1]), self.constants.get(node.input[2])
        if scale is None or zero_point is None:
            return None
        axis = _attribute(node, "axis", "i", 1) if scale.ndim else None
        return (scale.dtype.str, scale.shape, scale.tobytes(), zero_point.dtype.str,
                zero_point.shape, zero_point.tobytes(), axis)

    def dequantized(self, name: str) -> Any | None:
        """The DequantizeLinear that produces `name`, if one does."""
        node = self.producer.get(name)
        return node if node is not None and node.op_type == "DequantizeLinear" else None

    def only_reader(self, name: str) -> Any | None:
        """The one node that reads `name` (None where several, none, or a graph output do)."""
        readers = self.consumers.get(name, [])
        return readers[0] if len(readers) == 1 and name not in self.outputs else None

    def redirect(self, old: str, new: str) -> None:
        """Every reader of `old` reads `new` instead."""
        for node in self.consumers.get(old, []):
            for index, name in enumerate(node.input):
                if name == old:
                    node.input[index] = new


def _per_tensor(grid: tuple | None) -> bool:
    return grid is not None and grid[6] is None


def _fold_requantize(graph: _Graph) -> int:
    """Q(DQ(q)) on one grid -> q."""
    folded = 0
    for node in list(graph.graph.node):
        if node.op_type != "QuantizeLinear" or node.output[0] in graph.outputs:
            continue
        source = graph.dequantized(node.input[0])
        grid = graph.grid(node)
        if source is not None and grid is not None and graph.grid(source) == grid:
            graph.redirect(node.output[0], source.input[0])
            folded += 1
    graph.refresh()
    return folded


def _integer_concat(graph: _Graph) -> int:
    """Q(Concat(DQ(q1), DQ(q2), ...)) on one grid -> Concat(q1, q2, ...)."""
    rewritten, dropped = 0, []
    for concat in list(graph.graph.node):
        if concat.op_type != "Concat":
            continue
        quantize = graph.only_reader(concat.output[0])
        if quantize is None or quantize.op_type != "QuantizeLinear":
            continue
        grid = graph.grid(quantize)
        sources = [graph.dequantized(name) for name in concat.input]
        if not _per_tensor(grid) or any(source is None or graph.grid(source) != grid
                                        for source in sources):
            continue
        for index, source in enumerate(sources):
            concat.input[index] = source.input[0]
        concat.output[0] = quantize.output[0]  # the quantized result's readers read it
        dropped.append(quantize)
        rewritten += 1
    for node in dropped:
        graph.graph.node.remove(node)
    graph.refresh()
    return rewritten


def _quantized_after(graph: _Graph, name: str) -> bool:
    """`name` is read only by a QuantizeLinear, or only by a Relu read only by one."""
    reader = graph.only_reader(name)
    if reader is not None and reader.op_type == "Relu":
        reader = graph.only_reader(reader.output[0])
    return reader is not None and reader.op_type == "QuantizeLinear"


def _pooling_window(graph: _Graph, name: str) -> tuple[Any, list[int], list[int]] | None:
    """(the DequantizeLinear, kernel, strides) where `name` is a plain 2-d average pooling
    (no padding, floor mode) of a DequantizeLinear; else None. (The pooling stays where
    others read it: DenseNet quantizes it for the block's concatenations too.)"""
    pool = graph.producer.get(name)
    if pool is None or pool.op_type != "AveragePool":
        return None
    source = graph.dequantized(pool.input[0])
    if source is None:
        return None
    kernel = list(_attribute(pool, "kernel_shape", "ints", []))
    plain = (len(kernel) == 2 and not any(_attribute(pool, "pads", "ints", []))
             and not _attribute(pool, "ceil_mode", "i", 0)
             and _attribute(pool, "auto_pad", "s", b"NOTSET") in (b"NOTSET", b"VALID")
             and all(d == 1 for d in _attribute(pool, "dilations", "ints", [])))
    strides = list(_attribute(pool, "strides", "ints", [1, 1]))
    return (source, kernel, strides) if plain else None


def _conv_of_batch_norm(graph: _Graph, norm: Any, source: Any, kernel: list[int],
                        strides: list[int], helper: Any, numpy_helper: Any
                        ) -> list[Any] | None:
    """The nodes (and new initializers) of a depthwise int8 conv computing `norm` of the
    average over `kernel` windows (1x1: none) of `source`'s values."""
    params = [graph.constants.get(name) for name in norm.input[1:5]]
    if any(param is None for param in params):
        return None
    weight, bias, mean, var = (param.astype(np.float64) for param in params)
    epsilon = _attribute(norm, "epsilon", "f", 1e-5)
    gain = weight / np.sqrt(var + epsilon)
    shift = bias - mean * gain
    window = int(np.prod(kernel))  # an average: each input weighs gain / window
    weight_scale = np.where(gain == 0, 1.0, np.abs(gain) / (_INT8_GAIN * window)
                            ).astype(np.float32)
    x_scale = float(graph.constants[source.input[1]])
    bias_scale = (x_scale * weight_scale.astype(np.float64)).astype(np.float32)
    bias_int = np.round(shift / bias_scale.astype(np.float64))
    if not np.all(np.isfinite(bias_int)) or np.abs(bias_int).max(initial=0) > _INT32_MAX:
        return None  # a shift the accumulator cannot hold: the batch norm stays float
    channels = gain.size
    prefix = f"{norm.output[0]}_int8_conv"
    ints = np.broadcast_to((np.sign(gain) * _INT8_GAIN).astype(np.int8).reshape(-1, 1, 1, 1),
                           (channels, 1, *kernel))
    graph.graph.initializer.extend([
        numpy_helper.from_array(np.ascontiguousarray(ints), f"{prefix}_weight"),
        numpy_helper.from_array(weight_scale, f"{prefix}_weight_scale"),
        numpy_helper.from_array(np.zeros(channels, np.int8), f"{prefix}_weight_zero_point"),
        numpy_helper.from_array(bias_int.astype(np.int32), f"{prefix}_bias"),
        numpy_helper.from_array(bias_scale, f"{prefix}_bias_scale"),
        numpy_helper.from_array(np.zeros(channels, np.int32), f"{prefix}_bias_zero_point")])
    return [
        helper.make_node("DequantizeLinear", [f"{prefix}_weight", f"{prefix}_weight_scale",
                                              f"{prefix}_weight_zero_point"],
                         [f"{prefix}_weight_float"], axis=0),
        helper.make_node("DequantizeLinear", [f"{prefix}_bias", f"{prefix}_bias_scale",
                                              f"{prefix}_bias_zero_point"],
                         [f"{prefix}_bias_float"], axis=0),
        helper.make_node("Conv", [source.output[0], f"{prefix}_weight_float",
                                  f"{prefix}_bias_float"], [norm.output[0]],
                         name=f"{prefix}", group=channels, kernel_shape=kernel,
                         strides=strides)]


def _batch_norm_as_int8_conv(graph: _Graph, helper: Any, numpy_helper: Any) -> int:
    """DQ -> (AveragePool) -> BatchNormalization -> (Relu) -> Q  ->  DQ -> depthwise int8
    Conv -> (Relu) -> Q; an average pooling between them (DenseNet's transitions) is the
    conv's window."""
    nodes, rewritten = [], 0
    for node in graph.graph.node:
        replacement = None
        if (node.op_type == "BatchNormalization" and len(node.output) == 1
                and graph.ranks.get(node.output[0]) == 4
                and _quantized_after(graph, node.output[0])):
            source = graph.dequantized(node.input[0])
            window = (source, [1, 1], [1, 1]) if source is not None else \
                _pooling_window(graph, node.input[0])
            if window is not None and _per_tensor(graph.grid(window[0])):
                replacement = _conv_of_batch_norm(graph, node, *window, helper, numpy_helper)
        if replacement is None:
            nodes.append(node)
        else:
            nodes.extend(replacement)
            rewritten += 1
    if rewritten:
        del graph.graph.node[:]
        graph.graph.node.extend(nodes)
        graph.refresh()
    return rewritten


def _prune(graph: _Graph) -> None:
    """Drop nodes nothing reads, then initializers and value infos nothing names."""
    while True:
        unread = [node for node in graph.graph.node
                  if not any(name in graph.consumers or name in graph.outputs
                             for name in node.output)]
        if not unread:
            break
        for node in unread:
            graph.graph.node.remove(node)
        graph.refresh()
    unused = [init for init in graph.graph.initializer if init.name not in graph.consumers]
    for init in unused:
        graph.graph.initializer.remove(init)
    named = set(graph.producer) | {value.name for value in graph.graph.input}
    stale = [value for value in graph.graph.value_info if value.name not in named]
    for value in stale:
        graph.graph.value_info.remove(value)


def integer_rewrites(model: Any) -> dict[str, int]:
    """Rewrite a QDQ ModelProto in place (see the module's docstring); how often each applied."""
    from onnx import helper, numpy_helper

    graph = _Graph(model.graph, numpy_helper)
    counts = {"requantize_folded": _fold_requantize(graph),
              "integer_concat": _integer_concat(graph)}
    _prune(graph)
    counts["batch_norm_as_int8_conv"] = _batch_norm_as_int8_conv(graph, helper, numpy_helper)
    _prune(graph)
    return counts
