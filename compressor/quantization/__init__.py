"""Quantization with Distiller's semantics, one subpackage per stage: `core` (range-linear math,
activation clipping, settings), `statistics` (calibration and the stats file), `simulated`
(post-training quantization in float), `qat` (quantization-aware training), `int8` (lowering to
real 8-bit kernels per backend); `recipe` ties them together for checkpoints, and `request` is
what a run asks of them (the step and its one `QuantSettings`). Import public names from here."""

from compressor.quantization.core.clipping import (
    ALPHA_GAUSS,
    ALPHA_GAUSS_POSITIVE,
    ALPHA_LAPLACE,
    ALPHA_LAPLACE_POSITIVE,
    HISTOGRAM_BINS,
    ClipMode,
    aciq_alpha,
    check_clip_n_stds,
    histogram_range,
    parse_clip_mode,
    stats_range,
    tensor_range,
)
from compressor.quantization.core.errors import QuantizationError
from compressor.quantization.core.range_linear import (
    MAX_ACCUM_BITS,
    MAX_BITS,
    MIN_BITS,
    ClampedLinearQuantizeSTE,
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
from compressor.quantization.core.settings import (
    LayerSettings,
    QuantSettings,
    quantizable_modules,
    resolve_layers,
    settings_from_args,
    with_layer_overrides,
)
from compressor.quantization.int8.convert import INT8_BACKENDS, check_convertible, convert_to_int8
from compressor.quantization.qat.build import QAT_CLASSES, build_qat_quantizer, qat_from_recipe
from compressor.quantization.qat.methods import DorefaQuantizer, PACTQuantizer, WRPNQuantizer
from compressor.quantization.qat.quantizer import (
    QATQuantizer,
    QuantAwareTrainRangeLinearQuantizer,
    is_qat_prepared,
    qat_to_float,
    quantizer_parameter_names,
)
from compressor.quantization.simulated.packing import pack_state_dict, unpack_state_dict
from compressor.quantization.simulated.post_train import (
    PostTrainLinearQuantizer,
    calibration_batches,
    is_quantized,
    quantization_summary,
    quantize_from_recipe,
)
from compressor.quantization.statistics.collect import collect_stats, tensor_stats
from compressor.quantization.statistics.stats_file import (
    STAT_KEYS,
    STATS_FILE_NAME,
    ActivationStats,
    dump_stats,
    load_stats,
    parse_stats,
    save_stats,
)

__all__ = [
    "QuantizationError",
    # range_linear
    "MIN_BITS", "MAX_BITS", "MAX_ACCUM_BITS", "LinearQuantMode", "ModuleQuantMode",
    "parse_quant_mode", "parse_module_quant_mode", "check_bits", "check_accum_bits",
    "quantized_range", "quant_params", "weight_quant_params", "quantize", "dequantize",
    "fake_quantize", "LinearQuantizeSTE", "ClampedLinearQuantizeSTE", "fake_quantize_ste",
    "float_range", "torch_qparams",
    "accum_range", "bias_scale", "quantize_bias",
    # clipping
    "ClipMode", "parse_clip_mode", "check_clip_n_stds", "ALPHA_GAUSS", "ALPHA_GAUSS_POSITIVE",
    "ALPHA_LAPLACE", "ALPHA_LAPLACE_POSITIVE", "aciq_alpha", "stats_range", "tensor_range",
    "HISTOGRAM_BINS", "histogram_range",
    # stats
    "STATS_FILE_NAME", "STAT_KEYS", "ActivationStats", "load_stats", "parse_stats", "dump_stats",
    "save_stats", "tensor_stats", "collect_stats",
    # settings
    "QuantSettings", "LayerSettings", "settings_from_args", "with_layer_overrides",
    "resolve_layers", "quantizable_modules",
    # post-training, int8 kernels, checkpoint form
    "PostTrainLinearQuantizer", "quantize_from_recipe", "is_quantized", "quantization_summary",
    "calibration_batches", "INT8_BACKENDS", "check_convertible", "convert_to_int8",
    "pack_state_dict", "unpack_state_dict",
    # quantization-aware training
    "QATQuantizer", "QuantAwareTrainRangeLinearQuantizer", "DorefaQuantizer", "PACTQuantizer",
    "WRPNQuantizer", "QAT_CLASSES", "build_qat_quantizer", "qat_from_recipe", "is_qat_prepared",
    "qat_to_float", "quantizer_parameter_names",
]
