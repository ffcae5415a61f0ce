"""Thinning as a model recipe: removed filters and channels, recorded and replayed on load."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from compressor.models.description import describe, description_of, unwrap_model
from compressor.thinning.recipe import apply_thinning_recipe, compose_recipes
from compressor.thinning.thin import thin_model

__all__ = ["ThinningTransform", "THINNING", "thin", "probe_batch", "PROBE_SEED"]

THINNING = "thinning"
PROBE_SEED = 0  # thinning's probe batch is the same on every rank and in every rerun


class ThinningTransform:
    """Removed filters and channels: a recipe of removed indices of the freshly built model."""

    name = THINNING

    def apply(self, model: nn.Module, recipe: Any) -> nn.Module:
        """Slice a freshly built model to the thinned shapes."""
        return apply_thinning_recipe(model, recipe)

    def recipe_of(self, model: nn.Module) -> Any | None:
        """The composed recipe (indices of the freshly built model)."""
        return description_of(model).recipe(self.name)


def probe_batch(model: nn.Module, batch_size: int = 2) -> Tensor:
    """A seeded random batch at the model's InputSpec, on its device (identical on all ranks)."""
    spec = description_of(model).input_spec
    param = next(unwrap_model(model).parameters())
    generator = torch.Generator().manual_seed(PROBE_SEED)
    batch = torch.randn(batch_size, *spec.input_size, generator=generator)
    return batch.to(device=param.device, dtype=param.dtype)


def thin(model: nn.Module) -> dict[str, Any]:
    """Remove `model`'s zeroed filters and channels in place; returns the composed recipe.

    The recipe, composed with any earlier thinning, is recorded in the model's description,
    so a checkpoint of the model rebuilds the thin shapes.
    """
    inner = unwrap_model(model)
    description = description_of(inner)
    recipe = thin_model(inner, inputs=probe_batch(inner))
    composed = compose_recipes(description.recipe(THINNING), recipe)
    describe(inner, description.with_transform(THINNING, composed))
    return composed
