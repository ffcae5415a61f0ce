"""Quantization as a model recipe: post-training (simulated or int8 kernels) or quantization-aware
training. The recipe holds the settings, statistics and fusions; its hooks store post-training
weights as integers in checkpoints and convert an int8-kernel model once its weights are loaded.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from compressor.models.description import (
    ModelDescription,
    attach_stored_form,
    describe,
    description_of,
)
from compressor.quantization.int8.convert import convert_to_int8, kernels_saturate
from compressor.quantization.int8.onednn import ONEDNN, onednn_available
from compressor.quantization.int8.placement import int8_placement
from compressor.quantization.qat.build import qat_from_recipe
from compressor.quantization.simulated.packing import pack_state_dict, unpack_state_dict
from compressor.quantization.simulated.post_train import quantize_from_recipe
from compressor.utils.errors import CheckpointError

__all__ = ["QuantizationTransform", "QUANTIZATION", "quantization_kind", "int8_model"]

LOG = logging.getLogger("compressor")
QUANTIZATION = "quantization"
_KINDS = ("post_train", "qat")


def _post_training(recipe: Any) -> bool:
    return isinstance(recipe, Mapping) and recipe.get("kind") == "post_train"


class QuantizationTransform:
    """Quantization (compressor.quantization): post-training or quantization-aware training."""

    name = QUANTIZATION

    def apply(self, model: nn.Module, recipe: Any) -> nn.Module:
        """Give a freshly built float model the quantized structure its state_dict loads into."""
        if not isinstance(recipe, Mapping) or recipe.get("kind") not in _KINDS:
            raise CheckpointError(f"model_attrs holds a quantization recipe of unknown kind "
                                  f"({type(recipe).__name__}); upgrade compressor or use another "
                                  "checkpoint")
        if recipe["kind"] == "qat":
            return qat_from_recipe(model, {k: v for k, v in recipe.items() if k != "kind"})
        return quantize_from_recipe(model, recipe)

    def recipe_of(self, model: nn.Module) -> Any | None:
        """The quantization recipe."""
        return description_of(model).recipe(self.name)

    def pack_state(self, model: nn.Module, recipe: Any,
                   state: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Post-training quantized weights are saved as integers with their scales."""
        return pack_state_dict(model, state) if _post_training(recipe) else dict(state)

    def unpack_state(self, model: nn.Module, recipe: Any,
                     state: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The float state dict a post-training quantized model loads (inverse of pack_state)."""
        return unpack_state_dict(model, state) if _post_training(recipe) else dict(state)

    def after_load(self, model: nn.Module, recipe: Any) -> nn.Module:
        """With its weights loaded, a model quantized for int8 kernels is converted to them;
        where this CPU's kernels would saturate its 8-bit activations, it stays simulated
        (the simulation computes the integers the kernels computed where it was made)."""
        if not _post_training(recipe) or recipe.get("kernels") != "int8":
            return model
        backend = recipe.get("backend", "x86")
        if backend == ONEDNN and not onednn_available():
            LOG.info("this torch build lacks oneDNN's int8 kernels: the model runs on x86's")
            backend = "x86"
        reduced = bool(recipe.get("settings", {}).get("reduce_range", False))
        if not reduced and kernels_saturate(backend):
            LOG.warning("this CPU's %s int8 kernels saturate the model's 8-bit activations (no "
                        "VNNI): it runs simulated, computing the same integers", backend)
            return model
        return int8_model(model, backend)


def quantization_kind(description: ModelDescription) -> str | None:
    """'post_train' or 'qat' when the description records quantization, else None."""
    recipe = description.recipe(QUANTIZATION)
    return recipe.get("kind") if isinstance(recipe, Mapping) else None


def int8_model(simulated: nn.Module, backend: str) -> nn.Module:
    """The int8-kernel model of a simulated post-training quantized one (on the CPU), with its
    description, remembering `simulated` as the form checkpoints store."""
    int8_placement(simulated)
    converted = convert_to_int8(simulated, backend)
    return attach_stored_form(describe(converted, description_of(simulated)), simulated)
