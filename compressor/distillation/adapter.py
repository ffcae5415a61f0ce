"""Re-preprocess a batch for another model: each model of a distillation sees its own input spec.

The loader normalizes a batch for the student's InputSpec. A teacher trained with another
normalization, size or channel count gets that batch undone to [0, 1] pixels and redone for its
own spec, on the device. The student's crop cannot be undone: the teacher sees the student's
view of each image, resized to the teacher's size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from compressor.utils.errors import UsageError
from compressor.utils.input_spec import InputSpec

__all__ = ["InputAdapter", "LUMINANCE"]

# ITU-R 601-2 luma, as torchvision's Grayscale (the data pipeline's 3 -> 1 channel conversion)
LUMINANCE = (0.2989, 0.587, 0.114)
# F.interpolate modes for an InputSpec's interpolation; antialias where torch supports it
_MODES = {"bilinear": ("bilinear", True), "bicubic": ("bicubic", True),
          "nearest": ("nearest", False), "nearest-exact": ("nearest-exact", False)}


def _channel_view(values: tuple[float, ...], device: torch.device) -> Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device).view(1, -1, 1, 1)


class InputAdapter:
    """Turns a batch normalized for `source` into the batch that `target` expects."""

    def __init__(self, source: InputSpec, target: InputSpec, device: torch.device) -> None:
        if target.channels not in (1, 3) and target.channels != source.channels:
            raise UsageError(f"cannot feed {source.channels}-channel inputs to a teacher that "
                             f"expects {target.channels}; use a teacher with 1 or 3 channels")
        if source.channels not in (1, 3) and target.channels != source.channels:
            raise UsageError(f"cannot turn the student's {source.channels}-channel inputs into "
                             f"the teacher's {target.channels}; use a teacher with "
                             f"{source.channels} input channels")
        self.source, self.target = source, target
        self.renormalize = (source.channels != target.channels or source.mean != target.mean
                            or source.std != target.std)
        self.size = tuple(target.input_size[1:])
        self.mode, self.antialias = _MODES.get(target.interpolation.lower(), ("bilinear", True))
        self._mean_in = _channel_view(source.mean, device)
        self._std_in = _channel_view(source.std, device)
        self._mean_out = _channel_view(target.mean, device)
        self._std_out = _channel_view(target.std, device)
        self._luma = _channel_view(LUMINANCE, device)

    @property
    def is_identity(self) -> bool:
        """True when both specs agree on channels, normalization and size (nothing to do)."""
        return not self.renormalize and tuple(self.source.input_size[1:]) == self.size

    def __call__(self, inputs: Tensor) -> Tensor:
        """The batch as the target spec's preprocessing would have made it from these pixels."""
        x = inputs
        if self.renormalize:
            x = x * self._std_in.to(x.dtype) + self._mean_in.to(x.dtype)  # back to [0, 1] pixels
            x = self._convert_channels(x)
        if tuple(x.shape[-2:]) != self.size:
            # Resizing is linear with weights summing to 1, so it commutes with normalization.
            x = F.interpolate(x, size=self.size, mode=self.mode, antialias=self.antialias,
                              **({"align_corners": False} if self.antialias else {}))
        if self.renormalize:
            x = (x - self._mean_out.to(x.dtype)) / self._std_out.to(x.dtype)
        return x

    def _convert_channels(self, x: Tensor) -> Tensor:
        have, want = x.shape[1], self.target.channels
        if have == want:
            return x
        if have == 1:
            return x.expand(-1, want, -1, -1)
        return (x * self._luma.to(x.dtype)).sum(dim=1, keepdim=True)
