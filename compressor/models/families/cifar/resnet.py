"""Distiller's CIFAR ResNets (resnet20..110_cifar) and their shortcut-free plain20_cifar."""

from __future__ import annotations

from torch import Tensor, nn

from compressor.models.families.init import kaiming_conv_bn_init_
from compressor.models.layers.activation_checkpointing import checkpoint_stages
from compressor.models.layers.eltwise import EltwiseAdd
from compressor.models.layers.inplace_abn import InPlaceABN
from compressor.models.registry import register_model
from compressor.utils.input_spec import InputSpec

__all__ = ["BasicBlock", "ResNetCifar"]

CIFAR_DATASETS = ("cifar10", "cifar100", "mnist", "fashion-mnist")


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    """3x3 convolution with padding and no bias (a batch norm follows)."""
    return nn.Conv2d(in_planes, out_planes, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm; `residual=False` drops the shortcut (plain nets).

    Module names are Distiller's resnet_cifar's: relu1, relu2 and the shortcut's
    `residual_eltwiseadd(residual, out)`, so Distiller's statistics files and overrides apply.
    """

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None, residual: bool = True) -> None:
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu1 = nn.ReLU(inplace=False)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu2 = nn.ReLU(inplace=False)
        self.downsample = downsample
        self.residual = residual
        if residual:  # after relu2: in-place ABN pairs each bn with the next sibling
            self.residual_eltwiseadd = EltwiseAdd()

    def forward(self, x: Tensor) -> Tensor:
        out = self.conv2(self.relu1(self.bn1(self.conv1(x))))
        identity = None
        if self.residual:
            identity = x if self.downsample is None else self.downsample(x)
        if isinstance(self.bn2, InPlaceABN):  # fuses bn2, the residual add and relu2
            return self.relu2(self.bn2(out, identity))
        out = self.bn2(out)
        if identity is not None:
            out = self.residual_eltwiseadd(identity, out)
        return self.relu2(out)


class ResNetCifar(nn.Module):
    """conv-bn-relu stem, three stages of 16/32/64 channels, global pooling and one FC layer."""

    supports_inplace_abn = True  # each bn is applied right before its activation sibling

    def __init__(self, blocks_per_stage: int, num_classes: int, in_channels: int = 3,
                 residual: bool = True) -> None:
        super().__init__()
        self.inplanes = 16
        self.conv1 = conv3x3(in_channels, 16)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=False)
        self.layer1 = self._make_layer(16, blocks_per_stage, 1, residual)
        self.layer2 = self._make_layer(32, blocks_per_stage, 2, residual)
        self.layer3 = self._make_layer(64, blocks_per_stage, 2, residual)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64 * BasicBlock.expansion, num_classes)
        self.grad_checkpointing = False
        kaiming_conv_bn_init_(self)

    def _make_layer(self, planes: int, blocks: int, stride: int, residual: bool) -> nn.Sequential:
        downsample = None
        if residual and (stride != 1 or self.inplanes != planes):
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample, residual)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes, residual=residual) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute the residual blocks in backward instead of keeping their activations."""
        self.grad_checkpointing = enable

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        stages = (self.layer1, self.layer2, self.layer3)
        if self.grad_checkpointing:
            x = checkpoint_stages(stages, x)
        else:
            for stage in stages:
                x = stage(x)
        return self.fc(self.avgpool(x).flatten(1))


def _register_resnet(depth: int, residual: bool = True) -> None:
    name = f"{'resnet' if residual else 'plain'}{depth}_cifar"
    blocks = (depth - 2) // 6

    @register_model(name, datasets=CIFAR_DATASETS, family="resnet_cifar",
                    checkpoint_blocks=("BasicBlock",))
    def build(*, num_classes: int, input_spec: InputSpec) -> nn.Module:
        return ResNetCifar(blocks, num_classes, input_spec.channels, residual)


for _depth in (20, 32, 44, 56, 110):
    _register_resnet(_depth)
_register_resnet(20, residual=False)
