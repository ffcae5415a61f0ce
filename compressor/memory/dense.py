"""Efficient DenseNet (Pleiss et al.): keep the convolutions' outputs, recompute the rest.

A dense layer concatenates all earlier feature maps, so storing its concat + BN + ReLU makes
DenseNet's activation memory quadratic in depth. Here a dense layer keeps only the outputs of
its two convolutions (48 + 12 channels in DenseNet-BC), as gpleiss's efficient DenseNet does
with shared memory: the concatenation, norm1 and relu1 are recomputed in backward from the
earlier layers' outputs (which exist anyway), and norm2 and relu2 from conv1's output. The
convolutions are not recomputed: checkpoint's early stop ends a recomputation once it has
brought back the convolution's input. The module after a dense block (a transition, or the
final batch norm) concatenates the block's features inside its own recomputed segment, so
no block's concatenation is kept either. Batch-norm statistics are frozen during every
recomputation (FrozenNormStats of compressor.models.layers.activation_checkpointing): one
update per step.

torchvision's `_DenseBlock` (in torchvision's DenseNets and compressor's DenseNet-BC, built
from them) calls each `_DenseLayer`'s forward, which we do not own. So containers are
swapped: `EfficientDenseBlock` holds the very same layers under the very same keys and runs
them the efficient way, and `EfficientDenseFeatures` holds the very same children as the
Sequential around the blocks (a DenseNet's `features`); no name changes and the layers' own
forwards are never replaced.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models.densenet import _DenseBlock, _DenseLayer

from compressor.models.layers.activation_checkpointing import exact_checkpoint, needs_checkpoint

__all__ = ["EfficientDenseBlock", "EfficientDenseFeatures", "efficient_dense_layer",
           "has_dense_blocks", "make_densenet_efficient"]


def _bottleneck(layer: _DenseLayer, *features: Tensor) -> Tensor:
    """concat -> norm1 -> relu1 -> conv1 (1x1): the bottleneck's output."""
    return layer.conv1(layer.relu1(layer.norm1(torch.cat(features, 1))))


def _new_features(layer: _DenseLayer, bottleneck: Tensor) -> Tensor:
    """norm2 -> relu2 -> conv2 (3x3): the layer's new feature maps, before dropout."""
    return layer.conv2(layer.relu2(layer.norm2(bottleneck)))


def efficient_dense_layer(layer: _DenseLayer, features: Sequence[Tensor]) -> Tensor:
    """A dense layer's output; only its two convolutions' outputs are kept for backward.

    Two recomputed segments, each ending in a convolution whose output is the segment's
    output: (concat, norm1, relu1, conv1) and (norm2, relu2, conv2). Neither draws random
    numbers (dropout comes after), so no RNG state is stashed.
    """
    if needs_checkpoint(features):
        bottleneck = exact_checkpoint(lambda *f: _bottleneck(layer, *f), layer.norm1,
                                      *features, preserve_rng_state=False)
        new_features = exact_checkpoint(lambda b: _new_features(layer, b), layer.norm2,
                                        bottleneck, preserve_rng_state=False)
    else:
        new_features = _new_features(layer, _bottleneck(layer, *features))
    if layer.drop_rate > 0:
        new_features = F.dropout(new_features, p=layer.drop_rate, training=layer.training)
    return new_features


def _concatenated_into(module: nn.Module, features: Sequence[Tensor]) -> Tensor:
    """`module(torch.cat(features, 1))`, the concatenation recomputed rather than kept."""
    if needs_checkpoint(features):
        return exact_checkpoint(lambda *f: module(torch.cat(f, 1)), module, *features)
    return module(torch.cat(features, 1))


class EfficientDenseBlock(nn.ModuleDict):
    """The layers of a torchvision dense block, same keys, each run by efficient_dense_layer."""

    grad_checkpointing = True

    def __init__(self, block: nn.ModuleDict) -> None:
        super().__init__(block)
        self.training = block.training

    def features(self, init_features: Tensor) -> list[Tensor]:
        """The input and every layer's new features, not concatenated."""
        features = [init_features]
        for layer in self.values():
            features.append(efficient_dense_layer(layer, features))
        return features

    def forward(self, init_features: Tensor) -> Tensor:
        """Concatenation of the input and every layer's new features, as _DenseBlock's."""
        return torch.cat(self.features(init_features), 1)


class EfficientDenseFeatures(nn.Sequential):
    """The children of the Sequential around dense blocks, same keys (a DenseNet's features).

    A child that follows an EfficientDenseBlock gets the block's features and concatenates
    them itself, inside a recomputed segment: the block's concatenation, which a transition's
    or the final batch norm would keep, is recomputed in backward instead.
    """

    grad_checkpointing = True

    def __init__(self, modules: nn.Sequential | Mapping[str, nn.Module] | None = None) -> None:
        # A mapping too: nn.Sequential's slicing builds `type(self)(OrderedDict(...))`.
        items = (modules.named_children() if isinstance(modules, nn.Module)
                 else (modules or {}).items())
        super().__init__(OrderedDict(items))
        if isinstance(modules, nn.Module):
            self.training = modules.training

    def forward(self, x: Tensor) -> Tensor:
        """Run the children in order; a dense block's successor concatenates its features."""
        features: list[Tensor] | None = None  # of the dense block just run
        for module in self:
            if features is not None and not isinstance(module, EfficientDenseBlock):
                x, features = _concatenated_into(module, features), None
                continue
            if features is not None:  # two blocks in a row: the second's input is plain
                x, features = torch.cat(features, 1), None
            if isinstance(module, EfficientDenseBlock):
                features = module.features(x)
            else:
                x = module(x)
        return x if features is None else torch.cat(features, 1)


def _is_dense_block(module: nn.Module) -> bool:
    return isinstance(module, _DenseBlock) and all(
        isinstance(layer, _DenseLayer) for layer in module.values())


def has_dense_blocks(model: nn.Module) -> bool:
    """Whether `model` has torchvision dense blocks (plain or already efficient)."""
    return any(_is_dense_block(m) or isinstance(m, EfficientDenseBlock) for m in model.modules())


def make_densenet_efficient(model: nn.Module) -> int:
    """Make every dense block of `model` (and the Sequential around it) efficient, in place.

    torchvision's own `memory_efficient` flag is not used: it recomputes batch norm in
    training mode and so updates the running statistics twice per step, and it keeps the
    input of each layer's 3x3 convolution and every concatenation. Parameter and buffer names
    do not change. Returns the number of dense layers made efficient.
    """
    count = 0
    for parent in list(model.modules()):
        for key, child in list(parent.named_children()):
            if _is_dense_block(child):
                setattr(parent, key, EfficientDenseBlock(child))
                count += len(child)
    for parent in list(model.modules()):
        for key, child in list(parent.named_children()):
            if type(child) is nn.Sequential and any(
                    isinstance(m, EfficientDenseBlock) for m in child.children()):
                setattr(parent, key, EfficientDenseFeatures(child))
    return count
