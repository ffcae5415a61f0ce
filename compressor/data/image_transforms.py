"""Image transforms derived from an InputSpec plus the training augmentation of the dataset's row.

The dataset table (compressor.utils.dataset_table) gives each dataset's stored format (channels,
side) and its augmentation policy; everything about size and normalization comes from the InputSpec.
Randomness comes from torch's global RNG (torchvision v2 transforms draw from it), so seeding
torch makes the augmentation reproducible.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torchvision.transforms import InterpolationMode, v2

from compressor.utils.dataset_table import PAD_CROP_FLIP, RESIZED_CROP_FLIP, dataset_spec
from compressor.utils.errors import UsageError
from compressor.utils.input_spec import InputSpec

__all__ = ["build_transforms", "interpolation_mode", "is_deterministic"]

CIFAR_PADDING = 4  # Distiller's RandomCrop(32, padding=4)
# Steps that map an image the same way on every call and a batch as they map each image in it.
_DETERMINISTIC_STEPS = (v2.ToImage, v2.Grayscale, v2.RGB, v2.Resize, v2.CenterCrop, v2.ToDtype,
                        v2.Normalize, v2.ToPureTensor, v2.Identity)


def interpolation_mode(name: str) -> InterpolationMode:
    """The torchvision InterpolationMode for an InputSpec's interpolation name."""
    try:
        return InterpolationMode(name.lower())
    except ValueError:
        choices = ", ".join(mode.value for mode in InterpolationMode)
        raise UsageError(f"unknown interpolation '{name}' in the input spec; use one of: "
                         f"{choices}") from None


def _channel_transforms(native: int, wanted: int) -> list[Any]:
    if native == wanted:
        return []
    if native == 3 and wanted == 1:
        return [v2.Grayscale(num_output_channels=1)]
    if native == 1 and wanted == 3:
        return [v2.RGB()]
    raise UsageError(f"cannot turn {native}-channel images into the {wanted} channels the "
                     "model expects; use a model with 1 or 3 input channels")


def _sizing(spec: InputSpec, native_side: int | None, augment: str | None) -> list[Any]:
    """Resize/crop to the spec: only where it differs from a fixed native size; then augment.

    Images of varying size (native_side None) are always resized and center-cropped when not
    augmented. `augment` is the training policy, None when evaluating.
    """
    mode = interpolation_mode(spec.interpolation)
    if augment == RESIZED_CROP_FLIP:
        return [v2.RandomResizedCrop(spec.crop_size, interpolation=mode, antialias=True),
                v2.RandomHorizontalFlip()]
    steps: list[Any] = []
    side = native_side
    if side is None or spec.resize_size != side:
        steps.append(v2.Resize(spec.resize_size, interpolation=mode, antialias=True))
        side = spec.resize_size if native_side is not None else None
    if augment == PAD_CROP_FLIP:
        steps.append(v2.RandomCrop(spec.crop_size, padding=CIFAR_PADDING))
        steps.append(v2.RandomHorizontalFlip())
    elif side is None or spec.crop_size != side:
        steps.append(v2.CenterCrop(spec.crop_size))
    return steps


def build_transforms(input_spec: InputSpec, dataset: str,
                     train: bool) -> Callable[[Any], torch.Tensor]:
    """The transform of one dataset's images (PIL, HxWxC array or CxHxW tensor) for a model.

    Sizes, normalization and channel count come from the InputSpec only; the dataset's row
    picks the training augmentation: cifar10/cifar100 RandomCrop(crop, padding=4) + flip
    (Distiller's), imagenet RandomResizedCrop(crop) + flip (eval: Resize(resize) +
    CenterCrop(crop)), mnist/fashion-mnist/digits none. Generated data (synthetic): identity.
    """
    spec = dataset_spec(dataset)
    if spec.native_format is None:
        return v2.Identity()
    native_channels, native_side = spec.native_format
    steps: list[Any] = [v2.ToImage(), *_channel_transforms(native_channels, input_spec.channels)]
    steps += _sizing(input_spec, native_side, spec.augment if train else None)
    steps += [v2.ToDtype(torch.float32, scale=True),
              v2.Normalize(mean=list(input_spec.mean), std=list(input_spec.std)),
              v2.ToPureTensor()]
    return v2.Compose(steps)


def is_deterministic(transform: Callable[[Any], torch.Tensor]) -> bool:
    """Whether `transform` draws nothing at random and maps a batch of tensor images as it maps
    each one: then an in-memory split may be transformed a batch at a time."""
    steps = transform.transforms if isinstance(transform, v2.Compose) else [transform]
    return all(type(step) in _DETERMINISTIC_STEPS for step in steps)
