"""Checkpoints: plain, versioned dicts, written atomically and read with weights_only=True."""

from __future__ import annotations

import os
import pickle
import random
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from compressor.errors import CheckpointError

__all__ = [
    "FORMAT_VERSION", "REQUIRED_KEYS", "save_checkpoint", "load_checkpoint",
    "require_full_checkpoint", "clean_state_dict", "plain_state_dict", "get_rng_state",
    "set_rng_state",
]

FORMAT_VERSION = 1
REQUIRED_KEYS = ("format_version", "arch", "dataset", "num_classes", "model_attrs", "input_spec",
                 "state_dict")
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def save_checkpoint(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Write `state` to a temporary file beside `path`, fsync it, then rename it into place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a checkpoint (or a bare state dict) on the CPU, refusing anything but plain data."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}; check the path given")
    try:
        with warnings.catch_warnings():  # torch warns about old pickle protocols: noise here
            warnings.simplefilter("ignore")
            data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "Weights only load failed" in str(exc):
            raise CheckpointError(
                f"checkpoint {path} holds code or objects that are not plain data; it was "
                "refused unexecuted: load it only if you trust it, and re-save it as a plain "
                "dict of tensors") from None
        raise CheckpointError(f"checkpoint {path} is corrupted ({_first_line(exc)}); "
                              "use another checkpoint, e.g. best.pth.tar") from None
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {path} is truncated or corrupted ({_first_line(exc)}); "
                              "use another checkpoint, e.g. best.pth.tar") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(data).__name__}, not a dict; "
                              "save a state dict or a compressor checkpoint")
    return data


def require_full_checkpoint(checkpoint: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Check that a loaded dict is a compressor checkpoint that can rebuild its model."""
    missing = [key for key in REQUIRED_KEYS if key not in checkpoint]
    if missing:
        raise CheckpointError(
            f"{path} is not a compressor checkpoint (missing {', '.join(missing)}); to load "
            "weights alone use --exp-load-weights-from with -a ARCH")
    if checkpoint["format_version"] > FORMAT_VERSION:
        raise CheckpointError(f"{path} has format version {checkpoint['format_version']}, newer "
                              f"than this compressor reads ({FORMAT_VERSION}); upgrade compressor")


def clean_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip DataParallel/DDP `module.` and torch.compile `_orig_mod.` prefixes."""
    cleaned = {}
    for name, value in state_dict.items():
        while name.startswith(_WRAPPER_PREFIXES):
            name = name.split(".", 1)[1]
        cleaned[name] = value
    return cleaned


def plain_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state with parametrized tensors (e.g. pruning masks) saved as their values."""
    state = model.state_dict()
    plain = {k: v for k, v in state.items() if ".parametrizations." not in f".{k}"}
    for module_name, module in model.named_modules():
        parametrizations = getattr(module, "parametrizations", None)
        if parametrizations is None:
            continue
        prefix = f"{module_name}." if module_name else ""
        for tensor_name in parametrizations:
            plain[prefix + tensor_name] = getattr(module, tensor_name).detach().clone()
    return clean_state_dict(plain)


def get_rng_state() -> dict[str, Any]:
    """The torch, CUDA, numpy and python RNG states as plain values and tensors."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos,
                  "has_gauss": has_gauss, "cached": cached},
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what get_rng_state returned."""
    torch.set_rng_state(state["torch"])
    numpy_state = state["numpy"]
    np.random.set_state((numpy_state["kind"], numpy_state["keys"].numpy().astype(np.uint32),
                         numpy_state["pos"], numpy_state["has_gauss"], numpy_state["cached"]))
    python_state = state["python"]
    random.setstate((python_state["version"], tuple(python_state["internal"]),
                     python_state["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
