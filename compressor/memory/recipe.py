"""The memory-efficient variant as a model recipe: `memory_efficient: recompute | inplace-abn`."""

from __future__ import annotations

from typing import Any

from torch import nn

from compressor.memory.variants import apply_memory_variant
from compressor.models.description import description_of
from compressor.models.factory import get_arch_spec

__all__ = ["MemoryVariantTransform", "MEMORY_EFFICIENT"]

MEMORY_EFFICIENT = "memory_efficient"


class MemoryVariantTransform:
    """`--memory-efficient recompute | inplace-abn`: the recipe is the variant's name."""

    name = MEMORY_EFFICIENT

    def apply(self, model: nn.Module, recipe: Any) -> nn.Module:
        """Turn the model into its memory-efficient variant `recipe`."""
        return apply_memory_variant(model, get_arch_spec(description_of(model).arch), recipe)

    def recipe_of(self, model: nn.Module) -> Any | None:
        """The variant name."""
        return description_of(model).recipe(self.name)
