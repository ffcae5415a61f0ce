"""RunRequest: one command line, parsed and typed, grouped as `--help` groups the flags.

argparse ends in compressor.cli.configs, which builds the request; the runner and the command
table (compressor.cli.commands) read nothing else. Each group is the small typed config its
command takes (compressor.utils.config), plus the few choices that pick the command.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compressor.quantization.request import QuantizeRequest
from compressor.utils.config import (
    BudgetConfig,
    DataConfig,
    DistillationConfig,
    ModelRequest,
    OptimizerConfig,
    TrainConfig,
)

__all__ = ["RunRequest", "RunOptions", "ActionRequest", "MemoryRequest"]


@dataclass(frozen=True)
class RunOptions:
    """Where and how the run runs: seed, determinism, devices, run directory, DATASET_DIR."""

    seed: int | None = None
    deterministic: bool = False
    cpu: bool = False
    gpus: tuple[int, ...] | None = None
    output_dir: str = "logs"
    name: str | None = None
    data_dir: str | None = None


@dataclass(frozen=True)
class MemoryRequest:
    """--memory-efficient (a variant, "auto" or None) and --memory-budget (GiB, for auto)."""

    variant: str | None = None
    budget_gib: float | None = None


@dataclass(frozen=True)
class ActionRequest:
    """What a run does besides training: the flags that pick its command."""

    summary: tuple[str, ...] = ()  # --summary
    dry_run: Path | None = None  # --dry-run's schedule (--compress)
    export_onnx: str | None = None  # --export-onnx's destination
    evaluate: bool = False  # -e
    thinnify: bool = False  # --thinnify
    sense: str | None = None  # --sense's granularity
    sense_range: tuple[float, float, float] = (0.0, 0.95, 0.05)
    bn_recalibrate: int | None = None  # --bn-recalibrate (with -e: before evaluating)

    @property
    def training(self) -> bool:
        """Whether the command trains (no -e, --sense, --thinnify or --export-onnx)."""
        return not (self.evaluate or self.sense or self.thinnify or self.export_onnx is not None)


@dataclass(frozen=True)
class RunRequest:
    """One command line, typed: the model, the training and data configs, the budget, the
    quantization and distillation settings, the memory variant, what to do, and the arguments
    as given (args.yaml)."""

    model: ModelRequest
    train: TrainConfig
    data: DataConfig  # as the command reads it (training: with the --vs split)
    eval_data: DataConfig  # the test split alone (export samples, calibration sources)
    optimizer: OptimizerConfig
    budget: BudgetConfig
    quantize: QuantizeRequest | None  # None without a --qe* flag
    distillation: DistillationConfig | None  # None without a --kd-* flag
    run: RunOptions
    memory: MemoryRequest
    action: ActionRequest
    arguments: Mapping[str, Any] = field(default_factory=dict)
    budget_only_flags: tuple[str, ...] = ()  # given flags only a budget run reads

    @property
    def training(self) -> bool:
        """Whether the command trains."""
        return self.action.training
