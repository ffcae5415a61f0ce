"""One switch for the memory-efficient variants of a registered architecture."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from compressor.memory.dense import has_dense_blocks, make_densenet_efficient
from compressor.models.layers.activation_checkpointing import enable_checkpointing
from compressor.models.layers.inplace_abn import convert_to_inplace_abn
from compressor.utils.errors import UsageError
from compressor.utils.vocabulary import MEMORY_VARIANTS

if TYPE_CHECKING:
    from compressor.models.registry import ArchSpec

__all__ = ["MEMORY_VARIANTS", "apply_memory_variant", "supported_variants"]

# "recompute": activation checkpointing of the registry's checkpoint_blocks (for DenseNets,
# the efficient DenseNet, which keeps only the convolutions' outputs); "inplace-abn": BN +
# activation fused in place.
# MEMORY_VARIANTS ("recompute", "inplace-abn"): compressor.utils.vocabulary


def supported_variants(model: nn.Module, arch_spec: ArchSpec) -> tuple[str, ...]:
    """The memory variants that `model` (built from `arch_spec`) can be turned into."""
    variants = []
    if arch_spec.checkpoint_blocks or has_dense_blocks(model):
        variants.append("recompute")
    if getattr(model, "supports_inplace_abn", False) and any(
            isinstance(m, nn.BatchNorm2d) for m in model.modules()):
        variants.append("inplace-abn")
    return tuple(variants)


def apply_memory_variant(model: nn.Module, arch_spec: ArchSpec, variant: str) -> nn.Module:
    """Turn `model` into its memory-efficient `variant`, in place, and return it.

    "recompute" switches on a model's own `set_grad_checkpointing`, or puts recomputing
    containers in the place of its block containers
    (compressor.models.layers.activation_checkpointing, compressor.memory.dense);
    "inplace-abn" swaps batch norm + activation pairs for InPlaceABN + Identity. Nothing is
    written on the model but its modules: the caller records the variant (in the model's
    description). Parameter and buffer names are kept,
    so a plain checkpoint loads into the variant and a variant's into the plain model. A
    variant computes the same function with the same gradients and batch-norm statistics as
    the plain model; the one exception is that in-place ABN needs an invertible activation
    and so turns ReLU into leaky ReLU (0.01).
    """
    if variant not in MEMORY_VARIANTS:
        raise UsageError(f"unknown memory-efficient variant '{variant}'; "
                         f"use one of: {', '.join(MEMORY_VARIANTS)}")
    if variant not in supported_variants(model, arch_spec):
        supported = ", ".join(supported_variants(model, arch_spec)) or "none"
        raise UsageError(f"architecture '{arch_spec.name}' has no '{variant}' variant "
                         f"(supported: {supported}); drop --memory-efficient or pick another")
    if variant == "recompute":
        if has_dense_blocks(model):
            make_densenet_efficient(model)
        else:
            enable_checkpointing(model, arch_spec.checkpoint_blocks)
    else:
        convert_to_inplace_abn(model)
    return model
