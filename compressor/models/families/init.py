"""Weight initialisation shared by the ResNet-style families (He et al.'s, as torchvision's)."""

from __future__ import annotations

from torch import nn

__all__ = ["kaiming_conv_bn_init_"]


def kaiming_conv_bn_init_(model: nn.Module) -> None:
    """Kaiming-normal (fan_out, ReLU) convolutions; batch norms at weight 1, bias 0; in place."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
