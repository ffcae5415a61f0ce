"""Dataset views, loader requests and Distiller's --vs/--etrs/--evs/--etes splits (seeded)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset, Subset

from compressor.utils.errors import DataError, UsageError
from compressor.utils.input_spec import InputSpec

if TYPE_CHECKING:
    from compressor.utils.dataset_table import DatasetSpec

__all__ = [
    "DatasetSplits", "EvaluationData", "LoadRequest", "RawSplits", "TensorImageDataset",
    "TransformedDataset", "check_fractions", "subset_length", "split_train_val", "take_subset",
]

# Independent random streams, so that changing --etes does not move the --vs split etc.
_VALIDATION_STREAM, _TRAIN_STREAM, _VALID_STREAM, _TEST_STREAM = 1, 2, 3, 4


@dataclass
class DatasetSplits:
    """The train/validation/test datasets of one run; samples are (CxHxW float32, int label)."""

    train: Dataset  # with the training augmentation
    val: Dataset | None  # carved from train by --vs, eval transforms; None when --vs is 0
    test: Dataset  # eval transforms
    num_classes: int  # size of the label space: every label is below it
    class_names: tuple[str, ...] = ()  # label i is class_names[i]; () when unknown (synthetic)


@dataclass
class EvaluationData:
    """The test set alone (eval transforms), for -e, --sense, --thinnify and calibration."""

    test: Dataset
    num_classes: int
    class_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class LoadRequest:
    """What a dataset loader is asked for (see compressor.data.load.LOADERS)."""

    dataset: DatasetSpec
    root: Path | None  # the checked DATASET_DIR; None for datasets that need none
    input_spec: InputSpec  # the model's
    seed: int
    num_classes: int | None  # the model's outputs, if known
    train: bool  # False: the test split only, the training files are not read
    pretrained: bool = False  # the weights index the dataset's canonical classes (--pretrained)
    class_names: tuple[str, ...] | None = None  # the model's own label order, if it records one


@dataclass
class RawSplits:
    """Untransformed (image, label) splits as a loader returns them."""

    train: Dataset | None  # None when the request asked for the test split only
    test: Dataset | None  # None: no test split of its own (a folder without val/): --vs's
    num_classes: int  # size of the label space
    class_names: tuple[str, ...] = ()


class TensorImageDataset(Dataset):
    """In-memory images (N x C x H x W, uint8 or float in [0, 1]) with integer labels."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        if images.ndim != 4 or len(images) != len(labels):
            raise ValueError(f"need N x C x H x W images and N labels, got {tuple(images.shape)} "
                             f"and {len(labels)}")
        self.images = images
        self.targets = labels.long()

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.targets[index])


class TransformedDataset(Dataset):
    """A view of a raw (image, label) dataset that applies a transform to each image.

    With `batched=True` (a deterministic transform, see data.transforms.is_deterministic) and
    in-memory tensor images, the transform runs on chunks of CHUNK images at their first read
    and keeps the results, when the whole transformed set fits in MAX_CACHED_BYTES: the same
    tensors as image by image, without the transform's per-call overhead on every epoch.
    """

    CHUNK = 512
    MAX_CACHED_BYTES = 512 * 2**20

    def __init__(self, base: Dataset, transform: Callable[[Any], torch.Tensor], *,
                 batched: bool = False) -> None:
        self.base = base
        self.transform = transform
        self._chunks: dict[int, torch.Tensor] | None = (
            {} if batched and isinstance(base, TensorImageDataset) else None)

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self._chunks is None:
            image, label = self.base[index]
            return self.transform(image), int(label)
        index = range(len(self))[index]  # negative indices as lists take them; IndexError
        chunk, offset = divmod(index, self.CHUNK)
        images = self._chunks.get(chunk)
        if images is None:
            start = chunk * self.CHUNK
            images = self.transform(self.base.images[start:start + self.CHUNK])
            if images[0].nbytes * len(self) <= self.MAX_CACHED_BYTES:
                self._chunks[chunk] = images
            else:  # too large to keep: image by image from now on
                self._chunks = None
        return images[offset].clone(), int(self.base.targets[index])


def check_fractions(validation_split: float, effective_train_size: float,
                    effective_valid_size: float, effective_test_size: float) -> None:
    """Refuse fractions out of range: --vs in [0, 1), --etrs/--evs/--etes in (0, 1]."""
    if not 0.0 <= validation_split < 1.0:
        raise UsageError(f"--vs/--validation-split must be in [0, 1), got {validation_split}")
    for flag, value in (("--etrs", effective_train_size), ("--evs", effective_valid_size),
                        ("--etes", effective_test_size)):
        if not 0.0 < value <= 1.0:
            raise UsageError(f"{flag} must be a fraction in (0, 1], got {value}")


def subset_length(length: int, fraction: float, what: str) -> int:
    """Number of samples kept by a fraction (at least one); an empty result is a DataError."""
    kept = length if fraction >= 1.0 else math.floor(length * fraction)
    if kept <= 0:
        raise DataError(f"the {what} set of {length} samples becomes empty with a fraction of "
                        f"{fraction}; use a larger fraction or a larger dataset")
    return kept


def _permutation(length: int, seed: int, stream: int) -> list[int]:
    generator = torch.Generator().manual_seed((seed * 1_000_003 + stream) % 2**63)
    return torch.randperm(length, generator=generator).tolist()


def split_train_val(length: int, validation_split: float,
                    seed: int) -> tuple[list[int], list[int]]:
    """Indices of train and validation samples: --vs of a seeded permutation is held out."""
    if validation_split <= 0.0:
        return list(range(length)), []
    order = _permutation(length, seed, _VALIDATION_STREAM)
    num_val = math.floor(length * validation_split)
    if num_val == 0 or num_val == length:
        raise DataError(f"--vs {validation_split} of {length} training samples leaves an empty "
                        "train or validation set; choose another --vs")
    return sorted(order[num_val:]), sorted(order[:num_val])


def take_subset(dataset: Dataset, indices: Sequence[int], fraction: float, seed: int,
                what: str) -> Dataset:
    """The seeded random fraction of `indices` of a dataset (all of them when fraction is 1)."""
    stream = {"train": _TRAIN_STREAM, "validation": _VALID_STREAM}.get(what, _TEST_STREAM)
    kept = subset_length(len(indices), fraction, what)
    if kept < len(indices):
        order = _permutation(len(indices), seed, stream)[:kept]
        indices = sorted(indices[i] for i in order)
    if len(indices) == len(dataset):  # type: ignore[arg-type]
        return dataset
    return Subset(dataset, list(indices))
