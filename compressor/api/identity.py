"""What compressor must know of a model it did not build: its input size and its classes.

A model that compressor builds carries a ModelDescription (arch, dataset, classes, input spec,
recipes). The user's own nn.Module (their class, torchvision's, timm's) gets a provisional one
from an example batch the first time an API function needs it: its arch is a placeholder in
angle brackets until save_checkpoint names the real one, and the recipes recorded in between
(thinning, quantization) are kept, so the saved checkpoint rebuilds the compressed model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from compressor.models.description import (
    ModelDescription,
    describe,
    described,
    description_of,
    unwrap_model,
)
from compressor.models.probe import probe_forward
from compressor.training.losses import main_logits
from compressor.utils.dataset_table import FOLDER
from compressor.utils.errors import UsageError
from compressor.utils.input_spec import IMAGENET_MEAN, IMAGENET_STD, InputSpec

__all__ = ["ensure_described", "is_provisional", "input_batch", "default_input_spec",
           "check_module", "model_device"]

_EXAMPLE_FIX = ("pass example_inputs=..., a batch of inputs (N x C x H x W) as the model takes "
                "them")


def check_module(model: Any, what: str) -> nn.Module:
    """`model` itself when it is a torch module; a one-line UsageError otherwise."""
    if not isinstance(model, nn.Module):
        raise UsageError(f"{what}: model is a {type(model).__name__}, not a torch.nn.Module; "
                         "pass the model itself")
    return model


def is_provisional(description: ModelDescription) -> bool:
    """Whether the arch is a placeholder (a model compressor did not build, not yet saved)."""
    return description.arch.startswith("<")


def input_batch(example_inputs: Any, what: str, source: str = "example_inputs") -> Tensor:
    """The input tensor of an example: a batch, or the inputs of an (inputs, targets) pair;
    `source` names where it came from in the refusal."""
    value = example_inputs
    if isinstance(value, (tuple, list)) and value:
        value = value[0]
    if not isinstance(value, Tensor) or value.dim() != 4 or value.shape[0] < 1:
        got = (f"a tensor of shape {list(value.shape)}" if isinstance(value, Tensor)
               else f"of type {type(value).__name__}")
        raise UsageError(f"{what}: {source} is {got}, not a batch of images; "
                         f"{_fix_for(source)}")
    return value


def _fix_for(source: str) -> str:
    return (_EXAMPLE_FIX if source == "example_inputs" else
            "give batches of inputs (N x C x H x W) as the model takes them, or (inputs, "
            "targets) pairs")


def default_input_spec(input_size: tuple[int, int, int]) -> InputSpec:
    """The input spec of an example's size: ImageNet's mean and std (averaged over channels
    when there are not three), images resized straight to the size (no crop margin)."""
    channels, height, width = input_size
    imagenet = InputSpec((3, height, width), height, height, IMAGENET_MEAN, IMAGENET_STD)
    return imagenet.with_channels(channels)


def model_device(model: nn.Module) -> torch.device:
    """Where the model's tensors are (the CPU for a model without any)."""
    for tensor in unwrap_model(model).state_dict().values():
        if isinstance(tensor, Tensor):
            return tensor.device
    return torch.device("cpu")


def _num_classes(model: nn.Module, batch: Tensor, what: str, source: str) -> int:
    """The model's output count, from one eval-mode forward of one example (modes restored)."""
    try:
        logits = main_logits(probe_forward(model, batch[:1].to(model_device(model))))
    except Exception as exc:  # noqa: BLE001 - the user's forward: theirs to fix
        detail = " ".join(str(exc).split())[:200]
        raise UsageError(f"{what}: the model's forward fails on {source} of shape "
                         f"{list(batch.shape)} ({type(exc).__name__}: {detail}); "
                         f"{_fix_for(source)}") from None
    if logits.dim() != 2:
        raise UsageError(f"{what}: the model outputs shape {list(logits.shape)}, not (batch, "
                         "classes); compressor compresses classifiers that return logits")
    return int(logits.shape[1])


def ensure_described(model: nn.Module, example_inputs: Any, what: str,
                     source: str = "example_inputs") -> ModelDescription:
    """The model's description; a model compressor did not build gets a provisional one from
    `example_inputs` (its input size and, by one forward, its number of classes); `source`
    names where the example came from in a refusal."""
    check_module(model, what)
    if described(model):
        return description_of(model)
    if example_inputs is None:
        raise UsageError(f"{what} needs the model's input size, and this model was not built by "
                         f"compressor; {_EXAMPLE_FIX}")
    batch = input_batch(example_inputs, what, source)
    input_size = tuple(int(side) for side in batch.shape[1:])
    description = ModelDescription(f"<{type(unwrap_model(model)).__name__}>", FOLDER,
                                   _num_classes(model, batch, what, source),
                                   default_input_spec(input_size))  # type: ignore[arg-type]
    describe(model, description)
    return description
