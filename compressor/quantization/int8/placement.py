"""Where int8 kernels run: on the CPU. A model on (or meant for) another device is moved there
by the int8 steps themselves, with one log line saying so, instead of failing in a trace."""

from __future__ import annotations

import logging

import torch
from torch import Tensor, nn

__all__ = ["tensor_device", "int8_placement"]

LOG = logging.getLogger("compressor")


def tensor_device(model: nn.Module) -> torch.device:
    """Where the model's first parameter or buffer is (the CPU for a model without any)."""
    for tensor in model.state_dict().values():
        if isinstance(tensor, Tensor):
            return tensor.device
    return torch.device("cpu")


def int8_placement(model: nn.Module, device: torch.device | None = None,
                   log: bool = True) -> str | None:
    """Move `model` (in place) to the CPU, where int8 kernels run; returns the line saying so
    (logged unless `log` is False) when it is on another device, or was meant for one
    (`device`: the run's), else None."""
    source = torch.device(device) if device is not None else tensor_device(model)
    if source.type == "cpu":
        return None
    model.cpu()
    line = (f"int8 kernels run on the CPU: the model moves there from {source} (evaluation of "
            "the int8 model runs there too)")
    if log:
        LOG.info("%s", line)
    return line
