"""Distiller's pre-activation ImageNet ResNets (preact_resnet18..152), with its module names.

He et al. 2016, "Identity Mappings in Deep Residual Networks", as Distiller built it
(distiller/models/imagenet/preresnet_imagenet.py): a conv1-bn1-relu1-maxpool stem, blocks that
open with `pre_bn`/`pre_relu` (except each first block of layer1, which the stem already
activated), `final_bn`/`final_relu` and `fc`. The shortcut's sum is an `add` module (Distiller
wrote `+=`), so statistics and quantizer overrides can name it.
"""

from __future__ import annotations

from torch import Tensor, nn

from compressor.models.families.init import kaiming_conv_bn_init_
from compressor.models.layers.activation_checkpointing import checkpoint_seq
from compressor.models.layers.eltwise import EltwiseAdd
from compressor.models.registry import register_model
from compressor.utils.input_spec import InputSpec

__all__ = ["PreactBasicBlock", "PreactBottleneck", "PreactResNet"]


def _conv(in_planes: int, out_planes: int, kernel: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel, stride=stride, padding=kernel // 2,
                     bias=False)


class _PreactBlock(nn.Module):
    """What both block kinds share: the optional pre-activation and the shortcut's add."""

    expansion = 1

    def __init__(self, inplanes: int, preactivate: bool) -> None:
        super().__init__()
        self.preactivate = preactivate
        if preactivate:
            self.pre_bn = nn.BatchNorm2d(inplanes)
            self.pre_relu = nn.ReLU(inplace=True)

    def _finish(self, downsample: nn.Module | None) -> None:
        # Registered last, so that the children are listed in the order forward runs them.
        self.downsample = downsample
        self.add = EltwiseAdd(inplace=True)

    def residual_branch(self, preact: Tensor) -> Tensor:
        """The convolutions, from the pre-activated input."""
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        """Pre-activate, run the branch, add the (downsampled pre-activated) input."""
        preact = self.pre_relu(self.pre_bn(x)) if self.preactivate else x
        out = self.residual_branch(preact)
        residual = x if self.downsample is None else self.downsample(preact)
        return self.add(out, residual)


class PreactBasicBlock(_PreactBlock):
    """[pre_bn, pre_relu], conv1, bn1_2, relu1_2, conv2 (3x3 each)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None, preactivate: bool = True) -> None:
        super().__init__(inplanes, preactivate)
        self.conv1 = _conv(inplanes, planes, 3, stride)
        self.bn1_2 = nn.BatchNorm2d(planes)
        self.relu1_2 = nn.ReLU(inplace=True)
        self.conv2 = _conv(planes, planes, 3)
        self._finish(downsample)

    def residual_branch(self, preact: Tensor) -> Tensor:
        """conv1-bn-relu-conv2."""
        return self.conv2(self.relu1_2(self.bn1_2(self.conv1(preact))))


class PreactBottleneck(_PreactBlock):
    """[pre_bn, pre_relu], 1x1 conv1, bn1_2, relu1_2, 3x3 conv2, bn2_3, relu2_3, 1x1 conv3."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None, preactivate: bool = True) -> None:
        super().__init__(inplanes, preactivate)
        self.conv1 = _conv(inplanes, planes, 1)
        self.bn1_2 = nn.BatchNorm2d(planes)
        self.relu1_2 = nn.ReLU(inplace=True)
        self.conv2 = _conv(planes, planes, 3, stride)
        self.bn2_3 = nn.BatchNorm2d(planes)
        self.relu2_3 = nn.ReLU(inplace=True)
        self.conv3 = _conv(planes, planes * self.expansion, 1)
        self._finish(downsample)

    def residual_branch(self, preact: Tensor) -> Tensor:
        """conv1-bn-relu-conv2-bn-relu-conv3."""
        out = self.relu1_2(self.bn1_2(self.conv1(preact)))
        return self.conv3(self.relu2_3(self.bn2_3(self.conv2(out))))


class PreactResNet(nn.Module):
    """Stem, four stages of pre-activation blocks, final bn-relu, global pooling and one FC."""

    def __init__(self, block: type[PreactBasicBlock | PreactBottleneck], layers: list[int],
                 num_classes: int = 1000, in_channels: int = 3) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu1 = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0], 1)
        self.layer2 = self._make_layer(block, 128, layers[1], 2)
        self.layer3 = self._make_layer(block, 256, layers[2], 2)
        self.layer4 = self._make_layer(block, 512, layers[3], 2)
        self.final_bn = nn.BatchNorm2d(512 * block.expansion)
        self.final_relu = nn.ReLU(inplace=True)
        self.avgpool = nn.AdaptiveAvgPool2d(1)  # Distiller's AvgPool2d(7) at 224 px; any size
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        self.grad_checkpointing = False
        kaiming_conv_bn_init_(self)

    def _make_layer(self, block: type[PreactBasicBlock | PreactBottleneck], planes: int,
                    blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(_conv(self.inplanes, planes * block.expansion, 1, stride))
        # layer1's first block is not pre-activated: the stem's bn1, relu1 (and maxpool) did it.
        layers = [block(self.inplanes, planes, stride, downsample, preactivate=stride != 1)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each pre-activation block in backward instead of keeping its activations."""
        self.grad_checkpointing = enable

    def forward(self, x: Tensor) -> Tensor:
        """Stem, stages, final pre-activation, pooling, classifier."""
        x = self.maxpool(self.relu1(self.bn1(self.conv1(x))))
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = checkpoint_seq(stage, x) if self.grad_checkpointing else stage(x)
        x = self.final_relu(self.final_bn(x))
        return self.fc(self.avgpool(x).flatten(1))


def _register(depth: int, block: type[PreactBasicBlock | PreactBottleneck],
              layers: tuple[int, int, int, int]) -> None:
    @register_model(f"preact_resnet{depth}", datasets=("imagenet",), family="preact_resnet",
                    checkpoint_blocks=(block.__name__,))
    def build(*, num_classes: int, input_spec: InputSpec) -> nn.Module:
        return PreactResNet(block, list(layers), num_classes, input_spec.channels)


for _depth, _block, _layers in ((18, PreactBasicBlock, (2, 2, 2, 2)),
                                (34, PreactBasicBlock, (3, 4, 6, 3)),
                                (50, PreactBottleneck, (3, 4, 6, 3)),
                                (101, PreactBottleneck, (3, 4, 23, 3)),
                                (152, PreactBottleneck, (3, 8, 36, 3))):
    _register(_depth, _block, _layers)
