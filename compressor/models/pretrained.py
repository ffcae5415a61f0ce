"""Pretrained weights: torchvision's, found in $TORCH_HOME/hub/checkpoints/ or downloaded, or
the file an installed package ships (EfficientNet-Lite0's)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn
from torchvision.models import get_weight

from compressor.models.registry import ArchSpec
from compressor.utils.errors import CheckpointError, UsageError

__all__ = ["pretrained_weights_path", "has_pretrained_weights", "pretrained_file",
           "load_pretrained_weights"]


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
        raise UsageError(f"architecture '{spec.name}' has no pretrained weights; drop --pretrained")
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


def load_pretrained_weights(model: nn.Module, spec: ArchSpec) -> None:
    """Load the arch's pretrained weights into `model` (aux heads may be absent from it)."""
    path = pretrained_file(spec)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"pretrained weights file {path} cannot be read "
                              f"({type(exc).__name__}); delete it and download it again") from None
    own = model.state_dict()
    # torchvision files carry aux heads that a model built with aux_logits=False does not have.
    unexpected = [key for key in state if key not in own]
    if any(not key.startswith(("aux", "AuxLogits")) for key in unexpected):
        raise CheckpointError(f"pretrained weights file {path} does not match {spec.name} "
                              f"(unexpected keys such as {unexpected[0]}); delete it")
    try:
        model.load_state_dict({k: v for k, v in state.items() if k in own}, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"pretrained weights file {path} does not match {spec.name} "
                              f"({str(exc).splitlines()[0]}); delete it") from None
