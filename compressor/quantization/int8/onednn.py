"""int8 on oneDNN's kernels with plain uint8 tensors: the `onednn` backend (--qe-pytorch-backend).

torch 2.14 deprecates the quantized tensor types (quint8, qint8) that torch.ao's quantized modules
compute with. What replaces them for x86 CPUs is torchao's PT2E quantization lowered by inductor
onto `torch.ops.onednn.qconv_pointwise` / `qlinear_pointwise`: kernels that take plain uint8
activations and int8 weights with their scales and zero points as arguments. The modules here
call those kernels directly with the simulation's integers and scales, so the int8 model needs
neither the deprecated types nor inductor: OnednnLayer (a conv or linear layer, its activation
a post-op), OnednnPointwise (a depthwise 1x1 kernel for requantizations, adds, activations and
batch norms between two grids), and the simulation's own quantize / dequantize formulas where
the graph enters or leaves the integers (int8_onednn_graph.py places them).

oneDNN's kernels take symmetric weights only (a weight zero point is ignored), and the graph is
needed; `onednn_problem` names what keeps a model from this backend, and `auto` then uses x86.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch import Tensor, nn

from compressor.quantization.simulated.wrappers import ParamLayerWrapper
from compressor.utils.vocabulary import ONEDNN

__all__ = ["ONEDNN", "onednn_available", "onednn_problem", "OnednnLayer", "OnednnPointwise",
           "dequantize_uint8", "quantize_uint8", "eltwise_uint8",
           "relu_uint8", "onednn_saturates", "supported_post_op"]

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_PACKED_SHAPES = 4  # input shapes a layer keeps packed weights for (batch sizes, mostly)


def onednn_available() -> bool:
    """Whether this torch build has oneDNN's int8 kernels (x86 CPUs with mkldnn)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qconv_pointwise")


def onednn_problem(model: nn.Module) -> str | None:
    """Why oneDNN's int8 kernels cannot compute `model` (one phrase), or None where they can."""
    if not onednn_available():
        return "this torch build lacks oneDNN's int8 kernels"
    if not isinstance(model, torch.fx.GraphModule):
        return "the model is not a traced graph"
    for name, module in model.named_modules():
        if not isinstance(module, ParamLayerWrapper) or module.weight_quant is None:
            continue
        layer = module.wrapped
        if not isinstance(layer, (*_CONVS, nn.Linear)):
            return f"layer '{name}' is a {type(layer).__name__}"
        if isinstance(layer, _CONVS) and layer.padding_mode != "zeros":
            return f"layer '{name}' pads with '{layer.padding_mode}'"
        if isinstance(layer, _CONVS) and isinstance(layer.padding, str):
            return f"layer '{name}' has padding '{layer.padding}'"
        if bool((module.weight_zero_point != 0).any()):
            return f"layer '{name}' has asymmetric weights (oneDNN takes weight zero point 0)"
    return None


def dequantize_uint8(x: Tensor, sim_scale: float, zero_point: int) -> Tensor:
    """The float values of uint8 integers, as the simulation computes them: (x - zero_point)
    divided by Distiller's scale (Grid.dequantize_args)."""
    return torch.sub(x.float(), zero_point).div_(sim_scale)


def quantize_uint8(x: Tensor, sim_scale: float, sim_zero_point: float, zero_point: int,
                   top: int) -> Tensor:
    """Float x as uint8 integers, as the simulation computes them (Grid.quantize_args):
    round(x * scale - Distiller's zero point), shifted onto 0..top."""
    shift = zero_point + sim_zero_point
    return (torch.mul(x, sim_scale).sub_(sim_zero_point).round_().add_(shift)
            .clamp_(0, top).to(torch.uint8))


def eltwise_uint8(kind: str, sim_scale: float, sim_zero_point: float, zero_point: int,
                  top: int, *xs: Tensor) -> Tensor:
    """A float add (add_relu) or multiply of `xs` quantized onto the output grid."""
    result = xs[0]
    for other in xs[1:]:
        result = result * other if kind == "mul" else result + other
    if kind == "add_relu":
        result = torch.relu(result)
    return quantize_uint8(result, sim_scale, sim_zero_point, zero_point, top)


def relu_uint8(x: Tensor, zero_point: int) -> Tensor:
    """ReLU of integers on a grid: clamped at its zero point (the float 0)."""
    return torch.clamp_min(x, zero_point)


class OnednnLayer(nn.Module):
    """A conv / linear layer on oneDNN's int8 kernels: uint8 in on `x_grid`, uint8 out on
    `out_grid` (a ReLU fused); another activation runs in float before the output is quantized."""

    def __init__(self, wrapper: ParamLayerWrapper, ints: Tensor, w_scale: Tensor,
                 bias: Tensor | None, x_grid: Any, out_grid: Any) -> None:
        super().__init__()
        layer = wrapper.wrapped
        self.is_conv = isinstance(layer, _CONVS)
        if self.is_conv:
            self.stride, self.padding = list(layer.stride), list(layer.padding)
            self.dilation, self.groups = list(layer.dilation), layer.groups
        channels = ints.shape[0]
        self.register_buffer("weight_ints", ints)
        self.register_buffer("w_scale", w_scale.float().reshape(-1).expand(channels).clone())
        self.register_buffer("w_zero_point", torch.zeros(channels, dtype=torch.int64))
        self.register_buffer("bias", bias)
        self.x_grid, self.out_grid = x_grid, out_grid
        activation = wrapper.activation
        self.attr, self.scalars = _post_op(activation)
        self.activation = activation if self.attr == "none" else None  # computed in float
        # oneDNN's opaque weights, packed for each input shape on its first call
        self._packed: dict[tuple[int, ...], Tensor] = {}

    def __getstate__(self) -> dict[str, Any]:
        """The module without its packed weights (opaque tensors copies cannot read)."""
        state = self.__dict__.copy()
        state["_packed"] = {}
        return state

    def _pack(self, x_shape: list[int]) -> Tensor:
        if self.is_conv:
            return torch.ops.onednn.qconv_prepack(
                self.weight_ints, self.w_scale, self.x_grid.scale, self.x_grid.zero_point,
                self.stride, self.padding, self.dilation, self.groups, x_shape)
        return torch.ops.onednn.qlinear_prepack(self.weight_ints, x_shape)

    def packed(self, x: Tensor) -> Tensor:
        """oneDNN's weight packed in the layout its kernel picks for x's shape (a weight
        packed for no shape is reordered on every call of a shape preferring another: 5 % of
        a ResNet-20 conv at batch 32). The last few shapes' are kept."""
        key = tuple(x.shape)
        packed = self._packed.get(key)
        if packed is None:
            if len(self._packed) >= _PACKED_SHAPES:
                del self._packed[next(iter(self._packed))]  # the oldest
            packed = self._packed[key] = self._pack(list(key))
        return packed

    def forward(self, x: Tensor) -> Tensor:
        """The layer's uint8 output on its grid."""
        x_grid, out_grid = self.x_grid, self.out_grid
        to_float = self.activation is not None
        scale, zero_point = (1.0, 0) if to_float else (out_grid.scale, out_grid.zero_point)
        dtype = torch.float32 if to_float else torch.uint8
        if self.is_conv:
            out = torch.ops.onednn.qconv_pointwise(
                x, x_grid.scale, x_grid.zero_point, self.packed(x), self.w_scale,
                self.w_zero_point, self.bias, self.stride, self.padding, self.dilation,
                self.groups, scale, zero_point, dtype, self.attr, self.scalars, "")
        else:
            out = torch.ops.onednn.qlinear_pointwise(
                x, x_grid.scale, x_grid.zero_point, self.packed(x), self.w_scale,
                self.w_zero_point, self.bias, scale, zero_point, dtype, self.attr,
                self.scalars, "")
        if to_float:
            assert self.activation is not None
            return quantize_uint8(self.activation(out), *out_grid.quantize_args())
        return out if out_grid.top >= 255 else out.clamp_max_(out_grid.top)

    def extra_repr(self) -> str:
        """Kind, grids, fused activation."""
        kind = "conv" if self.is_conv else "linear"
        return (f"{kind}, x=({self.x_grid.scale:.4g}, {self.x_grid.zero_point}), "
                f"out=({self.out_grid.scale:.4g}, {self.out_grid.zero_point}), "
                f"post_op={self.attr}")


def supported_post_op(activation: nn.Module | None) -> bool:
    """Whether oneDNN computes `activation` as a post-op of its int8 kernels."""
    return _post_op(activation)[0] != "none"


def _post_op(activation: nn.Module | None) -> tuple[str, list[float]]:
    """oneDNN's post-op computing `activation` before the output is quantized (as the
    simulation computes it), or "none" where oneDNN has none for it."""
    if activation is None:
        return "none", []
    if type(activation) is nn.ReLU:
        return "relu", []
    if type(activation) is nn.ReLU6:
        return "hardtanh", [0.0, 6.0]
    if type(activation) is nn.Hardtanh:
        return "hardtanh", [float(activation.min_val), float(activation.max_val)]
    if type(activation) is nn.Hardswish:
        return "hardswish", []
    if type(activation) is nn.SiLU:
        return "swish", []
    return "none", []


class OnednnPointwise(nn.Module):
    """A per-channel affine map of uint8 integers onto another grid, a post-op after it, and
    optionally a second tensor added (oneDNN's sum post-op) before the post-op: one depthwise
    1x1 int8 convolution whose weights hold the gains exactly (+-127 with the gain / 127 as
    the channel's scale). It requantizes (gain 1), adds two quantized tensors (a residual add),
    applies an activation to quantized values, or computes an inference batch norm and the
    ReLU after it, as the simulation computes them in float between two quantizations.
    4-d tensors take the kernel; others are computed in float, the same way."""

    def __init__(self, x_grid: Any, out_grid: Any, gain: Tensor | None = None,
                 bias: Tensor | None = None, activation: nn.Module | None = None,
                 accum_grid: Any = None, accum_shared: bool = True) -> None:
        super().__init__()
        self.x_grid, self.out_grid, self.accum_grid = x_grid, out_grid, accum_grid
        self.register_buffer("gain", None if gain is None else gain.detach().float().clone())
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.attr, self.scalars = _post_op(activation)
        self.activation = activation
        self.accum_shared = accum_shared  # the added tensor is read elsewhere: copied first
        self._packed: dict[int, tuple[Tensor, Tensor, Tensor, Tensor]] = {}

    def __getstate__(self) -> dict[str, Any]:
        """The module without its packed weights (opaque tensors copies cannot read)."""
        state = self.__dict__.copy()
        state["_packed"] = {}
        return state

    def _weights(self, channels: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(packed weight, weight scales, weight zero points, bias) for `channels`."""
        if channels not in self._packed:
            if self.gain is None:  # exactly one
                ints, scale = torch.ones(channels, dtype=torch.int8), torch.ones(channels)
            else:
                gain = self.gain
                ints = torch.where(gain == 0, 0, torch.where(gain > 0, 127, -127)).to(torch.int8)
                scale = torch.where(gain == 0, torch.ones_like(gain), gain.abs() / 127)
            packed = torch.ops.onednn.qconv_prepack(
                ints.reshape(channels, 1, 1, 1), scale, self.x_grid.scale,
                self.x_grid.zero_point, [1, 1], [0, 0], [1, 1], channels, None)
            self._packed[channels] = (packed, scale, torch.zeros(channels, dtype=torch.int64),
                                      self.bias)
        return self._packed[channels]

    def forward(self, x: Tensor, accum: Tensor | None = None) -> Tensor:
        """The integers of post_op(gain * x + bias (+ accum)) on the output grid."""
        if (x.dim() != 4 or (self.attr == "none" and self.activation is not None)
                or (accum is not None and accum.shape != x.shape)):
            return self._in_float(x, accum)
        packed, scale, zero_point, bias = self._weights(x.shape[1])
        x_grid, out = self.x_grid, self.out_grid
        conv_args = ([1, 1], [0, 0], [1, 1], x.shape[1], out.scale, out.zero_point, torch.uint8)
        if accum is None:
            result = torch.ops.onednn.qconv_pointwise(
                x, x_grid.scale, x_grid.zero_point, packed, scale, zero_point, bias,
                *conv_args, self.attr, self.scalars, "")
        else:
            accum = (accum.clone(memory_format=torch.channels_last) if self.accum_shared
                     else accum.contiguous(memory_format=torch.channels_last))
            result = torch.ops.onednn.qconv2d_pointwise.binary(
                x, x_grid.scale, x_grid.zero_point, packed, scale, zero_point, accum, bias,
                *conv_args, self.accum_grid.scale, self.accum_grid.zero_point, "sum", 1.0,
                self.attr, self.scalars, "")
        return result if out.top >= 255 else result.clamp_max_(out.top)

    def _in_float(self, x: Tensor, accum: Tensor | None) -> Tensor:
        values = dequantize_uint8(x, *self.x_grid.dequantize_args())
        if self.gain is not None:
            shape = (-1,) + (1,) * (x.dim() - 2)
            values = values * self.gain.reshape(shape)
            if self.bias is not None:
                values = values + self.bias.reshape(shape)
        if accum is not None:
            values = values + dequantize_uint8(accum, *self.accum_grid.dequantize_args())
        if self.activation is not None:
            values = self.activation(values)
        return quantize_uint8(values, *self.out_grid.quantize_args())

    def extra_repr(self) -> str:
        """What it computes."""
        parts = ["requantize" if self.gain is None else "affine"]
        if self.accum_grid is not None:
            parts.append("+ accum")
        if self.activation is not None:
            parts.append(type(self.activation).__name__)
        return " ".join(parts)


def onednn_saturates() -> bool:
    """Whether oneDNN's int8 convolution on this CPU saturates full-range 8-bit activations
    (x86 without VNNI sums u8 x s8 pairs in int16): one 3x3 convolution of 255s by 127s."""
    if not onednn_available():
        return False
    ints = torch.full((1, 64, 3, 3), 127, dtype=torch.int8)
    scale = torch.ones(1)
    packed = torch.ops.onednn.qconv_prepack(ints, scale, 1.0, 0, [1, 1], [0, 0], [1, 1], 1, None)
    x = torch.full((1, 64, 3, 3), 255, dtype=torch.uint8)
    out = torch.ops.onednn.qconv_pointwise(
        x, 1.0, 0, packed, scale, torch.zeros(1, dtype=torch.int64), None, [1, 1], [0, 0],
        [1, 1], 1, 1.0, 0, torch.float32, "none", [], "")
    return float(out.item()) != 64 * 9 * 255 * 127


