"""What several commands share: a run's data, its evaluation function, the facts every
results.json carries, and the resolved-arguments record."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from compressor.assembly.setup import RunSetup
from compressor.data import (
    DatasetSplits,
    EvaluationData,
    load_calibration_dataset,
    load_datasets,
    load_test_dataset,
)
from compressor.data.image_sizes import small_images_note
from compressor.models.description import describe, description_of
from compressor.reports.metrics import model_metrics
from compressor.training.dataloaders import eval_loader
from compressor.training.loop import evaluate
from compressor.utils.config import DataConfig, LoaderConfig
from compressor.utils.distributed import DistContext, all_reduce_sum
from compressor.utils.errors import DataError
from compressor.utils.precision import Precision

__all__ = ["EvaluateFn", "load_run_data", "name_classes", "images_note", "device_of",
           "evaluation_fn", "model_facts", "run_record", "calibration_source"]

# datasets read as image folders of any size (a user's own, ImageNet's layout)
IMAGE_FOLDERS = ("folder", "imagenet")
EvaluateFn = Callable[[nn.Module], dict[str, float]]


def _labels(setup: RunSetup) -> dict[str, Any]:
    """How a run's data is labelled: seed, classes, pretrained indices, recorded class names."""
    checkpoint = setup.checkpoint or {}
    recorded = checkpoint.get("args")
    pretrained = setup.model.pretrained or bool(
        isinstance(recorded, dict) and recorded.get("pretrained"))
    # the checkpoint's classes (its description reads them), unless the dataset changed
    names = list(setup.description.class_names)
    return {"seed": setup.seed, "num_classes": setup.description.num_classes,
            "pretrained": pretrained, "class_names": names or None}


def load_run_data(setup: RunSetup, config: DataConfig, training: bool
                  ) -> DatasetSplits | EvaluationData:
    """Training: train/validation/test splits; otherwise the test split alone (no train files)."""
    description = setup.description
    labels = _labels(setup)
    if not training:
        return load_test_dataset(description.dataset, config.root, description.input_spec,
                                 effective_test_size=config.effective_test_size, **labels)
    return load_datasets(description.dataset, config.root, description.input_spec,
                         validation_split=config.validation_split,
                         effective_train_size=config.effective_train_size,
                         effective_valid_size=config.effective_valid_size,
                         effective_test_size=config.effective_test_size, **labels)


def device_of(model: nn.Module, ctx: DistContext) -> torch.device:
    """The run's device, or the CPU for a model that only runs there (int8 kernels)."""
    device = next((t.device for t in model.state_dict().values()
                   if isinstance(t, torch.Tensor)), ctx.device)
    return device if device.type == "cpu" else ctx.device


def evaluation_fn(dataset: Dataset, loader: LoaderConfig, ctx: DistContext,
                  desc: str = "test", precision: Precision | None = None) -> EvaluateFn:
    """model -> top-1/top-5/loss on `dataset` (all-reduced across ranks), on the model's device,
    under `precision` (--amp, --channels-last: as the model trains; None, fp32)."""
    batches = eval_loader(dataset, loader.batch_size, loader.workers, ctx)
    reduce = all_reduce_sum if ctx.enabled else None

    def evaluate_fn(net: nn.Module) -> dict[str, float]:
        return evaluate(net, batches, device_of(net, ctx), reduce=reduce, desc=desc,
                        precision=precision)

    return evaluate_fn


def model_facts(model: nn.Module, run_dir: Path) -> dict[str, Any]:
    """What every results.json says of its model: identity, sparsity, params, MACs, sizes."""
    description = description_of(model)
    return {"arch": description.arch, "dataset": description.dataset,
            "num_classes": description.num_classes,
            "transforms": [step.name for step in description.transforms],
            **model_metrics(model, run_dir / "checkpoint.pth.tar")}


def images_note(setup: RunSetup, root: str | Path | None) -> str | None:
    """One line when an image folder's images are much smaller than the model's input (they
    are upscaled: each step costs as at the model's size); None otherwise."""
    if root is None or setup.description.dataset not in IMAGE_FOLDERS:
        return None
    return small_images_note(root, setup.description.input_spec)


def name_classes(model: nn.Module, class_names: Sequence[str]) -> None:
    """Give `model`'s description the run's class names (a folder's, a dataset's), so they go
    wherever the model goes: checkpoints, thinning, int8, export."""
    description = description_of(model)
    named = description.with_class_names(list(class_names))
    if named != description:
        describe(model, named)


def run_record(arguments: Mapping[str, Any], setup: RunSetup,
               class_names: tuple[str, ...]) -> dict[str, Any]:
    """The resolved arguments: args.yaml, and the checkpoint's `args`."""
    record = {**arguments, **setup.description.to_record(), "seed": setup.seed}
    if class_names:  # the run's data names them (the description's, from to_record, else)
        record["class_names"] = list(class_names)
    if setup.model.pretrained_source is not None:
        record["pretrained_source"] = setup.model.pretrained_source.to_dict()
    elif isinstance((setup.checkpoint or {}).get("args"), Mapping):
        recorded = setup.checkpoint["args"].get("pretrained_source")  # kept across resumes
        if recorded is not None:
            record["pretrained_source"] = recorded
    if setup.model.arch_spec.source:
        record["arch_source"] = dict(setup.model.arch_spec.source)
    return record


CALIBRATION_FIX = ("calibration reads the training split, or calibrate on the test split with "
                   "--qe-calibration-split test")


def calibration_source(setup: RunSetup, config: DataConfig, test: Dataset, split: str,
                       fix: str = CALIBRATION_FIX) -> Callable[[], Dataset]:
    """What calibration reads, loaded when first asked for: the training split with evaluation
    transforms, or (Distiller's choice, `split="test"`) the test split evaluated on; `fix`
    ends the line of a training split that cannot be read (what reads it and what to do)."""
    if split == "test":
        return lambda: test

    def training_split() -> Dataset:
        description = setup.description
        try:
            return load_calibration_dataset(description.dataset, config.root,
                                            description.input_spec, **_labels(setup))
        except DataError as exc:
            raise DataError(f"{exc}; {fix}") from None

    return training_split
