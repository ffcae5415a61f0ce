"""load_datasets: a dataset by name, transformed for a model's InputSpec, split as Distiller."""

from __future__ import annotations

from pathlib import Path

from torch.utils.data import Dataset

from compressor.data.cifar import load_cifar
from compressor.data.digits import load_digits_splits
from compressor.data.idx import load_mnist_like
from compressor.data.imagenet import load_image_folders
from compressor.data.splits import (
    DatasetSplits,
    TransformedDataset,
    check_fractions,
    split_train_val,
    take_subset,
)
from compressor.data.synthetic import SYNTHETIC_TEST_SIZE, SYNTHETIC_TRAIN_SIZE, SyntheticDataset
from compressor.data.transforms import build_transforms
from compressor.errors import DataError, UsageError
from compressor.models.input_spec import DATASET_NUM_CLASSES, InputSpec

__all__ = ["DATASET_NAMES", "needs_data_dir", "load_datasets"]

DATASET_NAMES: tuple[str, ...] = (
    "digits", "mnist", "fashion-mnist", "cifar10", "cifar100", "imagenet", "synthetic")
_EMBEDDED = ("digits", "synthetic")
_DEFAULT_SYNTHETIC_CLASSES = 10


def _check_name(dataset: str) -> None:
    if dataset not in DATASET_NAMES:
        raise UsageError(f"unknown dataset '{dataset}'; use one of: {', '.join(DATASET_NAMES)}")


def needs_data_dir(dataset: str) -> bool:
    """Whether a dataset is read from DATASET_DIR (False for the embedded digits and synthetic)."""
    _check_name(dataset)
    return dataset not in _EMBEDDED


def _data_root(dataset: str, root: str | None) -> Path:
    if root is None or str(root) == "":
        raise DataError(f"dataset '{dataset}' needs DATASET_DIR; pass the directory that holds "
                        "it as the first argument")
    path = Path(root).expanduser()
    if not path.is_dir():
        raise DataError(f"DATASET_DIR {path} does not exist or is not a directory; pass the "
                        f"directory that holds the {dataset} data")
    return path


def _raw_splits(dataset: str, root: str | None, input_spec: InputSpec, seed: int,
                num_classes: int | None) -> tuple[Dataset, Dataset, int]:
    """Untransformed train and test sets, and the dataset's number of classes."""
    if dataset == "synthetic":
        classes = num_classes or _DEFAULT_SYNTHETIC_CLASSES
        return (SyntheticDataset(SYNTHETIC_TRAIN_SIZE, input_spec.input_size, classes, seed, 0),
                SyntheticDataset(SYNTHETIC_TEST_SIZE, input_spec.input_size, classes, seed, 1),
                classes)
    if dataset == "digits":
        train, test = load_digits_splits()
        return train, test, DATASET_NUM_CLASSES["digits"]
    path = _data_root(dataset, root)
    if dataset in ("mnist", "fashion-mnist"):
        train, test = load_mnist_like(path, dataset)
        return train, test, DATASET_NUM_CLASSES[dataset]
    if dataset in ("cifar10", "cifar100"):
        return load_cifar(path, dataset)
    return load_image_folders(path)


def load_datasets(dataset: str, root: str | None, input_spec: InputSpec, *,
                  validation_split: float = 0.0, effective_train_size: float = 1.0,
                  effective_valid_size: float = 1.0, effective_test_size: float = 1.0,
                  seed: int = 0, num_classes: int | None = None) -> DatasetSplits:
    """Train (augmented), validation (--vs of train, eval transforms) and test sets of a dataset.

    Args:
        dataset: one of DATASET_NAMES.
        root: DATASET_DIR (ignored by digits and synthetic).
        input_spec: the model's InputSpec; sizes, normalization and channels come from it.
        validation_split: fraction of train held out as validation (Distiller's --vs).
        effective_train_size, effective_valid_size, effective_test_size: fraction of each set
            used (--etrs, --evs, --etes), a random subset chosen with the seed.
        seed: seed of the splits and subsets (and of the synthetic samples).
        num_classes: the model's number of classes: the synthetic labels are drawn below it,
            and a real dataset with more classes than that is refused.

    Returns:
        DatasetSplits whose num_classes is the dataset's own class count.
    """
    _check_name(dataset)
    check_fractions(validation_split, effective_train_size, effective_valid_size,
                    effective_test_size)
    raw_train, raw_test, classes = _raw_splits(dataset, root, input_spec, seed, num_classes)
    if num_classes is not None and classes > num_classes:
        raise DataError(f"dataset '{dataset}' has {classes} classes but the model has "
                        f"{num_classes} outputs; build the model with at least {classes} classes")
    train_view = TransformedDataset(raw_train, build_transforms(input_spec, dataset, train=True))
    eval_transform = build_transforms(input_spec, dataset, train=False)
    train_idx, val_idx = split_train_val(len(raw_train), validation_split, seed)
    train = take_subset(train_view, train_idx, effective_train_size, seed, "train")
    val = None
    if val_idx:
        val = take_subset(TransformedDataset(raw_train, eval_transform), val_idx,
                          effective_valid_size, seed, "validation")
    test_view = TransformedDataset(raw_test, eval_transform)
    test = take_subset(test_view, range(len(raw_test)), effective_test_size, seed, "test")
    return DatasetSplits(train=train, val=val, test=test, num_classes=classes)
