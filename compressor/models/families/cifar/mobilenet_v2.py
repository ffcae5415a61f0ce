"""MobileNetV2 for small (CIFAR / MNIST-sized) inputs: depthwise convolutions and residual adds.

torchvision's MobileNetV2 (its module and parameter names) with the small-input changes usual
for CIFAR: the stem convolution keeps the resolution (stride 1, the dataset's channels) and so
does the second stage, so a 32x32 (or 28x28) image ends at 4x4 rather than 1x1. Its residual
adds are functional (`x + self.conv(x)`), as in torchvision: the network quantization must
follow through the traced graph.
"""

from __future__ import annotations

from torch import nn
from torchvision.models import MobileNetV2
from torchvision.ops.misc import Conv2dNormActivation

from compressor.models.families.cifar.resnet import CIFAR_DATASETS
from compressor.models.registry import register_model
from compressor.utils.input_spec import InputSpec

__all__ = ["mobilenet_v2_small_inputs"]

# torchvision's stages (expansion t, channels c, repeats n, stride s), the second at stride 1
SMALL_INPUT_STAGES = [[1, 16, 1, 1], [6, 24, 2, 1], [6, 32, 3, 2], [6, 64, 4, 2],
                      [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1]]


def mobilenet_v2_small_inputs(num_classes: int, in_channels: int = 3,
                              width_mult: float = 1.0) -> nn.Module:
    """torchvision's MobileNetV2 with a stride-1 stem over `in_channels` and a stride-1 second
    stage, for 28-32 px images."""
    model = MobileNetV2(num_classes=num_classes, width_mult=width_mult,
                        inverted_residual_setting=SMALL_INPUT_STAGES)
    stem = model.features[0]
    out_channels = stem[0].out_channels
    model.features[0] = Conv2dNormActivation(in_channels, out_channels, stride=1,
                                             norm_layer=nn.BatchNorm2d,
                                             activation_layer=nn.ReLU6)
    nn.init.kaiming_normal_(model.features[0][0].weight, mode="fan_out")
    return model


def _register(name: str, width_mult: float) -> None:
    @register_model(name, datasets=CIFAR_DATASETS, family="mobilenet_v2_cifar")
    def build(*, num_classes: int, input_spec: InputSpec) -> nn.Module:
        return mobilenet_v2_small_inputs(num_classes, input_spec.channels, width_mult)


_register("mobilenet_v2_cifar", 1.0)
_register("mobilenet_v2_050_cifar", 0.5)
