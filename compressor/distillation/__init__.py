"""Knowledge distillation (Hinton et al. 2015) with Distiller's --kd-* flags.

A frozen teacher, rebuilt from any compressor checkpoint or torchvision's pretrained weights and
fed its own preprocessing, and the loss sw * task + dw * T^2 * KL(teacher || student).
"""

from compressor.distillation.adapter import InputAdapter
from compressor.distillation.loss import (
    DistillationLoss,
    DistillationOutput,
    StudentLoss,
    distillation_loss,
    student_output,
)
from compressor.distillation.policy import (
    Distillation,
    StudentWithTeacher,
    check_resume_without_distillation,
)
from compressor.distillation.teacher import Teacher, TeacherSource, build_teacher, file_sha256

__all__ = [
    "Distillation", "StudentWithTeacher", "check_resume_without_distillation", "InputAdapter",
    "DistillationLoss", "DistillationOutput", "StudentLoss", "distillation_loss",
    "student_output", "Teacher", "TeacherSource", "build_teacher", "file_sha256",
]
