"""Distiller's CIFAR VGGs (vgg11..19_cifar and their _bn variants), with its module names."""

from __future__ import annotations

from types import MappingProxyType

from torch import Tensor, nn

from compressor.models.layers.activation_checkpointing import block_segments, checkpoint_seq
from compressor.models.layers.inplace_abn import InPlaceABN
from compressor.models.layers.light_pool import run_light_sequential
from compressor.models.registry import register_model
from compressor.utils.input_spec import InputSpec

__all__ = ["VGGCifar", "make_vgg_features", "VGG_CONFIGS"]

VGG_CONFIGS: MappingProxyType[int, tuple[int | str, ...]] = MappingProxyType({
    11: (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    13: (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    16: (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
         512, 512, 512, "M"),
    19: (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
         512, 512, 512, 512, "M"),
})


def make_vgg_features(config: tuple[int | str, ...], in_channels: int,
                      batch_norm: bool) -> nn.Sequential:
    """conv (+bn) + relu per number, 2x2 max-pool per 'M', indexed as in Distiller."""
    layers: list[nn.Module] = []
    for item in config:
        if item == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            continue
        layers.append(nn.Conv2d(in_channels, int(item), kernel_size=3, padding=1))
        if batch_norm:
            layers.append(nn.BatchNorm2d(int(item)))
        layers.append(nn.ReLU(inplace=False))
        in_channels = int(item)
    return nn.Sequential(*layers)


class VGGCifar(nn.Module):
    """VGG features on 32x32 inputs followed by a single linear classifier."""

    supports_inplace_abn = True  # each bn is applied right before its activation sibling

    def __init__(self, features: nn.Sequential, num_classes: int) -> None:
        super().__init__()
        self.features = features
        self.classifier = nn.Linear(512, num_classes)
        self.grad_checkpointing = False
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0, 0.01)
                nn.init.zeros_(module.bias)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each convolution and the layers up to the next one in backward."""
        self.grad_checkpointing = enable

    def forward(self, x: Tensor) -> Tensor:
        if self.grad_checkpointing:
            x = checkpoint_seq(self.features, x,
                               segments=block_segments(self.features, ["Conv2d"]))
        elif any(isinstance(m, InPlaceABN) and m.fused for m in self.features):
            # In-place ABN variant: its pools keep byte-sized argmaxes and the conv after a
            # pool recomputes the pooled map, so one map per conv is saved for backward.
            x = run_light_sequential(self.features, x)
        else:
            x = self.features(x)
        return self.classifier(x.flatten(1))


def _register_vgg(depth: int, batch_norm: bool) -> None:
    name = f"vgg{depth}{'_bn' if batch_norm else ''}_cifar"

    @register_model(name, datasets=("cifar10", "cifar100"), family="vgg_cifar",
                    checkpoint_blocks=("Conv2d",))
    def build(*, num_classes: int, input_spec: InputSpec) -> nn.Module:
        features = make_vgg_features(VGG_CONFIGS[depth], input_spec.channels, batch_norm)
        return VGGCifar(features, num_classes)


for _depth in VGG_CONFIGS:
    _register_vgg(_depth, batch_norm=False)
    _register_vgg(_depth, batch_norm=True)
