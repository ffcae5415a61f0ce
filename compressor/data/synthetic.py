"""Synthetic data for benchmarks: random tensors at a model's input size, made lazily per index.

Sample i of a split is drawn from its own generator seeded with (seed, split, i), so a
dataset costs no memory up front, any index can be read in any order or worker, and the same
seed always gives the same samples.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from compressor.data.splits import LoadRequest, RawSplits

__all__ = ["SyntheticDataset", "load_synthetic_dataset", "SYNTHETIC_TRAIN_SIZE",
           "SYNTHETIC_TEST_SIZE", "SYNTHETIC_DEFAULT_CLASSES"]

SYNTHETIC_TRAIN_SIZE = 1024
SYNTHETIC_TEST_SIZE = 256
SYNTHETIC_DEFAULT_CLASSES = 10  # when the model's class count is not given


class SyntheticDataset(Dataset):
    """`length` standard-normal CxHxW float32 tensors with uniform random labels."""

    def __init__(self, length: int, input_size: tuple[int, int, int], num_classes: int,
                 seed: int, split: int) -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be positive, got {num_classes}")
        self.length = length
        self.input_size = tuple(input_size)
        self.num_classes = num_classes
        self.seed = seed
        self.split = split  # 0 train, 1 test: different samples from the same seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} samples")
        key = ((self.seed * 2 + self.split) * 1_000_003 + index) % 2**63
        generator = torch.Generator().manual_seed(key)
        label = int(torch.randint(self.num_classes, (1,), generator=generator))
        image = torch.randn(self.input_size, generator=generator)
        return image, label


def load_synthetic_dataset(request: LoadRequest) -> RawSplits:
    """Train and test sets at the model's input size, labels below the model's class count."""
    classes = request.num_classes or SYNTHETIC_DEFAULT_CLASSES
    size = request.input_spec.input_size
    train = (SyntheticDataset(SYNTHETIC_TRAIN_SIZE, size, classes, request.seed, 0)
             if request.train else None)
    return RawSplits(train, SyntheticDataset(SYNTHETIC_TEST_SIZE, size, classes, request.seed, 1),
                     classes)
