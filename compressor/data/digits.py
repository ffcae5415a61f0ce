"""scikit-learn's bundled 8x8 handwritten digits: the embedded dataset that needs no download.

1797 images, 10 classes, pixel values 0..16 scaled by 1/16 to [0, 1], as 1x8x8 float32 tensors.
Split: stratified 80/20 by sklearn.model_selection.train_test_split(test_size=0.2,
random_state=0), fixed and independent of --seed: 1437 train, 360 test images.
Train-split statistics: mean 0.3054, std 0.3761 (whole set: 0.3053, 0.3760).
"""

from __future__ import annotations

import numpy as np
import torch

from compressor.data.splits import LoadRequest, RawSplits, TensorImageDataset

__all__ = ["load_digits_splits", "load_digits_dataset", "DIGITS_TEST_FRACTION",
           "DIGITS_SPLIT_SEED"]

DIGITS_TEST_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0  # fixed: the test set must not move with --seed


def _dataset(images: np.ndarray, labels: np.ndarray) -> TensorImageDataset:
    tensor = torch.from_numpy((images / 16.0).astype(np.float32)).unsqueeze(1)
    return TensorImageDataset(tensor, torch.from_numpy(labels.astype(np.int64)))


def load_digits_splits() -> tuple[TensorImageDataset, TensorImageDataset]:
    """Raw (1x8x8 float32 tensor in [0, 1], label) train and test sets of the digits."""
    from sklearn.datasets import load_digits  # imported here: only this dataset needs sklearn
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.images, digits.target, test_size=DIGITS_TEST_FRACTION, stratify=digits.target,
        random_state=DIGITS_SPLIT_SEED)
    return _dataset(x_train, y_train), _dataset(x_test, y_test)


def load_digits_dataset(request: LoadRequest) -> RawSplits:
    """The digits as raw splits (both are always made: the split needs the whole set)."""
    train, test = load_digits_splits()
    assert request.dataset.num_classes is not None  # the digits have 10 classes
    return RawSplits(train if request.train else None, test, request.dataset.num_classes)
