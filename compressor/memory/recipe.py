"""The memory-efficient variant as a model recipe: `memory_efficient: recompute | inplace-abn`,
or a list of variants applied in order (`--memory-efficient auto` may choose both)."""

from __future__ import annotations

from typing import Any

from torch import nn

from compressor.memory.variants import apply_memory_variant
from compressor.models.description import description_of
from compressor.models.factory import get_arch_spec
from compressor.utils.errors import CheckpointError

__all__ = ["MemoryVariantTransform", "MEMORY_EFFICIENT", "variants_of"]

MEMORY_EFFICIENT = "memory_efficient"


def variants_of(recipe: Any) -> tuple[str, ...]:
    """The variant names a recipe applies, in order: a name, a list of names, or none."""
    if recipe is None:
        return ()
    if isinstance(recipe, str):
        return (recipe,)
    if isinstance(recipe, (list, tuple)) and all(isinstance(item, str) for item in recipe):
        return tuple(recipe)
    raise CheckpointError(f"memory_efficient recipe {recipe!r} is neither a variant name nor a "
                          "list of them; the checkpoint is damaged, use another one")


class MemoryVariantTransform:
    """`--memory-efficient recompute | inplace-abn`: the recipe is the variant's name (or a list
    of names)."""

    name = MEMORY_EFFICIENT

    def apply(self, model: nn.Module, recipe: Any) -> nn.Module:
        """Turn the model into its memory-efficient variant `recipe` (each listed, in order)."""
        spec = get_arch_spec(description_of(model).arch)
        for variant in variants_of(recipe):
            model = apply_memory_variant(model, spec, variant)
        return model

    def recipe_of(self, model: nn.Module) -> Any | None:
        """The variant name."""
        return description_of(model).recipe(self.name)
