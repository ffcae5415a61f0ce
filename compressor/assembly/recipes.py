"""The table of recipes: structural changes applied after a model's builder, in recorded order.

A recipe is a method's Transform: a small class with `apply(model, recipe)` (give a freshly
built model the structure the recipe records) and `recipe_of(model)`, and optionally the hooks
`pack_state` / `unpack_state` (weights a checkpoint stores in the method's own form) and
`after_load` (a last step once the weights are in, such as int8 conversion). The recipes are
plain values stored, in order, in the model's ModelDescription and so in the checkpoint's
`model_attrs["transforms"]`; compressor.assembly.builder replays them. A method that changes a
model's structure adds its Transform class in its own package and one line to TRANSFORMS.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

from torch import nn

from compressor.memory.recipe import MemoryVariantTransform
from compressor.models.description import TransformStep, describe, description_of
from compressor.quantization.recipe import QuantizationTransform
from compressor.thinning.transform import ThinningTransform
from compressor.utils.errors import CheckpointError

__all__ = ["Transform", "TRANSFORMS", "get_transform", "apply_transform", "apply_recipes",
           "record_transform", "finish_loaded_model", "recipe_of"]


class Transform(Protocol):
    """A structural change recorded as plain data and replayed on load."""

    name: str

    def apply(self, model: nn.Module, recipe: Any) -> nn.Module:
        """Give `model` the structure `recipe` records; returns the (possibly new) module."""
        ...

    def recipe_of(self, model: nn.Module) -> Any | None:
        """The recipe of this transform that `model` carries (None when not applied)."""
        ...


TRANSFORMS: Mapping[str, Transform] = MappingProxyType({
    transform.name: transform for transform in (
        MemoryVariantTransform(),
        ThinningTransform(),
        QuantizationTransform(),
    )})


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
