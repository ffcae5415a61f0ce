"""Knowledge distillation for one training run (Distiller's --kd-* flags).

`Distillation` plugs into the epoch loop as a model wrapper and a loss, so the loop itself does
not change when a teacher is present: `wrap(net)` returns the module that train_one_epoch
trains (its output is the student's, with the teacher's logits on demand) and
`loss_for_epoch(epoch)` the loss of that epoch. Before --kd-start-epoch the loss is the arch's
own on the student alone and the teacher does not run (as in Distiller, whose policy was off).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from compressor.distillation.loss import DistillationLoss, DistillationOutput, StudentLoss
from compressor.distillation.teacher import (
    PRETRAINED,
    WEIGHTS,
    Teacher,
    TeacherSource,
    build_teacher,
)
from compressor.models.description import description_of
from compressor.training.losses import LossFn
from compressor.utils.config import DistillationConfig
from compressor.utils.errors import CheckpointError, UsageError

__all__ = ["Distillation", "StudentWithTeacher", "check_resume_without_distillation"]


_RESTART = "or add --reset-optimizer to start a new run from its weights"
# (record key, flag, type) of the loss settings a checkpoint records
_SETTINGS = (("temperature", "--kd-temperature", float),
             ("distill_weight", "--kd-distill-wt", float),
             ("student_weight", "--kd-student-wt", float),
             ("start_epoch", "--kd-start-epoch", int))
_TEACHER_KEYS = ("teacher_arch", "teacher_weights", "teacher_path", "teacher_sha256")


class StudentWithTeacher(nn.Module):
    """What train_one_epoch trains: the student (or its DDP wrapper) beside its frozen teacher."""

    def __init__(self, student: nn.Module, teacher: Teacher) -> None:
        super().__init__()
        self.student = student
        self.teacher = teacher  # a plain object, not a submodule: see Teacher

    def forward(self, inputs: Tensor) -> DistillationOutput:
        """The student's output; the teacher's logits for `inputs` when the loss asks."""
        return DistillationOutput(self.student(inputs), functools.partial(self.teacher.logits,
                                                                          inputs))


def _number(value: float) -> str:
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def _flags(record: Mapping[str, Any]) -> str:
    """The --kd-* flags that continue the distillation a record describes."""
    if record["teacher_weights"] == PRETRAINED:
        teacher = f"--kd-teacher {record['teacher_arch']} --kd-pretrained"
    elif record["teacher_weights"] == WEIGHTS:
        teacher = f"--kd-teacher {record['teacher_arch']} --kd-resume {record['teacher_path']}"
    else:
        teacher = f"--kd-resume {record['teacher_path']}"
    settings = " ".join(f"{flag} {_number(record[key])}" for key, flag, _ in _SETTINGS)
    return f"{teacher} {settings}"


def _read_record(recorded: Any) -> dict[str, Any]:
    """A checkpoint's distillation record, checked; a malformed one is a CheckpointError."""
    try:
        if not isinstance(recorded, Mapping):
            raise TypeError(f"a {type(recorded).__name__}, not a dict")
        record = {key: str(recorded[key]) for key in _TEACHER_KEYS}
        for key, _, kind in _SETTINGS:
            value = recorded[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{key} is {value!r}")
            record[key] = kind(value)
    except (KeyError, TypeError) as exc:
        raise CheckpointError(f"the checkpoint's distillation record is damaged ({exc}); "
                              f"{_RESTART}") from None
    return record


def _distilled_from(start_epoch: int, next_epoch: float) -> int | None:
    """The first completed epoch that was distilled, None when none was."""
    return start_epoch if start_epoch < next_epoch else None


def check_resume_without_distillation(recorded: Any, next_epoch: int) -> None:
    """Resuming without --kd-*: refuse a checkpoint whose completed epochs were distilled."""
    if recorded is None:
        return
    record = _read_record(recorded)
    if _distilled_from(record["start_epoch"], next_epoch) is None:
        return  # distillation had not started yet: dropping it changes no completed epoch
    raise UsageError(f"the checkpoint was distilled from epoch {record['start_epoch']} "
                     f"(teacher {record['teacher_arch']}); to continue it exactly pass "
                     f"{_flags(record)}, or add --reset-optimizer to train on from its weights "
                     "without a teacher")


class Distillation:
    """A frozen teacher and Hinton's loss, for the epochs from --kd-start-epoch on."""

    def __init__(self, config: DistillationConfig, teacher: Teacher, task_loss: LossFn) -> None:
        self.config = config
        self.teacher = teacher
        self.task_loss = task_loss

    @classmethod
    def start(cls, config: DistillationConfig, student: nn.Module, task_loss: LossFn,
              device: torch.device) -> Distillation:
        """Build the teacher for `student` (wrappers looked through) on `device`."""
        teacher = build_teacher(config.teacher, description_of(student), device)
        return cls(config, teacher, task_loss)

    def describe(self) -> str:
        """One log line: the teacher, the loss settings and what the teacher's input becomes."""
        config, adapter = self.config, self.teacher.adapter
        inputs = ("as the student's" if adapter.is_identity else
                  f"re-preprocessed to {adapter.target.input_size}, mean {adapter.target.mean}, "
                  f"std {adapter.target.std}")
        return (f"distillation: teacher {self.teacher.source.describe()}; T "
                f"{_number(config.temperature)}, distill weight {_number(config.distill_weight)}"
                f", student weight {_number(config.student_weight)}, from epoch "
                f"{config.start_epoch}; teacher input {inputs}")

    def is_active(self, epoch: int) -> bool:
        """Whether `epoch` is distilled."""
        return epoch >= self.config.start_epoch

    def wrap(self, net: nn.Module) -> nn.Module:
        """The module to train: `net` (the student or its DDP wrapper) beside the teacher."""
        return StudentWithTeacher(net, self.teacher)

    def loss_for_epoch(self, epoch: int) -> LossFn:
        """The loss of `epoch`: the task loss alone before the start epoch, then the KD loss."""
        if not self.is_active(epoch):
            return StudentLoss(self.task_loss)
        return DistillationLoss(self.task_loss, self.config.temperature,
                                self.config.distill_weight, self.config.student_weight)

    def record(self) -> dict[str, Any]:
        """The settings the checkpoint records (plain values; never the teacher's weights)."""
        source: TeacherSource = self.teacher.source
        return {"teacher_arch": source.arch, "teacher_weights": source.weights,
                "teacher_path": source.path, "teacher_sha256": source.sha256,
                "temperature": self.config.temperature,
                "distill_weight": self.config.distill_weight,
                "student_weight": self.config.student_weight,
                "start_epoch": self.config.start_epoch}

    def check_resume(self, recorded: Mapping[str, Any] | None,
                     next_epoch: int | None = None) -> None:
        """Refuse a resume that would distil the completed epochs otherwise than they were.

        `recorded` is the checkpoint's `distillation` entry and `next_epoch` the first epoch
        this run trains (None: compare everything). Until distillation has begun, its settings
        may still change; from then on teacher file (sha256), T, weights and start must match.
        """
        done = math.inf if next_epoch is None else next_epoch
        record = None if recorded is None else _read_record(recorded)
        began = None if record is None else _distilled_from(record["start_epoch"], done)
        starts = _distilled_from(self.config.start_epoch, done)
        if began is None:
            if starts is not None:
                later = ("" if next_epoch is None else
                         f"pass --kd-start-epoch {next_epoch} or later to distil from here on, ")
                raise UsageError(f"the checkpoint's completed epochs were trained without "
                                 f"distillation, so it cannot start at epoch {starts}; "
                                 f"{later}{_RESTART}")
            return  # no completed epoch was distilled: the settings may still change
        assert record is not None
        if starts != began:
            raise UsageError(f"the checkpoint was distilled from epoch {began}, not "
                             f"{self.config.start_epoch}; to continue it exactly pass "
                             f"{_flags(record)}, {_RESTART}")
        mine = self.record()
        self._check_teacher(record, mine)
        differ = [f"{flag} {_number(record[key])} (not {_number(mine[key])})"
                  for key, flag, _ in _SETTINGS if record[key] != mine[key]]
        if differ:
            raise UsageError(f"the checkpoint was distilled with {', '.join(differ)}; to continue "
                             f"it exactly pass {_flags(record)}, {_RESTART}")

    def _check_teacher(self, record: Mapping[str, Any], mine: Mapping[str, Any]) -> None:
        same = (record["teacher_sha256"] == mine["teacher_sha256"]
                and record["teacher_weights"] == mine["teacher_weights"]
                and record["teacher_arch"] == mine["teacher_arch"])
        if record["teacher_weights"] == PRETRAINED:
            same = same and record["teacher_path"] == mine["teacher_path"]
        if not same:
            old = TeacherSource(*(record[key] for key in _TEACHER_KEYS)).describe()
            raise CheckpointError(f"the checkpoint was distilled from the teacher {old}, not "
                                  f"{self.teacher.source.describe()}; to continue it exactly "
                                  f"pass {_flags(record)}, {_RESTART}")
