"""The model families, set apart from the machinery that registers, builds and describes
them (compressor.models: registry, factory, description, pretrained weights, user code):
Distiller's CIFAR, ImageNet and MNIST families, DenseNet-BC, EfficientNet-Lite, torchvision's
classifiers and timm's models. Importing this package imports every family, so that its
@register_model decorators run."""

from compressor.models.families import (
    cifar,
    densenet,
    efficientnet_lite,
    imagenet,
    mnist,
    torchvision_models,
)
from compressor.models.families.cifar import preact_resnet

__all__ = ["cifar", "densenet", "efficientnet_lite", "imagenet", "mnist", "preact_resnet",
           "torchvision_models"]
