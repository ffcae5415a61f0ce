"""Small typed run configs, built once from the parsed command line by compressor.cli.

Library code (training, thinning, model resolution) takes these, never argparse.Namespace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from compressor.utils.precision import Precision

__all__ = ["OptimizerConfig", "LoaderConfig", "DataConfig", "ModelRequest", "DistillationConfig",
           "ReportConfig", "TrainConfig", "BudgetConfig", "make_optimizer"]


@dataclass(frozen=True)
class OptimizerConfig:
    """SGD with momentum and weight decay, as Distiller's compress_classifier.py."""

    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    lr_head: float | None = None  # a newly initialised classifier's LR (None: HEAD_LR_FACTOR x lr)


@dataclass(frozen=True)
class LoaderConfig:
    """DataLoader settings."""

    batch_size: int = 256
    workers: int = 0


@dataclass(frozen=True)
class DataConfig:
    """Where the data is and which fractions of it a run uses (--vs, --etrs, --evs, --etes)."""

    root: str | None = None
    validation_split: float = 0.1
    effective_train_size: float = 1.0
    effective_valid_size: float = 1.0
    effective_test_size: float = 1.0


@dataclass(frozen=True)
class ModelRequest:
    """What the user asked to build: an arch, or a checkpoint to rebuild (and options)."""

    arch: str | None = None
    checkpoint: Path | None = None
    dataset: str | None = None
    pretrained: bool = False
    memory_efficient: str | None = None
    load_weights_from: Path | None = None
    num_classes: int | None = None  # --num-classes, or the classes of an image folder
    input_size: tuple[int, int, int] | None = None  # --input-size C,H,W
    mean: tuple[float, ...] | None = None  # --mean
    std: tuple[float, ...] | None = None  # --std
    pretrained_file: Path | None = None  # --pretrained-file: a state dict or safetensors file


@dataclass(frozen=True)
class DistillationConfig:
    """Knowledge distillation (Distiller's --kd-* flags): the teacher and the loss weights."""

    teacher: ModelRequest  # an arch with pretrained weights, or a checkpoint
    temperature: float = 1.0
    distill_weight: float = 0.5
    student_weight: float = 0.5
    start_epoch: int = 0


@dataclass(frozen=True)
class ReportConfig:
    """Optional per-epoch and end-of-run reports."""

    tensorboard: bool = False
    confusion: bool = False
    masks_sparsity: bool = False


@dataclass(frozen=True)
class BudgetConfig:
    """A budget run: targets as fractions of the dense model's figures, and how to measure."""

    targets: Mapping[str, float]  # "macs" | "params" | "latency" | "size" -> fraction
    max_drop: float | None = None  # validation top-1 points the budget may cost
    latency_batch: int = 1
    latency_threads: int = 1
    distill: bool = True  # fine-tune with the dense model as teacher
    # --target-accuracy-drop: the search removes as much of `targets`' one quantity (fraction
    # 1.0) as keeps validation top-1 within this many points of the dense model's
    accuracy_drop: float | None = None
    # --channel-multiple: pruned layers keep multiples of it (None: 8 on CUDA, 1 on the CPU)
    channel_multiple: int | None = None


@dataclass(frozen=True)
class TrainConfig:
    """The epoch loop: total epochs, logging, schedule, optimizer and loader settings."""

    epochs: int
    optimizer: OptimizerConfig
    loader: LoaderConfig
    print_freq: int = 10
    compress: Path | None = None
    reset_optimizer: bool = False
    distillation: DistillationConfig | None = None
    reports: ReportConfig = ReportConfig()
    bn_momentum: float | None = None  # --bn-momentum: every batch norm's, while training
    # --bn-recalibrate: batches of a batch-norm re-estimation (None: automatic, 0: never)
    bn_recalibrate: int | None = None
    precision: Precision = Precision()  # --amp, --channels-last


def make_optimizer(params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]],
                   config: OptimizerConfig) -> torch.optim.Optimizer:
    """The one optimizer factory: SGD(lr, momentum, weight_decay), over parameters or groups."""
    return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                           weight_decay=config.weight_decay)
