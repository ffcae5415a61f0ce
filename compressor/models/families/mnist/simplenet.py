"""Distiller's simplenet_mnist (LeNet-style) and a small CNN for the embedded 8x8 digits."""

from __future__ import annotations

from torch import Tensor, nn

from compressor.models.registry import register_model
from compressor.utils.input_spec import InputSpec

__all__ = ["SimpleNetMnist", "SimpleNetDigits"]


class SimpleNetMnist(nn.Module):
    """Two 5x5 convolutions with max-pooling and two fully connected layers (28x28 inputs)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 20, 5, 1)
        self.relu1 = nn.ReLU(inplace=False)
        self.pool1 = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(20, 50, 5, 1)
        self.relu2 = nn.ReLU(inplace=False)
        self.pool2 = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(4 * 4 * 50, 500)
        self.relu3 = nn.ReLU(inplace=False)
        self.fc2 = nn.Linear(500, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool1(self.relu1(self.conv1(x)))
        x = self.pool2(self.relu2(self.conv2(x)))
        return self.fc2(self.relu3(self.fc1(x.flatten(1))))


class SimpleNetDigits(nn.Module):
    """Three 3x3 conv-bn-relu layers, one max-pool and a linear head for 8x8 digits."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: int = 32) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu1 = nn.ReLU(inplace=False)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(2 * width)
        self.relu2 = nn.ReLU(inplace=False)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv3 = nn.Conv2d(2 * width, 4 * width, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(4 * width)
        self.relu3 = nn.ReLU(inplace=False)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4 * width, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.pool(self.relu2(self.bn2(self.conv2(x))))
        x = self.relu3(self.bn3(self.conv3(x)))
        return self.fc(self.avgpool(x).flatten(1))


@register_model("simplenet_mnist", datasets=("mnist", "fashion-mnist"), family="simplenet")
def simplenet_mnist(*, num_classes: int, input_spec: InputSpec) -> nn.Module:
    """Distiller's simplenet_mnist."""
    return SimpleNetMnist(num_classes, input_spec.channels)


@register_model("simplenet_digits", datasets=("digits",), family="simplenet",
                model_attrs={"width": 32})
def simplenet_digits(*, num_classes: int, input_spec: InputSpec, width: int) -> nn.Module:
    """A small CNN for scikit-learn's 8x8 digits (the embedded default dataset)."""
    return SimpleNetDigits(num_classes, input_spec.channels, width)
