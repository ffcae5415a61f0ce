"""Quantization-aware training of the graph int8 deploys: batch norms folded, ReLUs fused.

Post-training quantization folds each batch norm into the conv / linear layer before it and
fuses the ReLU after it (fusion.py), so the int8 model quantizes the folded weight and only the
chain's last output. `FusedQATWrapper` trains exactly that: the weight it fake-quantizes is the
folded one, `w * gamma / sqrt(running_var + eps)`, and the output it fake-quantizes is the one
after the batch norm and the ReLU. While training, the batch norm still normalises with the
batch's statistics (and updates its running ones): the layer computes with the folded quantized
weight, divides the fold back out and normalises, which in eval equals the folded layer of the
int8 model (Jacob et al., arXiv:1712.05877, section 3.2; torch.ao's ConvBn2d does the same).

The batch norm stays at its own name as a `FoldedBatchNorm`, which passes its input through and
keeps its parameters and running statistics (the same tensors: optimizers, schedules and
checkpoints see the names they knew); the fused ReLU is replaced by nn.Identity and runs inside
the wrapper. `unfuse` puts both back.

The fold reads the running variance before the batch norm updates it. Activation checkpointing
recomputes the forward in backward, after that update: the recomputation folds with the
variance the forward read, which each training forward keeps (a copy of C values), and
normalises with the batch's statistics without updating the running ones a second time
(whichever batch norms the recomputed segment declares as its own).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from compressor.quantization.qat.compact import fold_divide, in_recomputation
from compressor.quantization.qat.modules import QATWrapper, compact_now, where_enabled
from compressor.quantization.simulated.fusion import Fusion

__all__ = ["FoldedBatchNorm", "FusedQATWrapper", "fold_factor"]

_NormKind = type[nn.modules.batchnorm._BatchNorm]


class FoldedBatchNorm(nn.modules.batchnorm._BatchNorm):
    """A batch norm folded into the layer before it: passes its input through, keeps its state.

    Built from the batch norm it replaces with the same parameter and buffer tensors; the layer's
    `FusedQATWrapper` applies it (`normalize`).
    """

    def __init__(self, norm: nn.modules.batchnorm._BatchNorm) -> None:
        super().__init__(norm.num_features, norm.eps, norm.momentum, norm.affine,
                         norm.track_running_stats)
        self.plain_kind: _NormKind = type(norm)
        for name, param in norm.named_parameters(recurse=False):
            setattr(self, name, param)
        for name, buffer in norm.named_buffers(recurse=False):
            self._buffers[name] = buffer
        self.train(norm.training)

    def _check_input_dim(self, input: Tensor) -> None:  # noqa: A002 - torch's signature
        """Any input: the wrapper checked it."""

    def forward(self, x: Tensor) -> Tensor:
        """`x` unchanged: the layer before has applied the batch norm."""
        return x

    def normalize(self, x: Tensor) -> Tensor:
        """The batch norm itself (batch statistics in training, running ones in eval)."""
        if self.training and self.running_mean is not None and in_recomputation():
            # the forward has updated the statistics: update copies (the same tensors saved
            # for backward, as checkpoint checks; the output is the batch statistics')
            return F.batch_norm(x, self.running_mean.clone(), self.running_var.clone(),
                                self.weight, self.bias, True, 0.0, self.eps)
        return nn.modules.batchnorm._BatchNorm.forward(self, x)

    def plain(self) -> nn.modules.batchnorm._BatchNorm:
        """The batch norm it stands for, with the same tensors."""
        norm = self.plain_kind(self.num_features, self.eps, self.momentum, self.affine,
                               self.track_running_stats)
        for name, param in self.named_parameters(recurse=False):
            setattr(norm, name, param)
        for name, buffer in self.named_buffers(recurse=False):
            norm._buffers[name] = buffer
        return norm.train(self.training)


def fold_factor(norm: nn.modules.batchnorm._BatchNorm,
                running_var: Tensor | None = None) -> Tensor:
    """gamma / sqrt(running_var + eps) per channel, as torch's fuse_conv_bn_eval computes it
    (with `running_var` in place of the norm's own, if given)."""
    running_var = norm.running_var if running_var is None else running_var
    factor = torch.rsqrt(running_var + norm.eps)
    return norm.weight * factor if norm.affine else factor


class FusedQATWrapper(QATWrapper):
    """A QAT wrapper of a conv / linear layer with its batch norm folded and its ReLU fused (or
    of an element-wise add with its ReLU fused).

    The folded batch norm is held by reference (it stays registered at its own name); the
    activation is a child of the wrapper. Outputs are fake-quantized after both.
    """

    def __init__(self, base: QATWrapper, fusion: Fusion,
                 norm: FoldedBatchNorm | None, activation: nn.Module | None) -> None:
        super().__init__(base.wrapped, base.weight_quant, base.bias_quant, base.output_quant,
                         len(base.input_ranges), base.input_ranges[0].ema_decay)
        self.fusion = fusion
        object.__setattr__(self, "folded_norm", norm)  # not a child: it keeps its own name
        self.activation = activation
        self.compact_save = base.compact_save
        # the running variance the latest training forward folded with (for a recomputation)
        self._folded_var: Tensor | None = None

    def signature(self) -> str:
        """The base signature and what is fused."""
        return (f"{super().signature()} fused({self.fusion.batchnorm}, "
                f"{self.fusion.activation})")

    def install(self, model: nn.Module) -> None:
        """Put the folded batch norm and an identity at their names in `model`."""
        if self.fusion.batchnorm is not None and self.folded_norm is not None:
            model.set_submodule(self.fusion.batchnorm, self.folded_norm)
        if self.fusion.activation is not None:
            model.set_submodule(self.fusion.activation, nn.Identity())

    def uninstall(self, model: nn.Module) -> None:
        """Put the plain batch norm and the activation back at their names."""
        if self.fusion.batchnorm is not None and self.folded_norm is not None:
            model.set_submodule(self.fusion.batchnorm, self.folded_norm.plain())
        if self.fusion.activation is not None and self.activation is not None:
            model.set_submodule(self.fusion.activation, self.activation)

    @staticmethod
    def _over_outputs(factor: Tensor, out: Tensor) -> Tensor:
        """A per-channel factor shaped to broadcast over the channels (dim 1) of `out`."""
        return factor.reshape((1, -1) + (1,) * (out.dim() - 2))

    @staticmethod
    def _over_weight(factor: Tensor, weight: Tensor) -> Tensor:
        """A per-output-channel factor shaped to broadcast over `weight` (dim 0)."""
        return factor.reshape((-1,) + (1,) * (weight.dim() - 1))

    def _folded_weight(self) -> tuple[Tensor, Tensor | None]:
        """(weight the layer computes with, fold factor or None); fake-quantized while enabled.

        The factor is the one to divide the fold back out by: 1 where gamma is 0 (the folded
        weight is 0 there, and so is what the batch norm makes of it), and 1 everywhere while
        disabled, so that the layer then computes exactly as the float one."""
        weight = self.wrapped.weight
        factor = None
        if self.folded_norm is not None:
            fold = fold_factor(self.folded_norm, self._running_var_to_fold())
            factor = torch.where(self.enabled, fold, 1.0)
            weight = weight * self._over_weight(factor, weight)
            factor = torch.where(factor == 0, torch.ones_like(factor), factor)
        if self.weight_quant is not None:
            quant, folded = self.weight_quant, weight
            weight = where_enabled(self.enabled, lambda: quant(folded), folded)
        return weight, factor

    def _running_var_to_fold(self) -> Tensor | None:
        """The running variance to fold with: the forward's in a recomputation, else the
        norm's own (kept for a recomputation while training)."""
        norm = self.folded_norm
        if not (self.training and torch.is_grad_enabled()) or norm.running_var is None:
            return None
        if in_recomputation():
            return self._folded_var
        self._folded_var = norm.running_var.detach().clone()
        return None

    def effective_params(self) -> dict[str, Tensor]:
        """The plain layer's weight and bias: the folded quantized weight with the fold divided
        back out (folding it again, as int8 conversion does, gives the quantized weight)."""
        if not isinstance(getattr(self.wrapped, "weight", None), Tensor):
            return super().effective_params()  # an element-wise add with its ReLU fused
        weight, factor = self._folded_weight()
        if factor is not None:
            weight = weight / self._over_weight(factor, weight)
        bias = self.parameter("bias")
        return {"weight": weight} if bias is None else {"weight": weight, "bias": bias}

    def forward(self, *inputs: Any) -> Any:
        """Layer with the folded quantized weight, batch norm, activation, output quant."""
        if compact_now(self, inputs):
            return self._compact_fused(inputs)
        inputs = self.quantize_inputs(inputs)
        if not isinstance(getattr(self.wrapped, "weight", None), Tensor):
            out = self.wrapped(*inputs)  # an element-wise add, then its fused ReLU
            return self.quantize_output(self.activation(out) if self.activation else out)
        weight, factor = self._folded_weight()
        bias = self.parameter("bias")
        params = {"weight": weight}
        if bias is not None:  # with a fold, added after the fold is divided out
            params["bias"] = torch.zeros_like(bias) if factor is not None else bias
        out = functional_call(self.wrapped, params, inputs)
        if factor is not None:
            out = out / self._over_outputs(factor, out)
            if bias is not None:
                out = out + self._over_outputs(bias, out)
            out = self.folded_norm.normalize(out)
        if self.activation is not None:
            out = self.activation(out)
        return self.quantize_output(out)

    def _compact_fused(self, inputs: tuple[Any, ...]) -> Any:
        """`forward` while enabled, keeping codes and masks for backward (compact.py): the
        layer's input as codes, the division's quotient (the batch norm's input) once."""
        inputs = self.compact_inputs(inputs)
        if not isinstance(getattr(self.wrapped, "weight", None), Tensor) or len(inputs) != 1:
            return self.compact_output(self.wrapped(*inputs), self.activation)
        weight, factor = self._folded_weight()
        bias = self.parameter("bias")
        out = self.compact_layer(inputs[0], weight, torch.zeros_like(bias)
                                 if bias is not None and factor is not None else bias)
        if factor is not None:
            out = fold_divide(out, self._over_outputs(factor, out))
            if bias is not None:
                out = out + self._over_outputs(bias, out)
            out = self.folded_norm.normalize(out)
        return self.compact_output(out, self.activation)
