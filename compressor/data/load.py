"""Datasets by name for a model's InputSpec: all splits to train, the test split to evaluate."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
from torch.utils.data import Dataset

from compressor.data.cifar import load_cifar_dataset
from compressor.data.digits import load_digits_dataset
from compressor.data.folder import load_folder_dataset
from compressor.data.idx import load_idx_dataset
from compressor.data.image_transforms import build_transforms, is_deterministic
from compressor.data.imagenet import load_imagenet_dataset
from compressor.data.splits import (
    DatasetSplits,
    EvaluationData,
    LoadRequest,
    RawSplits,
    TransformedDataset,
    check_fractions,
    split_train_val,
    take_subset,
)
from compressor.data.synthetic import load_synthetic_dataset
from compressor.utils.dataset_table import DatasetSpec, dataset_names, dataset_spec
from compressor.utils.errors import DataError
from compressor.utils.input_spec import InputSpec

__all__ = ["DATASET_NAMES", "LOADERS", "needs_data_dir", "load_datasets", "load_test_dataset",
           "load_calibration_dataset"]

DATASET_NAMES: tuple[str, ...] = dataset_names()
# File format (a dataset row's `loader`) -> its loader: loader(request, **row.loader_options).
LOADERS: MappingProxyType[str, Callable[..., RawSplits]] = MappingProxyType({
    "digits": load_digits_dataset,
    "idx": load_idx_dataset,
    "cifar": load_cifar_dataset,
    "imagenet": load_imagenet_dataset,
    "folder": load_folder_dataset,
    "synthetic": load_synthetic_dataset,
})


def needs_data_dir(dataset: str) -> bool:
    """Whether a dataset is read from DATASET_DIR (False for the embedded digits and synthetic)."""
    return dataset_spec(dataset).needs_dir


def _data_root(spec: DatasetSpec, root: str | Path | None) -> Path | None:
    if not spec.needs_dir:
        return None
    if root is None or str(root) == "":
        raise DataError(f"dataset '{spec.name}' needs DATASET_DIR; pass the directory that holds "
                        "it as the first argument")
    path = Path(root).expanduser()
    if not path.is_dir():
        raise DataError(f"DATASET_DIR {path} does not exist or is not a directory; check the "
                        f"path (it holds the {spec.name} files, or your images in "
                        "train/<class>/ and val/<class>/)")
    return path


def _load_raw(dataset: str, root: str | Path | None, input_spec: InputSpec, *, train: bool,
              seed: int, num_classes: int | None, pretrained: bool,
              class_names: Sequence[str] | None) -> RawSplits:
    spec = dataset_spec(dataset)
    request = LoadRequest(spec, _data_root(spec, root), input_spec, seed, num_classes, train,
                          pretrained, tuple(class_names) if class_names else None)
    if spec.loader not in LOADERS:
        raise ValueError(f"dataset '{dataset}' names file format '{spec.loader}', which no "
                         f"loader reads (known: {', '.join(LOADERS)})")
    raw = LOADERS[spec.loader](request, **spec.loader_options)
    if not raw.class_names and len(spec.class_names) == raw.num_classes:
        raw.class_names = spec.class_names  # the table's names when the files carry none
    if num_classes is not None and raw.num_classes > num_classes:
        raise DataError(f"dataset '{dataset}' has {raw.num_classes} classes but the model has "
                        f"{num_classes} outputs; build the model with at least "
                        f"{raw.num_classes} classes")
    return raw


def _view(raw: Dataset, transform: Callable[[Any], torch.Tensor]) -> TransformedDataset:
    """`raw` through `transform`, a batch at a time where the transform allows it."""
    return TransformedDataset(raw, transform, batched=is_deterministic(transform))


def load_datasets(dataset: str, root: str | Path | None, input_spec: InputSpec, *,
                  validation_split: float = 0.0, effective_train_size: float = 1.0,
                  effective_valid_size: float = 1.0, effective_test_size: float = 1.0,
                  seed: int = 0, num_classes: int | None = None, pretrained: bool = False,
                  class_names: Sequence[str] | None = None) -> DatasetSplits:
    """Train (augmented), validation (--vs of train, eval transforms) and test sets of a dataset.

    Args:
        dataset: a name in the dataset table (compressor.utils.dataset_table).
        root: DATASET_DIR (ignored by digits and synthetic).
        input_spec: the model's InputSpec; sizes, normalization and channels come from it.
        validation_split: fraction of train held out as validation (Distiller's --vs).
        effective_train_size, effective_valid_size, effective_test_size: fraction of each set
            used (--etrs, --evs, --etes), a random subset chosen with the seed.
        seed: seed of the splits and subsets (and of the synthetic samples).
        num_classes: the model's number of classes: the synthetic labels are drawn below it,
            and a real dataset with more classes than that is refused.
        pretrained: the weights index the ImageNet-1k classes (--pretrained): ImageFolder
            classes that are not WordNet ids are refused unless their count is num_classes.
        class_names: the model's label order, when its checkpoint records one (ImageFolder).

    Returns:
        DatasetSplits: num_classes is the size of the dataset's label space, class_names the
        classes in label order: ImageFolder's folders, the names in the files (CIFAR's meta)
        or the dataset table's; empty when unknown (synthetic). A dataset without a test
        split of its own (a folder without val/) tests on the validation split.
    """
    check_fractions(validation_split, effective_train_size, effective_valid_size,
                    effective_test_size)
    raw = _load_raw(dataset, root, input_spec, train=True, seed=seed, num_classes=num_classes,
                    pretrained=pretrained, class_names=class_names)
    assert raw.train is not None  # asked for with train=True
    train_view = _view(raw.train, build_transforms(input_spec, dataset, train=True))
    eval_transform = build_transforms(input_spec, dataset, train=False)
    train_idx, val_idx = split_train_val(len(raw.train), validation_split, seed)
    train = take_subset(train_view, train_idx, effective_train_size, seed, "train")
    val = None
    if val_idx:
        val = take_subset(_view(raw.train, eval_transform), val_idx,
                          effective_valid_size, seed, "validation")
    if raw.test is not None:
        test_view = _view(raw.test, eval_transform)
        test = take_subset(test_view, range(len(raw.test)), effective_test_size, seed, "test")
    elif val is not None:  # no test split of its own (a folder without val/): --vs's stands in
        test = val
    else:
        raise DataError(f"dataset '{dataset}' in {root} has no val/ split, and --vs 0 holds "
                        "nothing out of train/ to test on; add val/<class>/ images or pass "
                        "--vs (e.g. --vs 0.1)")
    return DatasetSplits(train=train, val=val, test=test, num_classes=raw.num_classes,
                         class_names=raw.class_names)


def load_test_dataset(dataset: str, root: str | Path | None, input_spec: InputSpec, *,
                      effective_test_size: float = 1.0, seed: int = 0,
                      num_classes: int | None = None, pretrained: bool = False,
                      class_names: Sequence[str] | None = None) -> EvaluationData:
    """The test set alone, for evaluation: the training files are never read.

    The same samples, labels and transform as load_datasets(...).test with the same arguments
    (mnist: t10k files only, cifar: the test batch only, imagenet and folder: ROOT/val/ only,
    listing at most the folder names of ROOT/train/ to know the training classes). Arguments
    as there.
    """
    check_fractions(0.0, 1.0, 1.0, effective_test_size)
    raw = _load_raw(dataset, root, input_spec, train=False, seed=seed, num_classes=num_classes,
                    pretrained=pretrained, class_names=class_names)
    assert raw.test is not None  # asked for with train=False
    test_view = _view(raw.test, build_transforms(input_spec, dataset, train=False))
    test = take_subset(test_view, range(len(raw.test)), effective_test_size, seed, "test")
    return EvaluationData(test=test, num_classes=raw.num_classes, class_names=raw.class_names)


def load_calibration_dataset(dataset: str, root: str | Path | None, input_spec: InputSpec, *,
                             seed: int = 0, num_classes: int | None = None,
                             pretrained: bool = False,
                             class_names: Sequence[str] | None = None) -> Dataset:
    """The whole training split with the evaluation transforms: what post-training
    quantization calibrates on (a seeded fraction of it), so that the test split it is then
    evaluated on stays unseen. Arguments as load_datasets'."""
    raw = _load_raw(dataset, root, input_spec, train=True, seed=seed, num_classes=num_classes,
                    pretrained=pretrained, class_names=class_names)
    assert raw.train is not None  # asked for with train=True
    return _view(raw.train, build_transforms(input_spec, dataset, train=False))
