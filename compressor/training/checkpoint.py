"""Checkpoint files: plain, versioned dicts, written atomically and read with weights_only=True.

This module knows the file format (required keys, format version, RNG state, wrapper prefixes)
and no model or method: compressor.assembly.state turns a model into the dict and back,
calling each recipe's own hooks for weights stored in a method's form.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from compressor.models.description import ModelDescription
from compressor.utils.atomic_io import atomic_duplicate, atomic_write
from compressor.utils.errors import CheckpointError, CompressorError
from compressor.utils.torch_files import first_line, load_torch_file

__all__ = [
    "FORMAT_VERSION", "REQUIRED_KEYS", "CHECKPOINT_NAME", "BEST_NAME", "save_checkpoint",
    "save_run_checkpoint", "load_checkpoint", "require_full_checkpoint", "read_description",
    "clean_state_dict", "get_rng_state", "set_rng_state",
]

# 2: model_attrs holds the framework transforms as an ordered list under "transforms"
# (version 1 had flat "memory_efficient" / "thinning" keys; both are read).
FORMAT_VERSION = 2
REQUIRED_KEYS = ("format_version", "arch", "dataset", "num_classes", "model_attrs", "input_spec",
                 "state_dict")
CHECKPOINT_NAME = "checkpoint.pth.tar"
BEST_NAME = "best.pth.tar"
CHECKPOINT_FIX = "use another checkpoint, e.g. best.pth.tar"
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def save_checkpoint(path: str | os.PathLike[str], state: Mapping[str, Any]) -> None:
    """torch.save `state` atomically."""
    atomic_write(path, lambda handle: torch.save(dict(state), handle))


def save_run_checkpoint(run_dir: Path, state: Mapping[str, Any], is_best: bool) -> None:
    """Write run_dir/checkpoint.pth.tar and, when best, the same bytes to best.pth.tar.

    best.pth.tar is a hard link where the file system allows (no second copy on disk), as
    timm's checkpoint saver does; the next save replaces checkpoint.pth.tar, never writes into it.
    """
    path = run_dir / CHECKPOINT_NAME
    save_checkpoint(path, state)
    if is_best:
        atomic_duplicate(path, run_dir / BEST_NAME)


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a checkpoint (or a bare state dict) on the CPU, refusing anything but plain data.

    Any failure to read or parse the file becomes one CheckpointError line naming it: the
    weights-only unpickler raises many exception types on arbitrary bytes.
    """
    data = load_torch_file(path, "checkpoint", CHECKPOINT_FIX)
    if not isinstance(data, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(data).__name__}, not a dict; "
                              "save a state dict or a compressor checkpoint")
    return data


def require_full_checkpoint(checkpoint: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Check that a loaded dict is a compressor checkpoint that can rebuild its model."""
    missing = [key for key in REQUIRED_KEYS if key not in checkpoint]
    if missing:
        raise CheckpointError(
            f"{path} is not a compressor checkpoint (missing {', '.join(missing)}); to load "
            "weights alone use --exp-load-weights-from with -a ARCH")
    version = checkpoint["format_version"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise CheckpointError(f"{path} has format version {version!r}, not an integer; the "
                              "checkpoint is damaged, use another one")
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{path} has format version {version}, newer than this "
                              f"compressor reads ({FORMAT_VERSION}); upgrade compressor")


def read_description(checkpoint: Mapping[str, Any],
                     path: str | os.PathLike[str]) -> ModelDescription:
    """The ModelDescription a full checkpoint records; a malformed one is a CheckpointError."""
    require_full_checkpoint(checkpoint, path)
    try:
        return ModelDescription.from_checkpoint(checkpoint)
    except CompressorError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise CheckpointError(f"{path} has a malformed model description ({type(exc).__name__}: "
                              f"{first_line(exc)}); use another checkpoint") from None


def clean_state_dict(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Strip DataParallel/DDP `module.` and torch.compile `_orig_mod.` prefixes."""
    cleaned = {}
    for name, value in state_dict.items():
        name = str(name)
        while name.startswith(_WRAPPER_PREFIXES):
            name = name.split(".", 1)[1]
        cleaned[name] = value
    return cleaned


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


def set_rng_state(state: Mapping[str, Any]) -> None:
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

