"""Distiller's pre-activation CIFAR ResNets (preact_resnet20..110_cifar), with its module names."""

from __future__ import annotations

from torch import Tensor, nn

from compressor.models.families.cifar.resnet import CIFAR_DATASETS, conv3x3
from compressor.models.layers.activation_checkpointing import checkpoint_seq
from compressor.models.layers.eltwise import EltwiseAdd
from compressor.models.registry import register_model
from compressor.utils.input_spec import InputSpec

__all__ = ["PreactBasicBlock", "PreactResNetCifar", "channel_pad_downsample"]


class ChannelPad(nn.Module):
    """Zero-pads the channel dimension on both sides (the identity shortcut's widening)."""

    def __init__(self, pad: int) -> None:
        super().__init__()
        self.pad = pad

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.pad(x, (0, 0, 0, 0, self.pad, self.pad))


def channel_pad_downsample(inplanes: int) -> nn.Sequential:
    """Distiller's parameter-free shortcut: 2x2 average pooling, then zero channels both sides."""
    return nn.Sequential(nn.AvgPool2d(2), ChannelPad(inplanes // 2))


class PreactBasicBlock(nn.Module):
    """bn-relu-conv twice (He et al. 2016, identity mappings); the shortcut adds the input.

    Distiller's module names, plus `add` (out, residual) for the shortcut's sum, which
    Distiller computed with a bare `+=` that statistics and quantizers could not name.
    """

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None, preact_downsample: bool = True) -> None:
        super().__init__()
        self.pre_bn = nn.BatchNorm2d(inplanes)
        self.pre_relu = nn.ReLU(inplace=False)
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=False)
        self.conv2 = conv3x3(planes, planes)
        self.downsample = downsample
        self.preact_downsample = preact_downsample
        self.add = EltwiseAdd()

    def forward(self, x: Tensor) -> Tensor:
        preact = self.pre_relu(self.pre_bn(x))
        out = self.conv2(self.relu(self.bn(self.conv1(preact))))
        if self.downsample is None:
            residual = x
        else:
            residual = self.downsample(preact if self.preact_downsample else x)
        return self.add(out, residual)


class PreactResNetCifar(nn.Module):
    """conv stem, three stages of pre-activation blocks, final bn-relu, pooling and one FC."""

    def __init__(self, blocks_per_stage: int, num_classes: int, in_channels: int = 3,
                 conv_downsample: bool = False) -> None:
        super().__init__()
        self.inplanes = 16
        self.conv1 = nn.Conv2d(in_channels, 16, kernel_size=3, padding=1, bias=False)
        self.layer1 = self._make_layer(16, blocks_per_stage, 1, conv_downsample)
        self.layer2 = self._make_layer(32, blocks_per_stage, 2, conv_downsample)
        self.layer3 = self._make_layer(64, blocks_per_stage, 2, conv_downsample)
        self.final_bn = nn.BatchNorm2d(64)
        self.final_relu = nn.ReLU(inplace=False)
        self.avgpool = nn.AdaptiveAvgPool2d(1)  # Distiller's AvgPool2d(8) at 32x32; any size here
        self.fc = nn.Linear(64, num_classes)
        self.grad_checkpointing = False

    def _make_layer(self, planes: int, blocks: int, stride: int,
                    conv_downsample: bool) -> nn.Sequential:
        downsample: nn.Module | None = None
        if stride != 1 or self.inplanes != planes:
            downsample = (nn.Conv2d(self.inplanes, planes, 1, stride=stride, bias=False)
                          if conv_downsample else channel_pad_downsample(self.inplanes))
        layers = [PreactBasicBlock(self.inplanes, planes, stride, downsample, conv_downsample)]
        self.inplanes = planes
        layers += [PreactBasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each pre-activation block in backward instead of keeping its activations."""
        self.grad_checkpointing = enable

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv1(x)
        for stage in (self.layer1, self.layer2, self.layer3):
            x = checkpoint_seq(stage, x) if self.grad_checkpointing else stage(x)
        x = self.final_relu(self.final_bn(x))
        return self.fc(self.avgpool(x).flatten(1))


def _register(depth: int) -> None:
    blocks = (depth - 2) // 6

    @register_model(f"preact_resnet{depth}_cifar", datasets=CIFAR_DATASETS,
                    family="preact_resnet_cifar", model_attrs={"conv_downsample": False},
                    checkpoint_blocks=("PreactBasicBlock",))
    def build(*, num_classes: int, input_spec: InputSpec, conv_downsample: bool) -> nn.Module:
        return PreactResNetCifar(blocks, num_classes, input_spec.channels, conv_downsample)


for _depth in (20, 32, 44, 56, 110):
    _register(_depth)
