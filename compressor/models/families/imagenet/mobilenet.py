"""Distiller's MobileNet v1 (mobilenet, mobilenet_075/050/025), with its module names.

`model.0` is the stem; `model.1`..`model.13` are depthwise-separable blocks whose index 0 is
the 3x3 depthwise conv and index 3 the 1x1 pointwise conv (`model.4.3.weight` in schedules).
"""

from __future__ import annotations

from math import floor

from torch import Tensor, nn

from compressor.models.registry import register_model
from compressor.utils.input_spec import InputSpec

__all__ = ["MobileNetV1"]

BASE_CHANNELS = (32, 64, 128, 256, 512, 1024)
# (input width index, output width index, stride) of the 13 depthwise-separable blocks
BLOCKS = ((0, 1, 1), (1, 2, 2), (2, 2, 1), (2, 3, 2), (3, 3, 1), (3, 4, 2), (4, 4, 1),
          (4, 4, 1), (4, 4, 1), (4, 4, 1), (4, 4, 1), (4, 5, 2), (5, 5, 1))


def _conv_bn_relu(cin: int, cout: int, kernel: int, stride: int = 1,
                  groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, groups=groups,
                      bias=False),
            nn.BatchNorm2d(cout), nn.ReLU(inplace=False)]


class MobileNetV1(nn.Module):
    """Howard et al. 2017, with a width multiplier (channels floored, at least 8)."""

    def __init__(self, width: float = 1.0, num_classes: int = 1000, in_channels: int = 3,
                 min_channels: int = 8) -> None:
        super().__init__()
        if width <= 0:
            raise ValueError("MobileNet width must be > 0")
        ch = [max(floor(n * width), min_channels) for n in BASE_CHANNELS]
        layers: list[nn.Module] = [nn.Sequential(*_conv_bn_relu(in_channels, ch[0], 3, 2))]
        for cin, cout, stride in BLOCKS:
            layers.append(nn.Sequential(*_conv_bn_relu(ch[cin], ch[cin], 3, stride, ch[cin]),
                                        *_conv_bn_relu(ch[cin], ch[cout], 1)))
        layers.append(nn.AdaptiveAvgPool2d(1))  # Distiller's AvgPool2d(7) at 224 px
        self.model = nn.Sequential(*layers)
        self.fc = nn.Linear(ch[5], num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.model(x).flatten(1))


def _register(name: str, width: float) -> None:
    @register_model(name, datasets=("imagenet",), family="mobilenet_v1")
    def build(*, num_classes: int, input_spec: InputSpec) -> nn.Module:
        return MobileNetV1(width, num_classes, input_spec.channels)


for _name, _width in (("mobilenet", 1.0), ("mobilenet_075", 0.75), ("mobilenet_050", 0.5),
                      ("mobilenet_025", 0.25)):
    _register(_name, _width)
