"""The settings stage: what every other stage builds on. Range-linear math (quantize, dequantize,
scales and zero points, straight-through estimators), activation clipping (min/max, mean, N
standard deviations, ACIQ, histogram search), the typed settings read from the command line and
the YAML overrides, and the package's typed error. It imports no other stage."""

from compressor.quantization.core.clipping import (
    ClipMode,
    aciq_alpha,
    histogram_range,
    parse_clip_mode,
    stats_range,
    tensor_range,
)
from compressor.quantization.core.errors import MissingStatisticsError, QuantizationError
from compressor.quantization.core.range_linear import (
    LinearQuantMode,
    ModuleQuantMode,
    dequantize,
    fake_quantize,
    parse_quant_mode,
    quant_params,
    quantize,
)
from compressor.quantization.core.settings import (
    LayerSettings,
    QuantSettings,
    quantizable_modules,
    resolve_layers,
    settings_from_args,
    with_layer_overrides,
)

__all__ = [
    "QuantizationError", "MissingStatisticsError",
    "LinearQuantMode", "ModuleQuantMode", "parse_quant_mode", "quant_params", "quantize",
    "dequantize", "fake_quantize",
    "ClipMode", "parse_clip_mode", "aciq_alpha", "stats_range", "tensor_range", "histogram_range",
    "QuantSettings", "LayerSettings", "settings_from_args", "with_layer_overrides",
    "resolve_layers", "quantizable_modules",
]
