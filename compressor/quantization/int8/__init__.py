"""The int8 lowering stage: a simulated post-training model becomes one that runs real 8-bit
kernels, per backend (torch's quantized x86/qnnpack kernels, or oneDNN's), with its graph
lowered once so each layer calls its kernel directly and requantizes only where a tensor
changes grid. QDQ export (ONNX) is not here: it lives in compressor.export."""

from compressor.quantization.int8.convert import (
    ACTIVATION_BITS,
    AUTO,
    INT8_BACKENDS,
    Grid,
    Int8Model,
    activation_grid,
    check_convertible,
    convert_to_int8,
    kernels_saturate,
    resolve_backend,
    weight_integers,
)

__all__ = [
    # what the module compressor.quantization.int8 exported before it became this package
    "INT8_BACKENDS", "AUTO", "ACTIVATION_BITS", "Grid", "activation_grid", "weight_integers",
    "check_convertible", "convert_to_int8", "Int8Model", "kernels_saturate", "resolve_backend",
]
