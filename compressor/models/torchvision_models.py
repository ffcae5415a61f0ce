"""Every torchvision classification model, registered under its torchvision name.

Recomputation ("--memory-efficient recompute") of torchvision models keeps torchvision's
classes: compressor.memory swaps their block containers for name-keeping recomputing ones.
Inception v3 has no such container (its forward calls Mixed_5b ... Mixed_7c one by one), so
it is built as `CheckpointableInception3`, torchvision's class that opts in the timm way.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import torch
import torchvision
from torch import Tensor, nn
from torchvision.models import get_model, get_model_weights, list_models

from compressor.memory.checkpointing import checkpoint_seq
from compressor.models.input_spec import DATASET_INPUT_SPECS, InputSpec
from compressor.models.registry import register_model

__all__ = ["register_torchvision_models", "weights_input_spec", "CheckpointableInception3"]


class CheckpointableInception3(torchvision.models.Inception3):
    """torchvision's Inception v3 that can recompute its Mixed blocks in backward (opt-in)."""

    grad_checkpointing = False

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each Mixed block in backward instead of keeping its activations."""
        self.grad_checkpointing = enable

    def _forward(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """torchvision's _forward, with the Mixed blocks run through checkpoint_seq."""
        if not self.grad_checkpointing:
            return super()._forward(x)
        for stem in (self.Conv2d_1a_3x3, self.Conv2d_2a_3x3, self.Conv2d_2b_3x3, self.maxpool1,
                     self.Conv2d_3b_1x1, self.Conv2d_4a_3x3, self.maxpool2):
            x = stem(x)
        x = checkpoint_seq((self.Mixed_5b, self.Mixed_5c, self.Mixed_5d, self.Mixed_6a,
                            self.Mixed_6b, self.Mixed_6c, self.Mixed_6d, self.Mixed_6e), x)
        aux = self.AuxLogits(x) if self.AuxLogits is not None and self.training else None
        x = checkpoint_seq((self.Mixed_7a, self.Mixed_7b, self.Mixed_7c), x)
        x = torch.flatten(self.dropout(self.avgpool(x)), 1)
        return self.fc(x), aux


# torchvision builders replaced by a class of ours (same modules, same names), by model name.
OPT_IN_CLASSES: MappingProxyType[str, type[nn.Module]] = MappingProxyType({
    "inception_v3": CheckpointableInception3})

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
        if name in OPT_IN_CLASSES:  # what get_model(name, weights=None) builds, opted in
            return OPT_IN_CLASSES[name](num_classes=num_classes, **attrs)
        return get_model(name, weights=None, num_classes=num_classes, **attrs)


def register_torchvision_models() -> None:
    """Register all of torchvision.models' classification builders."""
    for name in list_models(module=torchvision.models):
        _register(name)


register_torchvision_models()
