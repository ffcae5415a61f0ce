"""Efficient DenseNet (Pleiss et al.): recompute each dense layer's bottleneck in backward.

A dense layer concatenates all earlier feature maps, so storing its concat + BN + ReLU makes
DenseNet's activation memory quadratic in depth. Here the layer keeps only its inputs (the
earlier layers' outputs, which exist anyway) and the input of its 3x3 convolution; the
concat, both batch norms, both ReLUs and the 1x1 convolution are recomputed in backward,
with the batch-norm statistics frozen during the recomputation (no double update).

torchvision's `_DenseBlock` (in torchvision's DenseNets and compressor's DenseNet-BC, built
from them) calls each `_DenseLayer`'s forward, which we do not own. So the block itself is
swapped: `EfficientDenseBlock` holds the very same layers under the very same keys (no name
changes) and runs them the efficient way; the layers' own forwards are never replaced.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models.densenet import _DenseBlock, _DenseLayer

from compressor.models.layers.checkpointing import exact_checkpoint, needs_checkpoint

__all__ = ["EfficientDenseBlock", "efficient_dense_layer", "has_dense_blocks",
           "make_densenet_efficient"]


def _bottleneck(layer: _DenseLayer, *features: Tensor) -> Tensor:
    """concat -> BN -> ReLU -> 1x1 conv -> BN -> ReLU: everything but the 3x3 convolution."""
    concatenated = torch.cat(features, 1)
    out = layer.conv1(layer.relu1(layer.norm1(concatenated)))
    return layer.relu2(layer.norm2(out))


def efficient_dense_layer(layer: _DenseLayer, features: Sequence[Tensor]) -> Tensor:
    """A dense layer's output, its bottleneck recomputed in backward instead of stored."""
    if needs_checkpoint(features):
        bottleneck = exact_checkpoint(lambda *f: _bottleneck(layer, *f), layer, *features)
    else:
        bottleneck = _bottleneck(layer, *features)
    new_features = layer.conv2(bottleneck)
    if layer.drop_rate > 0:
        new_features = F.dropout(new_features, p=layer.drop_rate, training=layer.training)
    return new_features


class EfficientDenseBlock(nn.ModuleDict):
    """The layers of a torchvision dense block, same keys, each run by efficient_dense_layer."""

    grad_checkpointing = True

    def __init__(self, block: nn.ModuleDict) -> None:
        super().__init__(block)
        self.training = block.training

    def forward(self, init_features: Tensor) -> Tensor:
        """Concatenation of the input and every layer's new features, as _DenseBlock's."""
        features = [init_features]
        for layer in self.values():
            features.append(efficient_dense_layer(layer, features))
        return torch.cat(features, 1)


def _is_dense_block(module: nn.Module) -> bool:
    return isinstance(module, _DenseBlock) and all(
        isinstance(layer, _DenseLayer) for layer in module.values())


def has_dense_blocks(model: nn.Module) -> bool:
    """Whether `model` has torchvision dense blocks (plain or already efficient)."""
    return any(_is_dense_block(m) or isinstance(m, EfficientDenseBlock) for m in model.modules())


def make_densenet_efficient(model: nn.Module) -> int:
    """Put an EfficientDenseBlock in the place of every dense block of `model`.

    torchvision's own `memory_efficient` flag is not used: it recomputes batch norm in
    training mode and so updates the running statistics twice per step. Parameter names do
    not change. Returns the number of dense layers made efficient.
    """
    count = 0
    for parent in list(model.modules()):
        for key, child in list(parent.named_children()):
            if _is_dense_block(child):
                setattr(parent, key, EfficientDenseBlock(child))
                count += len(child)
    return count
