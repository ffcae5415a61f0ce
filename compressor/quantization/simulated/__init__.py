"""The simulated (post-training) stage: the model's explicit graph and its fusions, the wrappers
that quantize weights and activations in float arithmetic, Distiller's
`PostTrainLinearQuantizer` that places them from settings and statistics, and the packing that
stores the quantized weights as integers in checkpoints."""

from compressor.quantization.simulated.graph import explicit_graph
from compressor.quantization.simulated.packing import pack_state_dict, unpack_state_dict
from compressor.quantization.simulated.post_train import (
    PostTrainLinearQuantizer,
    calibration_batches,
    is_quantized,
    quantization_summary,
    quantize_from_recipe,
)

__all__ = [
    "PostTrainLinearQuantizer", "quantize_from_recipe", "is_quantized", "quantization_summary",
    "calibration_batches", "explicit_graph", "pack_state_dict", "unpack_state_dict",
]
