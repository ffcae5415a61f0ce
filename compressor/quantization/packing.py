"""The checkpoint form of a simulated-quantized model: weights as integers beside their scales.

A wrapper's fake-quantized weight `<layer>.wrapped.weight` is stored as `<layer>.wrapped.weight_int`
(torch.int8 up to 8 bits, int16 up to 16; unsigned modes shifted by -2^(b-1) so they fit), next
to `<layer>.weight_scale` / `<layer>.weight_zero_point`, which the state_dict holds already.
Unpacking recomputes (q + zero_point) / scale exactly as the simulation did, so the weights come
back bitwise equal.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from compressor.quantization.errors import QuantizationError
from compressor.quantization.range_linear import dequantize, quantize
from compressor.quantization.wrappers import ParamLayerWrapper, WeightQuant

__all__ = ["INT_SUFFIX", "pack_state_dict", "unpack_state_dict"]

INT_SUFFIX = "_int"


def _packed_layers(model: nn.Module) -> dict[str, WeightQuant]:
    """The weight spec of every wrapper with quantized weights, by layer name."""
    return {name: module.weight_quant for name, module in model.named_modules()
            if isinstance(module, ParamLayerWrapper) and module.weight_quant is not None}


def _shift(spec: WeightQuant) -> int:
    """What is subtracted from the integers so that unsigned ones fit a signed dtype."""
    return 0 if spec.mode.signed else 2 ** (spec.bits - 1)


def pack_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The state_dict with each quantized weight as an integer tensor (`.weight_int`)."""
    state = dict(model.state_dict())
    for name, spec in _packed_layers(model).items():
        key = f"{name}.wrapped.weight"
        scale, zero_point = state[f"{name}.weight_scale"], state[f"{name}.weight_zero_point"]
        ints = quantize(state.pop(key), scale, zero_point, spec.bits, spec.mode) - _shift(spec)
        state[key + INT_SUFFIX] = ints.to(torch.int8 if spec.bits <= 8 else torch.int16)
    return state


def unpack_state_dict(model: nn.Module, packed: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A state_dict that `model` (built by quantize_from_recipe) loads, weights back in float."""
    state = dict(packed)
    reference = model.state_dict()
    for name, spec in _packed_layers(model).items():
        key = f"{name}.wrapped.weight"
        if key + INT_SUFFIX not in state:
            raise QuantizationError(f"the packed checkpoint lacks '{key}{INT_SUFFIX}'; save it "
                                    "with the same quantization recipe as the model")
        ints = state.pop(key + INT_SUFFIX).to(reference[key].dtype) + _shift(spec)
        state[key] = dequantize(ints, state[f"{name}.weight_scale"],
                                state[f"{name}.weight_zero_point"]).to(reference[key].dtype)
    return state
