"""CIFAR-style model families (32x32 inputs, also usable at 28x28 where noted)."""

from compressor.models.families.cifar import mobilenet_v2, resnet, vgg

__all__ = ["mobilenet_v2", "resnet", "vgg"]
