"""Distiller's own ImageNet models: MobileNet v1, AlexNet with batch norm, the pre-activation
ResNets, and Cadene's ResNeXt-101 32x4d that Distiller took from `pretrainedmodels`."""

from compressor.models.families.imagenet import alexnet_bn, mobilenet, preact_resnet, resnext

__all__ = ["alexnet_bn", "mobilenet", "preact_resnet", "resnext"]
