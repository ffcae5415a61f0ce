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

from compressor.quantization.clipping import ClipMode, tensor_range
from compressor.quantization.range_linear import (
    LinearQuantMode,
    fake_quantize,
    quant_params,
    quantize_bias,
    weight_quant_params,
)

__all__ = ["TensorQuant", "WeightQuant", "QuantWrapper", "ParamLayerWrapper", "EltwiseWrapper",
           "ActivationWrapper"]

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
                 activation: nn.Module | None = None) -> None:
        """Fake-quantizes `wrapped.weight` in place; `activation` runs before the output quant."""
        super().__init__(wrapped, inputs, output, qparams)
        self.weight_quant = weight
        self.bits_bias = bits_bias
        self.activation = activation
        if weight is not None:
            w = wrapped.weight
            scale, zero_point = weight_quant_params(w, weight.bits, weight.mode, weight.per_channel)
            self.register_buffer("weight_scale", scale.detach().float().clone())
            self.register_buffer("weight_zero_point", zero_point.detach().float().clone())
            with torch.no_grad():
                w.copy_(fake_quantize(w, self.weight_scale, self.weight_zero_point, weight.bits,
                                      weight.mode))

    def forward(self, x: Tensor) -> Tensor:
        """activation(layer(q(x); q(w), q(b))), fake-quantized."""
        x, input_scale = self.quantize_input(0, x)
        bias = self.wrapped.bias
        if (bias is not None and self.bits_bias is not None and input_scale is not None
                and self.weight_quant is not None):
            q, scale = quantize_bias(bias, input_scale, self.weight_scale, self.bits_bias)
            bias = (q.to(torch.float64) / scale.to(torch.float64)).to(bias.dtype)
            y = functional_call(self.wrapped, {"bias": bias}, (x,))
        else:
            y = self.wrapped(x)
        if self.activation is not None:
            y = self.activation(y)
        return self.quantize_output(y)

    def extra_repr(self) -> str:
        """Widths, including the weight's."""
        w = self.weight_quant
        text = "weight=float" if w is None else (
            f"weight={w.bits}b {w.mode.name}" + (" per-channel" if w.per_channel else ""))
        return f"{super().extra_repr()}, {text}"


class EltwiseWrapper(QuantWrapper):
    """An element-wise add / mult / concat of quantized inputs, with a quantized output."""

    kind = "eltwise"

    def forward(self, *inputs: Tensor) -> Tensor:
        """op(q(x0), q(x1), ...), fake-quantized."""
        quantized = [self.quantize_input(i, x)[0] for i, x in enumerate(inputs)]
        return self.quantize_output(self.wrapped(*quantized))


class ActivationWrapper(QuantWrapper):
    """An activation (ReLU ...) whose output is quantized."""

    kind = "activation"

    def forward(self, x: Tensor, *args: Any) -> Tensor:
        """q(act(x))."""
        return self.quantize_output(self.wrapped(x, *args))
