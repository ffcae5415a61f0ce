"""Image transforms derived from an InputSpec plus one training-augmentation policy per dataset.

Randomness comes from torch's global RNG (torchvision v2 transforms draw from it), so seeding
torch makes the augmentation reproducible.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import torch
from torchvision.transforms import InterpolationMode, v2

from compressor.errors import UsageError
from compressor.models.input_spec import InputSpec

__all__ = ["build_transforms", "interpolation_mode", "NATIVE_FORMATS"]

# (channels, side) of each dataset's images as stored; None: the size varies (ImageFolder).
NATIVE_FORMATS: MappingProxyType[str, tuple[int, int | None]] = MappingProxyType({
    "digits": (1, 8), "mnist": (1, 28), "fashion-mnist": (1, 28),
    "cifar10": (3, 32), "cifar100": (3, 32), "imagenet": (3, None),
})

CIFAR_PADDING = 4  # Distiller's RandomCrop(32, padding=4)


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


def _sizing(spec: InputSpec, native_side: int, train: bool, augment: bool) -> list[Any]:
    """Resize/crop of a fixed-size dataset; only where the spec differs from the native size."""
    mode = interpolation_mode(spec.interpolation)
    steps: list[Any] = []
    side = native_side
    if spec.resize_size != native_side:
        steps.append(v2.Resize(spec.resize_size, interpolation=mode, antialias=True))
        side = spec.resize_size
    if augment and train:
        steps.append(v2.RandomCrop(spec.crop_size, padding=CIFAR_PADDING))
        steps.append(v2.RandomHorizontalFlip())
    elif spec.crop_size != side:
        steps.append(v2.CenterCrop(spec.crop_size))
    return steps


def _imagenet_sizing(spec: InputSpec, train: bool) -> list[Any]:
    mode = interpolation_mode(spec.interpolation)
    if train:
        return [v2.RandomResizedCrop(spec.crop_size, interpolation=mode, antialias=True),
                v2.RandomHorizontalFlip()]
    return [v2.Resize(spec.resize_size, interpolation=mode, antialias=True),
            v2.CenterCrop(spec.crop_size)]


def build_transforms(input_spec: InputSpec, dataset: str,
                     train: bool) -> Callable[[Any], torch.Tensor]:
    """The transform of one dataset's images (PIL, HxWxC array or CxHxW tensor) for a model.

    Sizes, normalization and channel count come from the InputSpec only; the dataset picks the
    training augmentation: cifar10/cifar100 RandomCrop(crop, padding=4) + flip (Distiller's),
    imagenet RandomResizedCrop(crop) + flip (eval: Resize(resize) + CenterCrop(crop)),
    mnist/fashion-mnist/digits none. synthetic data is generated ready to use: identity.
    """
    if dataset == "synthetic":
        return v2.Identity()
    if dataset not in NATIVE_FORMATS:
        raise UsageError(f"unknown dataset '{dataset}'; use one of: "
                         f"{', '.join([*NATIVE_FORMATS, 'synthetic'])}")
    native_channels, native_side = NATIVE_FORMATS[dataset]
    steps: list[Any] = [v2.ToImage(), *_channel_transforms(native_channels, input_spec.channels)]
    if native_side is None:
        steps += _imagenet_sizing(input_spec, train)
    else:
        steps += _sizing(input_spec, native_side, train, augment=dataset.startswith("cifar"))
    steps += [v2.ToDtype(torch.float32, scale=True),
              v2.Normalize(mean=list(input_spec.mean), std=list(input_spec.std)),
              v2.ToPureTensor()]
    return v2.Compose(steps)
