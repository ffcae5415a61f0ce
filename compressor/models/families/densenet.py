"""DenseNet-BC (Huang et al.) for small (CIFAR) and large inputs.

Built from torchvision's DenseNet, so module and parameter names are torchvision's
(features.denseblock1.denselayer1.conv1.weight ...). `small_inputs` replaces the 7x7/2
stem and its max-pool by one 3x3 convolution, as for CIFAR. The efficient DenseNet (only
each dense layer's two convolution outputs kept, the concatenations, batch norms and ReLUs
recomputed in backward, exactly) is the framework's `--memory-efficient recompute` variant
(compressor.memory.dense), not a builder attribute; checkpoints that recorded the former
`efficient: True` attribute load as that variant.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn
from torchvision.models import DenseNet

from compressor.models.registry import register_model
from compressor.utils.input_spec import InputSpec

__all__ = ["densenet_bc"]

DATASETS = ("cifar10", "cifar100", "imagenet", "mnist", "fashion-mnist")
CHECKPOINT_BLOCKS = ("_DenseLayer",)


def densenet_bc(depth: int, growth_rate: int, num_classes: int, in_channels: int = 3,
                small_inputs: bool = True, drop_rate: float = 0.0) -> nn.Module:
    """DenseNet-BC with `depth` layers and growth rate `growth_rate` (torchvision's modules).

    Three dense blocks of (depth - 4) / 6 bottleneck layers, transitions that halve the
    channels (compression 0.5) and a stem of 2 * growth_rate channels.
    """
    if (depth - 4) % 6 or depth < 10:
        raise ValueError(f"DenseNet-BC depth must be 6n + 4, got {depth}")
    layers = (depth - 4) // 6
    init_features = 2 * growth_rate
    model = DenseNet(growth_rate=growth_rate, block_config=(layers, layers, layers),
                     num_init_features=init_features, bn_size=4, drop_rate=drop_rate,
                     num_classes=num_classes)
    stem: list[tuple[str, nn.Module]]
    if small_inputs:
        stem = [("conv0", nn.Conv2d(in_channels, init_features, 3, padding=1, bias=False))]
    else:
        stem = [("conv0", nn.Conv2d(in_channels, init_features, 7, stride=2, padding=3,
                                    bias=False)),
                ("norm0", model.features.norm0), ("relu0", model.features.relu0),
                ("pool0", model.features.pool0)]
    body = [(name, module) for name, module in model.features.named_children()
            if name not in ("conv0", "norm0", "relu0", "pool0")]
    model.features = nn.Sequential(OrderedDict(stem + body))
    nn.init.kaiming_normal_(model.features.conv0.weight)
    return model


def _register(depth: int, growth_rate: int) -> None:
    @register_model(f"densenet_bc_{depth}_cifar", datasets=DATASETS, family="densenet_cifar",
                    checkpoint_blocks=CHECKPOINT_BLOCKS,
                    model_attrs={"small_inputs": True, "drop_rate": 0.0})
    def build(*, num_classes: int, input_spec: InputSpec, small_inputs: bool,
              drop_rate: float) -> nn.Module:
        return densenet_bc(depth, growth_rate, num_classes, input_spec.channels,
                           small_inputs=small_inputs, drop_rate=drop_rate)


_register(40, 12)
_register(100, 12)
_register(250, 24)
