"""Checkpoints: plain, versioned dicts, written atomically and read with weights_only=True.

Every file the project writes (checkpoints, best.pth.tar, metrics.csv, results.json,
args.yaml) goes through `atomic_write`: a temporary file beside the target, fsynced, then
renamed into place, so a crash never leaves a half-written file.
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch import nn

from compressor.errors import CheckpointError, CompressorError
from compressor.models.description import ModelDescription, description_of, unwrap_model

__all__ = [
    "FORMAT_VERSION", "REQUIRED_KEYS", "CHECKPOINT_NAME", "BEST_NAME", "atomic_write",
    "atomic_write_text", "save_checkpoint", "save_run_checkpoint", "assemble_checkpoint",
    "load_checkpoint", "require_full_checkpoint", "read_description", "load_weights",
    "clean_state_dict", "plain_state_dict", "get_rng_state", "set_rng_state",
]

# 2: model_attrs holds the framework transforms as an ordered list under "transforms"
# (version 1 had flat "memory_efficient" / "thinning" keys; both are read).
FORMAT_VERSION = 2
REQUIRED_KEYS = ("format_version", "arch", "dataset", "num_classes", "model_attrs", "input_spec",
                 "state_dict")
CHECKPOINT_NAME = "checkpoint.pth.tar"
BEST_NAME = "best.pth.tar"
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], None]) -> None:
    """Call `write(handle)` on a temporary file beside `path`, fsync it, rename it into place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            write(handle)
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


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write a UTF-8 text file atomically."""
    atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))


def save_checkpoint(path: str | os.PathLike[str], state: Mapping[str, Any]) -> None:
    """torch.save `state` atomically."""
    atomic_write(path, lambda handle: torch.save(dict(state), handle))


def save_run_checkpoint(run_dir: Path, state: Mapping[str, Any], is_best: bool) -> None:
    """Write run_dir/checkpoint.pth.tar and, when best, the same bytes to best.pth.tar."""
    path = run_dir / CHECKPOINT_NAME
    save_checkpoint(path, state)
    if is_best:
        def copy(handle: IO[bytes]) -> None:
            with open(path, "rb") as source:
                shutil.copyfileobj(source, handle)

        atomic_write(run_dir / BEST_NAME, copy)


def assemble_checkpoint(model: nn.Module, *, args: Mapping[str, Any],
                        **progress: Any) -> dict[str, Any]:
    """The checkpoint dict of DESIGN.md for `model` (wrappers looked through) and progress keys.

    The model's ModelDescription gives arch, dataset, classes, input spec and model_attrs;
    `progress` holds optimizer, lr_scheduler, compression, epoch, best_top1, best_epoch, rng...
    """
    description = description_of(model)
    return {
        "format_version": FORMAT_VERSION,
        "arch": description.arch,
        "dataset": description.dataset,
        "num_classes": description.num_classes,
        "model_attrs": description.model_attrs(),
        "input_spec": description.input_spec.to_dict(),
        "state_dict": plain_state_dict(model),
        "args": dict(args),
        **progress,
    }


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a checkpoint (or a bare state dict) on the CPU, refusing anything but plain data.

    Any failure to read or parse the file becomes one CheckpointError line naming it: the
    weights-only unpickler raises many exception types on arbitrary bytes.
    """
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
    except MemoryError:
        raise CheckpointError(f"checkpoint {path} is corrupted (it claims more memory than "
                              "exists); use another checkpoint, e.g. best.pth.tar") from None
    except Exception as exc:  # noqa: BLE001 - every parse failure is the same to the user
        raise CheckpointError(f"checkpoint {path} is truncated or corrupted "
                              f"({type(exc).__name__}: {_first_line(exc)}); use another "
                              "checkpoint, e.g. best.pth.tar") from None
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
                              f"{_first_line(exc)}); use another checkpoint") from None


def load_weights(model: nn.Module, state_dict: Mapping[str, Any], source: str) -> None:
    """Load a state dict (module./_orig_mod. prefixes stripped), naming the file on mismatch."""
    if not isinstance(state_dict, Mapping):
        raise CheckpointError(f"{source} holds no state dict of tensors; use a checkpoint "
                              "saved by compressor or torch.save(model.state_dict())")
    try:
        inner = unwrap_model(model)
        cleaned = clean_state_dict(state_dict)
        if _post_training_quantized(inner):
            from compressor.quantization.packing import unpack_state_dict

            cleaned = unpack_state_dict(inner, cleaned)
        inner.load_state_dict(cleaned, strict=True)
    except (RuntimeError, TypeError, AttributeError, KeyError, ValueError) as exc:
        detail = " ".join(str(exc).split())[:300]
        raise CheckpointError(f"weights in {source} do not fit {description_of(model).arch} "
                              f"({detail}); check the arch and the file") from None


def clean_state_dict(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Strip DataParallel/DDP `module.` and torch.compile `_orig_mod.` prefixes."""
    cleaned = {}
    for name, value in state_dict.items():
        name = str(name)
        while name.startswith(_WRAPPER_PREFIXES):
            name = name.split(".", 1)[1]
        cleaned[name] = value
    return cleaned


def _post_training_quantized(model: nn.Module) -> bool:
    """Whether the model is post-training quantized (its weights are stored as integers)."""
    from compressor.models.description import described
    from compressor.transforms import quantization_kind

    return described(model) and quantization_kind(description_of(model)) == "post_train"


def plain_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with wrapper prefixes stripped (masks live in the tensors);
    a post-training quantized model's weights as plain integer tensors with their scales."""
    from compressor.transforms import stored_form

    inner = stored_form(model)
    if _post_training_quantized(inner):
        from compressor.quantization.packing import pack_state_dict

        return clean_state_dict(pack_state_dict(inner))
    return clean_state_dict(inner.state_dict())


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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
