"""`compression_scheduler`: a Distiller YAML schedule (a file or a dict) as the
CompressionScheduler whose callbacks go into one's own training loop; the command line's
training builds its scheduler here too."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from compressor.api.identity import check_module, ensure_described
from compressor.models.description import described
from compressor.schedule.loader import build_scheduler, read_schedule
from compressor.schedule.scheduler import CompressionScheduler
from compressor.utils.errors import ScheduleError, UsageError

__all__ = ["compression_scheduler", "CompressionScheduler", "DICT_SOURCE"]

DICT_SOURCE = "<schedule dict>"  # how errors name a schedule given as a dict
# sections that change the model's structure (thinning, quantization-aware wrappers), which
# need its description: the probe batch's size, and the recipe a checkpoint rebuilds
_RESTRUCTURING = ("extensions", "quantizers")


def _shown(path: str | os.PathLike[str]) -> str:
    text = str(path)
    return text if text.isprintable() else repr(text)


def _document(source: Any) -> tuple[dict[str, Any], str]:
    """The parsed schedule and the name its errors give it."""
    if isinstance(source, Mapping):
        return dict(source), DICT_SOURCE
    if isinstance(source, (str, os.PathLike)):
        return read_schedule(source), _shown(source)
    raise ScheduleError(f"a schedule is a YAML file's path or a dict of its sections, not a "
                        f"{type(source).__name__}; pass one of them")


def compression_scheduler(source: str | os.PathLike[str] | Mapping[str, Any], model: nn.Module,
             optimizer: torch.optim.Optimizer, *, example_inputs: Any = None,
             seed: int = 0) -> CompressionScheduler:
    """Build the CompressionScheduler of a Distiller-format schedule for any model and optimizer.

    The replacement of Distiller's `file_config(model, optimizer, path)`: the same YAML, the
    same callbacks (on_epoch_begin, on_minibatch_begin, before_backward_pass,
    before_parameter_optimization, on_minibatch_end, on_epoch_end), and the same one-line
    ScheduleError as the command line for a bad schedule.

    Args:
        source: the path of a YAML schedule, or a dict with its sections (`pruners`,
            `regularizers`, `quantizers`, `lr_schedulers`, `extensions`, `policies`).
        model: the model to compress (its parameter names, with or without `module.`).
        optimizer: the optimizer that trains it (any torch optimizer); LR schedulers step it.
        example_inputs: a batch of inputs, needed when a model compressor did not build is
            thinned (`extensions`) or trained quantization-aware (`quantizers`).
        seed: seeds the pruners' random draws (the command line passes --seed).

    Returns:
        The scheduler; its masks are applied in place to the model's parameters.
    """
    check_module(model, "compression_scheduler")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(f"compression_scheduler: optimizer is a {type(optimizer).__name__}, "
                         "not a torch optimizer; pass the optimizer that trains the model")
    doc, name = _document(source)
    if example_inputs is not None:
        ensure_described(model, example_inputs, "compression_scheduler")
    elif not described(model):
        changing = [section for section in _RESTRUCTURING if doc.get(section)]
        if changing:
            raise ScheduleError(f"{name}: its {' and '.join(changing)} change the model's "
                                "structure, which needs the model's input size; pass "
                                "example_inputs=... (a batch of inputs) to compression_scheduler")
    return build_scheduler(doc, model, optimizer, source=name, seed=seed)
