"""In-place activated batch norm: BN (+ residual) + invertible activation, saving only its output.

Rota Bulo et al., "In-Place Activated BatchNorm for Memory-Optimized Training of DNNs": the
backward pass recovers the normalized input from the output by inverting the activation and
the affine transform, so the BN input (a convolution's output, kept by nothing else) is never
stored. ReLU is not invertible; leaky ReLU (slope 0.01), ELU and identity are.

As in the paper, backward recovers the pre-activation values in the storage of the saved
output itself when nothing else can still read that output (its consumers' backward ran
before, and no one else holds it): one activation-sized buffer less at the step's peak.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
from torch.nn.modules.batchnorm import _BatchNorm

from compressor.utils.errors import UsageError

__all__ = ["InPlaceABN", "InPlaceABNFunction", "ACTIVATIONS", "convert_to_inplace_abn"]

ACTIVATIONS = ("leaky_relu", "elu", "identity")
# Channels whose |gamma| is below this (relative to 1 + |beta|) keep their normalized input:
# dividing by a (near) zero gamma cannot recover it (channel pruning zeroes gammas).
SMALL_GAMMA = 1e-3


def _activate_(z: Tensor, activation: str, param: float) -> Tensor:
    if activation == "leaky_relu":
        return F.leaky_relu_(z, param)
    if activation == "elu":
        return F.elu_(z, param)
    return z


def _sole_holder(tensor: Tensor) -> bool:
    """Whether nothing but this backward can read `tensor`'s storage (so it may be overwritten).

    Holders of a saved output's storage in its backward: the saved variable, the unpacked
    alias and the storage handle made here. Anything more (the caller's reference to the
    output, a view, a consumer's saved input kept by retain_graph) raises the count, and the
    output is left alone. One blind spot: identity saved-tensor hooks (as in
    compressor.memory.measure_saved_bytes) make those holders share one tensor, so a caller
    who keeps the output and reads it after that backward reads BN(x) + residual.
    """
    if torch.compiler.is_compiling():
        return False
    try:
        return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata) <= 3
    except (AttributeError, RuntimeError):  # a torch without the counter: never overwrite
        return False


def _invert(z: Tensor, grad_z: Tensor, activation: str, param: float,
            in_place: bool) -> tuple[Tensor, Tensor]:
    """Pre-activation values (in z's storage if `in_place`) and the gradient with respect to them.

    The gradient comes first: ELU's is computed from the output.
    """
    if activation == "leaky_relu":  # one fused pass each: x if x > 0 else x * slope
        grad = torch.ops.aten.leaky_relu_backward(grad_z, z, param, True)
        if in_place:
            return (torch.ops.aten.leaky_relu_backward.grad_input(z, z, 1.0 / param, True,
                                                                  grad_input=z), grad)
        return torch.ops.aten.leaky_relu_backward(z, z, 1.0 / param, True), grad
    if activation == "elu":
        grad = torch.ops.aten.elu_backward(grad_z, param, 1.0, 1.0, True, z)
        # Saturated outputs (z -> -alpha) cannot be inverted: clamp to the float's resolution.
        ratio = torch.div(z, param).clamp_(min=-1.0 + torch.finfo(z.dtype).eps).log1p_()
        return torch.where(z > 0, z, ratio, out=z if in_place else None), grad
    return z, grad_z


def _channel_view(t: Tensor, dim: int) -> Tensor:
    return t.view(1, -1, *([1] * (dim - 2)))


def _train_input_grad(grad_y: Tensor, y: Tensor, shift: Tensor, inv_gamma: Tensor,
                      grad_w: Tensor, grad_b: Tensor, scale: Tensor) -> Tensor:
    """Training batch norm's input gradient, written over y (no new buffer).

    dx = (dy - mean(dy) - x_hat * mean(dy * x_hat)) * scale with x_hat = (y - shift) *
    inv_gamma, i.e. scale * dy + slope * y + offset per channel; grad_w and grad_b are the
    per-channel sums of dy * x_hat and dy, scale is gamma * invstd.
    """
    dim, count = y.dim(), y.numel() // y.shape[1]
    projection = inv_gamma * grad_w / count  # mean(dy * x_hat) * inv_gamma
    slope = -scale * projection
    offset = scale * (shift * projection - grad_b / count)
    y.mul_(_channel_view(slope, dim)).addcmul_(grad_y, _channel_view(scale, dim))
    return y.add_(_channel_view(offset, dim))  # three in-place passes beat two addcmuls


class InPlaceABNFunction(torch.autograd.Function):
    """y = act(BN(x) + residual); saves y (and the per-channel statistics), not x.

    Backward overwrites the saved y with BN(x) + residual when it holds y's only reference
    (see _sole_holder); otherwise it works on a copy. The gradients are the same either way.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor, residual: Tensor | None,
                running_mean: Tensor | None, running_var: Tensor | None, training: bool,
                momentum: float, eps: float, activation: str, param: float) -> Tensor:
        """Normalize, add the residual and activate; running stats update as in F.batch_norm."""
        out, mean, invstd = torch.native_batch_norm(
            x, weight, bias, running_mean, running_var, training, momentum, eps)
        if not training:
            mean = running_mean
            invstd = torch.rsqrt(running_var + eps)
        small = (weight.abs() < SMALL_GAMMA * (1 + bias.abs())).nonzero().flatten()
        kept = None
        if small.numel():
            dim = x.dim()
            kept = ((x.index_select(1, small) - _channel_view(mean[small], dim))
                    * _channel_view(invstd[small], dim)).to(x.dtype)
        if residual is not None:
            out.add_(residual)
        out = _activate_(out, activation, param)
        ctx.save_for_backward(out, weight, bias, residual, mean, invstd, small,
                              kept if kept is not None else out.new_empty(0))
        ctx.training, ctx.eps, ctx.activation, ctx.param = training, eps, activation, param
        ctx.has_residual = residual is not None
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        """Invert the activation and the affine map, then apply batch norm's backward."""
        out, weight, bias, residual, mean, invstd, small, kept = ctx.saved_tensors
        dim = out.dim()
        in_place = _sole_holder(out)
        y, grad_y = _invert(out, grad_out, ctx.activation, ctx.param, in_place)
        writable = in_place or y is not out  # y is a new tensor, or the output nobody reads
        if residual is not None:
            y = y.sub_(residual) if writable else y - residual
            writable = True
        # y = gamma * x_hat + beta, so y is the input of a batch norm with mean beta and
        # invstd 1 / gamma; its weight gamma^2 * invstd makes the kernel's dx batch norm's.
        # Channels with a (near) zero gamma use their kept x_hat with mean 0 and invstd 1.
        shift, inv_gamma, kernel_weight = bias, None, weight * weight * invstd
        if small.numel():
            y = y if writable else y.clone()
            y.index_copy_(1, small, kept)
            shift = bias.index_fill(0, small, 0.0)
            kernel_weight = kernel_weight.index_copy(0, small, (weight * invstd)[small])
            inv_gamma = weight.index_fill(0, small, 1.0).reciprocal()
        else:
            inv_gamma = weight.reciprocal()
        needs_x = ctx.needs_input_grad[0]
        if ctx.training:
            # Only the kernel's reductions: its CPU version allocates the input gradient twice
            # (a transient extra activation at the step's peak); dx is written over y instead.
            _, grad_w, grad_b = torch.ops.aten.native_batch_norm_backward(
                grad_y, y, kernel_weight, None, None, shift, inv_gamma, True, 0.0,
                [False, True, True])
            grad_x = None
            if needs_x:
                grad_x = _train_input_grad(grad_y, y if writable else y.clone(), shift,
                                           inv_gamma, grad_w, grad_b, weight * invstd)
        else:
            dims = [0, *range(2, dim)]
            x_hat = (y - _channel_view(shift, dim)) * _channel_view(inv_gamma, dim)
            grad_x = grad_y * _channel_view(weight * invstd, dim) if needs_x else None
            grad_w = (grad_y * x_hat).sum(dims)
            grad_b = grad_y.sum(dims)
        grad_residual = grad_y if ctx.has_residual and ctx.needs_input_grad[3] else None
        return (grad_x, grad_w, grad_b, grad_residual) + (None,) * 7


class InPlaceABN(_BatchNorm):
    """Batch norm fused with an invertible activation (and optionally a residual add).

    Parameters and buffers have batch norm's names, so a BatchNorm2d's state_dict loads into
    it. `forward(x, residual=None)` returns act(BN(x) + residual). With fused=False it runs
    the same computation with standard autograd ops (the reference it must match).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 activation: str = "leaky_relu", activation_param: float | None = None,
                 fused: bool = True, **kwargs: Any) -> None:
        super().__init__(num_features, eps, momentum, affine=True, **kwargs)
        if activation not in ACTIVATIONS:
            raise UsageError(f"in-place ABN activation '{activation}' is not invertible; "
                             f"use one of: {', '.join(ACTIVATIONS)}")
        if activation_param is None:  # leaky ReLU's slope or ELU's alpha
            activation_param = 1.0 if activation == "elu" else 0.01
        self.activation = activation
        self.activation_param = float(activation_param)
        self.fused = fused

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def extra_repr(self) -> str:
        """Batch norm's repr plus the activation."""
        return (f"{super().extra_repr()}, activation={self.activation}, "
                f"activation_param={self.activation_param}")

    def _factor(self) -> tuple[bool, float]:
        """Training flag and running-average factor, exactly as nn.BatchNorm computes them."""
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                      else self.momentum)
        training = self.training or (self.running_mean is None and self.running_var is None)
        return training, factor

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """act(batch_norm(x) + residual)."""
        self._check_input_dim(x)
        training, factor = self._factor()
        use_running = not self.training or self.track_running_stats
        running_mean = self.running_mean if use_running else None
        running_var = self.running_var if use_running else None
        # Without a backward to come (evaluation, batch-norm re-estimation) nothing needs the
        # output saved: the plain ops compute the same values, without the fused path's search
        # for near-zero gammas (a host-device sync per layer on an accelerator).
        backward = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, residual, self.weight, self.bias))
        if not self.fused or not backward:
            out = F.batch_norm(x, running_mean, running_var, self.weight, self.bias,
                               training, factor, self.eps)
            if residual is not None:
                out = out + residual
            if self.activation == "leaky_relu":
                return F.leaky_relu(out, self.activation_param)
            if self.activation == "elu":
                return F.elu(out, self.activation_param)
            return out
        return InPlaceABNFunction.apply(x, self.weight, self.bias, residual, running_mean,
                                        running_var, training, factor, self.eps,
                                        self.activation, self.activation_param)


_ACTIVATION_OF = {nn.ReLU: "leaky_relu", nn.LeakyReLU: "leaky_relu", nn.ELU: "elu"}


def _activation_param(act: nn.Module) -> float:
    if isinstance(act, nn.LeakyReLU):
        return float(act.negative_slope)
    if isinstance(act, nn.ELU):
        return float(act.alpha)
    return 0.01


def convert_to_inplace_abn(model: nn.Module, fused: bool = True) -> int:
    """Replace each BatchNorm followed by an activation sibling with InPlaceABN + Identity.

    The model must declare `supports_inplace_abn` (its forward applies a batch norm child
    and the next activation child back to back, or passes a residual to the batch norm when
    it is an InPlaceABN). ReLU becomes leaky ReLU with slope 0.01, as in the paper: ReLU
    cannot be inverted. Returns the number of fused pairs.
    """
    count = 0
    for parent in list(model.modules()):
        children = list(parent.named_children())
        for (bn_name, bn), (act_name, act) in zip(children, children[1:], strict=False):
            if type(bn) not in (nn.BatchNorm1d, nn.BatchNorm2d) or not bn.affine:
                continue
            if type(act) not in _ACTIVATION_OF:
                continue
            fused_bn = InPlaceABN(bn.num_features, bn.eps, bn.momentum, _ACTIVATION_OF[type(act)],
                                  _activation_param(act), fused=fused,
                                  track_running_stats=bn.track_running_stats,
                                  device=bn.weight.device, dtype=bn.weight.dtype)
            fused_bn.load_state_dict(bn.state_dict())
            fused_bn.train(bn.training)
            setattr(parent, bn_name, fused_bn)
            setattr(parent, act_name, nn.Identity())
            count += 1
    return count
