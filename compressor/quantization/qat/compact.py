"""What quantization-aware training keeps for backward, in compact form, with the same gradients.

A fake-quantized activation is `(q + zero_point) / scale` for integers q: instead of the float
tensor, backward gets q in the smallest integer dtype (uint8 for 8-bit asymmetric codes) and
rebuilds the float values with the very same operations, so they are bitwise those of the
forward. The straight-through estimators' clamps and the fused ReLUs pass the gradient where
a mask holds; the masks are kept as bits. So:

* `masked_quantize`: (activation, then) fake quantization, saving one bit per element (two
  for PACT, whose learned clipping value gets the gradient where values were clipped). Its
  output carries its codes (`codes_of`), valid while the tensor is not modified in place.
* `layer_on_codes`: a conv / linear layer whose input carries codes saves the codes, not the
  input (a conv's backward is torch's own convolution_backward on the rebuilt input; other
  layers run their forward again on it in backward).
* `fold_divide`: the folded batch norm's division saves its output, which the batch norm
  saves anyway, instead of its input.

Each backward computes what torch's own formulas compute (ConvolutionBackward0,
DivBackward0, WhereBackward0, ReluBackward0, HardtanhBackward0), on bitwise equal tensors.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["GridCodes", "GridParts", "codes_of", "pack_mask", "unpack_mask", "fusable_activation",
           "masked_quantize", "layer_on_codes", "fold_divide", "in_recomputation"]

_CODES_ATTR = "_qat_grid_codes"  # the attribute of a fake-quantized tensor holding its codes


class GridCodes(NamedTuple):
    """The integers a fake-quantized tensor is made of, and how to make it of them again."""

    codes: Tensor  # integer dtype
    zero_point: Tensor | float
    scale: Tensor | float
    version: int  # the tensor's version counter when it was made: in-place changes void it

    def values(self, dtype: torch.dtype) -> Tensor:
        """The float tensor, bitwise as fake quantization made it: (q + zero_point) / scale."""
        return _dequantize(self.codes, self.zero_point, self.scale, dtype)


class GridParts(NamedTuple):
    """One fake quantization computed in full: its output, codes, and where it passes the
    gradient: where low <= input <= high (a clamp's straight-through estimator)."""

    out: Tensor
    codes: Tensor  # the integers of `out`, in the smallest integer dtype
    zero_point: Tensor | float
    scale: Tensor | float
    low: Tensor | float  # Python floats where the input's dtype holds them (on the CPU)
    high: Tensor | float
    to_alpha: Tensor | None = None  # bool: where it reaches a learned clipping value instead


def _dequantize(codes: Tensor, zero_point: Tensor | float, scale: Tensor | float,
                dtype: torch.dtype) -> Tensor:
    """(q + zero_point) / scale in `dtype`, as fake quantization computes it (in place on one
    temporary: the same operations, so bitwise the same values)."""
    return codes.to(dtype).add_(zero_point).div_(scale)


def codes_of(x: Any) -> GridCodes | None:
    """The codes `x` was fake-quantized from, if it still holds exactly those values."""
    codes = getattr(x, _CODES_ATTR, None) if type(x) is Tensor else None
    return codes if codes is not None and codes.version == x._version else None


def in_recomputation() -> bool:
    """Whether a forward runs inside a backward pass: activation checkpointing recomputing it."""
    return torch._C._current_graph_task_id() != -1


def pack_mask(mask: Tensor) -> Tensor:
    """A 0 / 1 (or bool) tensor as bits, eight to a uint8, in its flattened order."""
    flat = mask.reshape(-1)
    if flat.dtype != torch.float32:
        flat = flat.to(torch.float32)
    pad = -flat.numel() % 8
    if pad:
        flat = torch.cat((flat, flat.new_zeros(pad)))
    # each group of eight as the sum of its bits times 1, 2, 4 ... 128 (exact in float)
    weights = 2.0 ** torch.arange(8, dtype=torch.float32, device=mask.device)
    return torch.mv(flat.view(-1, 8), weights).to(torch.uint8)


def unpack_mask(packed: Tensor, shape: torch.Size, dtype: torch.dtype) -> Tensor:
    """The mask of `shape` that `pack_mask` packed, as 0 / 1 values of `dtype`."""
    table = (torch.arange(256, device=packed.device).unsqueeze(1)
             >> torch.arange(8, device=packed.device)).bitwise_and_(1).to(dtype)
    return table.index_select(0, packed.int()).view(-1)[:shape.numel()].view(shape)


def fusable_activation(activation: nn.Module | None) -> bool:
    """Whether `masked_quantize` fuses it: none, or one whose backward is a mask."""
    return activation is None or type(activation) in (nn.ReLU, nn.ReLU6, nn.Hardtanh)


def _activation(activation: nn.Module | None, y: Tensor) -> tuple[Tensor, float, float]:
    """(activation(y), low, high): its backward passes the gradient where low < y < high."""
    if activation is None:
        return y, -math.inf, math.inf
    if type(activation) is nn.ReLU:  # threshold_backward(grad, result, 0): result > 0
        return torch.relu(y), 0.0, math.inf
    # hardtanh_backward(grad, self, min, max): min < self < max
    low, high = activation.min_val, activation.max_val
    return F.hardtanh(y, low, high), float(low), float(high)


def _pass_mask(y: Tensor, low: Tensor | float, high: Tensor | float, open_low: float,
               open_high: float) -> Tensor:
    """1 where low <= y <= high and open_low < y < open_high, else 0, in y's dtype.

    With host bounds one hardtanh_backward pass computes it (it passes strictly inside its
    bounds: the closed ones are given one step of y's dtype outside); torch's comparisons and
    their and are several times slower on the CPU."""
    if isinstance(low, float) and isinstance(high, float):
        outside = torch.nextafter(torch.tensor([low, high], dtype=y.dtype),
                                  torch.tensor([-math.inf, math.inf], dtype=y.dtype)).tolist()
        ones = torch.ones((), dtype=y.dtype, device=y.device).expand(y.shape)
        return torch.ops.aten.hardtanh_backward(ones, y, max(outside[0], open_low),
                                                min(outside[1], open_high))
    mask = (y >= low).logical_and_(y <= high)
    if open_low > -math.inf:
        mask.logical_and_(y > open_low)
    if open_high < math.inf:
        mask.logical_and_(y < open_high)
    return mask.to(y.dtype)


def _memory_order(tensor: Tensor) -> tuple[int, ...]:
    """The tensor's dimensions from the largest stride to the smallest (ties in their order):
    `tensor.permute(order)` is a contiguous view of a dense tensor, channels-last included."""
    return tuple(sorted(range(tensor.dim()), key=lambda dim: -tensor.stride(dim)))


def _masked_grad(grad: Tensor, packed: Tensor, shape: torch.Size, order: tuple[int, ...],
                 grad_first: bool = False) -> Tensor:
    """The gradient where the packed mask holds, 0 elsewhere, bitwise and in the memory layout
    that the float path's last backward op gives it.

    The mask was packed in y's memory order (`order`) and comes back as a view in y's layout.
    An element-wise op lays its result out as its first operand that decides it: threshold_
    backward (ReLU's, and the select of WhereBackward0 on a mask) puts the mask first,
    hardtanh_backward (the clamp's straight-through estimator with host bounds, ReLU6's) the
    gradient. The layout sets the summation order of every reduction downstream (a batch
    norm's backward, a bias gradient), so it is what keeps those bitwise the float path's.
    """
    stored = unpack_mask(packed, torch.Size(shape[dim] for dim in order), grad.dtype)
    mask = stored.permute(sorted(range(len(order)), key=order.__getitem__))
    if grad_first:  # passes strictly between 0.5 and 1.5: where the mask is 1
        return torch.ops.aten.hardtanh_backward(grad, mask, 0.5, 1.5)
    return torch.ops.aten.threshold_backward(grad, mask, 0.5)


class _MaskedQuantize(torch.autograd.Function):
    """y -> fake-quantized activation(y); gradient to y where the activation and the clamp
    passed it, to alpha (PACT's clipping value) summed where values were clipped to it."""

    @staticmethod
    def forward(ctx: Any, y: Tensor, alpha: Tensor | None, activation: nn.Module | None,
                parts_of: Callable[[Tensor], GridParts]) -> tuple[Tensor, Tensor]:
        """The fake-quantized output and its codes."""
        value, open_low, open_high = _activation(activation, y)
        parts = parts_of(value)
        ctx.shape, ctx.order = y.shape, _memory_order(y)
        # the float path's last op on the gradient: ReLU's threshold_backward (the mask first),
        # or, with host bounds, the estimator's (or ReLU6's) hardtanh_backward (the gradient)
        ctx.grad_first = (isinstance(parts.low, float) and isinstance(parts.high, float)
                          and type(activation) is not nn.ReLU)
        ctx.alpha_shape = alpha.shape if alpha is not None else None
        needs_y, needs_alpha = ctx.needs_input_grad[:2]
        passes = None
        if needs_y:  # where the activation passes, value = y: the clamp's range is y's
            passes = pack_mask(_pass_mask(y, parts.low, parts.high, open_low,
                                          open_high).permute(ctx.order))
        ctx.save_for_backward(passes, pack_mask(parts.to_alpha.permute(ctx.order))
                              if needs_alpha and parts.to_alpha is not None else None)
        ctx.mark_non_differentiable(parts.codes)
        return parts.out, parts.codes

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor, _: Tensor | None) -> tuple[Tensor | None, ...]:
        """The masked gradients."""
        passes, to_alpha = ctx.saved_tensors
        grad_y = (_masked_grad(grad, passes, ctx.shape, ctx.order, ctx.grad_first)
                  if passes is not None else None)
        grad_alpha = None
        if to_alpha is not None:
            grad_alpha = _masked_grad(grad, to_alpha, ctx.shape, ctx.order).sum_to_size(
                ctx.alpha_shape)
        return grad_y, grad_alpha, None, None


def masked_quantize(y: Tensor, parts_of: Callable[[Tensor], GridParts],
                    activation: nn.Module | None = None, alpha: Tensor | None = None) -> Tensor:
    """`parts_of(activation(y)).out` with masked straight-through gradients; the result
    carries its codes (`codes_of`).

    `activation` is None or a `fusable_activation`; `parts_of` computes the whole fake
    quantization bitwise as the quantizer's own forward, without autograd (it may update
    range trackers); `alpha` is the learned clipping value that `GridParts.to_alpha` is about.
    """
    grids: list[tuple[Tensor | float, Tensor | float]] = []

    def computed(tensor: Tensor) -> GridParts:
        parts = parts_of(tensor)
        grids.append((parts.zero_point, parts.scale))
        return parts

    out, codes = _MaskedQuantize.apply(y, alpha, activation, computed)
    setattr(out, _CODES_ATTR, GridCodes(codes, *grids[0], out._version))
    return out


class _LayerOnCodes(torch.autograd.Function):
    """A layer whose input is rebuilt from its integer codes in backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, codes: GridCodes,
                layer: nn.Module) -> Tensor:
        """layer(x) with the given weight and bias."""
        ctx.save_for_backward(codes.codes, weight, bias)
        ctx.grid, ctx.dtype, ctx.layer = (codes.zero_point, codes.scale), x.dtype, layer
        return _layer_forward(layer, x, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        """The layer's own backward on the rebuilt input."""
        codes, weight, bias = ctx.saved_tensors
        x = _dequantize(codes, *ctx.grid, ctx.dtype)
        needs = ctx.needs_input_grad[:3]
        return (*_layer_backward(ctx.layer, grad, x, weight, bias, needs), None, None)


def _layer_forward(layer: nn.Module, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """The conv / linear layer's forward with `weight` and `bias` in place of its own."""
    if isinstance(layer, nn.Linear):
        return F.linear(x, weight, bias)
    return layer._conv_forward(x, weight, bias)


def _direct_conv(layer: nn.Module) -> bool:
    """Whether torch's convolution_backward computes the conv's backward by itself (zero
    padding given as numbers: the conv is one aten.convolution of the input)."""
    return (isinstance(layer, (nn.Conv1d, nn.Conv2d, nn.Conv3d))
            and layer.padding_mode == "zeros" and not isinstance(layer.padding, str))


def _layer_backward(layer: nn.Module, grad: Tensor, x: Tensor, weight: Tensor,
                    bias: Tensor | None, needs: tuple[bool, ...]) -> tuple[Tensor | None, ...]:
    """Gradients w.r.t. x, weight and bias, as autograd's node of the layer's forward computes
    them (convolution_backward, or the forward run again under autograd)."""
    if _direct_conv(layer):
        dims = weight.dim() - 2
        mask = [needs[0], needs[1], needs[2] and bias is not None]
        grads = torch.ops.aten.convolution_backward(
            grad, x, weight, list(bias.shape) if bias is not None else None, list(layer.stride),
            list(layer.padding), list(layer.dilation), False, [0] * dims, layer.groups, mask)
        return tuple(g if wanted else None for g, wanted in zip(grads, mask, strict=True))
    leaves = [t.detach().requires_grad_(bool(n)) if t is not None else None
              for t, n in zip((x, weight, bias), needs, strict=True)]
    with torch.enable_grad():
        out = _layer_forward(layer, *leaves)
    wanted = [t for t in leaves if t is not None and t.requires_grad]
    grads = iter(torch.autograd.grad(out, wanted, grad) if wanted else ())
    return tuple(next(grads) if t is not None and t.requires_grad else None for t in leaves)


def layer_on_codes(layer: nn.Module, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """layer(x) with `weight` and `bias`; backward keeps x's codes instead of x where it has
    them (see `codes_of`), else autograd keeps x as usual."""
    codes = codes_of(x)
    if codes is None:
        return _layer_forward(layer, x, weight, bias)
    return _LayerOnCodes.apply(x, weight, bias, codes, layer)


class _FoldDivide(torch.autograd.Function):
    """out / factor, keeping the quotient (DivBackward0 keeps out: the same gradients)."""

    @staticmethod
    def forward(ctx: Any, out: Tensor, factor: Tensor) -> Tensor:
        """The quotient."""
        quotient = out / factor
        ctx.save_for_backward(quotient, factor)
        return quotient

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """div_tensor_self_backward and div_tensor_other_backward, reduced as autograd does."""
        quotient, factor = ctx.saved_tensors
        grad_out = grad / factor if ctx.needs_input_grad[0] else None
        grad_factor = None
        if ctx.needs_input_grad[1]:  # -grad * ((out / factor) / factor)
            grad_factor = (-grad * (quotient / factor)).sum_to_size(factor.shape)
        return grad_out, grad_factor


def fold_divide(out: Tensor, factor: Tensor) -> Tensor:
    """out / factor (the fold divided back out), its quotient kept for backward."""
    return _FoldDivide.apply(out, factor)
