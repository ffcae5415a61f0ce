"""Range-linear quantization as Distiller does it: modes, scale and zero point, (fake) quantize.

Distiller's convention is kept, so that its statistics, schedules and numbers carry over:

    q = clamp(round(scale * x - zero_point), qmin, qmax)        x ~= (q + zero_point) / scale

`scale` counts integer steps per unit of x (one step is 1 / scale, the reciprocal of torch.ao's
scale) and `zero_point` is subtracted (torch.ao's zero point is its negation): `torch_qparams`
converts. The integer range of each mode (`quantized_range`, 8 bits shown):

    SYMMETRIC             [-128, 127]  scale = 127.5 / max|x|            (2^b - 1) / 2 steps a side
    SYMMETRIC_RESTRICTED  [-127, 127]  scale = 127 / max|x|              2^(b-1) - 1 steps a side
    ASYMMETRIC_UNSIGNED   [0, 255]     scale = 255 / (max - min), zero_point = round(scale * min)
    ASYMMETRIC_SIGNED     [-128, 127]  as unsigned, zero_point shifted by +2^(b-1)

(asymmetric ranges are first widened to include 0). Bit widths are 2..16; "keep float" (Distiller's
`null` / 0 bits) is the quantizer's business, not this module's.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType
from typing import Any, NamedTuple

import torch
from torch import Tensor

from compressor.quantization.core.errors import QuantizationError, shown, unknown_choice
from compressor.utils.vocabulary import QUANT_MODE_NAMES

__all__ = [
    "MIN_BITS", "MAX_BITS", "MAX_ACCUM_BITS", "LinearQuantMode", "ModuleQuantMode",
    "parse_quant_mode", "parse_module_quant_mode", "check_bits", "check_accum_bits",
    "quantized_range", "quant_params", "range_qparams", "weight_quant_params", "quantize",
    "dequantize",
    "fake_quantize", "LinearQuantizeSTE", "ClampedLinearQuantizeSTE", "fake_quantize_ste",
    "float_range", "torch_qparams",
    "accum_range", "bias_scale", "quantize_bias",
    # the pieces of ClampedLinearQuantizeSTE, for training that saves integer codes for backward
    "code_dtype", "clip_bounds", "quantize_clamped_",
]

MIN_BITS, MAX_BITS = 2, 16
MAX_ACCUM_BITS = 32


class LinearQuantMode(Enum):
    """Distiller's range-linear quantization modes (same names and values)."""

    SYMMETRIC = 1
    SYMMETRIC_RESTRICTED = 2
    ASYMMETRIC_UNSIGNED = 3
    ASYMMETRIC_SIGNED = 4

    @property
    def symmetric(self) -> bool:
        """Whether the zero point is always 0."""
        return self in (LinearQuantMode.SYMMETRIC, LinearQuantMode.SYMMETRIC_RESTRICTED)

    @property
    def signed(self) -> bool:
        """Whether the integers are signed (all modes but ASYMMETRIC_UNSIGNED)."""
        return self is not LinearQuantMode.ASYMMETRIC_UNSIGNED

    @property
    def short_name(self) -> str:
        """The command line's name of the mode (`--qe-mode sym`)."""
        return next(k for k, v in SHORT_NAMES.items() if v is self)


# Distiller's command-line choices (--qe-mode / --qema / --qemw)
SHORT_NAMES: Mapping[str, LinearQuantMode] = MappingProxyType({
    short: LinearQuantMode[distiller] for short, distiller in QUANT_MODE_NAMES.items()})
_KINDS = ("activations", "weights")


class ModuleQuantMode(NamedTuple):
    """The modes of one module's activations and weights (Distiller's ModuleQuantMode)."""

    activations: LinearQuantMode
    weights: LinearQuantMode


def parse_quant_mode(value: LinearQuantMode | str, what: str = "quantization mode"
                     ) -> LinearQuantMode:
    """A mode from Distiller's name (any case) or the command line's short name."""
    if isinstance(value, LinearQuantMode):
        return value
    if isinstance(value, str):
        name = value.strip()
        if name.lower() in SHORT_NAMES:
            return SHORT_NAMES[name.lower()]
        if name.upper() in LinearQuantMode.__members__:
            return LinearQuantMode[name.upper()]
    raise unknown_choice(what, value, [*LinearQuantMode.__members__, *SHORT_NAMES])


def parse_module_quant_mode(value: Any) -> ModuleQuantMode:
    """One mode for both tensor kinds, or Distiller's `{activations: ..., weights: ...}`."""
    if isinstance(value, ModuleQuantMode):
        return value
    if isinstance(value, Mapping):
        for key in value:
            if key not in _KINDS:
                raise unknown_choice("key of the quantization mode", key, _KINDS)
        for key in _KINDS:
            if key not in value:
                raise QuantizationError(
                    f"the quantization mode mapping lacks '{key}'; give both "
                    "{activations: MODE, weights: MODE} or a single MODE for both")
        return ModuleQuantMode(parse_quant_mode(value["activations"], "activations mode"),
                               parse_quant_mode(value["weights"], "weights mode"))
    mode = parse_quant_mode(value)
    return ModuleQuantMode(mode, mode)


def check_bits(num_bits: Any, what: str = "num_bits", low: int = MIN_BITS,
               high: int = MAX_BITS) -> int:
    """`num_bits` as an int in low..high, else a one-line QuantizationError naming `what`."""
    if isinstance(num_bits, bool) or not isinstance(num_bits, numbers.Integral):
        raise QuantizationError(f"{what} must be a whole number of bits, got {shown(num_bits)}; "
                                f"use an integer from {low} to {high}")
    if not low <= int(num_bits) <= high:
        raise QuantizationError(f"{what}={int(num_bits)} is out of range; "
                                f"use {low}..{high} bits")
    return int(num_bits)


def check_accum_bits(bits_accum: Any) -> int:
    """The accumulator width (Distiller's `bits_accum`, default 32) as an int in 2..32."""
    return check_bits(bits_accum, "bits_accum", MIN_BITS, MAX_ACCUM_BITS)


def quantized_range(num_bits: int, mode: LinearQuantMode | str) -> tuple[int, int]:
    """The (qmin, qmax) integers of `mode` at `num_bits` (Distiller's get_quantized_range)."""
    bits, mode = check_bits(num_bits), parse_quant_mode(mode)
    if not mode.signed:
        return 0, 2 ** bits - 1
    qmax = 2 ** (bits - 1) - 1
    return (-qmax if mode is LinearQuantMode.SYMMETRIC_RESTRICTED else -qmax - 1), qmax


def _float_tensor(value: Any, name: str) -> Tensor:
    """A detached floating tensor of a range end (float32 for Python numbers, as Distiller)."""
    if isinstance(value, Tensor):
        tensor = value.detach()
        if not tensor.is_floating_point():
            tensor = tensor.to(torch.float32)
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        tensor = torch.tensor(float(value), dtype=torch.float32)
    else:
        raise QuantizationError(f"the range {name} must be a number, got {shown(value)}; "
                                "give numeric min/max values")
    if not bool(torch.isfinite(tensor).all()):
        raise QuantizationError(f"the range {name} is not finite ({shown(value)}); collect the "
                                "statistics again or give finite clipping values")
    return tensor


def quant_params(min_val: float | Tensor, max_val: float | Tensor, num_bits: int,
                 mode: LinearQuantMode | str) -> tuple[Tensor, Tensor]:
    """(scale, zero_point) that map [min_val, max_val] onto the integers of `mode`.

    As Distiller's symmetric/asymmetric_linear_quantization_params: symmetric modes use
    max(|min|, |max|) and a zero point of 0; asymmetric ones widen the range to include 0 and
    round the zero point; an all-zero range gives scale 1. Tensors of shape (C,) give per-channel
    parameters of shape (C,); Python numbers give 0-dim float32 tensors.
    """
    bits, mode = check_bits(num_bits), parse_quant_mode(mode)
    low, high = _float_tensor(min_val, "min"), _float_tensor(max_val, "max")
    dtype = torch.promote_types(low.dtype, high.dtype)
    low, high = torch.broadcast_tensors(low.to(dtype), high.to(device=low.device, dtype=dtype))
    if bool((low > high).any()):
        raise QuantizationError(f"the range min {shown(min_val)} is greater than its max "
                                f"{shown(max_val)}; give min <= max")
    return range_qparams(low, high, bits, mode)


def range_qparams(low: Tensor, high: Tensor, num_bits: int, mode: LinearQuantMode
                  ) -> tuple[Tensor, Tensor]:
    """`quant_params` without its checks, and so without a host sync (ranges computed in a
    forward pass, e.g. QAT's tracked ones); an all-zero range gives scale 1."""
    if mode.symmetric:
        steps = (2 ** (num_bits - 1) - 1 if mode is LinearQuantMode.SYMMETRIC_RESTRICTED
                 else (2 ** num_bits - 1) / 2)
        saturation = torch.maximum(low.abs(), high.abs())
        saturation = torch.where(saturation == 0, torch.full_like(saturation, steps), saturation)
        scale = steps / saturation
        return scale, torch.zeros_like(scale)
    steps = 2 ** num_bits - 1
    low, high = low.clamp(max=0), high.clamp(min=0)
    width = high - low
    width = torch.where(width == 0, torch.full_like(width, steps), width)
    scale = steps / width
    zero_point = torch.round(scale * low)
    if mode is LinearQuantMode.ASYMMETRIC_SIGNED:
        zero_point = zero_point + 2 ** (num_bits - 1)
    return scale, zero_point


def weight_quant_params(weight: Tensor, num_bits: int, mode: LinearQuantMode | str,
                        per_channel: bool = False) -> tuple[Tensor, Tensor]:
    """(scale, zero_point) from a weight's own min/max, per output channel (dim 0) if asked.

    Per-channel parameters have shape (C, 1, ...) so that they broadcast against the weight.
    """
    if weight.numel() == 0:
        raise QuantizationError("cannot quantize an empty weight tensor; leave it in float")
    flat = weight.detach()
    if not per_channel:
        return quant_params(flat.min(), flat.max(), num_bits, mode)
    if weight.dim() < 2:
        raise QuantizationError(
            f"per-channel quantization needs a weight with output channels along dim 0, got shape "
            f"{tuple(weight.shape)}; quantize this tensor per tensor")
    flat = flat.reshape(weight.shape[0], -1)
    scale, zero_point = quant_params(flat.min(dim=1).values, flat.max(dim=1).values,
                                     num_bits, mode)
    shape = (-1,) + (1,) * (weight.dim() - 1)
    return scale.reshape(shape), zero_point.reshape(shape)


def quantize(x: Tensor, scale: Tensor | float, zero_point: Tensor | float, num_bits: int,
             mode: LinearQuantMode | str) -> Tensor:
    """The integers of `x`, in x's float dtype: clamp(round(scale * x - zero_point), qmin, qmax)."""
    qmin, qmax = quantized_range(num_bits, mode)
    # one temporary of the broadcast shape, worked on in place (a large weight is one pass each)
    return torch.mul(x, scale).sub_(zero_point).round_().clamp_(qmin, qmax)


def dequantize(q: Tensor, scale: Tensor | float, zero_point: Tensor | float) -> Tensor:
    """The float values of integers `q`: (q + zero_point) / scale."""
    return torch.add(q, zero_point).div_(scale)


def fake_quantize(x: Tensor, scale: Tensor | float, zero_point: Tensor | float, num_bits: int,
                  mode: LinearQuantMode | str) -> Tensor:
    """Quantize then dequantize in float: `x` on the grid (|error| <= 0.5 / scale inside it)."""
    return quantize(x, scale, zero_point, num_bits, mode).add_(zero_point).div_(scale)


class LinearQuantizeSTE(torch.autograd.Function):
    """Quantize (and optionally dequantize) with a straight-through gradient (Distiller's STE).

    `apply(x, scale, zero_point, qmin, qmax, dequantize)`. The gradient w.r.t. x is the incoming
    gradient unchanged, as Distiller's LinearQuantizeSTE; scale and zero point get none. Unlike
    Distiller the integers are clamped to [qmin, qmax] (Distiller lets SYMMETRIC reach +2^(b-1) at
    the top of the range), so that the simulated model matches a real integer one.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, scale: Tensor | float, zero_point: Tensor | float,
                qmin: int, qmax: int, dequantize: bool) -> Tensor:
        """The (de)quantized x."""
        q = torch.clamp(torch.round(scale * x - zero_point), qmin, qmax)
        return (q + zero_point) / scale if dequantize else q

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        """Straight through: d(out)/dx taken as 1."""
        return grad_output, None, None, None, None, None


class ClampedLinearQuantizeSTE(torch.autograd.Function):
    """Clamp to a range, then quantize and dequantize: one autograd node for the two steps.

    `apply(x, low, high, scale, zero_point, qmin, qmax)`, the range as Python floats (on the CPU,
    where reading it costs nothing and float bounds take the fast kernels) or as tensors. The
    gradient w.r.t. x is the incoming one where low <= x <= high (at the bounds too: Distiller
    clamps with Python numbers, which pass it whole there) and 0 outside; the range and the
    parameters get none.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, low: Tensor | float, high: Tensor | float,
                scale: Tensor | float, zero_point: Tensor | float, qmin: int, qmax: int
                ) -> Tensor:
        """The clamped x on the grid, in float."""
        if isinstance(low, Tensor):
            ctx.save_for_backward(x, low, high)  # the mask is made in backward, if one runs
        else:
            ctx.save_for_backward(x)
            ctx.bounds = (low, high)
        q = torch.clamp(torch.round(scale * torch.clamp(x, low, high) - zero_point), qmin, qmax)
        return (q + zero_point) / scale

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        """The gradient inside the range, 0 outside it."""
        saved = ctx.saved_tensors  # once: activation checkpointing unpacks each tensor once
        if len(saved) == 3:
            x, low, high = saved
            grad = torch.where((x >= low) & (x <= high), grad_output, 0.0)
        else:
            (x,) = saved
            # hardtanh's backward passes the gradient strictly inside its bounds: bounds one
            # step of x's dtype outside the range pass it at the range's ends too
            low, high = (torch.nextafter(torch.tensor(bound, dtype=x.dtype),
                                         torch.tensor(toward, dtype=x.dtype)).item()
                         for bound, toward in zip(ctx.bounds, (-math.inf, math.inf),
                                                  strict=True))
            grad = torch.ops.aten.hardtanh_backward(grad_output, x, low, high)
        return grad, None, None, None, None, None, None


def _host_bounds(x: Tensor, clip_range: tuple[Tensor | float, Tensor | float]
                 ) -> tuple[Tensor | float, Tensor | float]:
    """The clip range as x's dtype's values: Python floats for a plain CPU tensor and a range
    of two numbers, else tensors on x's device (per-channel ranges; no host sync)."""
    on_host = type(x) is Tensor and x.device.type == "cpu" and all(
        (type(v) is Tensor and v.numel() == 1) or isinstance(v, (int, float))
        for v in clip_range)
    low, high = (torch.as_tensor(v, dtype=x.dtype, device=x.device) for v in clip_range)
    return (low.item(), high.item()) if on_host else (low, high)


def clip_bounds(x: Tensor, clip_range: tuple[Tensor | float, Tensor | float]
                ) -> tuple[Tensor | float, Tensor | float]:
    """The clip range as `fake_quantize_ste` applies it to `x` (Python floats for a plain CPU
    tensor and a range of two numbers, else tensors on x's device)."""
    return _host_bounds(x, clip_range)


def quantize_clamped_(clamped: Tensor, scale: Tensor | float, zero_point: Tensor | float,
                      qmin: int, qmax: int) -> Tensor:
    """The integers ClampedLinearQuantizeSTE makes of x, from `clamp(x, low, high)` and in its
    place, in x's float dtype: the same operations, so `(q + zero_point) / scale` is bitwise
    the STE's output."""
    return clamped.mul_(scale).sub_(zero_point).round_().clamp_(qmin, qmax)


def code_dtype(qmin: int, qmax: int) -> torch.dtype:
    """The smallest integer dtype that holds qmin..qmax (uint8, int8, int16 or int32)."""
    for dtype in (torch.uint8, torch.int8, torch.int16):
        info = torch.iinfo(dtype)
        if info.min <= qmin and qmax <= info.max:
            return dtype
    return torch.int32


def fake_quantize_ste(x: Tensor, scale: Tensor | float, zero_point: Tensor | float,
                      num_bits: int, mode: LinearQuantMode | str,
                      clip_range: tuple[Tensor | float, Tensor | float] | None = None) -> Tensor:
    """Fake-quantize `x` for training: gradient 1 inside `clip_range`, 0 outside it.

    As Distiller's quantization-aware training: activations are first clamped to their tracked
    range (`clip_range`: the gradient passes at and inside the bounds, zero outside) and then go
    through the STE; weights are quantized from their own range, `clip_range=None`.
    """
    qmin, qmax = quantized_range(num_bits, mode)
    if clip_range is None:
        return LinearQuantizeSTE.apply(x, scale, zero_point, qmin, qmax, True)
    low, high = _host_bounds(x, clip_range)
    return ClampedLinearQuantizeSTE.apply(x, low, high, scale, zero_point, qmin, qmax)


def float_range(scale: Tensor | float, zero_point: Tensor | float, num_bits: int,
                mode: LinearQuantMode | str) -> tuple[Tensor, Tensor]:
    """The float values of qmin and qmax: the range the parameters can represent."""
    qmin, qmax = quantized_range(num_bits, mode)
    scale_t = torch.as_tensor(scale)
    ends = torch.tensor([qmin, qmax], dtype=scale_t.dtype if scale_t.is_floating_point()
                        else torch.float32, device=scale_t.device)
    low, high = dequantize(ends, scale_t.unsqueeze(-1), torch.as_tensor(zero_point).unsqueeze(-1)
                           ).unbind(-1)
    return low, high


def torch_qparams(scale: Tensor | float, zero_point: Tensor | float) -> tuple[Tensor, Tensor]:
    """torch.ao's (scale, zero_point) of Distiller's: (1 / scale, -zero_point as int64)."""
    scale_t = torch.as_tensor(scale)
    return 1.0 / scale_t, (-torch.as_tensor(zero_point)).round().to(torch.int64)


def accum_range(bits_accum: int = 32) -> tuple[int, int]:
    """The signed integer range of the accumulator (always signed, never restricted)."""
    bits = check_accum_bits(bits_accum)
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def bias_scale(input_scale: Tensor | float, weight_scale: Tensor | float) -> Tensor:
    """The accumulator's scale, input_scale * weight_scale: flat (C,) per channel, else 0-dim."""
    scale = torch.as_tensor(input_scale) * torch.as_tensor(weight_scale)
    return scale.reshape(-1) if scale.numel() > 1 else scale.reshape(())


def quantize_bias(bias: Tensor, input_scale: Tensor | float, weight_scale: Tensor | float,
                  bits_accum: int = 32) -> tuple[Tensor, Tensor]:
    """(int32 bias, its scale): the bias on the accumulator's grid, as Distiller.

    Distiller adds the bias into the integer accumulator, so it is quantized with the
    accumulator's scale (input_scale * weight_scale), zero point 0, clamped to `bits_accum`
    signed bits. Rounding is done in float64 so that 32-bit ends are exact.
    """
    scale = bias_scale(input_scale, weight_scale)
    if scale.numel() > 1 and scale.numel() != bias.numel():
        raise QuantizationError(
            f"the bias has {bias.numel()} values but the weight has {scale.numel()} channel "
            "scales; quantize the weight per output channel of this layer")
    qmin, qmax = accum_range(bits_accum)
    scaled = bias.detach().to(torch.float64) * scale.to(torch.float64)
    q = torch.clamp(torch.round(scaled), qmin, qmax)
    return q.to(torch.int32), scale
