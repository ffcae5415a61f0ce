"""Memory-light max-pooling: window positions instead of int64 indices, and pool + conv fused.

torch's max-pool keeps its argmax as an int64 index into the input plane: 8 bytes per output,
twice a float32 output. Here it is kept as the position within the pooling window, in the
smallest integer dtype that holds kernel_h * kernel_w positions (uint8 up to 16x16), packed
further when a position needs 4 bits or fewer (2x2: four positions to a byte), and turned
back into torch's indices in backward, so that torch's own backward kernel runs on the very
same indices (the same gradients, bitwise).

A convolution right after the pool saves the pooled map for its weight gradient. Fused, the
pair saves the pool's input (which the layer before it saves anyway: in-place ABN's output)
and the window positions; backward gathers the pooled map back and runs the convolution's
own backward kernel on it. `run_light_sequential` applies both to an nn.Sequential.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
from torch.nn.modules import module as module_hooks
from torch.nn.modules.utils import _pair

__all__ = ["PoolGeometry", "WindowMaxPool", "MaxPoolConv", "window_positions",
           "plane_indices", "position_dtype", "pack_positions", "unpack_positions",
           "run_light_sequential"]


@dataclass(frozen=True)
class PoolGeometry:
    """A 2-d max-pool's kernel, stride, padding, dilation (pairs) and ceil mode."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    ceil_mode: bool

    @classmethod
    def of(cls, pool: nn.MaxPool2d) -> PoolGeometry:
        """The geometry of an nn.MaxPool2d (its stride defaults to its kernel)."""
        return cls(_pair(pool.kernel_size), _pair(pool.stride or pool.kernel_size),
                   _pair(pool.padding), _pair(pool.dilation), bool(pool.ceil_mode))

    def args(self) -> tuple[Any, ...]:
        """kernel, stride, padding, dilation, ceil_mode: the aten max-pool arguments."""
        return self.kernel, self.stride, self.padding, self.dilation, self.ceil_mode


def position_dtype(positions: int) -> torch.dtype:
    """The smallest integer dtype that holds 0 .. positions - 1."""
    for dtype in (torch.uint8, torch.int16, torch.int32):
        if positions - 1 <= torch.iinfo(dtype).max:
            return dtype
    return torch.int64


def _window_origins(shape: torch.Size, geometry: PoolGeometry,
                    device: torch.device) -> tuple[Tensor, Tensor]:
    """Input row (as a column) and column (as a row) of each output's window's first tap."""
    rows = torch.arange(shape[-2], device=device) * geometry.stride[0] - geometry.padding[0]
    cols = torch.arange(shape[-1], device=device) * geometry.stride[1] - geometry.padding[1]
    return rows.view(-1, 1), cols


def _floor_div(tensor: Tensor, divisor: int) -> Tensor:
    """tensor // divisor for tensor >= 0; a shift when divisor is a power of two (4x faster)."""
    if divisor & (divisor - 1) == 0:
        return tensor >> (divisor.bit_length() - 1)
    return torch.div(tensor, divisor, rounding_mode="floor")


def window_positions(indices: Tensor, width: int, geometry: PoolGeometry) -> Tensor:
    """torch's max-pool indices (into the input plane) as row-major positions in the window."""
    top, left = _window_origins(indices.shape, geometry, indices.device)
    kernel_h, kernel_w = geometry.kernel
    dtype = position_dtype(kernel_h * kernel_w)
    rows = _floor_div(indices, width)
    if geometry.dilation == (1, 1):
        # position = (row - top) * kernel_w + (col - left), col = index - row * width
        rows.mul_(kernel_w - width).add_(indices).sub_(top * kernel_w + left)
        return rows.to(dtype)
    cols = indices - rows * width
    # The argmax lies on the window's dilated grid, so these divisions are exact.
    rows.sub_(top).div_(geometry.dilation[0], rounding_mode="floor")
    cols.sub_(left).div_(geometry.dilation[1], rounding_mode="floor")
    return rows.mul_(kernel_w).add_(cols).to(dtype)


def plane_indices(positions: Tensor, width: int, geometry: PoolGeometry) -> Tensor:
    """Window positions back as torch's int64 indices into the input plane."""
    top, left = _window_origins(positions.shape, geometry, positions.device)
    kernel_w = geometry.kernel[1]
    dilation_h, dilation_w = geometry.dilation
    rows = _floor_div(positions, kernel_w).long()  # divided in the small dtype
    # index = (top + row * dilation_h) * width + left + col * dilation_w, col = pos - row * kw
    indices = positions.long()
    if dilation_w != 1:
        indices.sub_(rows * kernel_w).mul_(dilation_w).add_(rows * kernel_w)
    rows.mul_(dilation_h * width - kernel_w)
    return indices.add_(rows).add_(top * width + left)


def _bits_per_position(count: int) -> int:
    """Bits of a packed position: 1, 2 or 4 (8: a whole byte, nothing to pack)."""
    return next(bits for bits in (1, 2, 4, 8) if count <= 2 ** bits or bits == 8)


def pack_positions(positions: Tensor, count: int) -> Tensor:
    """Positions in 0 .. count - 1 (uint8, contiguous) packed 8, 4 or 2 to a byte, flat."""
    bits = _bits_per_position(count)
    per_byte = 8 // bits
    flat = positions.reshape(-1)
    if flat.numel() % per_byte:
        flat = torch.cat([flat, flat.new_zeros(per_byte - flat.numel() % per_byte)])
    groups = flat.view(-1, per_byte)
    packed = groups[:, 0].clone()
    for slot in range(1, per_byte):
        packed.bitwise_or_(groups[:, slot] << (slot * bits))
    return packed


def unpack_positions(packed: Tensor, shape: torch.Size, count: int) -> Tensor:
    """The positions that pack_positions packed, as uint8 of `shape`."""
    bits = _bits_per_position(count)
    per_byte = 8 // bits
    groups = torch.empty(packed.numel(), per_byte, dtype=torch.uint8, device=packed.device)
    for slot in range(per_byte):
        torch.bitwise_and(packed >> (slot * bits), 2 ** bits - 1, out=groups[:, slot])
    return groups.view(-1)[:shape.numel()].view(shape)


@dataclass(frozen=True)
class _Argmax:
    """How a max-pool's argmax was saved: window positions, packed when they fit."""

    geometry: PoolGeometry
    shape: torch.Size
    packed: bool

    @classmethod
    def of(cls, positions: Tensor, geometry: PoolGeometry) -> tuple[_Argmax, Tensor]:
        """The record, and the tensor to save for backward."""
        count = geometry.kernel[0] * geometry.kernel[1]
        # A byte or more per position: saved as is (also when not contiguous: channels last).
        packed = _bits_per_position(count) < 8 and positions.is_contiguous()
        saved = pack_positions(positions, count) if packed else positions
        return cls(geometry, positions.shape, packed), saved

    def indices(self, saved: Tensor, width: int) -> Tensor:
        """torch's int64 indices into the input plane, from the saved tensor."""
        count = self.geometry.kernel[0] * self.geometry.kernel[1]
        positions = unpack_positions(saved, self.shape, count) if self.packed else saved
        return plane_indices(positions, width, self.geometry)


def _pool_forward(x: Tensor, geometry: PoolGeometry) -> tuple[Tensor, _Argmax, Tensor]:
    """The pooled map, the argmax's record and the tensor to save for it."""
    pooled, indices = torch.ops.aten.max_pool2d_with_indices(x, *geometry.args())
    return pooled, *_Argmax.of(window_positions(indices, x.shape[-1], geometry), geometry)


def _pool_backward(grad: Tensor, x: Tensor, indices: Tensor, geometry: PoolGeometry) -> Tensor:
    return torch.ops.aten.max_pool2d_with_indices_backward(grad, x, *geometry.args(), indices)


class WindowMaxPool(torch.autograd.Function):
    """2-d max-pool (N, C, H, W) that saves its input and the argmax's window positions."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, geometry: PoolGeometry) -> Tensor:
        """torch's max-pool output."""
        pooled, ctx.argmax, saved = _pool_forward(x, geometry)
        ctx.save_for_backward(x, saved)
        return pooled

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, None]:
        """torch's max-pool backward on the indices rebuilt from the positions."""
        x, saved = ctx.saved_tensors
        indices = ctx.argmax.indices(saved, x.shape[-1])
        return _pool_backward(grad_out, x, indices, ctx.argmax.geometry), None


class MaxPoolConv(torch.autograd.Function):
    """conv2d(max_pool2d(x)) that saves x and the window positions, not the pooled map."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None,
                geometry: PoolGeometry, conv: tuple[Any, ...]) -> Tensor:
        """The convolution (stride, padding, dilation, groups in `conv`) of the pooled x."""
        pooled, ctx.argmax, saved = _pool_forward(x, geometry)
        out = F.conv2d(pooled, weight, bias, *conv)
        ctx.save_for_backward(x, weight, saved)
        ctx.conv, ctx.has_bias = conv, bias is not None
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        """Gather the pooled map back, then the convolution's and the pool's own backward."""
        x, weight, saved = ctx.saved_tensors
        needs_x, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        indices = ctx.argmax.indices(saved, x.shape[-1])
        pooled = x.flatten(2).gather(2, indices.flatten(2)).view(indices.shape)
        if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
            pooled = pooled.contiguous(memory_format=torch.channels_last)  # forward's layout
        stride, padding, dilation, groups = ctx.conv
        grad_pooled, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
            grad_out, pooled, weight, [weight.shape[0]] if ctx.has_bias else None,
            stride, padding, dilation, False, [0, 0], groups,
            [needs_x, needs_weight, needs_bias and ctx.has_bias])
        del pooled
        grad_x = _pool_backward(grad_pooled, x, indices, ctx.argmax.geometry) if needs_x else None
        return grad_x, grad_weight, grad_bias, None, None


_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks",
                 "_global_backward_hooks", "_global_backward_pre_hooks")


def _hooked(module: nn.Module) -> bool:
    """Whether calling the module runs hooks that a fused path would skip."""
    if any(getattr(module_hooks, name, None) for name in _GLOBAL_HOOKS):
        return True
    return bool(module._forward_hooks or module._forward_pre_hooks
                or module._backward_hooks or module._backward_pre_hooks)


def _light_pool(module: nn.Module, x: Tensor) -> PoolGeometry | None:
    """The geometry of a plain, hook-free 2-d max-pool on a batch that autograd records."""
    if (type(module) is not nn.MaxPool2d or module.return_indices or _hooked(module)
            or x.dim() != 4 or not torch.is_grad_enabled()):
        return None
    return PoolGeometry.of(module)


def _fusable_conv(module: nn.Module | None, x: Tensor) -> bool:
    """A hook-free Conv2d (parametrized weights included) whose forward is nn.Conv2d's."""
    return (isinstance(module, nn.Conv2d) and type(module).forward is nn.Conv2d.forward
            and type(module)._conv_forward is nn.Conv2d._conv_forward
            and module.padding_mode == "zeros" and not isinstance(module.padding, str)
            and not _hooked(module) and not torch.is_autocast_enabled(x.device.type))


def run_light_sequential(layers: nn.Sequential, x: Tensor) -> Tensor:
    """`layers(x)`, with its max-pools memory-light and each fused with a convolution after it.

    A pool (or convolution) with hooks, and anything run without autograd, runs as itself;
    so does `layers` as a whole when it has hooks of its own.
    """
    if _hooked(layers) or not torch.is_grad_enabled():
        return layers(x)
    modules = list(layers)
    index = 0
    while index < len(modules):
        module = modules[index]
        geometry = _light_pool(module, x)
        if geometry is None:
            x = module(x)
            index += 1
            continue
        following = modules[index + 1] if index + 1 < len(modules) else None
        if _fusable_conv(following, x):
            conv = (following.stride, following.padding, following.dilation, following.groups)
            x = MaxPoolConv.apply(x, following.weight, following.bias, geometry, conv)
            index += 2
        else:
            x = WindowMaxPool.apply(x, geometry)
            index += 1
    return x
