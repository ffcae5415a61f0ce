"""One forward of a model to learn what it does with an input, leaving no trace on it."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["probe_forward"]


def probe_forward(model: nn.Module, inputs: Tensor) -> Any:
    """`model`'s eval-mode output for `inputs`, without gradients; every module's training
    flag and the CPU random stream are as they were afterwards (exceptions propagate)."""
    modes = {module: module.training for module in model.modules()}
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            return model.eval()(inputs)
    finally:
        for module, training in modes.items():
            module.training = training
