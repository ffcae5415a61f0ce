"""`--compress SCHEDULE --dry-run`: what the schedule will do, per epoch, without data."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from compressor.api.schedule import compression_scheduler
from compressor.schedule import format_dry_run
from compressor.utils.config import OptimizerConfig, make_optimizer

__all__ = ["run_dry_run"]


def run_dry_run(model: nn.Module, schedule: Path, optimizer: OptimizerConfig,
                epochs: int) -> int:
    """Print the schedule's per-epoch plan for `model`; returns the exit status."""
    scheduler = compression_scheduler(schedule, model,
                                      make_optimizer(model.parameters(), optimizer))
    print(format_dry_run(scheduler, epochs))
    return 0
