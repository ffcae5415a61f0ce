"""How a loop computes: mixed precision (autocast, with a gradient scaler for fp16) and the
memory format, as one small typed setting that the training and evaluation loops take."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from compressor.utils.vocabulary import AMP_NAMES

__all__ = ["AMP_DTYPES", "Precision"]

# --amp's names -> the dtype autocast computes in
AMP_DTYPES = dict(zip(AMP_NAMES, (torch.bfloat16, torch.float16), strict=True))


@dataclass(frozen=True)
class Precision:
    """Autocast dtype (`amp`: "bf16", "fp16" or None for fp32) and channels-last memory format.

    Weights and optimizer state stay fp32 (autocast casts inside the forward); fp16 scales the
    loss with a gradient scaler, bf16 needs none.
    """

    amp: str | None = None
    channels_last: bool = False
    compile: bool = False  # --compile: the training step's forward through torch.compile

    def __post_init__(self) -> None:
        if self.amp is not None and self.amp not in AMP_DTYPES:
            raise ValueError(f"amp is {self.amp!r}; use one of {', '.join(AMP_DTYPES)} or None")

    @classmethod
    def from_record(cls, record: Any) -> Precision:
        """The setting a checkpoint recorded (fp32, contiguous where it records none)."""
        if not isinstance(record, Mapping):
            return cls()
        amp = record.get("amp")
        return cls(amp=amp if amp in AMP_DTYPES else None,
                   channels_last=bool(record.get("channels_last", False)),
                   compile=bool(record.get("compile", False)))

    def record(self) -> dict[str, Any]:
        """Plain values for a checkpoint."""
        return {"amp": self.amp, "channels_last": self.channels_last, "compile": self.compile}

    def describe(self) -> str:
        """In words, for a log line."""
        amp = f"mixed precision ({self.amp} autocast)" if self.amp else "fp32"
        return amp + (", channels-last memory format" if self.channels_last else "") + (
            ", torch.compile" if self.compile else "")

    @property
    def dtype(self) -> torch.dtype | None:
        """The dtype autocast computes in (None: no autocast)."""
        return AMP_DTYPES[self.amp] if self.amp is not None else None

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        """The autocast region of a forward pass (and its loss) on `device`."""
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=AMP_DTYPES[self.amp])

    def grad_scaler(self, device: torch.device) -> torch.amp.GradScaler | None:
        """A gradient scaler for fp16 (its small range underflows gradients); None otherwise."""
        return torch.amp.GradScaler(device.type) if self.amp == "fp16" else None

    def inputs(self, x: Tensor) -> Tensor:
        """A batch of images in the memory format the model computes in."""
        if self.channels_last and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    def compiled(self, net: nn.Module) -> nn.Module:
        """`net` as the training step runs it: through torch.compile with --compile (the
        module itself is what is saved and evaluated), else `net`."""
        return torch.compile(net) if self.compile else net  # type: ignore[return-value]

    def prepare(self, model: nn.Module) -> nn.Module:
        """The model (in place) in this memory format; parameters keep their identity."""
        if self.channels_last:
            model.to(memory_format=torch.channels_last)
        return model
