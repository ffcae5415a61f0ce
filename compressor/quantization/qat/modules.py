"""The modules of quantization-aware training: EMA range trackers, fake quantizers, wrappers.

`QATWrapper` keeps the wrapped module as `wrapped` and fake-quantizes its float "shadow"
weights (straight-through estimator) and its output; `InputQuantizer` quantizes the model's
input. Every flag and tracked range is a buffer, applied by `where_enabled`: `torch.where` on an
accelerator (no host sync), a branch on the CPU (where reading a flag costs nothing).

While training with QAT enabled, the wrappers keep what backward needs in compact form
(compact.py: activations as integer codes, clamp masks as bits) with bitwise the same
gradients; `compact_save = False` on a wrapper keeps torch's own float tensors (for debugging).
There the flag is read on the host (on an accelerator once, until the flag changes), so only
the branch taken is computed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from compressor.quantization.core.range_linear import (
    LinearQuantizeSTE,
    LinearQuantMode,
    clip_bounds,
    code_dtype,
    fake_quantize_ste,
    quantize_clamped_,
    quantized_range,
    range_qparams,
)
from compressor.quantization.core.settings import PARAM_LAYERS
from compressor.quantization.qat.compact import (
    GridParts,
    fusable_activation,
    in_recomputation,
    layer_on_codes,
    masked_quantize,
)
from compressor.quantization.qat.precision import in_fp32

__all__ = ["DEFAULT_EMA_DECAY", "where_enabled", "update_ema", "range_qparams", "RangeTracker",
           "tracked_clip_range", "on_tracked_grid", "tracked_grid_parts", "compact_now",
           "FakeLinearQuantization", "LinearWeightQuant", "InputGrid", "QATWrapper",
           "InputQuantizer"]

DEFAULT_EMA_DECAY = 0.999  # Distiller's default


def where_enabled(flag: Tensor, enabled: Callable[[], Tensor], disabled: Tensor) -> Tensor:
    """`enabled()` where the bool tensor `flag` holds, else `disabled`, as torch.where computes
    it. A plain CPU flag is read and only the branch taken is computed (half the work of a
    where over an activation, forward and backward); elsewhere (an accelerator, a traced or
    fake tensor) both are, with no host sync."""
    if type(flag) is Tensor and flag.device.type == "cpu":
        return enabled() if bool(flag) else disabled
    return torch.where(flag, enabled(), disabled)


def _flag_on_host(owner: nn.Module, flag: Tensor) -> bool | None:
    """The bool flag's value, None while tracing; on an accelerator read once (a host sync)
    and cached until the flag tensor changes (its version counter moves on any in-place write:
    set_qat_enabled, load_state_dict, DDP's buffer broadcast)."""
    if type(flag) is not Tensor or torch.jit.is_tracing():
        return None
    if flag.device.type == "cpu":
        return bool(flag)
    seen = owner.__dict__.get("_flag_seen")
    if seen is not None and seen[0] is flag and seen[1] == flag._version:
        return seen[2]
    value = bool(flag)
    owner.__dict__["_flag_seen"] = (flag, flag._version, value)
    return value


def compact_now(owner: nn.Module, inputs: tuple[Any, ...]) -> bool:
    """Whether `owner` (a wrapper or input quantizer) runs its compact path: asked for,
    autograd recording, quantization enabled, plain tensors in, no autocast."""
    if not getattr(owner, "compact_save", False) or not torch.is_grad_enabled():
        return False
    if not inputs or not all(type(value) is Tensor for value in inputs):
        return False
    if torch.is_autocast_enabled(inputs[0].device.type):
        return False
    return bool(_flag_on_host(owner, owner.enabled))


def update_ema(biased: Tensor, value: Tensor, decay: float, step: Tensor
               ) -> tuple[Tensor, Tensor]:
    """(biased EMA, bias-corrected EMA) after `value` at `step` (1-based), as Distiller."""
    biased = biased * decay + (1 - decay) * value
    return biased, biased / (1 - decay ** step)


class RangeTracker(nn.Module):
    """A tensor's min / max tracked by Distiller's bias-corrected EMA (buffers: resumable)."""

    def __init__(self, ema_decay: float = DEFAULT_EMA_DECAY) -> None:
        super().__init__()
        self.ema_decay = float(ema_decay)
        for name in ("tracked_min_biased", "tracked_min", "tracked_max_biased", "tracked_max"):
            self.register_buffer(name, torch.zeros(()))
        self.register_buffer("iter_count", torch.zeros((), dtype=torch.int64))

    def extra_repr(self) -> str:
        """The decay."""
        return f"ema_decay={self.ema_decay}"

    @torch.no_grad()
    def update(self, x: Tensor, active: Tensor) -> None:
        """Fold the min / max of `x` into the averages when `active` (a bool tensor).

        Not while activation checkpointing recomputes the forward in backward: the step has
        tracked x already, and the recomputation must use the range the forward used."""
        if in_recomputation():
            return
        low, high = torch.aminmax(x.detach())
        step = self.iter_count + active.to(self.iter_count.dtype)
        # step 0 only when inactive, where the result is not used: keep the division finite
        safe_step = step.clamp(min=1).to(self.tracked_min.dtype)
        pairs = ((self.tracked_min_biased, self.tracked_min, low),
                 (self.tracked_max_biased, self.tracked_max, high))
        for biased, tracked, value in pairs:
            new_biased, new_tracked = update_ema(biased, value.to(biased.dtype), self.ema_decay,
                                                 safe_step)
            biased.copy_(torch.where(active, new_biased, biased))
            tracked.copy_(torch.where(active, new_tracked, tracked))
        self.iter_count.copy_(step)

    def range(self) -> tuple[Tensor, Tensor]:
        """The bias-corrected (min, max)."""
        return self.tracked_min, self.tracked_max


def tracked_clip_range(tracker: RangeTracker, mode: LinearQuantMode) -> tuple[Tensor, Tensor]:
    """The range values are clamped to: the tracked one, made symmetric in symmetric modes."""
    low, high = tracker.range()
    if mode.symmetric:
        edge = torch.maximum(low.abs(), high.abs())
        return -edge, edge
    return low, high


def on_tracked_grid(x: Tensor, tracker: RangeTracker, num_bits: int,
                    mode: LinearQuantMode) -> Tensor:
    """x fake-quantized on the grid of the tracker's range as it is now (nothing tracked)."""
    low, high = tracked_clip_range(tracker, mode)
    scale, zero_point = range_qparams(low, high, num_bits, mode)
    return fake_quantize_ste(x, scale, zero_point, num_bits, mode, (low, high))


def tracked_grid_parts(x: Tensor, tracker: RangeTracker, num_bits: int,
                       mode: LinearQuantMode) -> GridParts:
    """`on_tracked_grid` computed in full, without autograd: output (bitwise the same), codes
    and the range where the clamp passes the gradient."""
    low, high = tracked_clip_range(tracker, mode)
    scale, zero_point = range_qparams(low, high, num_bits, mode)
    qmin, qmax = quantized_range(num_bits, mode)
    low, high = clip_bounds(x, (low, high))
    q = quantize_clamped_(torch.clamp(x, low, high), scale, zero_point, qmin, qmax)
    codes = q.to(code_dtype(qmin, qmax))
    return GridParts(q.add_(zero_point).div_(scale), codes, zero_point, scale, low, high)


class FakeLinearQuantization(nn.Module):
    """Fake-quantize activations to their EMA-tracked range (Distiller's FakeLinearQuantization).

    In training the range is updated first, then used; in eval the tracked range is used as is.
    Values are clamped to the range (gradient 1 inside and at its ends, 0 outside) and go through
    the straight-through estimator.
    """

    def __init__(self, num_bits: int, mode: LinearQuantMode,
                 ema_decay: float = DEFAULT_EMA_DECAY) -> None:
        super().__init__()
        self.num_bits, self.mode = num_bits, mode
        self.tracker = RangeTracker(ema_decay)

    def extra_repr(self) -> str:
        """Bits and mode."""
        return f"num_bits={self.num_bits}, mode={self.mode.name}"

    def clip_range(self) -> tuple[Tensor, Tensor]:
        """The range values are clamped to: the tracked one, made symmetric in symmetric modes."""
        return tracked_clip_range(self.tracker, self.mode)

    @in_fp32
    def forward(self, x: Tensor, active: Tensor) -> Tensor:
        """x on the grid of the tracked range (tracking only counts while `active`)."""
        if self.training:
            self.tracker.update(x, active)
        return self.on_grid(x)

    @in_fp32
    def on_grid(self, x: Tensor) -> Tensor:
        """x on the grid of the tracked range as it is now (nothing tracked)."""
        return on_tracked_grid(x, self.tracker, self.num_bits, self.mode)

    def grid_parts(self, x: Tensor, active: Tensor) -> GridParts:
        """`forward` computed in full for the compact path (range tracked in training)."""
        if self.training:
            self.tracker.update(x, active)
        return tracked_grid_parts(x, self.tracker, self.num_bits, self.mode)

    def output_range(self) -> tuple[float, float]:
        """The (min, max) the quantized outputs span, for statistics."""
        low, high = self.tracker.range()
        return float(low), float(high)


class LinearWeightQuant(nn.Module):
    """Range-linear fake quantization of a weight from its own range (per output channel
    optional), straight-through gradient, as Distiller's QAT `linear_quantize_param`."""

    def __init__(self, num_bits: int, mode: LinearQuantMode, per_channel: bool = False) -> None:
        super().__init__()
        self.num_bits, self.mode, self.per_channel = num_bits, mode, per_channel

    def extra_repr(self) -> str:
        """Bits, mode, per channel."""
        return f"num_bits={self.num_bits}, mode={self.mode.name}, per_channel={self.per_channel}"

    def qparams(self, weight: Tensor) -> tuple[Tensor, Tensor]:
        """(scale, zero_point) of `weight`, shaped to broadcast per channel when asked."""
        flat = weight.detach()
        if self.per_channel and flat.dim() >= 2:
            low, high = torch.aminmax(flat.reshape(flat.shape[0], -1), dim=1)
            shape = (-1,) + (1,) * (flat.dim() - 1)
            scale, zero_point = range_qparams(low, high, self.num_bits, self.mode)
            return scale.reshape(shape), zero_point.reshape(shape)
        low, high = torch.aminmax(flat)
        return range_qparams(low, high, self.num_bits, self.mode)

    @in_fp32
    def forward(self, weight: Tensor) -> Tensor:
        """The fake-quantized weight."""
        qmin, qmax = quantized_range(self.num_bits, self.mode)
        scale, zero_point = self.qparams(weight)
        return LinearQuantizeSTE.apply(weight, scale, zero_point, qmin, qmax, True)


class InputGrid:
    """The grid one input of a layer is quantized to in the int8 model: its producer's output
    grid (pooling or a flatten in between leaves values off it), or, with no quantized
    producer, the grid of the input's own tracked range. Holds references, not modules: the
    quantizers and trackers belong to the wrappers that own them."""

    def __init__(self, producer: FakeLinearQuantization | None = None,
                 own: tuple[RangeTracker, int, LinearQuantMode] | None = None) -> None:
        self.producer, self.own = producer, own

    @in_fp32
    def __call__(self, x: Tensor) -> Tensor:
        """`x` fake-quantized on the grid."""
        if self.producer is not None:
            return self.producer.on_grid(x)
        assert self.own is not None
        return on_tracked_grid(x, *self.own)

    def parts(self, x: Tensor) -> GridParts:
        """`x` on the grid, computed in full for the compact path."""
        if self.producer is not None:
            producer = self.producer
            return tracked_grid_parts(x, producer.tracker, producer.num_bits, producer.mode)
        assert self.own is not None
        return tracked_grid_parts(x, *self.own)

    def __repr__(self) -> str:
        """Which grid."""
        return "InputGrid(producer)" if self.producer is not None else "InputGrid(own range)"


class QATWrapper(nn.Module):
    """A module whose weight / bias / output are fake-quantized while `enabled`.

    Also tracks the range of its first inputs and, when its output is not quantized, of its
    output, so that `qat_to_float` can give the post-training quantizer statistics.
    """

    def __init__(self, wrapped: nn.Module, weight_quant: nn.Module | None = None,
                 bias_quant: nn.Module | None = None, output_quant: nn.Module | None = None,
                 num_inputs: int = 1, ema_decay: float = DEFAULT_EMA_DECAY) -> None:
        super().__init__()
        self.wrapped = wrapped  # first child: the original parameters keep their order
        self.weight_quant, self.bias_quant, self.output_quant = (weight_quant, bias_quant,
                                                                 output_quant)
        self.input_ranges = nn.ModuleList(RangeTracker(ema_decay) for _ in range(num_inputs))
        self.output_range = RangeTracker(ema_decay) if output_quant is None else None
        self.register_buffer("enabled", torch.ones((), dtype=torch.bool))
        # the grids inputs are quantized to, as in the int8 model (set by the quantizer's plan)
        self.input_grids: list[InputGrid | None] = []
        self.compact_save = True  # keep codes and bit masks for backward (same gradients)

    def _track_inputs(self, inputs: tuple[Any, ...]) -> None:
        """Track the inputs' ranges (training)."""
        if self.training:
            # measured before the module runs: in-place modules overwrite their input
            for tracker, value in zip(self.input_ranges, inputs, strict=False):
                if isinstance(value, Tensor) and value.is_floating_point() and value.numel():
                    tracker.update(value, self.enabled)

    def quantize_inputs(self, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        """Track the inputs' ranges (training), then put them on their grids while enabled."""
        active = self.enabled
        self._track_inputs(inputs)
        if not self.input_grids:
            return inputs
        gridded = []
        for index, value in enumerate(inputs):
            grid = self.input_grids[index] if index < len(self.input_grids) else None
            if grid is not None and isinstance(value, Tensor) and value.is_floating_point():
                value = where_enabled(active, lambda v=value, g=grid: g(v), value)
            gridded.append(value)
        return tuple(gridded)

    def signature(self) -> str:
        """What the wrapper does, to compare with a plan (parameters' values left out)."""
        parts = [f"{name}={module!r}" for name, module in (
            ("weight", self.weight_quant), ("bias", self.bias_quant),
            ("output", self.output_quant)) if module is not None]
        return f"{type(self.wrapped).__name__}({', '.join(parts)}, inputs={len(self.input_ranges)})"

    def parameter(self, name: str) -> Tensor | None:
        """The wrapped module's "weight" or "bias" as the forward uses it: fake-quantized while
        enabled where it has a quantizer, else as it is; None where the module has none."""
        value = getattr(self.wrapped, name, None)
        if not isinstance(value, Tensor):
            return None
        quant = self.weight_quant if name == "weight" else self.bias_quant
        if quant is None:
            return value
        return where_enabled(self.enabled, lambda: quant(value), value)

    def effective_params(self) -> dict[str, Tensor]:
        """The quantized weight and bias the forward uses in place of the module's own."""
        params: dict[str, Tensor] = {}
        for name, quant in (("weight", self.weight_quant), ("bias", self.bias_quant)):
            value = self.parameter(name) if quant is not None else None
            if value is not None:
                params[name] = value
        return params

    def forward(self, *inputs: Any) -> Any:
        """The wrapped module on fake-quantized parameters, its output fake-quantized."""
        if compact_now(self, inputs):
            return self._compact_forward(inputs)
        inputs = self.quantize_inputs(inputs)
        params = self.effective_params()
        out = functional_call(self.wrapped, params, inputs) if params else self.wrapped(*inputs)
        return self.quantize_output(out)

    # --- the compact path: quantization enabled, autograd recording (see compact.py)
    def compact_inputs(self, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        """`quantize_inputs` while enabled, each gridded input carrying its codes."""
        self._track_inputs(inputs)
        gridded = []
        for index, value in enumerate(inputs):
            grid = self.input_grids[index] if index < len(self.input_grids) else None
            if grid is not None and value.is_floating_point():
                value = masked_quantize(value, grid.parts)
            gridded.append(value)
        return tuple(gridded)

    def compact_layer(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """The wrapped conv / linear layer on x with this weight and bias (x kept as codes)."""
        wrapped = self.wrapped
        if wrapped._forward_hooks or wrapped._forward_pre_hooks:  # run as a module call
            params = {"weight": weight} if bias is None else {"weight": weight, "bias": bias}
            return functional_call(wrapped, params, (x,))
        return layer_on_codes(wrapped, x, weight, bias)

    def compact_output(self, out: Tensor, activation: nn.Module | None = None) -> Tensor:
        """activation(out) fake-quantized while enabled, one bit kept per element."""
        quant = self.output_quant
        if quant is None or not hasattr(quant, "grid_parts") or not fusable_activation(activation):
            return self.quantize_output(activation(out) if activation is not None else out)
        active = self.enabled
        alpha = getattr(quant, "clip_val", None)
        return masked_quantize(out, lambda value: quant.grid_parts(value, active), activation,
                               alpha if isinstance(alpha, Tensor) else None)

    def _compact_forward(self, inputs: tuple[Any, ...]) -> Any:
        """`forward` while enabled, keeping codes and masks for backward."""
        inputs = self.compact_inputs(inputs)
        wrapped = self.wrapped
        if isinstance(wrapped, PARAM_LAYERS) and len(inputs) == 1:
            params = self.effective_params()
            out = self.compact_layer(inputs[0], params.get("weight", wrapped.weight),
                                     params.get("bias", wrapped.bias))
            return self.compact_output(out)
        if (self.output_quant is not None and len(inputs) == 1
                and not wrapped._forward_hooks and not wrapped._forward_pre_hooks
                and fusable_activation(wrapped)):
            return self.compact_output(inputs[0], activation=wrapped)  # a quantized ReLU
        return self.compact_output(wrapped(*inputs))

    def quantize_output(self, out: Tensor) -> Tensor:
        """The output fake-quantized while enabled; else its range tracked (training)."""
        active = self.enabled
        if self.output_quant is not None:
            quant = self.output_quant
            return where_enabled(active, lambda: quant(out, active), out)
        if self.training and self.output_range is not None and out.numel():
            self.output_range.update(out, active)
        return out


class InputQuantizer(nn.Module):
    """Fake-quantizes the model's input (Distiller's `inputs_quant`), as a forward pre-hook."""

    def __init__(self, quant: FakeLinearQuantization) -> None:
        super().__init__()
        self.quant = quant
        self.register_buffer("enabled", torch.ones((), dtype=torch.bool))
        self.compact_save = True

    def pre_hook(self, _: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The model's arguments with the first one fake-quantized."""
        if not args or not isinstance(args[0], Tensor) or not args[0].is_floating_point():
            return None
        x = args[0]
        if compact_now(self, (x,)):  # the first layer keeps the codes of its input
            return (masked_quantize(x, lambda t: self.quant.grid_parts(t, self.enabled)),
                    *args[1:])
        return (where_enabled(self.enabled, lambda: self.quant(x, self.enabled), x), *args[1:])
