"""Quantization with Distiller's semantics: range-linear math, activation clipping, statistics."""

from compressor.quantization.clipping import (
    ALPHA_GAUSS,
    ALPHA_GAUSS_POSITIVE,
    ALPHA_LAPLACE,
    ALPHA_LAPLACE_POSITIVE,
    ClipMode,
    aciq_alpha,
    check_clip_n_stds,
    parse_clip_mode,
    stats_range,
    tensor_range,
)
from compressor.quantization.errors import QuantizationError
from compressor.quantization.range_linear import (
    MAX_ACCUM_BITS,
    MAX_BITS,
    MIN_BITS,
    LinearQuantizeSTE,
    LinearQuantMode,
    ModuleQuantMode,
    accum_range,
    bias_scale,
    check_accum_bits,
    check_bits,
    dequantize,
    fake_quantize,
    fake_quantize_ste,
    float_range,
    parse_module_quant_mode,
    parse_quant_mode,
    quant_params,
    quantize,
    quantize_bias,
    quantized_range,
    torch_qparams,
    weight_quant_params,
)
from compressor.quantization.stats import (
    STAT_KEYS,
    STATS_FILE_NAME,
    ActivationStats,
    collect_stats,
    dump_stats,
    load_stats,
    parse_stats,
    save_stats,
    tensor_stats,
)

__all__ = [
    "QuantizationError",
    # range_linear
    "MIN_BITS", "MAX_BITS", "MAX_ACCUM_BITS", "LinearQuantMode", "ModuleQuantMode",
    "parse_quant_mode", "parse_module_quant_mode", "check_bits", "check_accum_bits",
    "quantized_range", "quant_params", "weight_quant_params", "quantize", "dequantize",
    "fake_quantize", "LinearQuantizeSTE", "fake_quantize_ste", "float_range", "torch_qparams",
    "accum_range", "bias_scale", "quantize_bias",
    # clipping
    "ClipMode", "parse_clip_mode", "check_clip_n_stds", "ALPHA_GAUSS", "ALPHA_GAUSS_POSITIVE",
    "ALPHA_LAPLACE", "ALPHA_LAPLACE_POSITIVE", "aciq_alpha", "stats_range", "tensor_range",
    # stats
    "STATS_FILE_NAME", "STAT_KEYS", "ActivationStats", "load_stats", "parse_stats", "dump_stats",
    "save_stats", "tensor_stats", "collect_stats",
]
