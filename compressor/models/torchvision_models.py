"""Every torchvision classification model, registered under its torchvision name."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import torchvision
from torch import nn
from torchvision.models import get_model, get_model_weights, list_models

from compressor.models.input_spec import DATASET_INPUT_SPECS, InputSpec
from compressor.models.registry import register_model

__all__ = ["register_torchvision_models", "weights_input_spec"]

# Blocks that activation checkpointing recomputes, by model-name prefix.
CHECKPOINT_BLOCKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("resnet", ("BasicBlock", "Bottleneck")),
    ("resnext", ("Bottleneck",)),
    ("wide_resnet", ("Bottleneck",)),
    ("mobilenet_v2", ("InvertedResidual",)),
    ("inception_v3", ("InceptionA", "InceptionB", "InceptionC", "InceptionD", "InceptionE")),
    ("densenet", ("_DenseLayer",)),
)

# Models whose torchvision defaults we change, with the reason in DESIGN.md: both get their
# input normalization from the InputSpec (transform_input=False) and train with aux heads.
SPECIAL_CASES: MappingProxyType[str, dict[str, Any]] = MappingProxyType({
    "inception_v3": dict(loss="inception_aux",
                         model_attrs={"transform_input": False, "aux_logits": True}),
    "googlenet": dict(loss="googlenet_aux",
                      model_attrs={"transform_input": False, "aux_logits": True},
                      # torchvision's pretrained GoogLeNet aux heads are untrained: drop them.
                      pretrained_attrs={"aux_logits": False},
                      mean_std=((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))),
})


def weights_input_spec(weights: Any) -> InputSpec:
    """The InputSpec that a torchvision weights entry's own preprocessing metadata gives."""
    preprocess = weights.transforms()
    crop = int(preprocess.crop_size[0])
    resize = int(preprocess.resize_size[0])
    return InputSpec((3, crop, crop), resize, crop, tuple(preprocess.mean), tuple(preprocess.std),
                     preprocess.interpolation.value)


def _register(name: str) -> None:
    special = dict(SPECIAL_CASES.get(name, {}))
    mean_std = special.pop("mean_std", None)
    try:
        weights = get_model_weights(name).DEFAULT
    except (ValueError, AttributeError):
        weights = None
    spec = weights_input_spec(weights) if weights is not None else DATASET_INPUT_SPECS["imagenet"]
    if mean_std is not None:
        spec = InputSpec(spec.input_size, spec.resize_size, spec.crop_size, *mean_std,
                         spec.interpolation)
    blocks = next((b for prefix, b in CHECKPOINT_BLOCKS if name.startswith(prefix)), ())
    model_attrs = special.get("model_attrs", {})

    @register_model(name, datasets=("imagenet",), input_specs={"imagenet": spec},
                    weights=str(weights) if weights is not None else None,
                    family="torchvision", checkpoint_blocks=blocks, **special)
    def build(*, num_classes: int, input_spec: InputSpec, **attrs: Any) -> nn.Module:
        if model_attrs:  # Inception/GoogLeNet: avoid the slow scipy-free init warning path
            attrs.setdefault("init_weights", True)
        return get_model(name, weights=None, num_classes=num_classes, **attrs)


def register_torchvision_models() -> None:
    """Register all of torchvision.models' classification builders."""
    for name in list_models(module=torchvision.models):
        _register(name)


register_torchvision_models()
