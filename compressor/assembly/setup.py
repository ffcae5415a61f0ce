"""Resolve what to build (arch or checkpoint, dataset, input spec, transforms) and build it.

`resolve_model` and `load_model` take plain values, never argparse, so library code (a
distillation teacher, an export) can rebuild any compressor checkpoint on its own.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from compressor.assembly.builder import build_model
from compressor.assembly.recipes import finish_loaded_model
from compressor.assembly.state import load_weights
from compressor.memory.recipe import MemoryVariantTransform
from compressor.models.description import ModelDescription
from compressor.models.factory import get_arch_spec
from compressor.models.pretrained import PretrainedSource, pretrained_source
from compressor.models.probe import probe_forward
from compressor.models.registry import ArchSpec
from compressor.models.sources import is_code_reference
from compressor.training.checkpoint import load_checkpoint, read_description
from compressor.utils.config import ModelRequest
from compressor.utils.dataset_table import FOLDER, SYNTHETIC
from compressor.utils.errors import CheckpointError, UsageError
from compressor.utils.input_spec import InputSpec

__all__ = ["ResolvedModel", "RunSetup", "resolve_model", "build_resolved_model", "load_model",
           "resolve_run"]

LOG = logging.getLogger("compressor")


@dataclass(frozen=True)
class ResolvedModel:
    """A model to build: its description, and where its weights come from."""

    description: ModelDescription
    arch_spec: ArchSpec
    checkpoint: Mapping[str, Any] | None = None  # the checkpoint it is rebuilt from, if any
    checkpoint_path: Path | None = None
    pretrained: bool = False
    load_weights_from: Path | None = None
    pretrained_source: PretrainedSource | None = None  # with `pretrained`: the weights read
    pretrained_file: Path | None = None  # --pretrained-file, else the arch's own weights

    @property
    def new_layers(self) -> tuple[str, ...]:
        """Classifier layers initialised for the dataset (not from pretrained weights), also as
        the checkpoint being resumed records them."""
        if self.pretrained_source is not None:
            return self.pretrained_source.new_layers
        recorded = (self.checkpoint or {}).get("args")
        source = recorded.get("pretrained_source") if isinstance(recorded, Mapping) else None
        layers = source.get("new_layers") if isinstance(source, Mapping) else None
        return tuple(str(layer) for layer in layers) if isinstance(layers, list) else ()


@dataclass(frozen=True)
class RunSetup:
    """The resolved description of a run: its model and its seed."""

    model: ResolvedModel
    seed: int

    @property
    def description(self) -> ModelDescription:
        """The model's description as resolved (before any training changes it)."""
        return self.model.description

    @property
    def arch(self) -> str:
        """The architecture's registry name."""
        return self.model.description.arch

    @property
    def dataset(self) -> str:
        """The dataset the run uses."""
        return self.model.description.dataset

    @property
    def checkpoint(self) -> Mapping[str, Any] | None:
        """The --resume-from checkpoint, if any."""
        return self.model.checkpoint

    @property
    def checkpoint_path(self) -> Path | None:
        """Where the --resume-from checkpoint was read."""
        return self.model.checkpoint_path

    def progress(self, test: Mapping[str, float]) -> dict[str, Any]:
        """Epoch and best top-1 of the evaluated checkpoint (of `test` when there is none)."""
        checkpoint = self.checkpoint or {}
        epoch = int(checkpoint.get("epoch", -1))
        return {"epoch": epoch, "best_top1": checkpoint.get("best_top1", test["top1"]),
                "best_epoch": checkpoint.get("best_epoch", epoch)}


def _refuse_code_from_checkpoint(arch: str, request: ModelRequest) -> None:
    """A checkpoint never makes compressor import code: the command line names it again."""
    if is_code_reference(arch) and request.arch is None:
        raise CheckpointError(
            f"checkpoint {request.checkpoint} holds a model of your own code ({arch}); pass "
            f"-a {arch} again (compressor imports code only where the command line names it)")


def _warn_changed_code(spec: ArchSpec, checkpoint: Mapping[str, Any], path: Path) -> None:
    """Own code whose file changed since the checkpoint was written: one warning, the run goes
    on (the weights still load where the names and shapes are the same)."""
    recorded = checkpoint.get("args")
    source = recorded.get("arch_source") if isinstance(recorded, Mapping) else None
    before = source.get("sha256") if isinstance(source, Mapping) else None
    now = spec.source.get("sha256")
    if before and now and before != now:
        LOG.warning("warning: %s changed since %s was written (sha256 %s, now %s); the model is "
                    "built from the code as it is now", spec.source.get("file"), path,
                    str(before)[:12], str(now)[:12])


def _refuse_new_input(request: ModelRequest, description: ModelDescription) -> None:
    """The checkpoint's classes and input spec are the model's: a request may not change them."""
    if request.num_classes is not None and request.num_classes != description.num_classes:
        raise UsageError(f"--num-classes {request.num_classes}: checkpoint {request.checkpoint} "
                         f"has {description.num_classes} classes; drop --num-classes")
    if any(value is not None for value in (request.input_size, request.mean, request.std)):
        raise UsageError(f"checkpoint {request.checkpoint} records its input spec; drop "
                         "--input-size / --mean / --std")


def _input_spec(spec: ArchSpec, dataset: str, request: ModelRequest) -> InputSpec:
    """The arch's input spec for the dataset, with the request's --input-size/--mean/--std."""
    try:
        return spec.input_spec(dataset).with_overrides(request.input_size, request.mean,
                                                       request.std)
    except ValueError as exc:
        raise UsageError(f"{exc}; check --input-size, --mean and --std") from None


def _from_arch(request: ModelRequest, spec: ArchSpec) -> ModelDescription:
    dataset = request.dataset or spec.default_dataset
    # the arch's own weights are for its default dataset; the user's own code has no weights
    # but a --pretrained-file of theirs, for any dataset
    own_weights = not is_code_reference(spec.name)
    if own_weights and request.pretrained and dataset not in (spec.default_dataset, SYNTHETIC,
                                                              FOLDER):
        raise UsageError(f"--pretrained weights of {spec.name} are for "
                         f"{spec.default_dataset}, not {dataset}; drop --pretrained or "
                         "--dataset")
    num_classes = request.num_classes or spec.num_classes(dataset)
    return ModelDescription(spec.name, dataset, num_classes, _input_spec(spec, dataset, request))


def resolve_model(request: ModelRequest) -> ResolvedModel:
    """Arch, dataset, input spec, attributes and transforms from the request or the checkpoint.

    A checkpoint describes its model: its input spec, classes and transforms win over today's
    registry; the request may change the dataset (e.g. evaluate on synthetic data) and add a
    memory-efficient variant.
    """
    checkpoint: Mapping[str, Any] | None = None
    source = None
    if request.checkpoint is not None:
        checkpoint = load_checkpoint(request.checkpoint)
        description = read_description(checkpoint, request.checkpoint)
        _refuse_code_from_checkpoint(description.arch, request)
        if request.arch is not None and request.arch != description.arch:
            raise CheckpointError(
                f"checkpoint {request.checkpoint} is of arch '{description.arch}', not "
                f"'{request.arch}'; drop -a or pass -a {description.arch}")
        _refuse_new_input(request, description)
        spec = get_arch_spec(description.arch)
        _warn_changed_code(spec, checkpoint, request.checkpoint)
        if request.dataset is not None and request.dataset != description.dataset:
            description = ModelDescription(description.arch, request.dataset,
                                           description.num_classes, description.input_spec,
                                           description.builder_attrs, description.transforms)
    elif request.arch is not None:
        spec = get_arch_spec(request.arch)
        description = _from_arch(request, spec)
        if request.pretrained:
            source = pretrained_source(spec, description.num_classes, request.pretrained_file)
    else:
        raise UsageError("no architecture given: pass -a ARCH, or --resume-from CKPT")
    if request.memory_efficient:
        description = description.with_transform(MemoryVariantTransform.name,
                                                  request.memory_efficient)
    return ResolvedModel(description, spec, checkpoint, request.checkpoint,
                         request.pretrained and checkpoint is None, request.load_weights_from,
                         source, request.pretrained_file)


def _check_takes_input(model: nn.Module, resolved: ResolvedModel) -> None:
    """A registered arch at another --input-size than its own: one eval forward of a 1xCxHxW
    zeros batch (no state changes), so that a size its layers cannot take is one line."""
    description = resolved.description
    size = description.input_spec.input_size
    if is_code_reference(description.arch):  # the user's code is checked at its build
        return
    try:
        own = resolved.arch_spec.input_spec(description.dataset).input_size
    except ValueError:
        return
    if tuple(size) == tuple(own):
        return
    device = next(model.parameters(), torch.empty(0)).device
    try:
        probe_forward(model, torch.zeros(1, *size, device=device))
    except (RuntimeError, ValueError) as exc:
        detail = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        shown = "x".join(str(d) for d in size)
        raise UsageError(f"{description.arch} cannot take a {shown} input ({detail}); pass its "
                         f"own --input-size {','.join(str(d) for d in own)}, or another") from None


def build_resolved_model(resolved: ResolvedModel) -> nn.Module:
    """Build the model; load the checkpoint's, the pretrained or the --exp-load-weights weights."""
    model = build_model(resolved.description, pretrained=resolved.pretrained,
                        source=resolved.pretrained_source, weights_file=resolved.pretrained_file)
    if resolved.checkpoint is None:
        _check_takes_input(model, resolved)
    if resolved.checkpoint is not None:
        load_weights(model, resolved.checkpoint["state_dict"], str(resolved.checkpoint_path))
        return finish_loaded_model(model)
    elif resolved.load_weights_from is not None:
        data = load_checkpoint(resolved.load_weights_from)
        load_weights(model, data.get("state_dict", data), str(resolved.load_weights_from))
    return model


def load_model(path: str | Path, *, dataset: str | None = None,
               memory_efficient: str | None = None, arch: str | None = None) -> nn.Module:
    """Rebuild any compressor checkpoint's model (arch, attributes, transforms) with weights;
    a model of the user's own code needs its `arch` (`path/to/file.py:Name`) named again."""
    return build_resolved_model(resolve_model(ModelRequest(
        arch=arch, checkpoint=Path(path), dataset=dataset, memory_efficient=memory_efficient)))


def _checkpoint_seed(checkpoint: Mapping[str, Any] | None) -> int | None:
    recorded = (checkpoint or {}).get("args")
    seed = recorded.get("seed") if isinstance(recorded, Mapping) else None
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def resolve_run(request: ModelRequest, *, seed: int | None = None,
                deterministic: bool = False) -> RunSetup:
    """The model to build and the run's seed (given, else the checkpoint's, else drawn)."""
    resolved = resolve_model(request)
    if seed is None:
        seed = _checkpoint_seed(resolved.checkpoint)
    if seed is None:
        seed = 0 if deterministic else random.SystemRandom().randrange(2**31)
    return RunSetup(resolved, int(seed))
