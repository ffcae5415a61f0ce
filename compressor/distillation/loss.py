"""Hinton's distillation loss, and the output of a student run beside its teacher.

loss = sw * task loss + dw * T^2 * KL(softmax(teacher / T) || softmax(student / T)), the KL
averaged over the batch (Hinton et al., "Distilling the Knowledge in a Neural Network", 2015:
T^2 keeps the soft term's gradients on the scale of the hard term's as T changes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from torch import Tensor

from compressor.training.losses import LossFn, main_logits

__all__ = ["DistillationOutput", "student_output", "distillation_loss", "DistillationLoss",
           "StudentLoss"]


class DistillationOutput:
    """The student's own output, and its teacher's logits for the same batch on demand.

    `logits` is the student's main head, so compressor.training.losses.main_logits and the training
    metrics see the student. The teacher runs only when a loss asks for its logits, so epochs
    before --kd-start-epoch cost nothing extra.
    """

    __slots__ = ("student", "_teacher", "_teacher_logits")

    def __init__(self, student: Any, teacher: Callable[[], Tensor]) -> None:
        self.student = student
        self._teacher = teacher
        self._teacher_logits: Tensor | None = None

    @property
    def logits(self) -> Tensor:
        """The student's main logits."""
        return main_logits(self.student)

    def teacher_logits(self) -> Tensor:
        """The teacher's main logits (computed once, without gradients)."""
        if self._teacher_logits is None:
            self._teacher_logits = self._teacher()
        return self._teacher_logits


def student_output(output: Any) -> Any:
    """The student's own output (as the arch's loss expects it) of a model output."""
    return output.student if isinstance(output, DistillationOutput) else output


def distillation_loss(student_logits: Tensor, teacher_logits: Tensor,
                      temperature: float) -> Tensor:
    """T^2 * KL(softmax(teacher / T) || softmax(student / T)), averaged over the batch (in
    fp32: logits from a mixed-precision forward are cast first)."""
    log_student = F.log_softmax(student_logits.float() / temperature, dim=1)
    log_teacher = F.log_softmax(teacher_logits.detach().float() / temperature, dim=1)
    kl = F.kl_div(log_student, log_teacher, log_target=True, reduction="batchmean")
    return kl * (temperature * temperature)


@dataclass(frozen=True)
class StudentLoss:
    """The arch's own loss on the student's output alone (before --kd-start-epoch)."""

    task_loss: LossFn

    def __call__(self, output: Any, target: Tensor) -> Tensor:
        """task loss(student output, target)."""
        return self.task_loss(student_output(output), target)


@dataclass(frozen=True)
class DistillationLoss:
    """sw * task loss + dw * T^2 * KL on the main logits of student and teacher."""

    task_loss: LossFn  # the arch's own (e.g. Inception's main + 0.4 * aux)
    temperature: float
    distill_weight: float
    student_weight: float

    def __call__(self, output: Any, target: Tensor) -> Tensor:
        """The weighted sum for one batch; `output` comes from Distillation.wrap's module."""
        if not isinstance(output, DistillationOutput):
            raise TypeError("the distillation loss needs the output of Distillation.wrap(model)")
        loss = self.student_weight * self.task_loss(output.student, target)
        if self.distill_weight == 0.0:
            return loss
        soft = distillation_loss(output.logits, output.teacher_logits(), self.temperature)
        return loss + self.distill_weight * soft
