"""Build a model from its description: registry builder, then the transforms its attrs name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from compressor.models.input_spec import InputSpec
from compressor.models.pretrained import load_pretrained_weights
from compressor.models.registry import create_model, get_arch_spec

__all__ = ["build_model", "FRAMEWORK_ATTRS"]

# Model attributes that the framework applies after the builder, in this order.
FRAMEWORK_ATTRS = ("memory_efficient", "thinning")


def build_model(arch: str, dataset: str, *, num_classes: int | None = None,
                input_spec: InputSpec | None = None, model_attrs: Mapping[str, Any] | None = None,
                pretrained: bool = False) -> nn.Module:
    """create_model with builder attrs, then memory variant and thinning from framework attrs."""
    attrs = dict(model_attrs or {})
    framework = {key: attrs.pop(key) for key in FRAMEWORK_ATTRS if attrs.get(key) is not None}
    spec = get_arch_spec(arch)
    model = create_model(arch, dataset, num_classes=num_classes, input_spec=input_spec,
                         model_attrs=attrs, pretrained=pretrained)
    if pretrained:
        load_pretrained_weights(model, spec)
    builder_attrs = dict(model.model_attrs)
    if "memory_efficient" in framework:
        from compressor.memory import apply_memory_variant

        model = apply_memory_variant(model, spec, framework["memory_efficient"])
    if "thinning" in framework:
        from compressor.thinning import apply_thinning_recipe

        model = apply_thinning_recipe(model, framework["thinning"])
    model.arch = arch
    model.dataset = dataset
    model.input_spec = input_spec or spec.input_spec(dataset)
    model.num_classes = num_classes or spec.num_classes(dataset)
    model.model_attrs = {**builder_attrs, **framework}
    return model
