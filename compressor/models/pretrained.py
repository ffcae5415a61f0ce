"""Pretrained weights: torchvision's (found in $TORCH_HOME/hub/checkpoints/ or downloaded), the
file an installed package ships (EfficientNet-Lite0's), timm's (the local Hugging Face cache) or
a file the user names (--pretrained-file: a state dict or a safetensors file).

Transfer learning: when the dataset's classes differ from the weights', every weight is loaded
but the arch's classifier layers (ArchSpec.classifier), which keep the initialisation their
family's builder gave them; `PretrainedSource.new_layers` names them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torchvision.models import get_weight

from compressor.models.names import canonical_name
from compressor.models.registry import ArchSpec
from compressor.utils.errors import CheckpointError, UsageError
from compressor.utils.file_hash import file_sha256
from compressor.utils.torch_files import load_torch_file

__all__ = ["PretrainedSource", "pretrained_weights_path", "has_pretrained_weights",
           "pretrained_file", "read_weights_file", "pretrained_source", "load_pretrained_weights"]

WEIGHTS_FILE_FIX = "give a torch.save(state_dict) or safetensors file"
# Keys of a checkpoint dict that hold the state dict itself (timm's, Lightning's, ours)
_STATE_KEYS = ("state_dict", "model", "state_dict_ema", "model_ema")
# Heads that torchvision's files carry and a model built with aux_logits=False does not have
_OPTIONAL_HEADS = ("aux", "AuxLogits")


@dataclass(frozen=True)
class PretrainedSource:
    """Where a backbone's weights came from, and which layers were newly initialised."""

    weights: str  # the weights' name: torchvision's enum, timm's hub id, a package, a file
    file: str  # the file's name
    sha256: str
    new_layers: tuple[str, ...] = ()  # classifier layers built for the dataset's classes

    def to_dict(self) -> dict[str, Any]:
        """Plain values, as args.yaml and the checkpoint's `args` record them."""
        return {"weights": self.weights, "file": self.file, "sha256": self.sha256,
                "new_layers": list(self.new_layers)}

    def describe(self) -> str:
        """The log line of a run that starts from these weights."""
        head = (f"; newly initialised for the dataset's classes: {', '.join(self.new_layers)}"
                if self.new_layers else "")
        where = f"{self.file}, " if self.file != self.weights else ""
        return f"pretrained weights {self.weights} ({where}sha256 {self.sha256[:12]}){head}"


def pretrained_weights_path(url: str) -> Path:
    """Where torch.hub keeps the file of `url`: $TORCH_HOME/hub/checkpoints/<file name>."""
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(url)


def has_pretrained_weights(spec: ArchSpec) -> bool:
    """Whether the architecture has pretrained weights (torchvision's or a package's)."""
    return spec.weights is not None or spec.weights_file is not None


def pretrained_file(spec: ArchSpec, *, download: bool = True) -> Path:
    """The local file of the arch's pretrained weights (torchvision's downloaded when absent and
    `download`); an arch without any is a UsageError."""
    if spec.weights_file is not None:
        return spec.weights_file()
    if spec.weights is None:
        raise UsageError(f"architecture '{spec.name}' has no pretrained weights; drop --pretrained "
                         "or give a weights file with --pretrained-file PATH")
    weights = get_weight(spec.weights)
    path = pretrained_weights_path(weights.url)
    if not path.is_file() and download:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.hub.download_url_to_file(weights.url, str(path), progress=False)
        except Exception as exc:  # no network, refused, interrupted: all the same to the user
            raise CheckpointError(
                f"pretrained weights for {spec.name} not found at {path} and the download from "
                f"{weights.url} failed ({type(exc).__name__}); copy the file there or set "
                "TORCH_HOME") from None
    return path


def _unwrap(data: Any, path: Path) -> dict[str, Tensor]:
    """The state dict inside a loaded file, with wrapper prefixes stripped."""
    while isinstance(data, Mapping) and not any(isinstance(v, Tensor) for v in data.values()):
        inner = next((data[key] for key in _STATE_KEYS if isinstance(data.get(key), Mapping)),
                     None)
        if inner is None:
            break
        data = inner
    if not isinstance(data, Mapping) or not data:
        raise CheckpointError(f"weights file {path} holds no state dict of tensors; give a "
                              "torch.save(model.state_dict()) or safetensors file")
    return {canonical_name(str(key)): value for key, value in data.items()
            if isinstance(value, Tensor)}


def read_weights_file(path: Path) -> dict[str, Tensor]:
    """A state dict from a torch file (weights_only) or a safetensors file, on the CPU."""
    if path.suffix != ".safetensors":
        return _unwrap(load_torch_file(path, "weights file", WEIGHTS_FILE_FIX), path)
    if not path.is_file():
        raise CheckpointError(f"weights file not found: {path}; check the path given")
    try:
        from safetensors.torch import load_file

        data = load_file(str(path), device="cpu")
    except ImportError:
        raise UsageError(f"{path} is a safetensors file and the safetensors package is not "
                         "installed; pip install safetensors") from None
    except Exception as exc:  # noqa: BLE001 - every parse failure is the same to the user
        detail = " ".join(str(exc).split())[:160] or type(exc).__name__
        raise CheckpointError(f"weights file {path} cannot be read ({detail}); "
                              f"{WEIGHTS_FILE_FIX}") from None
    return _unwrap(data, path)


def _classifier_keys(layers: tuple[str, ...], keys: Any) -> list[str]:
    return [key for key in keys if any(key.startswith(f"{layer}.") for layer in layers)]


def pretrained_source(spec: ArchSpec, num_classes: int, file: Path | None = None
                      ) -> PretrainedSource:
    """The weights a model of `num_classes` classes starts from: the arch's own (or `file`),
    with the classifier layers whose class count differs from the weights' listed as new."""
    path = file if file is not None else pretrained_file(spec)
    state = read_weights_file(path)
    new_layers = []
    for layer in spec.classifier:
        weight = state.get(f"{layer}.weight")
        if weight is not None and weight.ndim >= 1 and weight.shape[0] != num_classes:
            new_layers.append(layer)
    name = str(path) if file is not None else str(spec.weights or spec.source.get("weights")
                                                  or path.name)
    return PretrainedSource(name, path.name, file_sha256(path), tuple(new_layers))


def load_pretrained_weights(model: nn.Module, spec: ArchSpec,
                            source: PretrainedSource | None = None,
                            file: Path | None = None) -> PretrainedSource:
    """Load pretrained weights into `model`, all but `source.new_layers` (transfer learning).

    Returns the source (computed here when not given). A weight the model lacks (but
    torchvision's aux heads), a model weight the file lacks or a shape mismatch outside the
    classifier is a CheckpointError naming the first such key.
    """
    path = file if file is not None else pretrained_file(spec)
    if source is None:
        from compressor.models.description import description_of

        source = pretrained_source(spec, description_of(model).num_classes, file)
    state = read_weights_file(path)
    own = model.state_dict()
    skipped = set(_classifier_keys(source.new_layers, state))
    unexpected = [key for key in state if key not in own and key not in skipped]
    if any(not key.startswith(_OPTIONAL_HEADS) for key in unexpected):
        first = next(key for key in unexpected if not key.startswith(_OPTIONAL_HEADS))
        raise CheckpointError(f"weights file {path} does not match {spec.name} (unexpected keys "
                              f"such as {first}); give the weights of this architecture")
    loaded = {key: value for key, value in state.items() if key in own and key not in skipped}
    fresh = set(_classifier_keys(source.new_layers, own))
    missing = [key for key in own if key not in loaded and key not in fresh
               and not key.endswith("num_batches_tracked")]  # older files lack the counter
    mismatched = [key for key, value in loaded.items() if value.shape != own[key].shape]
    if missing or mismatched:
        key = (missing or mismatched)[0]
        what = "missing" if missing else (f"shape {tuple(loaded[key].shape)} for "
                                          f"{tuple(own[key].shape)}")
        raise CheckpointError(f"weights file {path} does not match {spec.name} ({key}: {what}); "
                              "give the weights of this architecture and input size")
    model.load_state_dict(loaded, strict=False)
    return source
