"""Modules that simulate range-linear quantization in float (Distiller's RangeLinearQuant*Wrapper).

Each wrapper keeps the module it quantizes as `wrapped` (so `conv1.wrapped.weight` addresses the
weight) and its quantization parameters as buffers (`input0_scale`, `output_zero_point`,
`weight_scale` ...), so that a rebuilt model loading the state_dict reproduces the outputs
bitwise. Weights are fake-quantized once, in place; the bias is put on the accumulator's grid
(input scale * weight scale) at each call. In dynamic mode (no buffers for activations) each
activation's range is taken from the batch itself, as Distiller's --qe-dynamic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.func import functional_call

from compressor.quantization.core.clipping import ClipMode, tensor_range
from compressor.quantization.core.range_linear import (
    MAX_ACCUM_BITS,
    MAX_BITS,
    LinearQuantMode,
    accum_range,
    bias_scale,
    fake_quantize,
    quant_params,
    quantize_bias,
    weight_quant_params,
)

__all__ = ["TensorQuant", "WeightQuant", "QuantWrapper", "ParamLayerWrapper", "EltwiseWrapper",
           "ActivationWrapper", "input_padding"]

QParams = tuple[Tensor, Tensor]


class TensorQuant(NamedTuple):
    """How one activation tensor is quantized: width, mode and (for dynamic ranges) clipping."""

    bits: int
    mode: LinearQuantMode
    clip: ClipMode = ClipMode.NONE
    clip_n_stds: float | None = None
    half_range: bool = False


class WeightQuant(NamedTuple):
    """How a layer's weight is quantized."""

    bits: int
    mode: LinearQuantMode
    per_channel: bool = False


class QuantWrapper(nn.Module):
    """Quantizes the inputs and the output of `wrapped` (None specs pass through in float)."""

    kind = "module"

    def __init__(self, wrapped: nn.Module, inputs: Sequence[TensorQuant | None],
                 output: TensorQuant | None, qparams: Mapping[str, QParams] | None) -> None:
        """`qparams` holds (scale, zero_point) by 'input0'.. / 'output'; None = dynamic."""
        super().__init__()
        self.wrapped = wrapped
        self.inputs = tuple(inputs)
        self.output = output
        self.dynamic = qparams is None
        if qparams is not None:
            slots = [(f"input{i}", s) for i, s in enumerate(self.inputs)] + [("output", output)]
            for slot, spec in slots:
                if spec is not None:
                    scale, zero_point = qparams[slot]
                    self.register_buffer(f"{slot}_scale", scale.detach().float().clone())
                    self.register_buffer(f"{slot}_zero_point", zero_point.detach().float().clone())

    def qparams(self, slot: str) -> QParams:
        """The stored (scale, zero_point) of 'input<i>' or 'output'."""
        return getattr(self, f"{slot}_scale"), getattr(self, f"{slot}_zero_point")

    def _slot_qparams(self, slot: str, spec: TensorQuant, x: Tensor) -> QParams:
        """The slot's stored (scale, zero_point), or x's own when dynamic."""
        if not self.dynamic:
            return self.qparams(slot)
        low, high = tensor_range(x, spec.clip, spec.mode, spec.bits, spec.clip_n_stds,
                                 spec.half_range)
        return quant_params(low, high, spec.bits, spec.mode)

    def quantize_input(self, index: int, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """(the quantized input, its scale or None when it stays float)."""
        spec = self.inputs[index] if index < len(self.inputs) else None
        if spec is None:
            return x, None
        scale, zero_point = self._slot_qparams(f"input{index}", spec, x)
        return fake_quantize(x, scale, zero_point, spec.bits, spec.mode), scale

    def quantize_output(self, y: Tensor) -> Tensor:
        """The output fake-quantized (unchanged when it stays float)."""
        if self.output is None:
            return y
        scale, zero_point = self._slot_qparams("output", self.output, y)
        return fake_quantize(y, scale, zero_point, self.output.bits, self.output.mode)

    def extra_repr(self) -> str:
        """The widths of inputs and output."""
        widths = ["float" if s is None else f"{s.bits}b {s.mode.name}" for s in self.inputs]
        out = "float" if self.output is None else f"{self.output.bits}b {self.output.mode.name}"
        return f"inputs=[{', '.join(widths)}], output={out}" + (", dynamic" if self.dynamic
                                                                 else "")


class ParamLayerWrapper(QuantWrapper):
    """A conv / linear layer on quantized input, weight and bias (+ a fused ReLU)."""

    kind = "param"

    def __init__(self, wrapped: nn.Module, inputs: Sequence[TensorQuant | None],
                 output: TensorQuant | None, qparams: Mapping[str, QParams] | None,
                 weight: WeightQuant | None, bits_bias: int | None,
                 activation: nn.Module | None = None, bits_accum: int = 32) -> None:
        """Fake-quantizes `wrapped.weight` in place; `activation` runs before the output quant.

        `bits_bias` (up to 16) quantizes the bias on its own grid first, as quantization-aware
        training does; the bias then joins the accumulator (input scale * weight scale), which
        holds `bits_accum` signed bits: sums beyond it are clamped, as in Distiller.
        """
        super().__init__(wrapped, inputs, output, qparams)
        self.weight_quant = weight
        self.bits_bias = bits_bias
        self.bits_accum = bits_accum
        self.activation = activation
        if weight is not None:
            w = wrapped.weight
            scale, zero_point = weight_quant_params(w, weight.bits, weight.mode, weight.per_channel)
            self.register_buffer("weight_scale", scale.detach().float().clone())
            self.register_buffer("weight_zero_point", zero_point.detach().float().clone())
            with torch.no_grad():
                w.copy_(fake_quantize(w, self.weight_scale, self.weight_zero_point, weight.bits,
                                      weight.mode))

    def grid_bias(self, input_scale: Tensor | None) -> Tensor | None:
        """The bias as the integer layer adds it: on its own `bits_bias` grid (up to 16 bits),
        then on the accumulator's; as it is where the input or the weight stays float."""
        bias = self.wrapped.bias
        if bias is None:
            return None
        if self.bits_bias is not None and self.bits_bias <= MAX_BITS:
            mode = self.weight_quant.mode if self.weight_quant is not None else (
                LinearQuantMode.SYMMETRIC)
            scale, zero_point = weight_quant_params(bias, self.bits_bias, mode, False)
            bias = fake_quantize(bias, scale, zero_point, self.bits_bias, mode)
        if input_scale is None or self.weight_quant is None:
            return bias
        q, scale = quantize_bias(bias, input_scale, self.weight_scale, self.bits_accum)
        return (q.to(torch.float64) / scale.to(torch.float64)).to(bias.dtype)

    def forward(self, x: Tensor) -> Tensor:
        """activation(accumulator(layer(q(x); q(w), q(b)))), fake-quantized."""
        x, input_scale = self.quantize_input(0, x)
        bias = self.grid_bias(input_scale)
        if bias is not None and bias is not self.wrapped.bias:
            y = functional_call(self.wrapped, {"bias": bias}, (x,))
        else:
            y = self.wrapped(x)
        if self.bits_accum < MAX_ACCUM_BITS and input_scale is not None and (
                self.weight_quant is not None):
            y = _clamp_accumulator(y, bias_scale(input_scale, self.weight_scale),
                                   self.bits_accum)
        if self.activation is not None:
            y = self.activation(y)
        return self.quantize_output(y)

    def extra_repr(self) -> str:
        """Widths, including the weight's."""
        w = self.weight_quant
        text = "weight=float" if w is None else (
            f"weight={w.bits}b {w.mode.name}" + (" per-channel" if w.per_channel else ""))
        return f"{super().extra_repr()}, {text}"


def _clamp_accumulator(y: Tensor, scale: Tensor, bits_accum: int) -> Tensor:
    """y (in float) within the signed `bits_accum` range of the accumulator it was summed in."""
    low, high = accum_range(bits_accum)
    shape = [1] * y.dim()
    if scale.numel() > 1:
        shape[1] = -1  # one accumulator scale per output channel (dim 1 of conv/linear output)
    scale = scale.reshape(shape).to(y.dtype)
    return torch.clamp(y * scale, low, high) / scale


def input_padding(layer: nn.Module) -> tuple[int, ...] | None:
    """The zero padding a conv layer applies to its input before convolving, beyond its own
    `padding` (TF "same" padding, asymmetric at stride 2: efficientnet_pytorch's convolutions
    keep it as `static_padding`, an nn.ZeroPad2d); None when it has none."""
    pad = getattr(layer, "static_padding", None)
    if isinstance(pad, nn.ZeroPad2d) and any(pad.padding):
        return tuple(int(p) for p in pad.padding)
    return None


class EltwiseWrapper(QuantWrapper):
    """An element-wise add / mult / concat of quantized inputs, with a quantized output (an add
    followed by a ReLU has the ReLU fused: one quantization, after it, as int8's add_relu)."""

    kind = "eltwise"

    def __init__(self, wrapped: nn.Module, inputs: Sequence[TensorQuant | None],
                 output: TensorQuant | None, qparams: Mapping[str, QParams] | None,
                 activation: nn.Module | None = None) -> None:
        """`activation` runs before the output is quantized."""
        super().__init__(wrapped, inputs, output, qparams)
        self.activation = activation

    def forward(self, *inputs: Tensor) -> Tensor:
        """act(op(q(x0), q(x1), ...)), fake-quantized."""
        quantized = [self.quantize_input(i, x)[0] for i, x in enumerate(inputs)]
        out = self.wrapped(*quantized)
        if self.activation is not None:
            out = self.activation(out)
        return self.quantize_output(out)


class ActivationWrapper(QuantWrapper):
    """An activation (ReLU ...) whose output is quantized."""

    kind = "activation"

    def forward(self, x: Tensor, *args: Any) -> Tensor:
        """q(act(x))."""
        return self.quantize_output(self.wrapped(x, *args))
