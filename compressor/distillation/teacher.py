"""The teacher of a distillation: rebuilt from a checkpoint or pretrained weights, then frozen.

A `Teacher` is deliberately not an nn.Module: no wrapper (the student's DDP, the distillation
wrapper) can register it as a submodule, so it never enters a state_dict, a checkpoint, DDP's
gradient buckets or a `.train()` call. Under torchrun every rank builds its own replica.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from compressor.assembly.setup import ResolvedModel, build_resolved_model, resolve_model
from compressor.distillation.adapter import InputAdapter
from compressor.models.description import ModelDescription, description_of
from compressor.models.factory import get_arch_spec
from compressor.models.inference import inference_copy
from compressor.models.pretrained import has_pretrained_weights, pretrained_file
from compressor.models.registry import ArchSpec
from compressor.models.sources import is_code_reference
from compressor.training.checkpoint import REQUIRED_KEYS, load_checkpoint
from compressor.training.losses import main_logits
from compressor.utils.config import ModelRequest
from compressor.utils.errors import CheckpointError, CompressorError, UsageError
from compressor.utils.file_hash import file_sha256

__all__ = ["Teacher", "TeacherSource", "build_teacher", "file_sha256", "CHECKPOINT", "WEIGHTS",
           "PRETRAINED"]

CHECKPOINT = "checkpoint"  # a compressor checkpoint: it describes its own model
WEIGHTS = "weights"  # a bare or Distiller state dict, for the --kd-teacher architecture
PRETRAINED = "pretrained"  # torchvision's weights for --kd-teacher


@dataclass(frozen=True)
class TeacherSource:
    """Where the teacher's weights come from, as the student's checkpoint records it."""

    arch: str
    weights: str  # CHECKPOINT, WEIGHTS or PRETRAINED
    path: str  # the file as given (pretrained: the weights' file name)
    sha256: str  # of that file's bytes

    def describe(self) -> str:
        """A short human description, for messages."""
        return f"{self.arch} ({self.weights} {self.path}, sha256 {self.sha256[:12]})"


class Teacher:
    """A frozen teacher: eval mode, no gradients, fed its own preprocessing. It holds only its
    inference copy (batch norms folded, channels-last), not the model it was built from: one
    copy of the teacher's weights in memory."""

    def __init__(self, model: nn.Module, adapter: InputAdapter, source: TeacherSource) -> None:
        self.description: ModelDescription = description_of(model)
        # what computes the logits: the same function, batch norms folded, channels-last
        self.inference = inference_copy(model.eval().requires_grad_(False))
        self.adapter = adapter
        self.source = source

    def logits(self, inputs: Tensor) -> Tensor:
        """The teacher's main logits for a batch normalized for the student."""
        # no_grad, not inference_mode: the logits feed the student's autograd graph as constants
        with torch.no_grad():
            return main_logits(self.inference(self.adapter(inputs)))


def _dataset_for(spec: ArchSpec, student_dataset: str, pretrained: bool) -> str:
    """The student's dataset when the arch (and its weights) support it, else the arch's own."""
    own = spec.own_dataset(student_dataset)
    if own in spec.datasets and (not pretrained or own == spec.default_dataset):
        return student_dataset
    return spec.default_dataset


def _is_compressor_checkpoint(path: Path) -> bool:
    return all(key in load_checkpoint(path) for key in REQUIRED_KEYS)


def _named_code(path: Path, arch: str | None) -> str | None:
    """The --kd-teacher that a checkpoint of the user's own code needs (its arch, named again:
    code is imported only where the command line names it); None for any other file."""
    checkpoint = load_checkpoint(path)
    found = checkpoint.get("arch")
    if not isinstance(found, str) or not is_code_reference(found):
        return None
    if arch != found:
        raise CheckpointError(f"--kd-resume {path} holds a model of your own code ({found}); "
                              f"pass --kd-teacher {found} (compressor imports code only where "
                              "the command line names it)")
    return found


def _resolve_file(path: Path, arch: str | None, student: ModelDescription
                  ) -> tuple[ResolvedModel, str]:
    """A compressor checkpoint rebuilds itself (own code with --kd-teacher naming it again);
    other state dicts need --kd-teacher ARCH."""
    try:
        resolved = resolve_model(ModelRequest(checkpoint=path, arch=_named_code(path, arch)))
    except CheckpointError:
        if _is_compressor_checkpoint(path):
            raise  # a damaged compressor checkpoint: its own message says what is wrong
        if arch is None:
            raise CheckpointError(f"--kd-resume {path} is not a compressor checkpoint; name the "
                                  "teacher's architecture with --kd-teacher ARCH to load its "
                                  "weights") from None
        spec = get_arch_spec(arch)
        dataset = _dataset_for(spec, student.dataset, pretrained=False)
        return resolve_model(ModelRequest(arch=arch, dataset=dataset,
                                          load_weights_from=path)), WEIGHTS
    found = resolved.description.arch
    if arch is not None and arch != found:
        raise UsageError(f"--kd-resume {path} holds a '{found}', not the --kd-teacher '{arch}'; "
                         f"drop --kd-teacher or pass --kd-teacher {found}")
    return resolved, CHECKPOINT


def _resolve(request: ModelRequest, student: ModelDescription) -> tuple[ResolvedModel, str]:
    """The teacher to build and the kind of its weights."""
    if request.checkpoint is not None:
        return _resolve_file(request.checkpoint, request.arch, student)
    if request.arch is None:
        raise UsageError("no teacher given: pass --kd-teacher ARCH --kd-pretrained or "
                         "--kd-resume CKPT")
    spec = get_arch_spec(request.arch)
    if not has_pretrained_weights(spec):
        raise UsageError(f"architecture '{spec.name}' has no pretrained weights; train "
                         f"one and pass --kd-resume CKPT instead of --kd-pretrained")
    dataset = _dataset_for(spec, student.dataset, pretrained=True)
    return resolve_model(ModelRequest(arch=spec.name, dataset=dataset, pretrained=True)), PRETRAINED


def _source(resolved: ResolvedModel, kind: str, request: ModelRequest) -> TeacherSource:
    arch = resolved.description.arch
    if kind == PRETRAINED:
        file = pretrained_file(resolved.arch_spec, download=False)
        return TeacherSource(arch, kind, file.name, file_sha256(file))
    path = request.checkpoint
    assert path is not None
    return TeacherSource(arch, kind, str(path), file_sha256(path))


def build_teacher(request: ModelRequest, student: ModelDescription,
                  device: torch.device) -> Teacher:
    """Build, load and freeze the teacher of `request` for a student described by `student`.

    A compressor checkpoint gives everything (arch, attributes, transforms, input spec); a
    bare state dict needs --kd-teacher ARCH; pretrained weights use the arch's own spec. The
    global RNG is left as it was, so a teacher changes nothing of the student's run.
    """
    try:
        resolved, kind = _resolve(request, student)
        with torch.random.fork_rng(devices=[]):
            model = build_resolved_model(resolved)
        source = _source(resolved, kind, request)
    except CompressorError as exc:
        raise type(exc)(f"distillation teacher: {exc}") from None
    except OSError as exc:
        raise CheckpointError(f"distillation teacher: cannot read its weights "
                              f"({type(exc).__name__}: {exc}); check --kd-resume") from None
    teacher_desc = description_of(model)
    if teacher_desc.num_classes != student.num_classes:
        raise UsageError(
            f"the teacher {teacher_desc.arch} predicts {teacher_desc.num_classes} classes but the "
            f"student {student.arch} predicts {student.num_classes}; use a teacher trained on "
            f"{student.dataset} (--kd-resume CKPT)")
    adapter = InputAdapter(student.input_spec, teacher_desc.input_spec, device)
    return Teacher(model.to(device), adapter, source)
