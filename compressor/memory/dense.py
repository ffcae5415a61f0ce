"""Efficient DenseNet (Pleiss et al.): recompute each dense layer's bottleneck in backward.

A dense layer concatenates all earlier feature maps, so storing its concat + BN + ReLU makes
DenseNet's activation memory quadratic in depth. Here the layer keeps only its inputs (the
earlier layers' outputs, which exist anyway) and the input of its 3x3 convolution; the
concat, both batch norms, both ReLUs and the 1x1 convolution are recomputed in backward,
with the batch-norm statistics frozen during the recomputation (no double update).
Works on torchvision's `_DenseLayer` (and so on compressor's DenseNet-BC, built from it).
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from compressor.memory.checkpointing import exact_checkpoint

__all__ = ["make_densenet_efficient", "is_dense_layer", "efficient_dense_forward"]


def is_dense_layer(module: nn.Module) -> bool:
    """Whether `module` is a DenseNet layer with torchvision's structure and names."""
    return all(hasattr(module, name) for name in
               ("norm1", "relu1", "conv1", "norm2", "relu2", "conv2", "drop_rate"))


def _bottleneck(layer: nn.Module, *features: Tensor) -> Tensor:
    """concat -> BN -> ReLU -> 1x1 conv -> BN -> ReLU: everything but the 3x3 convolution."""
    concatenated = torch.cat(features, 1)
    out = layer.conv1(layer.relu1(layer.norm1(concatenated)))
    return layer.relu2(layer.norm2(out))


def efficient_dense_forward(self: nn.Module, input: Any) -> Tensor:
    """A dense layer's forward that recomputes its bottleneck instead of storing it."""
    features = [input] if isinstance(input, Tensor) else list(input)
    if torch.is_grad_enabled() and any(f.requires_grad for f in features):
        bottleneck = exact_checkpoint(lambda *f: _bottleneck(self, *f), self, *features)
    else:
        bottleneck = _bottleneck(self, *features)
    new_features = self.conv2(bottleneck)
    if self.drop_rate > 0:
        new_features = F.dropout(new_features, p=self.drop_rate, training=self.training)
    return new_features


def make_densenet_efficient(model: nn.Module, enabled: bool = True) -> int:
    """Switch every dense layer of `model` to (or back from) the efficient forward.

    torchvision's own `memory_efficient` flag is turned off: it recomputes batch norm in
    training mode and so updates the running statistics twice per step. Parameter names do
    not change. Returns the number of dense layers switched.
    """
    count = 0
    for module in model.modules():
        if not is_dense_layer(module):
            continue
        if hasattr(module, "memory_efficient"):
            module.memory_efficient = False
        if enabled:
            module.forward = types.MethodType(efficient_dense_forward, module)
        else:
            vars(module).pop("forward", None)
        count += 1
    return count
