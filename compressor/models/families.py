"""Imports every model family so that its @register_model decorators run."""

from compressor.models import cifar, mnist, torchvision_models

__all__ = ["cifar", "mnist", "torchvision_models"]
