"""The QDQ form of a post-training quantized model: what `--export-onnx` writes for it.

Each quantization wrapper of the simulated model becomes the same computation written with
torch's quantize / dequantize ops (`torch.ops.quantized_decomposed`), which torch.onnx exports
as QuantizeLinear / DequantizeLinear: activations on the simulation's uint8 grids (a grid
narrower than 8 bits clamps first, as the simulation does), weights as int8 initializers with
their per-tensor or per-channel scales, biases as int32 on the accumulator's grid. ONNX Runtime
runs that graph and fuses the patterns it knows into integer kernels (QLinearConv, QLinearAdd,
MatMulInteger); everything else in the graph stays float, as in the simulation.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed ops)
import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn

from compressor.models.description import describe, description_of, stored_form
from compressor.quantization.core.errors import QuantizationError
from compressor.quantization.core.range_linear import quantize_bias
from compressor.quantization.int8.convert import Grid, activation_grid, weight_integers
from compressor.quantization.simulated.wrappers import (
    ActivationWrapper,
    EltwiseWrapper,
    ParamLayerWrapper,
    QuantWrapper,
    input_padding,
)

__all__ = ["qdq_form", "check_qdq_exportable", "MAX_QDQ_BITS"]

MAX_QDQ_BITS = 8  # QuantizeLinear to uint8 / int8
_OPS = torch.ops.quantized_decomposed


class _FakeQuant(nn.Module):
    """x onto an activation grid and back (QuantizeLinear + DequantizeLinear in ONNX)."""

    def __init__(self, grid: Grid) -> None:
        super().__init__()
        self.scale, self.zero_point, self.top = grid.scale, grid.zero_point, grid.top
        self.bounds = grid.bounds()

    def forward(self, x: Tensor) -> Tensor:
        """Clamped to a narrower grid first (a Clip node), then quantized and dequantized."""
        if self.bounds is not None:
            x = x.clamp(*self.bounds)
        q = _OPS.quantize_per_tensor.default(x, self.scale, self.zero_point, 0, 255,
                                             torch.uint8)
        return _OPS.dequantize_per_tensor.default(q, self.scale, self.zero_point, 0, 255,
                                                  torch.uint8)


def _grid(wrapper: QuantWrapper, slot: str, spec: Any) -> _FakeQuant | None:
    if spec is None:
        return None
    return _FakeQuant(activation_grid(*wrapper.qparams(slot), spec))


class _QDQLayer(nn.Module):
    """A conv / linear layer on dequantized int8 weights and an int32 bias (QDQ)."""

    def __init__(self, wrapper: ParamLayerWrapper) -> None:
        super().__init__()
        layer = wrapper.wrapped
        self.input = _grid(wrapper, "input0", wrapper.inputs[0])
        self.pre_pad = input_padding(layer)
        ints, scale, zero_point = weight_integers(wrapper)
        self.register_buffer("weight_int8", ints)
        self.per_channel = scale.dim() > 0
        # per channel: tensors; per tensor: Python numbers (constants of the exported graph)
        self.weight_qparams: tuple[Any, Any] = (
            (scale.float(), zero_point.to(torch.int64)) if self.per_channel
            else (float(scale), int(zero_point)))
        self.bias_qparams: tuple[Any, Any] | None = None
        if layer.bias is not None:
            grid_bias = wrapper.grid_bias(wrapper.input0_scale)
            assert grid_bias is not None
            # the bias on the accumulator's grid as int32, in torch's units (1 / Distiller's)
            q, accum = quantize_bias(grid_bias, wrapper.input0_scale, wrapper.weight_scale)
            self.register_buffer("bias_int32", q)
            bias_scale = (1.0 / accum.double()).float().reshape(-1)
            self.bias_qparams = ((bias_scale, torch.zeros_like(bias_scale, dtype=torch.int64))
                                 if bias_scale.numel() > 1 else (float(bias_scale), 0))
        self.kind = "linear" if isinstance(layer, nn.Linear) else f"conv{layer.weight.dim() - 2}d"
        if self.kind != "linear":
            self.stride, self.padding = layer.stride, layer.padding
            self.dilation, self.groups = layer.dilation, layer.groups
        self.activation = copy.deepcopy(wrapper.activation)
        self.output = _grid(wrapper, "output", wrapper.output)

    def _weight(self) -> Tensor:
        scale, zero_point = self.weight_qparams
        if self.per_channel:
            return _OPS.dequantize_per_channel.default(self.weight_int8, scale, zero_point, 0,
                                                       -128, 127, torch.int8)
        return _OPS.dequantize_per_tensor.default(self.weight_int8, scale, zero_point, -128, 127,
                                                  torch.int8)

    def _bias(self) -> Tensor | None:
        if self.bias_qparams is None:
            return None
        scale, zero_point = self.bias_qparams
        low, high = -2 ** 31, 2 ** 31 - 1
        if isinstance(scale, Tensor):
            return _OPS.dequantize_per_channel.default(self.bias_int32, scale, zero_point, 0,
                                                       low, high, torch.int32)
        return _OPS.dequantize_per_tensor.default(self.bias_int32, scale, zero_point, low, high,
                                                  torch.int32)

    def forward(self, x: Tensor) -> Tensor:
        """The layer's QDQ graph."""
        if self.input is not None:
            x = self.input(x)
        if self.pre_pad is not None:
            x = F.pad(x, self.pre_pad)
        weight, bias = self._weight(), self._bias()
        if self.kind == "linear":
            y = F.linear(x, weight, bias)
        else:
            conv = getattr(F, self.kind)
            y = conv(x, weight, bias, self.stride, self.padding, self.dilation, self.groups)
        if self.activation is not None:
            y = self.activation(y)
        return self.output(y) if self.output is not None else y


class _QDQOp(nn.Module):
    """An element-wise op or activation on fake-quantized inputs, its output fake-quantized."""

    def __init__(self, wrapper: EltwiseWrapper | ActivationWrapper) -> None:
        super().__init__()
        self.op = copy.deepcopy(wrapper.wrapped)
        specs = [] if isinstance(wrapper, ActivationWrapper) else list(wrapper.inputs)
        self.inputs = nn.ModuleList(
            _grid(wrapper, f"input{i}", spec) or nn.Identity() for i, spec in enumerate(specs))
        self.output = _grid(wrapper, "output", wrapper.output)
        self.activation = copy.deepcopy(getattr(wrapper, "activation", None))  # a fused ReLU

    def forward(self, *xs: Tensor) -> Tensor:
        """act(op(QDQ(x0), QDQ(x1), ...)), then QDQ."""
        ready = [self.inputs[i](x) if i < len(self.inputs) else x for i, x in enumerate(xs)]
        y = self.op(*ready)
        if self.activation is not None:
            y = self.activation(y)
        return self.output(y) if self.output is not None else y


def _check_exportable(name: str, wrapper: QuantWrapper) -> None:
    specs = [wrapper.output, *getattr(wrapper, "inputs", [])]
    weight = getattr(wrapper, "weight_quant", None)
    if wrapper.dynamic:
        raise QuantizationError(f"layer '{name}' quantizes with dynamic ranges, which a QDQ "
                                "graph cannot hold; quantize with statistics to export it")
    widths = [s.bits for s in specs if s is not None] + ([weight.bits] if weight else [])
    if any(bits > MAX_QDQ_BITS for bits in widths):
        raise QuantizationError(f"layer '{name}' is wider than 8 bits, and ONNX's QDQ "
                                "operators are 8-bit; quantize to 8 bits or fewer to export it")
    if isinstance(wrapper, ParamLayerWrapper) and (weight is None or wrapper.inputs[0] is None):
        raise QuantizationError(f"layer '{name}' keeps its weights or input in float, and its "
                                "QDQ form needs both quantized; quantize them to export it")


def check_qdq_exportable(model: nn.Module) -> None:
    """Raise a QuantizationError, naming the layer, where a QDQ graph cannot hold the model."""
    for name, module in stored_form(model).named_modules():
        if isinstance(module, QuantWrapper):
            _check_exportable(name, module)


def qdq_form(model: nn.Module) -> nn.Module:
    """A CPU copy of a post-training quantized model (simulated or int8: its stored form) with
    every wrapper written as quantize / dequantize ops, described as the model is."""
    simulated = stored_form(model)
    form = copy.deepcopy(simulated).cpu().float().eval()
    replaced: list[str] = []
    for name, module in list(form.named_modules()):
        if not name or any(name.startswith(f"{done}.") for done in replaced):
            continue
        if isinstance(module, QuantWrapper):
            _check_exportable(name, module)
            parent, _, child = name.rpartition(".")
            owner = form.get_submodule(parent) if parent else form
            setattr(owner, child, _QDQLayer(module) if isinstance(module, ParamLayerWrapper)
                    else _QDQOp(module))
            replaced.append(name)
    if isinstance(form, torch.fx.GraphModule):
        form.recompile()
    return describe(form, description_of(simulated))
