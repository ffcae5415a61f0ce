"""`DistillationLoss`: Hinton's knowledge distillation as a loss for one's own training loop,
computed by the loss the command line's --kd-* flags train with."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from compressor.api.identity import check_module
from compressor.distillation.loss import DistillationLoss as WeightedDistillationLoss
from compressor.distillation.loss import DistillationOutput
from compressor.training.losses import cross_entropy, main_logits
from compressor.utils.errors import UsageError

__all__ = ["DistillationLoss"]


def _number(name: str, value: Any, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            value <= 0 if positive else value < 0):
        raise UsageError(f"DistillationLoss: {name}={value!r}; give a number "
                         f"{'above' if positive else 'at least'} 0")
    return float(value)


class DistillationLoss:
    """sw * task loss + dw * T^2 * KL(softmax(teacher / T) || softmax(student / T)).

    A loss wrapper: the training loop stays as it is, the loss is called with the batch's
    inputs too, and the frozen teacher (eval mode, no gradients) runs on them:

        kd = compressor.DistillationLoss(teacher, temperature=4.0)
        loss = kd(model(x), y, x)

    Defaults are Distiller's --kd-* defaults (T 1, weights 0.5 and 0.5).
    """

    def __init__(self, teacher: nn.Module, temperature: float = 1.0,
                 distill_weight: float = 0.5, student_weight: float = 0.5,
                 task_loss: Callable[[Any, Tensor], Tensor] | None = None) -> None:
        """Args:
            teacher: the trained model to learn from (same classes); it is put in eval mode.
            temperature: T, the softmax temperature of both models' logits.
            distill_weight: dw, the weight of the distillation term.
            student_weight: sw, the weight of the task loss on the true labels.
            task_loss: the task loss (output, target) -> loss; cross-entropy by default.
        """
        if task_loss is not None and not callable(task_loss):
            raise UsageError("DistillationLoss: task_loss is not callable; give a function "
                             "(output, target) -> loss, or None for cross-entropy")
        self.teacher = check_module(teacher, "DistillationLoss").eval()
        self.loss = WeightedDistillationLoss(
            task_loss if task_loss is not None else cross_entropy,
            _number("temperature", temperature, positive=True),
            _number("distill_weight", distill_weight, positive=False),
            _number("student_weight", student_weight, positive=False))

    @property
    def temperature(self) -> float:
        """T."""
        return self.loss.temperature

    def __call__(self, output: Any, target: Tensor, inputs: Tensor) -> Tensor:
        """The loss of one batch.

        Args:
            output: the student's output on `inputs` (logits, or an output holding them).
            target: the true labels.
            inputs: the batch the student saw; the teacher runs on it.

        Returns:
            The weighted sum, a scalar to backpropagate.
        """
        student = DistillationOutput(output, functools.partial(self._teacher_logits, inputs))
        return self.loss(student, target)

    def _teacher_logits(self, inputs: Tensor) -> Tensor:
        with torch.no_grad():
            return main_logits(self.teacher(inputs))

