"""Every torchvision classification model, registered under its torchvision name.

Recomputation ("--memory-efficient recompute") of torchvision models keeps torchvision's
classes: compressor.memory swaps their block containers for name-keeping recomputing ones.
Inception v3 has no such container (its forward calls Mixed_5b ... Mixed_7c one by one), so
it is built as `CheckpointableInception3`, torchvision's class that opts in the timm way.

The ResNet family (resnet*, resnext*, wide_resnet*) is torchvision's ResNet built with
Distiller's blocks (distiller/models/imagenet/resnet.py): each block's shared `relu` becomes
`relu1`, `relu2` (`relu3`) and its `+=` an `add` module, so activation statistics and
quantizer overrides name them as Distiller's did (`layer1.0.add`). Parameter names are
torchvision's, so torchvision's weights load unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import torch
import torchvision
from torch import Tensor, nn
from torchvision.models import get_model, get_model_weights, list_models
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

from compressor.models.layers.activation_checkpointing import checkpoint_seq
from compressor.models.layers.eltwise import EltwiseAdd
from compressor.models.registry import register_model
from compressor.utils.dataset_table import DATASET_INPUT_SPECS
from compressor.utils.input_spec import InputSpec

__all__ = ["register_torchvision_models", "weights_input_spec", "CheckpointableInception3",
           "CLASSIFIERS",
           "DistillerBasicBlock", "DistillerBottleneck", "DISTILLER_RESNETS"]


def _order_children(module: nn.Module, names: Sequence[str]) -> None:
    """Re-register `module`'s children in this order: the order forward runs them in."""
    children = [(name, getattr(module, name)) for name in names]
    for name, child in children:
        if child is not None:
            delattr(module, name)
    for name, child in children:
        if child is not None:
            setattr(module, name, child)


class DistillerBasicBlock(BasicBlock):
    """torchvision's BasicBlock with Distiller's relu1, relu2 and `add(out, identity)` modules."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        del self.relu  # used twice by torchvision: one module per use, as Distiller did
        self.relu1 = nn.ReLU(inplace=True)
        self.relu2 = nn.ReLU(inplace=True)
        self.add = EltwiseAdd(inplace=True)
        _order_children(self, ("conv1", "bn1", "relu1", "conv2", "bn2", "downsample", "add",
                               "relu2"))

    def forward(self, x: Tensor) -> Tensor:
        """conv-bn-relu1-conv-bn, add the (downsampled) input, relu2."""
        out = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu2(self.add(out, identity))


class DistillerBottleneck(Bottleneck):
    """torchvision's Bottleneck with Distiller's relu1..3 and `add(out, identity)` modules."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        del self.relu
        self.relu1 = nn.ReLU(inplace=True)
        self.relu2 = nn.ReLU(inplace=True)
        self.relu3 = nn.ReLU(inplace=True)
        self.add = EltwiseAdd(inplace=True)
        _order_children(self, ("conv1", "bn1", "relu1", "conv2", "bn2", "relu2", "conv3", "bn3",
                               "downsample", "add", "relu3"))

    def forward(self, x: Tensor) -> Tensor:
        """1x1, 3x3 (grouped), 1x1 convolutions with bn, add the (downsampled) input, relu3."""
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.relu2(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu3(self.add(out, identity))


# torchvision's ResNet builders, as (block, blocks per stage, ResNet keyword arguments).
ResNetConfig = tuple[type[BasicBlock | Bottleneck], tuple[int, ...], dict[str, int]]
DISTILLER_RESNETS: MappingProxyType[str, ResNetConfig] = MappingProxyType({
    "resnet18": (DistillerBasicBlock, (2, 2, 2, 2), {}),
    "resnet34": (DistillerBasicBlock, (3, 4, 6, 3), {}),
    "resnet50": (DistillerBottleneck, (3, 4, 6, 3), {}),
    "resnet101": (DistillerBottleneck, (3, 4, 23, 3), {}),
    "resnet152": (DistillerBottleneck, (3, 8, 36, 3), {}),
    "resnext50_32x4d": (DistillerBottleneck, (3, 4, 6, 3), {"groups": 32, "width_per_group": 4}),
    "resnext101_32x8d": (DistillerBottleneck, (3, 4, 23, 3),
                         {"groups": 32, "width_per_group": 8}),
    "resnext101_64x4d": (DistillerBottleneck, (3, 4, 23, 3),
                         {"groups": 64, "width_per_group": 4}),
    "wide_resnet50_2": (DistillerBottleneck, (3, 4, 6, 3), {"width_per_group": 128}),
    "wide_resnet101_2": (DistillerBottleneck, (3, 4, 23, 3), {"width_per_group": 128}),
})


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
    ("resnet", ("DistillerBasicBlock", "DistillerBottleneck")),
    ("resnext", ("DistillerBottleneck",)),
    ("wide_resnet", ("DistillerBottleneck",)),
    ("mobilenet_v2", ("InvertedResidual",)),
    ("inception_v3", ("InceptionA", "InceptionB", "InceptionC", "InceptionD", "InceptionE")),
    ("densenet", ("_DenseLayer",)),
)

# The classification head(s) by model-name prefix (first match): the layers a pretrained
# backbone leaves out when fine-tuned on other classes (each built as its family initialises it).
CLASSIFIERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("alexnet", ("classifier.6",)),
    ("vgg", ("classifier.6",)),
    ("convnext", ("classifier.2",)),
    ("densenet", ("classifier",)),
    ("efficientnet", ("classifier.1",)),
    ("googlenet", ("fc", "aux1.fc2", "aux2.fc2")),
    ("inception_v3", ("fc", "AuxLogits.fc")),
    ("maxvit", ("classifier.5",)),
    ("mnasnet", ("classifier.1",)),
    ("mobilenet_v2", ("classifier.1",)),
    ("mobilenet_v3", ("classifier.3",)),
    ("squeezenet", ("classifier.1",)),
    ("swin", ("head",)),
    ("vit_", ("heads.head",)),
    ("", ("fc",)),  # ResNet, ResNeXt, Wide ResNet, RegNet, ShuffleNet
)

# Builders whose model fixes its input size, and the argument that sets it, by model-name
# prefix: built from scratch a ViT defaults to 224 px, whatever size its InputSpec (from its
# weights: vit_h_14's are at 518 px) feeds it.
INPUT_SIZE_ARGS: tuple[tuple[str, str], ...] = (("vit_", "image_size"),)

# Models whose torchvision defaults we change: both get their input normalization from the
# InputSpec (transform_input=False, which its weights' measured top-1 favours) and train with
# their aux heads (the registry's aux-logits loss).
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
    classifier = next(layers for prefix, layers in CLASSIFIERS if name.startswith(prefix))
    model_attrs = special.get("model_attrs", {})
    size_arg = next((arg for prefix, arg in INPUT_SIZE_ARGS if name.startswith(prefix)), None)

    @register_model(name, datasets=("imagenet",), input_specs={"imagenet": spec},
                    weights=str(weights) if weights is not None else None,
                    family="torchvision", checkpoint_blocks=blocks, classifier=classifier,
                    **special)
    def build(*, num_classes: int, input_spec: InputSpec, **attrs: Any) -> nn.Module:
        if model_attrs:  # Inception/GoogLeNet: avoid the slow scipy-free init warning path
            attrs.setdefault("init_weights", True)
        if size_arg is not None:  # the size the InputSpec feeds
            attrs.setdefault(size_arg, input_spec.crop_size)
        if name in OPT_IN_CLASSES:  # what get_model(name, weights=None) builds, opted in
            return OPT_IN_CLASSES[name](num_classes=num_classes, **attrs)
        if name in DISTILLER_RESNETS:  # what get_model(name, weights=None) builds, renamed
            block, layers, config = DISTILLER_RESNETS[name]
            return ResNet(block, list(layers), num_classes=num_classes, **config, **attrs)
        return get_model(name, weights=None, num_classes=num_classes, **attrs)


def register_torchvision_models() -> None:
    """Register all of torchvision.models' classification builders."""
    for name in list_models(module=torchvision.models):
        _register(name)


register_torchvision_models()
