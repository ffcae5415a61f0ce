"""What a thinned model must compute where thinning removes channels a LayerNorm normalizes.

Removing a zeroed channel is exact for a batch norm (each channel on its own) but not for a
LayerNorm over the channels: its mean and variance are taken over every channel, a zeroed one
included, and over the kept ones alone once it is gone. Torch-Pruning prunes such channels
anyway (ConvNeXt's and a transformer's residual streams). Thinning does too, and checks its
work against the model as thinning defines it: each LayerNorm the recipe thins normalizing
its kept channels among themselves, the removed ones keeping the values they had (zero, where
the pruner masked the norm with the filters). The thinned model computes that exactly, so the
check still catches a channel followed wrongly; the change the renormalization makes is the
pruning's own, which the fine-tune after it absorbs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from compressor.thinning.recipe import is_channel_layer_norm
from compressor.utils.errors import UsageError

__all__ = ["renormalized_norms", "renormalized"]


def renormalized_norms(model: nn.Module, recipe: dict[str, Any]) -> dict[str, list[int]]:
    """LayerNorm name -> the channels it keeps, for each LayerNorm `recipe` removes some of."""
    modules = dict(model.named_modules())
    kept: dict[str, list[int]] = {}
    for name, entry in recipe.get("modules", {}).items():
        module = modules.get(name)
        removed = {*entry.get("out", ()), *entry.get("in", ())}
        if module is not None and is_channel_layer_norm(module) and removed:
            size = module.normalized_shape[0]
            kept[name] = [i for i in range(size) if i not in removed]
    return kept


def _channel_dim(norm: nn.LayerNorm, x: Tensor, out: Tensor) -> int:
    """The dimension `norm` normalized (the last, or 1 for a channels-first LayerNorm2d):
    the one whose layer_norm reproduces its output."""
    size = norm.normalized_shape[0]
    for dim in (-1, 1):
        if x.dim() > 1 and x.shape[dim] == size:
            again = F.layer_norm(x.movedim(dim, -1), (size,), norm.weight, norm.bias,
                                 norm.eps).movedim(-1, dim)
            if again.shape == out.shape and torch.allclose(again, out, rtol=1e-4, atol=1e-5):
                return dim
    raise UsageError(f"thinning cannot tell which dimension {type(norm).__name__} normalizes; "
                     "keep this model unthinned (pruning masks keep the zeros)")


def _hook(keep: list[int]) -> Any:
    def renormalize(norm: nn.Module, args: tuple[Any, ...], out: Tensor) -> Tensor:
        assert isinstance(norm, nn.LayerNorm)
        x = args[0]
        dim = _channel_dim(norm, x, out)
        index = torch.tensor(keep, device=x.device)
        weight = None if norm.weight is None else norm.weight.index_select(0, index)
        bias = None if norm.bias is None else norm.bias.index_select(0, index)
        kept = F.layer_norm(x.movedim(dim, -1).index_select(-1, index), (len(keep),), weight,
                            bias, norm.eps)
        result = out.movedim(dim, -1).clone()
        result[..., index] = kept.to(result.dtype)
        return result.movedim(-1, dim)

    return renormalize


@contextmanager
def renormalized(model: nn.Module, recipe: dict[str, Any]) -> Iterator[nn.Module]:
    """`model` computing, inside the block, as thinning by `recipe` defines it: each LayerNorm
    the recipe thins normalizes the channels it keeps among themselves."""
    modules = dict(model.named_modules())
    handles = [modules[name].register_forward_hook(_hook(keep))
               for name, keep in renormalized_norms(model, recipe).items()]
    try:
        yield model
    finally:
        for handle in handles:
            handle.remove()
