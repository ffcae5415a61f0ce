"""Fake quantization computes in fp32 under mixed precision: a grid of 256 levels is not
representable in bf16's 8 significant bits (nor its ranges and scales in fp16), so a fake
quantizer's forward runs with autocast off, on its input cast to fp32; the layers between
quantizers keep running under autocast."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor

__all__ = ["in_fp32"]

_HALF = (torch.float16, torch.bfloat16)
F = TypeVar("F", bound=Callable[..., Tensor])


def in_fp32(forward: F) -> F:
    """Decorate a fake quantizer's `forward(self, x, ...)`: under autocast, it runs with
    autocast off on `x` in fp32 (and returns fp32); otherwise exactly as it is."""

    @functools.wraps(forward)
    def run(self: Any, x: Any, *rest: Any, **kwargs: Any) -> Tensor:
        if not isinstance(x, Tensor) or not torch.is_autocast_enabled(x.device.type):
            return forward(self, x, *rest, **kwargs)
        with torch.autocast(x.device.type, enabled=False):
            return forward(self, x.float() if x.dtype in _HALF else x, *rest, **kwargs)

    return run  # type: ignore[return-value]
