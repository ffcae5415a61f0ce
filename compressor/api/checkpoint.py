"""`save_checkpoint` / `load_model`: a model compressed in one's own loop as a checkpoint the
command line reads (`-a ARCH --resume-from CKPT -e`), with its thinning and quantization
recipes, and back."""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from compressor.api.identity import check_module, ensure_described, is_provisional
from compressor.assembly.builder import build_model
from compressor.assembly.setup import load_model as load_checkpoint_model
from compressor.assembly.state import assemble_checkpoint, load_weights, plain_state_dict
from compressor.models.description import (
    ModelDescription,
    describe,
    described,
    description_of,
)
from compressor.models.factory import get_arch_spec
from compressor.training.checkpoint import save_checkpoint as write_checkpoint
from compressor.utils.dataset_table import dataset_spec
from compressor.utils.errors import CheckpointError, CompressorError, UsageError
from compressor.utils.input_spec import InputSpec

__all__ = ["save_checkpoint", "load_model"]

_SPEC_KEYS = tuple(field.name for field in dataclasses.fields(InputSpec))


def _arch(given: str | None, description: ModelDescription) -> str:
    if given is not None:
        if not isinstance(given, str) or not given:
            raise UsageError(f"save_checkpoint: arch is {given!r}; give it as -a takes it")
        return given
    if is_provisional(description):
        raise UsageError("save_checkpoint needs arch=... for a model compressor did not build: "
                         "'path/to/file.py:Name' of its class (as -a takes it), or a registered "
                         "or timm/NAME arch")
    return description.arch


def _spec_from(given: Mapping[str, Any] | InputSpec, base: InputSpec) -> InputSpec:
    """An InputSpec, or a mapping of some of its fields over `base`'s."""
    if isinstance(given, InputSpec):
        return given
    if not isinstance(given, Mapping):
        raise UsageError(f"save_checkpoint: input_spec is a {type(given).__name__}; give a dict "
                         f"of some of {', '.join(_SPEC_KEYS)}")
    for key in given:
        if key not in _SPEC_KEYS:
            close = difflib.get_close_matches(str(key), _SPEC_KEYS, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"use {', '.join(_SPEC_KEYS)}"
            raise UsageError(f"save_checkpoint: input_spec has no key {key!r}; {hint}")
    fields = {**base.to_dict(), **given}
    try:
        return InputSpec.from_dict(fields)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"save_checkpoint: input_spec {dict(given)} does not fit ({exc}); give "
                         "input_size as (C, H, W) and C values of mean and std") from None


def _input_spec(given: Mapping[str, Any] | InputSpec | None, description: ModelDescription,
                dataset: str) -> InputSpec:
    """The given spec (over the model's), else the model's; a provisional one (an example's
    size) takes the dataset's own preprocessing where the sizes agree (digits, CIFAR ...)."""
    base = description.input_spec
    own = dataset_spec(dataset).input_spec
    if is_provisional(description) and own is not None and own.input_size == base.input_size:
        base = own
    return base if given is None else _spec_from(given, base)


def _example_of(given: Mapping[str, Any] | InputSpec | None) -> Tensor | None:
    """A zero batch of the input size an input_spec gives (None when it gives none)."""
    size = given.input_size if isinstance(given, InputSpec) else (
        given.get("input_size") if isinstance(given, Mapping) else None)
    try:
        return torch.zeros(1, *(int(side) for side in size)) if size is not None else None
    except (TypeError, ValueError):
        return None  # _spec_from says what is wrong with it


def _class_names(names: Sequence[str] | None, num_classes: int) -> list[str]:
    if names is None:
        return []
    if isinstance(names, str) or not all(isinstance(name, str) for name in names):
        raise UsageError("save_checkpoint: class_names must be a list of strings (e.g. an "
                         "ImageFolder's .classes)")
    if len(names) != num_classes:
        raise UsageError(f"save_checkpoint: {len(names)} class_names for a model of "
                         f"{num_classes} classes; give one name per output, in label order")
    return list(names)


def _rebuilt(description: ModelDescription, model: nn.Module) -> nn.Module:
    """The model the command line builds from the checkpoint, with these weights loaded: the
    proof that `-a ARCH --resume-from` it will work."""
    rebuilt = build_model(description)
    load_weights(rebuilt, plain_state_dict(model), "the model given to save_checkpoint")
    return rebuilt


def save_checkpoint(model: nn.Module, path: str | os.PathLike[str], *, arch: str | None = None,
                    dataset: str | None = None, class_names: Sequence[str] | None = None,
                    input_spec: Mapping[str, Any] | InputSpec | None = None,
                    example_inputs: Any = None) -> Path:
    """Write a checkpoint of `model` that `compress_classifier.py -a ARCH --resume-from PATH -e`
    evaluates (and --thinnify, --qe, --export-onnx and training with --exp-load-weights-from
    read), its thinning and quantization recipes kept.

    The model is rebuilt from `arch` and loaded with these weights before anything is written,
    so a checkpoint that the command line cannot read is refused in one line.

    Args:
        model: the model (float, pruned, thinned or from quantize_int8).
        path: the file to write (written atomically; its directory is made).
        arch: what `-a` names: 'path/to/file.py:Name' or 'package.module:Name' of the code
            that builds the model (also 'torchvision.models:resnet18' for torchvision's own), a
            registered arch or 'timm/NAME'; required for a model compressor did not build. A
            registered arch may build other modules than the given model (Distiller's blocks),
            which a quantized model's recipe does not fit: name its own builder then.
        dataset: what the command line evaluates it on: 'folder' (an ImageFolder-style
            DATASET_DIR, the default for one's own model), 'digits', 'cifar10', 'imagenet' ...
        class_names: the classes in label order (e.g. ImageFolder's `.classes`), stored with the
            model as the command line stores a folder's (by default the model's own, kept
            from load_model through thin and quantize_int8).
        input_spec: the preprocessing the command line applies, as a dict of some of
            input_size, resize_size, crop_size, mean, std, interpolation (by default the
            dataset's at the model's input size, else ImageNet's mean and std).
        example_inputs: a batch of inputs, for a model no other API function has seen yet
            (not needed when input_spec gives its input_size).

    Returns:
        The path written.
    """
    check_module(model, "save_checkpoint")
    if Path(path).is_dir():
        raise UsageError(f"save_checkpoint: {path} is a directory; give the file to write, e.g. "
                         f"{Path(path) / 'checkpoint.pth.tar'}")
    if example_inputs is None and not described(model):
        example_inputs = _example_of(input_spec)
    description = ensure_described(model, example_inputs, "save_checkpoint")
    arch = _arch(arch, description)
    spec = get_arch_spec(arch)
    dataset = dataset if dataset is not None else description.dataset
    dataset_spec(dataset)  # an unknown name is refused, listing the known ones
    names = _class_names(class_names, description.num_classes) or list(
        description.class_names)
    attrs = description.builder_attrs if arch == description.arch else {}
    wanted = ModelDescription(arch, dataset, description.num_classes,
                              _input_spec(input_spec, description, dataset), attrs,
                              description.transforms, tuple(names))
    try:
        final = description_of(_rebuilt(wanted, model))
    except CompressorError as exc:
        raise CheckpointError(f"save_checkpoint: the model -a {arch} builds does not take this "
                              f"one's weights and recipes ({exc}); name the code that built it "
                              "(e.g. 'torchvision.models:resnet18' for torchvision's own)"
                              ) from None
    describe(model, final)
    record: dict[str, Any] = final.to_record()
    if spec.source:
        record["arch_source"] = dict(spec.source)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_checkpoint(target, assemble_checkpoint(model, args=record))
    return target


def load_model(path: str | os.PathLike[str], *, arch: str | None = None) -> nn.Module:
    """Rebuild the model of a compressor checkpoint with its weights (thinned, quantized ...).

    Args:
        path: a checkpoint written by save_checkpoint or by the command line.
        arch: for a model of one's own code, its 'path/to/file.py:Name' again (code is imported
            only where it is named, never because a checkpoint says so).

    Returns:
        The model, on the CPU, with its description (save_checkpoint needs no arch for it).
    """
    return load_checkpoint_model(path, arch=arch)
