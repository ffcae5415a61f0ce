"""Reading a file the user names as torch.save's output (a checkpoint, a weights file): plain
data only (weights_only), every way it can fail told in one line naming the file."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import torch

from compressor.utils.errors import CheckpointError

__all__ = ["TORCH_SAVE_HEADS", "load_torch_file", "first_line"]

# the first bytes of what torch.save writes: a zip archive, or (the legacy format) a pickle of
# protocol 2 or later, which opens with the PROTO opcode
TORCH_SAVE_HEADS = (b"PK\x03\x04", b"\x80")


def first_line(exc: BaseException) -> str:
    """An exception's first line (at most 200 characters), or its type's name."""
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def _check_serialized(path: Path, what: str, fix: str) -> None:
    """Refuse a file in neither of torch.save's formats: a schedule, an image or an ONNX file
    given where a checkpoint belongs is named as such, not as a damaged checkpoint."""
    with path.open("rb") as stream:
        head = stream.read(len(TORCH_SAVE_HEADS[0]))
    if not head:
        raise CheckpointError(f"{what} {path} is empty (0 bytes); {fix}")
    if not head.startswith(TORCH_SAVE_HEADS):
        raise CheckpointError(f"{what} {path} is not a PyTorch file (neither the zip archive nor "
                              f"the pickle that torch.save writes); {fix}")


def load_torch_file(path: str | Path, what: str, fix: str) -> Any:
    """torch.load of `path` on the CPU with weights_only=True; `what` names the file ("weights
    file") and `fix` says what to give instead in each one-line CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{what} not found: {path}; check the path given")
    _check_serialized(path, what, fix)
    try:
        with warnings.catch_warnings():  # torch warns about old pickle protocols: noise here
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "Weights only load failed" in str(exc):
            raise CheckpointError(
                f"{what} {path} holds code or objects that are not plain data; it was refused "
                "unexecuted: load it only if you trust it, and re-save it as a plain dict of "
                "tensors") from None
        raise CheckpointError(f"{what} {path} is corrupted ({first_line(exc)}); {fix}") from None
    except MemoryError:
        raise CheckpointError(f"{what} {path} is corrupted (it claims more memory than exists); "
                              f"{fix}") from None
    except Exception as exc:  # noqa: BLE001 - every parse failure is the same to the user
        raise CheckpointError(f"{what} {path} is truncated or corrupted ({type(exc).__name__}: "
                              f"{first_line(exc)}); {fix}") from None
