"""Distiller's clipping-based QAT methods: DoReFa, PACT and WRPN.

    DoReFa (Zhou et al., arXiv:1606.06160)  weights 2 * quantize_k(tanh(w) / (2 max|tanh w|) + 1/2)
                                            - 1; ReLU outputs clamped to [0, 1], quantized
    PACT (Choi et al., arXiv:1805.06085)    weights as DoReFa; ReLU outputs clipped to [0, alpha],
                                            alpha learned per activation (gradient 1 where
                                            x >= alpha), quantized
    WRPN (Mishra et al., arXiv:1709.01134)  weights clamped to [-1, 1], 2^(b-1) - 1 levels a side;
                                            ReLU outputs clamped to [0, 1], quantized

Quantization is straight-through (gradient 1 inside the clamp, 0 outside). As in Distiller only
nn.ReLU outputs are quantized (element-wise and parameter-layer outputs stay float).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch
from torch import Tensor, nn

from compressor.quantization.core.errors import QuantizationError, shown
from compressor.quantization.core.range_linear import LinearQuantizeSTE, code_dtype
from compressor.quantization.core.settings import LayerSettings, QuantSettings
from compressor.quantization.qat.compact import GridParts
from compressor.quantization.qat.precision import in_fp32
from compressor.quantization.qat.quantizer import QATQuantizer

__all__ = [
    "clamp_ste", "dorefa_weight", "wrpn_weight", "DorefaWeightQuant", "WRPNWeightQuant",
    "ClippedLinearQuantization", "LearnedClippedLinearQuantization", "DorefaQuantizer",
    "PACTQuantizer", "WRPNQuantizer", "DEFAULT_ACT_CLIP_INIT",
]

DEFAULT_ACT_CLIP_INIT = 8.0  # Distiller's PACT default


def clamp_ste(x: Tensor, low: float, high: float) -> Tensor:
    """x clamped to [low, high] with gradient 1 inside and at the ends, 0 outside (Distiller's
    clamp; this torch's clamp passes none at the ends)."""
    return torch.where(x < low, low, torch.where(x > high, high, x))


def dorefa_weight(weight: Tensor, num_bits: int) -> Tensor:
    """DoReFa's k-bit weights in [-1, 1] (gradient through tanh and the normalization).

    Its grid, 2q/(2^k - 1) - 1, has no zero (at 4 bits 0 would become +-1/15): a weight that is
    exactly zero, as pruning leaves it, stays zero, so a pruned model trains and deploys pruned.
    """
    levels = 2 ** num_bits - 1
    squashed = weight.tanh()
    peak = squashed.abs().max()
    peak = torch.where(peak == 0, torch.ones_like(peak), peak)  # an all-zero weight stays 0
    unit = squashed / (2 * peak) + 0.5
    quantized = 2 * LinearQuantizeSTE.apply(unit, float(levels), 0.0, 0, levels, True) - 1
    return torch.where(weight == 0, torch.zeros_like(quantized), quantized)


def wrpn_weight(weight: Tensor, num_bits: int) -> Tensor:
    """WRPN's weights: clamped to [-1, 1], symmetric with 2^(b-1) - 1 levels a side."""
    levels = 2 ** (num_bits - 1) - 1
    clamped = clamp_ste(weight, -1.0, 1.0)
    return LinearQuantizeSTE.apply(clamped, float(levels), 0.0, -levels, levels, True)


class DorefaWeightQuant(nn.Module):
    """DoReFa weight quantization as a module (for the wrapper's repr and plan)."""

    def __init__(self, num_bits: int) -> None:
        super().__init__()
        self.num_bits = num_bits

    def extra_repr(self) -> str:
        """The bits."""
        return f"num_bits={self.num_bits}"

    @in_fp32
    def forward(self, weight: Tensor) -> Tensor:
        """The quantized weight."""
        return dorefa_weight(weight, self.num_bits)


class WRPNWeightQuant(DorefaWeightQuant):
    """WRPN weight quantization as a module."""

    @in_fp32
    def forward(self, weight: Tensor) -> Tensor:
        """The quantized weight."""
        return wrpn_weight(weight, self.num_bits)


class ClippedLinearQuantization(nn.Module):
    """Activations clamped to [0, clip_val] and quantized (Distiller's, for DoReFa and WRPN)."""

    def __init__(self, num_bits: int, clip_val: float = 1.0) -> None:
        super().__init__()
        self.num_bits, self.clip_val = num_bits, float(clip_val)

    def extra_repr(self) -> str:
        """Bits and clipping value."""
        return f"num_bits={self.num_bits}, clip_val={self.clip_val}"

    @in_fp32
    def forward(self, x: Tensor, active: Tensor | None = None) -> Tensor:
        """x clamped (gradient 1 inside and at the ends) then on the grid."""
        levels = 2 ** self.num_bits - 1
        clamped = clamp_ste(x, 0.0, self.clip_val)
        return LinearQuantizeSTE.apply(clamped, levels / self.clip_val, 0.0, 0, levels, True)

    def grid_parts(self, x: Tensor, active: Tensor | None = None) -> GridParts:
        """`forward` computed in full for the compact path (QATWrapper.compact_output)."""
        levels = 2 ** self.num_bits - 1
        scale = levels / self.clip_val
        return _ste_parts(clamp_ste(x, 0.0, self.clip_val), scale, levels, self.clip_val)

    def output_range(self) -> tuple[float, float]:
        """(0, clip_val)."""
        return 0.0, self.clip_val


class LearnedClippedLinearQuantization(nn.Module):
    """PACT: activations clipped to [0, clip_val] with clip_val learned, then quantized."""

    def __init__(self, num_bits: int, init_act_clip_val: float = DEFAULT_ACT_CLIP_INIT) -> None:
        super().__init__()
        self.num_bits = num_bits
        self.clip_val = nn.Parameter(torch.tensor([float(init_act_clip_val)]))

    def extra_repr(self) -> str:
        """The bits (clip_val is a parameter)."""
        return f"num_bits={self.num_bits}"

    @in_fp32
    def forward(self, x: Tensor, active: Tensor | None = None) -> Tensor:
        """x clipped to [0, clip_val] then on the grid; d/d clip_val is 1 where x >= clip_val."""
        levels = 2 ** self.num_bits - 1
        clipped = torch.where(x < self.clip_val, torch.where(x < 0, 0.0, x), self.clip_val)
        scale = levels / self.clip_val.detach()
        return LinearQuantizeSTE.apply(clipped, scale, 0.0, 0, levels, True)

    def grid_parts(self, x: Tensor, active: Tensor | None = None) -> GridParts:
        """`forward` computed in full for the compact path: the gradient reaches x where
        0 <= x < clip_val, and clip_val where x >= clip_val."""
        levels = 2 ** self.num_bits - 1
        clip_val = self.clip_val.detach()
        below = x < clip_val
        clipped = torch.where(below, torch.where(x < 0, 0.0, x), clip_val)
        top = torch.nextafter(clip_val, torch.full_like(clip_val, -math.inf))  # below clip_val
        if top.device.type == "cpu" and top.numel() == 1:
            top = top.item()  # a host bound: the faster mask (compact.py)
        return _ste_parts(clipped, levels / clip_val, levels, top, below.logical_not_())

    def output_range(self) -> tuple[float, float]:
        """(0, clip_val)."""
        return 0.0, float(self.clip_val.detach().reshape(-1)[0])


def _ste_parts(clamped: Tensor, scale: Tensor | float, levels: int, top: Tensor | float,
               to_alpha: Tensor | None = None) -> GridParts:
    """LinearQuantizeSTE's dequantized output on [0, levels] (zero point 0.0), in full; the
    gradient passes where 0 <= x <= top."""
    q = clamped.mul_(scale).sub_(0.0).round_().clamp_(0, levels)
    codes = q.to(code_dtype(0, levels))
    return GridParts(q.add_(0.0).div_(scale), codes, 0.0, scale, 0.0, top, to_alpha)


class DorefaQuantizer(QATQuantizer):
    """Distiller's DorefaQuantizer: DoReFa weights, ReLU outputs clamped to [0, 1]."""

    class_name = "DorefaQuantizer"

    def weight_quant(self, num_bits: int, layer: LayerSettings) -> nn.Module:
        """DoReFa's weights."""
        return DorefaWeightQuant(num_bits)

    def output_quant(self, module: nn.Module, layer: LayerSettings) -> nn.Module | None:
        """ReLU outputs in [0, 1]."""
        if not isinstance(module, nn.ReLU) or layer.bits_activations is None:
            return None
        return ClippedLinearQuantization(layer.bits_activations, 1.0)


class WRPNQuantizer(DorefaQuantizer):
    """Distiller's WRPNQuantizer: weights clamped to [-1, 1], ReLU outputs to [0, 1]."""

    class_name = "WRPNQuantizer"

    def weight_quant(self, num_bits: int, layer: LayerSettings) -> nn.Module:
        """WRPN's weights."""
        return WRPNWeightQuant(num_bits)


def _positive(value: Any, key: str) -> float:
    """A finite positive number."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value) or value <= 0):
        raise QuantizationError(f"{key} must be a positive number, got {shown(value)}; "
                                "use e.g. 8.0")
    return float(value)


class PACTQuantizer(DorefaQuantizer):
    """Distiller's PACTQuantizer: DoReFa weights, ReLU outputs clipped to a learned alpha."""

    class_name = "PACTQuantizer"
    extra_keys = ("act_clip_init_val", "act_clip_decay")

    def __init__(self, settings: QuantSettings, act_clip_init_val: float = DEFAULT_ACT_CLIP_INIT,
                 act_clip_decay: float | None = None) -> None:
        super().__init__(settings)
        self.act_clip_init_val = _positive(act_clip_init_val, "act_clip_init_val")
        if act_clip_decay is not None and (
                isinstance(act_clip_decay, bool) or not isinstance(act_clip_decay, numbers.Real)
                or not math.isfinite(act_clip_decay) or act_clip_decay < 0):
            raise QuantizationError(f"act_clip_decay must be a number >= 0 (the weight decay "
                                    f"of the clipping values), got {shown(act_clip_decay)}; "
                                    "use e.g. 0.0001 or leave it out")
        self.act_clip_decay = None if act_clip_decay is None else float(act_clip_decay)

    def extra_args(self) -> dict[str, Any]:
        """act_clip_init_val and act_clip_decay."""
        return {"act_clip_init_val": self.act_clip_init_val,
                "act_clip_decay": self.act_clip_decay}

    def output_quant(self, module: nn.Module, layer: LayerSettings) -> nn.Module | None:
        """ReLU outputs clipped to a learned alpha."""
        if not isinstance(module, nn.ReLU) or layer.bits_activations is None:
            return None
        return LearnedClippedLinearQuantization(layer.bits_activations, self.act_clip_init_val)

    def param_groups(self, model: nn.Module) -> list[dict[str, Any]]:
        """One group of the clipping values, with weight decay act_clip_decay (if given)."""
        params = [m.clip_val for m in model.modules()
                  if isinstance(m, LearnedClippedLinearQuantization)]
        if not params:
            return []
        group: dict[str, Any] = {"params": params}
        if self.act_clip_decay is not None:
            group["weight_decay"] = self.act_clip_decay
        return [group]
