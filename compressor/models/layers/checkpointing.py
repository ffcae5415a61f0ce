"""Activation checkpointing that recomputes blocks in backward without touching BN statistics.

No `forward` is ever replaced on an instance, and no parameter or buffer name changes (a
plain checkpoint loads into the variant and back, and schedules name the same tensors):

* A model opts in, as in timm: it defines `set_grad_checkpointing(enable)` and its own
  forward runs its stages through `checkpoint_seq` while the flag is set (compressor's CIFAR
  ResNets and VGGs, and Inception v3 as the registry builds it).
* torchvision models whose forward we do not own keep their blocks in nn.Sequential
  containers (ResNet's layer1..4, MobileNet v2's features): `enable_checkpointing` puts a
  `RecomputedSequential` in the container's place. It holds the very same child modules
  under the very same keys, so every name stays as it was; its forward recomputes the
  blocks. (A wrapper around each block would add a level to every name; a stand-in that
  borrows a block's children, or state_dict hooks that strip the extra level, would keep
  state_dict keys but not named_parameters, module hooks or isinstance checks.)
* DenseNets: their dense blocks become `compressor.memory.dense.EfficientDenseBlock`.

A module recomputes when its `grad_checkpointing` attribute is true (`is_checkpointed`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

__all__ = ["FrozenNormStats", "exact_checkpoint", "checkpoint_seq", "block_segments",
           "RecomputedSequential", "enable_checkpointing", "is_checkpointed"]

Segments = Sequence[tuple[int, int]]


class FrozenNormStats:
    """Context that undoes what the batch norms under `modules` do to their running statistics.

    A recomputation in backward runs batch norm in training mode a second time; without this,
    running_mean/var would move twice per step and num_batches_tracked would count 2
    (torchvision's memory_efficient DenseNet has that flaw). The buffers are copied on entry
    and written back on exit, so the recomputation itself (and the tensors it saves, which
    checkpoint matches one by one against the forward's) is exactly the forward's.
    A class rather than a generator so that one instance may be entered again (retain_graph).
    """

    def __init__(self, modules: nn.Module | Iterable[nn.Module]) -> None:
        roots = [modules] if isinstance(modules, nn.Module) else list(modules)
        self._buffers = [buffer for root in roots for m in root.modules()
                         if isinstance(m, _BatchNorm)
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


def exact_checkpoint(function: Callable[..., Any], owner: nn.Module | Iterable[nn.Module],
                     *args: Any) -> Any:
    """Run `function(*args)` under non-reentrant checkpointing, recomputed exactly in backward.

    `owner` is the module (or modules) whose batch norms `function` runs: their statistics are
    frozen during the recomputation. RNG state is preserved, so dropout draws the same masks.
    """
    owners = owner if isinstance(owner, nn.Module) else tuple(owner)
    return checkpoint(function, *args, use_reentrant=False, preserve_rng_state=True,
                      context_fn=lambda: (_NullContext(), FrozenNormStats(owners)))


def needs_checkpoint(args: Iterable[Any]) -> bool:
    """Whether recomputing pays: autograd records and some input is a tensor needing grad.

    Also false under torch.fx tracing (the inputs are proxies), so traced graphs are plain.
    """
    if not torch.is_grad_enabled():
        return False
    return any(isinstance(a, Tensor) and a.requires_grad for a in args)


def _run(modules: Sequence[nn.Module], x: Any) -> Any:
    for module in modules:
        x = module(x)
    return x


def checkpoint_seq(modules: Iterable[nn.Module], x: Any, *,
                   segments: Segments | None = None) -> Any:
    """Run `modules` in order; each segment (start, end) is recomputed in backward.

    Without `segments`, every module is its own segment (timm's checkpoint_seq with every=1).
    Modules outside the segments run as usual. Without grad, everything runs as usual.
    """
    children = list(modules)
    if segments is None:
        segments = [(i, i + 1) for i in range(len(children))]
    position = 0
    for start, end in segments:
        x = _run(children[position:start], x)
        segment = children[start:end]
        if needs_checkpoint((x,)):
            x = exact_checkpoint(lambda inp, seg=segment: _run(seg, inp), segment, x)
        else:
            x = _run(segment, x)
        position = end
    return _run(children[position:], x)


def block_segments(sequential: nn.Sequential, block_names: Iterable[str]) -> list[tuple[int, int]]:
    """Segments of a Sequential that start at each child whose class name is in `block_names`.

    Each runs up to the next named child (VGG: conv, bn, relu, pool recomputed as one).
    """
    names = set(block_names)
    starts = [i for i, child in enumerate(sequential) if type(child).__name__ in names]
    return list(zip(starts, starts[1:] + [len(sequential)], strict=False))


class RecomputedSequential(nn.Sequential):
    """The children of an nn.Sequential, under the same keys, with segments recomputed.

    Put in the place of a torchvision container, it keeps every name of the model.
    """

    def __init__(self, modules: nn.Sequential | Mapping[str, nn.Module] | None = None,
                 segments: Segments = ()) -> None:
        # A mapping too: nn.Sequential's slicing builds `type(self)(OrderedDict(...))`.
        items = (modules.named_children() if isinstance(modules, nn.Module)
                 else (modules or {}).items())
        super().__init__(OrderedDict(items))
        if isinstance(modules, nn.Module):
            self.training = modules.training
        self.segments = tuple((int(a), int(b)) for a, b in segments)

    @property
    def grad_checkpointing(self) -> bool:
        """Whether any segment is recomputed."""
        return bool(self.segments)

    def extra_repr(self) -> str:
        """The recomputed segments."""
        return f"segments={list(self.segments)}"

    def forward(self, x: Any) -> Any:
        """Run the children, recomputing each segment in backward."""
        return checkpoint_seq(self, x, segments=self.segments)


def is_checkpointed(module: nn.Module) -> bool:
    """Whether `module` recomputes (its blocks) in backward: its `grad_checkpointing` flag."""
    return bool(getattr(module, "grad_checkpointing", False))


def enable_checkpointing(model: nn.Module, block_names: Iterable[str]) -> int:
    """Make `model` recompute every module whose class name is in `block_names` in backward.

    A model that opts in (`set_grad_checkpointing`) is switched on. Otherwise every
    nn.Sequential holding such modules becomes a RecomputedSequential in its parent; a named
    class that is a child of one starts a segment that runs up to the next named sibling.
    Parameter and buffer names do not change. Returns the number of recomputed blocks.
    """
    names = set(block_names)
    opt_in = getattr(model, "set_grad_checkpointing", None)
    if callable(opt_in):
        opt_in(True)
        return sum(type(m).__name__ in names for m in model.modules())
    if type(model) is nn.Sequential and block_segments(model, names):
        raise ValueError("the model itself is the Sequential to recompute: build it as "
                         "RecomputedSequential(model, block_segments(model, names))")
    count = 0
    for parent in reversed(list(model.modules())):  # children first: parents copy them
        for key, child in list(parent.named_children()):
            if type(child) is not nn.Sequential:
                continue
            segments = block_segments(child, names)
            if segments:
                setattr(parent, key, RecomputedSequential(child, segments))
                count += len(segments)
    return count
