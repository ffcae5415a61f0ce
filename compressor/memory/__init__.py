"""Memory-efficient model variants and the measurement of activation memory."""

from compressor.memory.auto import (
    AUTO,
    MeasuredVariant,
    MemoryChoice,
    choose_memory_variant,
    fit_memory_budget,
    measure_candidates,
    memory_candidates,
    variant_label,
)
from compressor.memory.compare import training_divergence
from compressor.memory.dense import EfficientDenseBlock, make_densenet_efficient
from compressor.memory.measure import MemoryReport, default_loss, measure_saved_bytes
from compressor.memory.variants import MEMORY_VARIANTS, apply_memory_variant, supported_variants
from compressor.models.layers.activation_checkpointing import (
    FrozenNormStats,
    RecomputedSequential,
    block_segments,
    checkpoint_seq,
    enable_checkpointing,
    exact_checkpoint,
    is_checkpointed,
)
from compressor.models.layers.inplace_abn import (
    InPlaceABN,
    InPlaceABNFunction,
    convert_to_inplace_abn,
)

__all__ = [
    "MEMORY_VARIANTS", "apply_memory_variant", "supported_variants",
    "measure_saved_bytes", "MemoryReport", "default_loss",
    "InPlaceABN", "InPlaceABNFunction", "convert_to_inplace_abn",
    "enable_checkpointing", "exact_checkpoint", "checkpoint_seq", "block_segments",
    "RecomputedSequential", "is_checkpointed", "FrozenNormStats",
    "EfficientDenseBlock", "make_densenet_efficient", "training_divergence",
    "AUTO", "MeasuredVariant", "MemoryChoice", "memory_candidates", "measure_candidates",
    "choose_memory_variant", "fit_memory_budget", "variant_label",
]
