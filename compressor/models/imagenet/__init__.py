"""Distiller's own ImageNet models: MobileNet v1 and AlexNet with batch norm."""

from compressor.models.imagenet import alexnet_bn, mobilenet

__all__ = ["alexnet_bn", "mobilenet"]
