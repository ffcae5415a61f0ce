"""Distiller's alexnet_bn (AlexNet with batch norm, after TensorPack's DoReFa AlexNet).

Module indices follow Distiller (`features.0` .. `features.21`, `classifier.0` .. `.6`), so
its schedules address the same layers.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from compressor.models.registry import register_model
from compressor.utils.input_spec import InputSpec

__all__ = ["AlexNetBN"]


def _bn2d(channels: int) -> nn.BatchNorm2d:
    # TensorPack's settings (Distiller copied them): eps 1e-4 and PyTorch momentum 0.9.
    return nn.BatchNorm2d(channels, eps=1e-4, momentum=0.9)


class AlexNetBN(nn.Module):
    """Five convolutions (two of them grouped) and three FC layers, batch norm after each."""

    def __init__(self, num_classes: int = 1000, in_channels: int = 3) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 96, kernel_size=12, stride=4),  # 224 -> 54
            nn.ReLU(inplace=False),
            nn.Conv2d(96, 256, kernel_size=5, padding=2, groups=2, bias=False),
            _bn2d(256),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),  # 54 -> 27
            nn.ReLU(inplace=False),
            nn.Conv2d(256, 384, kernel_size=3, padding=1, bias=False),
            _bn2d(384),
            nn.MaxPool2d(kernel_size=3, stride=2, padding=1),  # 27 -> 14
            nn.ReLU(inplace=False),
            nn.Conv2d(384, 384, kernel_size=3, padding=1, groups=2, bias=False),
            _bn2d(384),
            nn.ReLU(inplace=False),
            nn.Conv2d(384, 256, kernel_size=3, padding=1, groups=2, bias=False),
            _bn2d(256),
            nn.MaxPool2d(kernel_size=3, stride=2),  # 14 -> 6
            nn.ReLU(inplace=False),
        )
        self.classifier = nn.Sequential(
            nn.Linear(256 * 6 * 6, 4096, bias=False),
            nn.BatchNorm1d(4096, eps=1e-4, momentum=0.9),
            nn.ReLU(inplace=False),
            nn.Linear(4096, 4096, bias=False),
            nn.BatchNorm1d(4096, eps=1e-4, momentum=0.9),
            nn.ReLU(inplace=False),
            nn.Linear(4096, num_classes),
        )
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                fan_in = (module.in_channels * module.kernel_size[0] * module.kernel_size[1]
                          if isinstance(module, nn.Conv2d) else module.in_features)
                nn.init.normal_(module.weight, 0.0, math.sqrt(2.0 / fan_in))
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.BatchNorm2d, nn.BatchNorm1d)):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x).flatten(1))


@register_model("alexnet_bn", datasets=("imagenet",), family="alexnet_bn")
def alexnet_bn(*, num_classes: int, input_spec: InputSpec) -> nn.Module:
    """Distiller's alexnet_bn."""
    return AlexNetBN(num_classes, input_spec.channels)
