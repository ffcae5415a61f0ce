"""A training schedule's quantizer: wrap the model once, add its parameters to the optimizer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from compressor.assembly.recipes import record_transform
from compressor.models.description import described, description_of, unwrap_model
from compressor.quantization.recipe import QUANTIZATION
from compressor.schedule.config import EntryReader

__all__ = ["prepare_quantizer", "qat_recipe"]


def qat_recipe(quantizer: Any) -> dict[str, Any]:
    """The transform recipe a quantization-aware-trained model records."""
    return {"kind": "qat", **quantizer.recipe()}


def prepare_quantizer(top: EntryReader, quantizers: Sequence[tuple[str, Any]], model: nn.Module,
                      optimizer: torch.optim.Optimizer) -> bool:
    """Wrap `model` for the schedule's quantizer; True when it was wrapped now (not resumed).

    A model rebuilt from a checkpoint of this training already carries the same recipe: its
    wrappers and the quantizer's parameters are reused. The quantizer's new parameters (PACT's
    clipping values) join the optimizer as their own group, as in Distiller.
    """
    if len(quantizers) > 1:
        top.fail(f"defines {len(quantizers)} quantizers ({', '.join(n for n, _ in quantizers)})",
                 "keep one quantizer per schedule")
    name, quantizer = quantizers[0]
    inner = unwrap_model(model)
    recorded = description_of(inner).recipe(QUANTIZATION) if described(inner) else None
    wanted = qat_recipe(quantizer)
    if isinstance(recorded, Mapping):
        if recorded.get("kind") != "qat":
            top.fail(f"quantizer '{name}' trains a model that is already post-training quantized",
                     "train the float checkpoint it came from")
        if dict(recorded) != wanted:
            top.fail(f"quantizer '{name}' differs from the one this checkpoint was trained with "
                     f"({recorded.get('class_name', recorded.get('class', '?'))})",
                     "resume with the schedule the checkpoint was trained with")
    fresh = not isinstance(recorded, Mapping)
    for group in quantizer.prepare(inner):
        optimizer.add_param_group(group)
    if fresh and described(inner):  # a plain torch model (library use) has no description
        record_transform(inner, QUANTIZATION, wanted)
    return fresh

