"""`-e`: evaluate a model on the test split; `--confusion`: its confusion matrix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from compressor.assembly.setup import RunSetup
from compressor.commands.common import EvaluateFn, device_of
from compressor.data import DatasetSplits, EvaluationData
from compressor.reports import confusion_report
from compressor.training.dataloaders import eval_loader
from compressor.utils.config import LoaderConfig
from compressor.utils.distributed import DistContext, all_reduce_sum

__all__ = ["evaluate_model", "confusion_results"]


def evaluate_model(setup: RunSetup, model: nn.Module, evaluate_fn: EvaluateFn) -> dict[str, Any]:
    """Test top-1/top-5/loss, with the epoch and best top-1 of the checkpoint evaluated."""
    test = evaluate_fn(model)
    return {**test, **setup.progress(test)}


def confusion_results(ctx: DistContext, model: nn.Module, data: DatasetSplits | EvaluationData,
                      run_dir: Path | None, loader: LoaderConfig) -> dict[str, Any]:
    """--confusion: the confusion matrix of the test split (confusion.csv, confusion.png)."""
    batches = eval_loader(data.test, loader.batch_size, loader.workers, ctx)
    return confusion_report(model, batches, device_of(model, ctx), num_classes=data.num_classes,
                            class_names=data.class_names, run_dir=run_dir,
                            reduce=all_reduce_sum if ctx.enabled else None)
