"""Recomputed batch norms apply forward's batch statistics instead of computing them again.

A recomputed segment runs its training-mode batch norms again in backward only to get their
outputs back, bit for bit as forward made them. The batch statistics are the costly part: on
CPU, PyTorch collects them in a scalar double-precision loop over every element, about five
times the cost of applying them, so they dominate the recomputation of BN + ReLU pairs.
Forward has them already (the mean and inverse standard deviation that autograd keeps for
batch norm's backward), so the recomputation applies them with the very same kernel run in
inference mode. That kernel turns (mean, invstd, weight, bias) into y = x * alpha + beta with
alpha = invstd * weight and beta = bias - mean * alpha, whether invstd is forward's (training
mode) or 1 / sqrt(running_var + eps) (inference mode). The recomputation passes a running
variance whose 1 / sqrt(var + eps) is exactly 1 and forward's alpha as the weight, so alpha,
and with it beta (the same expression on the same values), are forward's to the bit. Forward
checks on one sample that this reproduces its output exactly; wherever it does not (CUDA, a
dtype or layout the check does not cover, a kernel that computes otherwise), that batch norm
is recomputed by the training-mode op as before. Either way the tensors batch norm's backward
receives are bitwise those of the plain model, and the running statistics are not touched.

Both halves are dispatch modes (below autograd, so the autograd node is forward's own and the
statistics it saves are forward's): RecordNormStats runs in forward, ReplayNormStats in the
recomputation, sharing one NormStash per recomputed segment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["NormStash", "RecordNormStats", "ReplayNormStats", "unit_variance"]

_BATCH_NORM = torch.ops.aten.native_batch_norm.default
_SOLVE_STEPS = 4  # 1 - eps is within an ulp of a variance that gives exactly 1


@dataclass(frozen=True)
class _Replay:
    """The inference-mode arguments that reproduce a training-mode batch norm's output."""

    alpha: Tensor  # invstd * weight, passed as the weight
    mean: Tensor
    unit_variance: Tensor  # 1 / sqrt(unit_variance + eps) == 1 exactly
    invstd: Tensor
    # what forward's call was made with, to recognise the recomputation's call as the same
    shape: torch.Size
    weight: Tensor | None
    bias: Tensor | None
    eps: float

    def matches(self, x: Tensor, weight: Tensor | None, bias: Tensor | None,
                eps: float) -> bool:
        """Whether a call with these arguments is the one forward made (same values)."""
        return (x.shape == self.shape and eps == self.eps
                and _same(weight, self.weight) and _same(bias, self.bias))


def _same(a: Tensor | None, b: Tensor | None) -> bool:
    # a parameter is the same object; a computed one (a parametrization) the same values
    return a is b or (a is not None and b is not None and torch.equal(a, b))


@dataclass
class NormStash:
    """Per training-mode batch norm of a segment, in call order: its replay, or None."""

    entries: list[_Replay | None] = field(default_factory=list)


def _arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    names = ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum",
             "eps")
    return list(args) + [kwargs[name] for name in names[len(args):]]


def unit_variance(eps: float, like: Tensor) -> Tensor | None:
    """A variance, shaped and typed as `like`, whose 1 / sqrt(variance + eps) is exactly 1."""
    one = torch.ones((), dtype=like.dtype)
    variance = torch.full_like(like, 1 - eps)
    for _ in range(_SOLVE_STEPS):
        got = 1 / torch.sqrt(variance + eps)
        if bool((got == one).all()):
            return variance
        # 1 / sqrt decreases with the variance: above 1 means the variance is too small
        variance = torch.nextafter(variance, torch.where(got > one, 2 * one, 0 * one))
    return None


def _replay_of(args: list[Any], out: tuple[Tensor, Tensor, Tensor]) -> _Replay | None:
    """How to recompute this batch norm from forward's statistics, checked on one sample."""
    x, weight, bias, _, _, _, momentum, eps = args
    y, mean, invstd = out
    params = [t for t in (weight, bias) if t is not None]
    if (x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64)
            or x.dim() < 2 or x.shape[0] == 0 or not x.is_contiguous()
            or any(t.dtype != x.dtype for t in (*params, mean, invstd))):
        return None
    with torch.no_grad():
        variance = unit_variance(eps, invstd)
        if variance is None:
            return None
        alpha = invstd if weight is None else invstd * weight
        replay = _Replay(alpha, mean, variance, invstd, x.shape, weight, bias, eps)
        if not torch.equal(_apply(replay, x[:1], bias, momentum, eps), y[:1]):
            return None
    return replay


def _apply(replay: _Replay, x: Tensor, bias: Tensor | None, momentum: float,
           eps: float) -> Tensor:
    """Forward's output of batch norm on `x`, by the inference-mode kernel."""
    return _BATCH_NORM(x, replay.alpha, bias, replay.mean, replay.unit_variance, False,
                       momentum, eps)[0]


class RecordNormStats(TorchDispatchMode):
    """Forward half: note how each training-mode batch norm can be replayed."""

    def __init__(self, stash: NormStash) -> None:
        super().__init__()
        self.stash = stash

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        """Run every op; after a training-mode batch norm, stash its replay."""
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is _BATCH_NORM:
            arguments = _arguments(args, kwargs)
            if arguments[5]:
                self.stash.entries.append(_replay_of(arguments, out))
        return out


class ReplayNormStats(TorchDispatchMode):
    """Recomputation half: apply forward's statistics in place of collecting them again."""

    def __init__(self, stash: NormStash) -> None:
        super().__init__()
        self.stash = stash
        self._next = 0

    def __enter__(self) -> ReplayNormStats:
        self._next = 0  # a recomputation may run again (backward with retain_graph)
        return super().__enter__()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        """Every op as usual, but a training-mode batch norm with a replay applies it."""
        kwargs = kwargs or {}
        if func is not _BATCH_NORM:
            return func(*args, **kwargs)
        arguments = _arguments(args, kwargs)
        if not arguments[5]:
            return func(*args, **kwargs)
        index, self._next = self._next, self._next + 1
        replay = self.stash.entries[index] if index < len(self.stash.entries) else None
        x, weight, bias, _, _, _, momentum, eps = arguments
        if replay is None or not replay.matches(x, weight, bias, eps):
            return func(*args, **kwargs)
        return _apply(replay, x, bias, momentum, eps), replay.mean, replay.invstd
