"""The quantization-aware training stage: fake-quantized wrappers trained with straight-through
estimators (range tracking, folded batch norms), Distiller's QAT quantizers (range-linear,
DoReFa, PACT, WRPN), the schedule's builder for them, and the way back to a float model that
post-training quantization converts. It shares the simulated stage's graph and fusions."""

from compressor.quantization.qat.build import QAT_CLASSES, build_qat_quantizer, qat_from_recipe
from compressor.quantization.qat.methods import DorefaQuantizer, PACTQuantizer, WRPNQuantizer
from compressor.quantization.qat.quantizer import (
    DEFAULT_EMA_DECAY,
    INPUTS_QUANT_NAME,
    FakeLinearQuantization,
    InputQuantizer,
    LinearWeightQuant,
    QATQuantizer,
    QATWrapper,
    QuantAwareTrainRangeLinearQuantizer,
    RangeTracker,
    is_qat_prepared,
    qat_to_float,
    quantizer_parameter_names,
    range_qparams,
    set_compact_save,
    set_qat_enabled,
    unprepare,
    update_ema,
)

__all__ = [
    # what the module compressor.quantization.qat exported before it became this package
    "DEFAULT_EMA_DECAY", "INPUTS_QUANT_NAME", "update_ema", "range_qparams", "RangeTracker",
    "FakeLinearQuantization", "LinearWeightQuant", "QATWrapper", "InputQuantizer",
    "QATQuantizer", "QuantAwareTrainRangeLinearQuantizer", "is_qat_prepared",
    "quantizer_parameter_names", "set_qat_enabled", "qat_to_float", "unprepare",
    "set_compact_save",
    # the methods and their builder
    "DorefaQuantizer", "PACTQuantizer", "WRPNQuantizer", "QAT_CLASSES", "build_qat_quantizer",
    "qat_from_recipe",
]
