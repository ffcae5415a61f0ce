"""Build a model from its ModelDescription: registry builder, weights, then transform recipes."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from compressor.assembly.recipes import apply_recipes
from compressor.models.description import ModelDescription, describe, description_of
from compressor.models.factory import create_model, get_arch_spec
from compressor.models.pretrained import PretrainedSource, load_pretrained_weights

__all__ = ["build_model"]


def build_model(description: ModelDescription, *, pretrained: bool = False,
                source: PretrainedSource | None = None,
                weights_file: Path | None = None) -> nn.Module:
    """create_model with the builder attrs (and pretrained weights: the arch's own or
    `weights_file`, all but `source.new_layers`), then the transforms in order.

    Returns a model whose description equals `description` (builder attributes resolved, the
    class names kept).
    """
    model = create_model(description.arch, description.dataset,
                         num_classes=description.num_classes, input_spec=description.input_spec,
                         model_attrs=description.builder_attrs, pretrained=pretrained)
    if pretrained:
        load_pretrained_weights(model, get_arch_spec(description.arch), source, weights_file)
    model = apply_recipes(model, description.transforms)
    if description.class_names:
        describe(model, description_of(model).with_class_names(description.class_names))
    return model
