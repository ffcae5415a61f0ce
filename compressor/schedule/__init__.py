"""Compression schedules: Distiller's YAML format, policies and the CompressionScheduler."""

from compressor.schedule.dry_run import format_dry_run
from compressor.schedule.loader import build_scheduler, load_schedule
from compressor.schedule.lr import MultiStepMultiGammaLR
from compressor.schedule.registry import QUANTIZER_CLASSES, SCHEDULE_CLASSES
from compressor.schedule.scheduler import CompressionScheduler

__all__ = ["load_schedule", "build_scheduler", "CompressionScheduler", "format_dry_run",
           "MultiStepMultiGammaLR", "SCHEDULE_CLASSES", "QUANTIZER_CLASSES"]
