"""ResNeXt-101 32x4d with the module tree of Cadene's `pretrainedmodels`, as Distiller used it.

Distiller took `resnext101_32x4d` from Cadene's package (a conversion of Facebook's Torch7
model), so its schedules name parameters by that tree: `features.4.0.0.0.0.0.weight` is
stage 1 (features.4), block 0, the block's two branches (0), the main branch (0), its first
conv-bn-relu-conv-bn-relu group (0) and that group's first convolution (0). Each block is
Sequential(branches, add, relu): the branches are Sequential(main, shortcut), the main branch
Sequential(Sequential(1x1, bn, relu, grouped 3x3, bn, relu), 1x1, bn) and the shortcut a
Sequential(1x1, bn) where the shape changes, else a parameter-free identity. Cadene's sum was a
lambda; here it is an `add` module at the same index.
"""

from __future__ import annotations

from torch import Tensor, nn

from compressor.models.families.init import kaiming_conv_bn_init_
from compressor.models.layers.eltwise import EltwiseAdd
from compressor.models.registry import register_model
from compressor.utils.input_spec import IMAGENET_MEAN, IMAGENET_STD, InputSpec

__all__ = ["Branches", "ResNeXtBlock", "CadeneResNeXt"]

# Cadene's preprocessing: 224 px crop of the image resized by 224 / 0.875, ImageNet mean/std.
CADENE_INPUT_SPEC = InputSpec((3, 224, 224), 256, 224, IMAGENET_MEAN, IMAGENET_STD, "bilinear")


class Branches(nn.Sequential):
    """Every child applied to the same input, their outputs as a tuple (Torch7's ConcatTable)."""

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        """(child_0(x), child_1(x), ...)."""
        return tuple(branch(x) for branch in self)


def _conv_bn(inplanes: int, planes: int, kernel: int, stride: int = 1,
             groups: int = 1) -> list[nn.Module]:
    conv = nn.Conv2d(inplanes, planes, kernel, stride, kernel // 2, groups=groups, bias=False)
    return [conv, nn.BatchNorm2d(planes)]


class ResNeXtBlock(nn.Sequential):
    """A bottleneck block as Sequential(Branches(main, shortcut), EltwiseAdd, ReLU)."""

    def __init__(self, inplanes: int, width: int, planes: int, stride: int,
                 groups: int) -> None:
        group = nn.Sequential(*_conv_bn(inplanes, width, 1), nn.ReLU(),
                              *_conv_bn(width, width, 3, stride, groups), nn.ReLU())
        main = nn.Sequential(group, *_conv_bn(width, planes, 1))
        shortcut: nn.Module = nn.Identity()
        if stride != 1 or inplanes != planes:
            shortcut = nn.Sequential(*_conv_bn(inplanes, planes, 1, stride))
        super().__init__(Branches(main, shortcut), EltwiseAdd(), nn.ReLU())

    def forward(self, x: Tensor) -> Tensor:
        """relu(main(x) + shortcut(x))."""
        main, shortcut = self[0](x)
        return self[2](self[1](main, shortcut))


class CadeneResNeXt(nn.Module):
    """`features` (stem and four stages), `avg_pool` and `last_linear`, as Cadene named them."""

    def __init__(self, layers: tuple[int, ...], groups: int, width_per_group: int,
                 num_classes: int = 1000, in_channels: int = 3) -> None:
        super().__init__()
        stem = [*_conv_bn(in_channels, 64, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
        stages: list[nn.Module] = []
        inplanes, width = 64, groups * width_per_group
        for index, blocks in enumerate(layers):
            planes = width * 2
            stride = 1 if index == 0 else 2
            stage = [ResNeXtBlock(inplanes, width, planes, stride, groups)]
            stage += [ResNeXtBlock(planes, width, planes, 1, groups) for _ in range(1, blocks)]
            stages.append(nn.Sequential(*stage))
            inplanes, width = planes, width * 2
        self.features = nn.Sequential(*stem, *stages)
        self.avg_pool = nn.AdaptiveAvgPool2d(1)  # Cadene's AvgPool2d(7) at 224 px; any size
        self.last_linear = nn.Linear(inplanes, num_classes)
        kaiming_conv_bn_init_(self)

    def forward(self, x: Tensor) -> Tensor:
        """Features, global average pooling, classifier."""
        return self.last_linear(self.avg_pool(self.features(x)).flatten(1))


@register_model("resnext101_32x4d", datasets=("imagenet",),
                input_specs={"imagenet": CADENE_INPUT_SPEC}, family="resnext_cadene",
                weights=None, checkpoint_blocks=("ResNeXtBlock",))
def resnext101_32x4d(*, num_classes: int, input_spec: InputSpec) -> nn.Module:
    """ResNeXt-101 (32 groups of 4 channels in stage 1), Cadene's module tree; no weights."""
    return CadeneResNeXt((3, 4, 23, 3), 32, 4, num_classes, input_spec.channels)
