"""Thinning: physically remove pruned filters and channels, and rebuild thinned models."""

from compressor.thinning.recipe import apply_thinning_recipe, compose_recipes
from compressor.thinning.thin import thin_model

__all__ = ["thin_model", "apply_thinning_recipe", "compose_recipes"]
