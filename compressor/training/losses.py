"""Training losses: cross-entropy, and the aux-logits losses of Inception v3 and GoogLeNet."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import torch.nn.functional as F
from torch import Tensor

__all__ = ["main_logits", "aux_logits", "cross_entropy", "aux_logits_loss", "get_loss",
           "LOSSES", "LossFn"]

LossFn = Callable[[Any, Tensor], Tensor]


def main_logits(output: Any) -> Tensor:
    """The main head's logits of a model output (a tensor, or torchvision's namedtuples)."""
    if isinstance(output, Tensor):
        return output
    if hasattr(output, "logits"):  # InceptionOutputs, GoogLeNetOutputs
        return output.logits
    if isinstance(output, (tuple, list)):
        return output[0]
    raise TypeError(f"cannot find logits in a model output of type {type(output).__name__}")


def aux_logits(output: Any) -> tuple[Tensor, ...]:
    """The auxiliary heads' logits, in order (empty when the model returned none)."""
    if isinstance(output, Tensor):
        return ()
    heads = [getattr(output, name, None) for name in ("aux_logits", "aux_logits2", "aux_logits1")]
    return tuple(head for head in heads if isinstance(head, Tensor))


def cross_entropy(output: Any, target: Tensor) -> Tensor:
    """Cross-entropy on the main head."""
    return F.cross_entropy(main_logits(output), target)


def aux_logits_loss(output: Any, target: Tensor, aux_weights: tuple[float, ...]) -> Tensor:
    """main + sum(w_i * aux_i); plain cross-entropy when the model returned no aux heads."""
    loss = F.cross_entropy(main_logits(output), target)
    heads = aux_logits(output)
    if not heads:
        return loss
    if len(heads) != len(aux_weights):
        raise ValueError(f"model returned {len(heads)} aux heads, loss expects {len(aux_weights)}")
    for weight, head in zip(aux_weights, heads, strict=True):
        loss = loss + weight * F.cross_entropy(head, target)
    return loss


def _inception_aux(output: Any, target: Tensor) -> Tensor:
    return aux_logits_loss(output, target, (0.4,))


def _googlenet_aux(output: Any, target: Tensor) -> Tensor:
    return aux_logits_loss(output, target, (0.3, 0.3))


LOSSES: Mapping[str, LossFn] = MappingProxyType({
    "cross_entropy": cross_entropy,
    "inception_aux": _inception_aux,  # Szegedy et al. 2016: main + 0.4 * aux
    "googlenet_aux": _googlenet_aux,  # Szegedy et al. 2015: main + 0.3 * aux1 + 0.3 * aux2
})


def get_loss(name: str) -> LossFn:
    """The training loss registered under `name` (an ArchSpec's `loss`)."""
    return LOSSES[name]

