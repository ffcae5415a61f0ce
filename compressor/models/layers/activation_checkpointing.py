"""Activation checkpointing that recomputes blocks in backward without touching BN statistics.

No `forward` is ever replaced on an instance, and no parameter or buffer name changes (a
plain checkpoint loads into the variant and back, and schedules name the same tensors):

* A model opts in, as in timm: it defines `set_grad_checkpointing(enable)` and its own
  forward runs its stages through `checkpoint_seq` while the flag is set (compressor's VGGs
  and pre-activation ResNets, and Inception v3 as the registry builds it), or through
  `checkpoint_stages` (CIFAR ResNets: sqrt(n)-block segments, the last stage kept).
* torchvision models whose forward we do not own keep their blocks in nn.Sequential
  containers (ResNet's layer1..4, MobileNet v2's features): `enable_checkpointing` puts a
  `RecomputedSequential` in the container's place. It holds the very same child modules
  under the very same keys, so every name stays as it was; its forward recomputes the
  blocks. (A wrapper around each block would add a level to every name; a stand-in that
  borrows a block's children, or state_dict hooks that strip the extra level, would keep
  state_dict keys but not named_parameters, module hooks or isinstance checks.)
* DenseNets: their dense blocks become `compressor.memory.dense.EfficientDenseBlock`.

Every recomputed segment freezes the running statistics of its batch norms while it is
recomputed (FrozenNormStats) and, on CPU, applies the batch statistics forward computed
instead of collecting them again (compressor.models.layers.norm_replay), bit for bit.
A module recomputes when its `grad_checkpointing` attribute is true (`is_checkpointed`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

from compressor.models.layers.norm_replay import NormStash, RecordNormStats, ReplayNormStats

__all__ = ["FrozenNormStats", "exact_checkpoint", "checkpoint_seq", "checkpoint_stages",
           "sqrt_segments", "block_segments", "RecomputedSequential", "enable_checkpointing",
           "is_checkpointed"]

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
        # The buffers are looked up on entry, not here: checkpoint builds this context in
        # forward for every segment, and most segments are never recomputed twice.
        self._roots = (modules,) if isinstance(modules, nn.Module) else tuple(modules)
        self._buffers: list[Tensor] = []
        self._saved: list[Tensor] = []

    def __enter__(self) -> FrozenNormStats:
        self._buffers = [buffer for root in self._roots for m in root.modules()
                         if isinstance(m, _BatchNorm)
                         for buffer in (m.running_mean, m.running_var, m.num_batches_tracked)
                         if buffer is not None]
        self._saved = [buffer.clone() for buffer in self._buffers]
        return self

    def __exit__(self, *exc: object) -> None:
        with torch.no_grad():
            for buffer, saved in zip(self._buffers, self._saved, strict=True):
                buffer.copy_(saved)
        self._buffers, self._saved = [], []


class _NullContext:
    """A reusable do-nothing context (the forward half of checkpoint's context_fn)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class _Recomputation:
    """The recomputation's context: statistics frozen, and forward's batch statistics replayed.

    Reusable: a recomputation runs again when backward runs again (retain_graph).
    """

    def __init__(self, owners: nn.Module | tuple[nn.Module, ...], stash: NormStash | None) -> None:
        self._contexts: tuple[Any, ...] = (FrozenNormStats(owners),)
        if stash is not None:
            self._contexts += (ReplayNormStats(stash),)

    def __enter__(self) -> None:
        for context in self._contexts:
            context.__enter__()

    def __exit__(self, *exc: Any) -> None:
        for context in reversed(self._contexts):
            context.__exit__(*exc)


def _contexts(owners: nn.Module | tuple[nn.Module, ...], replay: bool) -> tuple[Any, Any]:
    if not replay:
        return _NullContext(), _Recomputation(owners, None)
    stash = NormStash()
    return RecordNormStats(stash), _Recomputation(owners, stash)


def exact_checkpoint(function: Callable[..., Any], owner: nn.Module | Iterable[nn.Module],
                     *args: Any, preserve_rng_state: bool = True) -> Any:
    """Run `function(*args)` under non-reentrant checkpointing, recomputed exactly in backward.

    `owner` is the module (or modules) whose batch norms `function` runs: their statistics are
    frozen during the recomputation, and the recomputation applies the batch statistics
    forward computed rather than collecting them again (compressor.models.layers.norm_replay).
    The RNG state is preserved, so dropout draws the same masks; a caller that knows
    `function` draws no random numbers may skip that (`preserve_rng_state=False`: no RNG
    state is copied per segment). The recomputation stops as soon as it has brought back
    every tensor backward needs (checkpoint's early stop), so a segment that ends in a
    convolution does not rerun the convolution.
    """
    owners = owner if isinstance(owner, nn.Module) else tuple(owner)
    # Replaying batch statistics pays on CPU, where collecting them is slow (and the replay is
    # checked to be exact); elsewhere its dispatch modes would only add per-op overhead.
    replay = any(isinstance(a, Tensor) and a.device.type == "cpu" for a in args)
    return checkpoint(function, *args, use_reentrant=False,
                      preserve_rng_state=preserve_rng_state,
                      context_fn=lambda: _contexts(owners, replay))


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


def sqrt_segments(count: int) -> list[tuple[int, int]]:
    """Segments of ceil(sqrt(count)) consecutive blocks (Chen et al.'s sublinear-memory plan).

    A segment keeps only its input for backward and brings back one segment's activations at
    a time, so both grow as sqrt(count) rather than count (one block per segment keeps count
    inputs).
    """
    size = math.isqrt(count - 1) + 1 if count > 0 else 1  # ceil(sqrt(count))
    return [(start, min(start + size, count)) for start in range(0, count, size)]


def checkpoint_stages(stages: Sequence[Iterable[nn.Module]], x: Any) -> Any:
    """Run the blocks of `stages` in order, every stage but the last recomputed in backward.

    Each recomputed stage runs in sqrt_segments of its blocks. The last stage runs as usual:
    backward needs its activations first, so recomputing them would redo its forward right
    after forward; and in a network whose stages halve the resolution while doubling the
    width (ResNets, VGGs), a block of the last stage holds the fewest activation bytes for
    the same compute, so its recomputation saves the least memory per second spent.
    """
    for index, stage in enumerate(stages):
        if index == len(stages) - 1:
            x = stage(x) if isinstance(stage, nn.Module) else _run(list(stage), x)
        else:
            blocks = list(stage)
            x = checkpoint_seq(blocks, x, segments=sqrt_segments(len(blocks)))
    return x


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

    A model that opts in (`set_grad_checkpointing`) is switched on; its forward decides which
    of its blocks it recomputes. Otherwise every nn.Sequential holding such modules becomes a
    RecomputedSequential in its parent; a named class that is a child of one starts a
    segment that runs up to the next named sibling. Parameter and buffer names do not
    change. Returns the number of named blocks (of an opt-in model) or of recomputed segments.
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
