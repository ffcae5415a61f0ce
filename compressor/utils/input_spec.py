"""InputSpec: what an architecture expects as input (size, resize/crop, normalization).

A leaf module (no compressor imports): the dataset table (compressor.utils.dataset_table), the
model registry and the data loaders all read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["InputSpec", "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class InputSpec:
    """Input size (C, H, W), resize/crop sizes, mean/std and interpolation of one model."""

    input_size: tuple[int, int, int]
    resize_size: int
    crop_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str = "bilinear"

    def __post_init__(self) -> None:
        channels = self.input_size[0]
        if len(self.mean) != channels or len(self.std) != channels:
            raise ValueError(f"mean/std need {channels} values for input size {self.input_size}")

    @property
    def channels(self) -> int:
        """Number of input channels."""
        return self.input_size[0]

    def to_dict(self) -> dict[str, Any]:
        """Plain-value form, as stored in checkpoints."""
        data = asdict(self)
        data["input_size"] = list(self.input_size)
        data["mean"] = list(self.mean)
        data["std"] = list(self.std)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InputSpec:
        """Inverse of to_dict."""
        return cls(
            input_size=tuple(int(v) for v in data["input_size"]),
            resize_size=int(data["resize_size"]),
            crop_size=int(data["crop_size"]),
            mean=tuple(float(v) for v in data["mean"]),
            std=tuple(float(v) for v in data["std"]),
            interpolation=str(data.get("interpolation", "bilinear")),
        )

    def with_channels(self, channels: int) -> InputSpec:
        """The same spec for another channel count (mean/std repeated or averaged)."""
        if channels == self.channels:
            return self
        mean = sum(self.mean) / len(self.mean)
        std = sum(self.std) / len(self.std)
        return InputSpec((channels, *self.input_size[1:]), self.resize_size, self.crop_size,
                         (mean,) * channels, (std,) * channels, self.interpolation)

    def with_overrides(self, input_size: tuple[int, int, int] | None = None,
                       mean: tuple[float, ...] | None = None,
                       std: tuple[float, ...] | None = None) -> InputSpec:
        """This spec with a user's --input-size C,H,W (square: H == W; the resize keeps this
        spec's resize/crop ratio), --mean and --std; ValueError names what does not fit."""
        spec = self
        if input_size is not None:
            channels, height, width = input_size
            if height != width:
                raise ValueError(f"input size {height}x{width} is not square; give C,S,S")
            resize = max(height, round(height * self.resize_size / self.crop_size))
            spec = self.with_channels(channels)
            spec = InputSpec((channels, height, width), resize, height, spec.mean, spec.std,
                             self.interpolation)
        if mean is None and std is None:
            return spec
        return InputSpec(spec.input_size, spec.resize_size, spec.crop_size,
                         tuple(mean) if mean is not None else spec.mean,
                         tuple(std) if std is not None else spec.std, spec.interpolation)
