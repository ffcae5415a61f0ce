"""Distiller's knowledge-distillation flags (--kd-*)."""

from __future__ import annotations

import argparse

from compressor.cli.domains import INT_MAX, integer, path, real

__all__ = ["add_distillation_args", "KD_LOSS_DEFAULTS"]

# The loss settings' flags and defaults: given without a teacher they would do nothing
KD_LOSS_DEFAULTS = {"--kd-temperature": ("kd_temperature", 1.0),
                    "--kd-distill-wt": ("kd_distill_wt", 0.5),
                    "--kd-student-wt": ("kd_student_wt", 0.5),
                    "--kd-start-epoch": ("kd_start_epoch", 0)}


def add_distillation_args(parser: argparse.ArgumentParser) -> None:
    """--kd-teacher, --kd-pretrained, --kd-resume and the loss weights."""
    group = parser.add_argument_group(
        "distillation",
        "knowledge distillation from a teacher while training: loss = sw * task loss + dw * "
        "T^2 * KL(softmax(teacher/T) || softmax(student/T))")
    group.add_argument("--kd-teacher", dest="kd_teacher", default=None, metavar="ARCH",
                       help="teacher architecture (with --kd-pretrained or --kd-resume)")
    group.add_argument("--kd-pretrained", dest="kd_pretrained", action="store_true",
                       help="the teacher uses torchvision's pretrained weights")
    group.add_argument("--kd-resume", dest="kd_resume", default=None, metavar="CKPT", type=path,
                       help="the teacher: any compressor checkpoint (arch, attributes, "
                            "thinning, memory variant and input spec come from it)")
    group.add_argument("--kd-temperature", "--kd-temp", dest="kd_temperature",
                       type=real(0.0, None, low_open=True), default=1.0,
                       help="softmax temperature T, > 0 (default 1.0)")
    group.add_argument("--kd-distill-wt", "--kd-dw", dest="kd_distill_wt",
                       type=real(0.0, None), default=0.5,
                       help="weight dw of the distillation loss, >= 0 (default 0.5)")
    group.add_argument("--kd-student-wt", "--kd-sw", dest="kd_student_wt",
                       type=real(0.0, None), default=0.5,
                       help="weight sw of the student's task loss, >= 0 (default 0.5)")
    group.add_argument("--kd-teacher-wt", "--kd-tw", dest="kd_teacher_wt",
                       type=real(0.0, None), default=0.0,
                       help="weight of the teacher's own loss (not supported: must be 0)")
    group.add_argument("--kd-start-epoch", dest="kd_start_epoch", type=integer(0, INT_MAX),
                       default=0, help="epoch from which distillation is on, >= 0 (default 0)")
