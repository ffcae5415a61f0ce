"""Activation checkpointing that recomputes blocks in backward without touching BN statistics."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

__all__ = ["FrozenNormStats", "exact_checkpoint", "enable_checkpointing", "is_checkpointed"]


class FrozenNormStats:
    """Context that undoes what the batch norms under `module` do to their running statistics.

    A recomputation in backward runs batch norm in training mode a second time; without this,
    running_mean/var would move twice per step and num_batches_tracked would count 2
    (torchvision's memory_efficient DenseNet has that flaw). The buffers are copied on entry
    and written back on exit, so the recomputation itself (and the tensors it saves, which
    checkpoint matches one by one against the forward's) is exactly the forward's.
    A class rather than a generator so that one instance may be entered again (retain_graph).
    """

    def __init__(self, module: nn.Module) -> None:
        self._buffers = [buffer for m in module.modules() if isinstance(m, _BatchNorm)
                         for buffer in (m.running_mean, m.running_var, m.num_batches_tracked)
                         if buffer is not None]
        self._saved: list[Tensor] = []

    def __enter__(self) -> FrozenNormStats:
        self._saved = [buffer.clone() for buffer in self._buffers]
        return self

    def __exit__(self, *exc: object) -> None:
        with torch.no_grad():
            for buffer, saved in zip(self._buffers, self._saved, strict=True):
                buffer.copy_(saved)
        self._saved = []


class _NullContext:
    """A reusable do-nothing context (the forward half of checkpoint's context_fn)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def exact_checkpoint(function: Callable[..., Any], owner: nn.Module, *args: Any) -> Any:
    """Run `function(*args)` under non-reentrant checkpointing, recomputed exactly in backward.

    `owner` is the module whose batch norms `function` runs: their statistics are frozen
    during the recomputation. RNG state is preserved, so dropout draws the same masks.
    """
    return checkpoint(function, *args, use_reentrant=False, preserve_rng_state=True,
                      context_fn=lambda: (_NullContext(), FrozenNormStats(owner)))


def _needs_checkpoint(args: Iterable[Any]) -> bool:
    if not torch.is_grad_enabled():
        return False
    return any(isinstance(a, Tensor) and a.requires_grad for a in args)


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """Instance forward of a recomputed block: the class forward under exact_checkpoint."""
    forward = type(self).forward
    if not _needs_checkpoint(args):
        return forward(self, *args, **kwargs)
    return exact_checkpoint(lambda *a: forward(self, *a, **kwargs), self, *args)


def _segmented_forward(self: nn.Sequential, x: Any) -> Any:
    """Forward of a Sequential whose segments (start, end) are each recomputed as one block."""
    children = list(self)
    position = 0
    for start, end in self._checkpoint_segments:
        for child in children[position:start]:
            x = child(x)
        segment = children[start:end]

        def run(inp: Any, segment: list[nn.Module] = segment) -> Any:
            for child in segment:
                inp = child(inp)
            return inp

        if _needs_checkpoint((x,)):
            x = exact_checkpoint(run, nn.ModuleList(segment), x)
        else:
            x = run(x)
        position = end
    for child in children[position:]:
        x = child(x)
    return x


def is_checkpointed(module: nn.Module) -> bool:
    """Whether enable_checkpointing made `module` recompute itself (or its segments)."""
    return "_checkpoint_segments" in vars(module) or getattr(
        vars(module).get("forward"), "__func__", None) is _checkpointed_forward


def _segments(sequential: nn.Sequential, names: set[str]) -> list[tuple[int, int]]:
    starts = [i for i, child in enumerate(sequential) if type(child).__name__ in names]
    if not starts:
        return []
    ends = starts[1:] + [len(sequential)]
    return list(zip(starts, ends, strict=True))


def enable_checkpointing(model: nn.Module, block_names: Iterable[str]) -> int:
    """Make every module whose class name is in `block_names` recompute itself in backward.

    A named class that is a direct child of an nn.Sequential (VGG's Conv2d) instead starts a
    segment that runs up to the next named sibling (conv, bn, relu, pool), recomputed as one.
    Parameter and buffer names do not change, so state_dicts move freely between the plain
    model and this variant. Returns the number of recomputed blocks or segments.
    """
    names = set(block_names)
    count = 0
    in_sequence: set[int] = set()
    for module in model.modules():
        if isinstance(module, nn.Sequential):
            segments = _segments(module, names)
            if segments:
                in_sequence.update(id(module[start]) for start, _ in segments)
                module._checkpoint_segments = segments
                module.forward = types.MethodType(_segmented_forward, module)
                count += len(segments)
    for module in model.modules():
        if type(module).__name__ in names and id(module) not in in_sequence:
            if not is_checkpointed(module):
                module.forward = types.MethodType(_checkpointed_forward, module)
            count += 1
    return count
