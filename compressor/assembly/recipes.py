"""The table of framework transforms applied after a model's builder, in recipe order.

Each transform is a small class with `apply(model, recipe)` (give a freshly built model the
structure the recipe records) and `recipe_of(model)` (the recipe it carries). The recipes are
plain values stored, in order, in the model's ModelDescription and so in the checkpoint's
`model_attrs["transforms"]`; `compressor.model_builder.build_model` replays them. A new
method that changes a model's structure adds one class here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from compressor.errors import CheckpointError
from compressor.models.description import (
    ModelDescription,
    TransformStep,
    describe,
    description_of,
    unwrap_model,
)
from compressor.models.registry import get_arch_spec

__all__ = ["Transform", "MemoryVariantTransform", "ThinningTransform", "QuantizationTransform",
           "TRANSFORMS", "QUANTIZATION", "get_transform", "apply_transform", "apply_recipes",
           "record_transform", "finish_loaded_model", "recipe_of", "thin", "probe_batch",
           "attach_stored_form", "stored_form", "quantization_kind", "int8_model"]

PROBE_SEED = 0  # thinning's probe batch is the same on every rank and in every rerun
QUANTIZATION = "quantization"
_STORED_FORM = "_compressor_stored_form"  # an int8 model's simulated source (what is saved)


class Transform(Protocol):
    """A structural change recorded as plain data and replayed on load."""

    name: str

    def apply(self, model: nn.Module, recipe: Any) -> nn.Module:
        """Give `model` the structure `recipe` records; returns the (possibly new) module."""
        ...

    def recipe_of(self, model: nn.Module) -> Any | None:
        """The recipe of this transform that `model` carries (None when not applied)."""
        ...


class MemoryVariantTransform:
    """`--memory-efficient recompute | inplace-abn` (compressor.memory)."""

    name = "memory_efficient"

    def apply(self, model: nn.Module, recipe: Any) -> nn.Module:
        """Turn the model into its memory-efficient variant `recipe`."""
        from compressor.memory import apply_memory_variant

        return apply_memory_variant(model, get_arch_spec(description_of(model).arch), recipe)

    def recipe_of(self, model: nn.Module) -> Any | None:
        """The variant name."""
        return description_of(model).recipe(self.name)


class ThinningTransform:
    """Removed filters and channels (compressor.thinning): a recipe of removed indices."""

    name = "thinning"

    def apply(self, model: nn.Module, recipe: Any) -> nn.Module:
        """Slice a freshly built model to the thinned shapes."""
        from compressor.thinning import apply_thinning_recipe

        return apply_thinning_recipe(model, recipe)

    def recipe_of(self, model: nn.Module) -> Any | None:
        """The composed recipe (indices of the freshly built model)."""
        return description_of(model).recipe(self.name)


class QuantizationTransform:
    """Quantization (compressor.quantization): post-training (simulated or int8 kernels) or
    quantization-aware training; the recipe holds the settings, statistics and fusions."""

    name = QUANTIZATION

    def apply(self, model: nn.Module, recipe: Any) -> nn.Module:
        """Give a freshly built float model the quantized structure its state_dict loads into."""
        if not isinstance(recipe, Mapping) or recipe.get("kind") not in ("post_train", "qat"):
            raise CheckpointError(f"model_attrs holds a quantization recipe of unknown kind "
                                  f"({type(recipe).__name__}); upgrade compressor or use another "
                                  "checkpoint")
        if recipe["kind"] == "qat":
            from compressor.quantization.qat_build import qat_from_recipe

            return qat_from_recipe(model, {k: v for k, v in recipe.items() if k != "kind"})
        from compressor.quantization.post_train import quantize_from_recipe

        return quantize_from_recipe(model, recipe)

    def recipe_of(self, model: nn.Module) -> Any | None:
        """The quantization recipe."""
        return description_of(model).recipe(self.name)

    def after_load(self, model: nn.Module, recipe: Any) -> nn.Module:
        """With its weights loaded, a model quantized for int8 kernels is converted to them."""
        if recipe.get("kind") != "post_train" or recipe.get("kernels") != "int8":
            return model
        return int8_model(model, recipe.get("backend", "x86"))


def quantization_kind(description: ModelDescription) -> str | None:
    """'post_train' or 'qat' when the description records quantization, else None."""
    recipe = description.recipe(QUANTIZATION)
    return recipe.get("kind") if isinstance(recipe, Mapping) else None


def int8_model(simulated: nn.Module, backend: str) -> nn.Module:
    """The int8-kernel model of a simulated post-training quantized one (on the CPU), with its
    description, remembering `simulated` as the form checkpoints store."""
    from compressor.quantization.int8 import convert_to_int8

    converted = convert_to_int8(simulated.cpu(), backend)
    return attach_stored_form(describe(converted, description_of(simulated)), simulated)


TRANSFORMS: Mapping[str, Transform] = MappingProxyType({
    transform.name: transform for transform in (
        MemoryVariantTransform(), ThinningTransform(), QuantizationTransform())})


def get_transform(name: str) -> Transform:
    """The transform registered under `name`; an unknown one means a newer checkpoint."""
    if name not in TRANSFORMS:
        raise CheckpointError(f"unknown model transform '{name}' in model_attrs (known: "
                              f"{', '.join(TRANSFORMS)}); upgrade compressor or use another "
                              "checkpoint")
    return TRANSFORMS[name]


def apply_transform(model: nn.Module, name: str, recipe: Any) -> nn.Module:
    """Apply one transform and record its recipe in the model's description."""
    description = description_of(model)
    transformed = get_transform(name).apply(model, recipe)
    return describe(transformed, description.with_transform(name, recipe))


def attach_stored_form(converted: nn.Module, simulated: nn.Module) -> nn.Module:
    """Remember the simulated model an int8 model was converted from (checkpoints save it)."""
    object.__setattr__(unwrap_model(converted), _STORED_FORM, simulated)
    return converted


def stored_form(model: nn.Module) -> nn.Module:
    """The model as a checkpoint stores it: an int8 model's simulated source, else itself."""
    inner = unwrap_model(model)
    return vars(inner).get(_STORED_FORM, inner)


def record_transform(model: nn.Module, name: str, recipe: Any) -> nn.Module:
    """Record in `model`'s description that transform `name` was applied with `recipe`."""
    get_transform(name)
    return describe(model, description_of(model).with_transform(name, recipe))


def finish_loaded_model(model: nn.Module) -> nn.Module:
    """After a rebuilt model's weights are loaded: the transforms' last steps (int8 kernels)."""
    for step in description_of(model).transforms:
        after_load = getattr(get_transform(step.name), "after_load", None)
        if after_load is not None:
            model = after_load(model, step.recipe)
    return model


def apply_recipes(model: nn.Module, steps: Iterable[TransformStep]) -> nn.Module:
    """Replay transform steps in order on a freshly built model."""
    for step in steps:
        model = apply_transform(model, step.name, step.recipe)
    return model


def recipe_of(model: nn.Module, name: str) -> Any | None:
    """The recipe of transform `name` that `model` carries."""
    return get_transform(name).recipe_of(model)


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
    from compressor.thinning import compose_recipes, thin_model

    inner = unwrap_model(model)
    description = description_of(inner)
    recipe = thin_model(inner, inputs=probe_batch(inner))
    composed = compose_recipes(description.recipe(ThinningTransform.name), recipe)
    describe(inner, description.with_transform(ThinningTransform.name, composed))
    return composed
