"""The checkpoint form of a simulated-quantized model: weights as integers beside their scales.

A wrapper's fake-quantized weight `<layer>.wrapped.weight` is stored as `<layer>.wrapped.weight_int`
(torch.int8 up to 8 bits, int16 up to 16; unsigned modes shifted by -2^(b-1) so they fit), next
to `<layer>.weight_scale` / `<layer>.weight_zero_point`, which the state_dict holds already.
Unpacking recomputes (q + zero_point) / scale exactly as the simulation did, so the weights come
back bitwise equal. The one-element scales and zero points (per-tensor weights, every input and
output) travel as one float64 vector, `quantization_scalars`, in the model's state_dict order:
torch.save spends a few hundred bytes on every tensor, which on a small model is a sixth of the
file; float64 holds their float32 values exactly.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from compressor.quantization.core.errors import QuantizationError
from compressor.quantization.core.range_linear import dequantize, quantize
from compressor.quantization.simulated.wrappers import ParamLayerWrapper, WeightQuant

__all__ = ["INT_SUFFIX", "SCALARS_KEY", "pack_state_dict", "unpack_state_dict"]

INT_SUFFIX = "_int"
SCALARS_KEY = "quantization_scalars"
_QPARAM_SUFFIXES = ("_scale", "_zero_point")


def _packed_layers(model: nn.Module) -> dict[str, WeightQuant]:
    """The weight spec of every wrapper with quantized weights, by layer name."""
    return {name: module.weight_quant for name, module in model.named_modules()
            if isinstance(module, ParamLayerWrapper) and module.weight_quant is not None}


def _shift(spec: WeightQuant) -> int:
    """What is subtracted from the integers so that unsigned ones fit a signed dtype."""
    return 0 if spec.mode.signed else 2 ** (spec.bits - 1)


def _scalar_keys(reference: Mapping[str, Tensor]) -> list[str]:
    """The one-element quantization parameters of a state_dict, in its order."""
    return [key for key, value in reference.items()
            if key.endswith(_QPARAM_SUFFIXES) and value.numel() == 1]


def pack_state_dict(model: nn.Module, state: Mapping[str, Tensor] | None = None
                    ) -> dict[str, Tensor]:
    """The state_dict (`model`'s own unless given) with each quantized weight as an integer
    tensor (`.weight_int`) and the one-element scales and zero points as one vector."""
    state = dict(model.state_dict() if state is None else state)
    for name, spec in _packed_layers(model).items():
        key = f"{name}.wrapped.weight"
        scale, zero_point = state[f"{name}.weight_scale"], state[f"{name}.weight_zero_point"]
        ints = quantize(state.pop(key), scale, zero_point, spec.bits, spec.mode) - _shift(spec)
        state[key + INT_SUFFIX] = ints.to(torch.int8 if spec.bits <= 8 else torch.int16)
    scalars = _scalar_keys(state)
    if scalars:
        state[SCALARS_KEY] = torch.stack([state.pop(key).detach().reshape(()).double()
                                          for key in scalars]).cpu()
    return state


def unpack_state_dict(model: nn.Module, packed: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A state_dict that `model` (built by quantize_from_recipe) loads, weights back in float."""
    state = dict(packed)
    reference = model.state_dict()
    scalars = _scalar_keys(reference)
    if scalars and not (SCALARS_KEY not in state and all(key in state for key in scalars)):
        # (a checkpoint holding them one by one, as the first format did, loads as it is)
        vector = state.pop(SCALARS_KEY, None)
        if not isinstance(vector, Tensor) or vector.shape != (len(scalars),):
            raise QuantizationError(f"the packed checkpoint's '{SCALARS_KEY}' does not hold the "
                                    f"model's {len(scalars)} scales and zero points; save it "
                                    "with the same quantization recipe as the model")
        for key, value in zip(scalars, vector, strict=True):
            state[key] = value.to(reference[key].dtype).reshape(reference[key].shape)
    for name, spec in _packed_layers(model).items():
        key = f"{name}.wrapped.weight"
        if key + INT_SUFFIX not in state:
            raise QuantizationError(f"the packed checkpoint lacks '{key}{INT_SUFFIX}'; save it "
                                    "with the same quantization recipe as the model")
        ints = state.pop(key + INT_SUFFIX).to(reference[key].dtype) + _shift(spec)
        state[key] = dequantize(ints, state[f"{name}.weight_scale"],
                                state[f"{name}.weight_zero_point"]).to(reference[key].dtype)
    return state
