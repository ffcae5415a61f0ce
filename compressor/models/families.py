"""Imports every model family so that its @register_model decorators run."""

from compressor.models import (
    cifar,
    densenet,
    efficientnet_lite,
    imagenet,
    mnist,
    torchvision_models,
)
from compressor.models.cifar import preact_resnet

__all__ = ["cifar", "densenet", "efficientnet_lite", "imagenet", "mnist", "preact_resnet",
           "torchvision_models"]
