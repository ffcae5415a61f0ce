"""MNIST / Fashion-MNIST from tiny IDX files written here: layouts, .gz, values and errors."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from compressor.data import load_datasets
from compressor.data.idx import IMAGES_MAGIC, LABELS_MAGIC, read_idx
from compressor.utils.dataset_table import DATASET_INPUT_SPECS
from compressor.utils.errors import DataError
from compressor.utils.input_spec import InputSpec

MNIST_SPEC = DATASET_INPUT_SPECS["mnist"]


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    """An IDX file: big-endian magic, one big-endian int32 per dimension, then the bytes."""
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_mnist(directory: Path, gz: bool, n_train: int = 12, n_test: int = 6,
                seed: int = 0) -> dict[str, np.ndarray]:
    """Write the four IDX files of a tiny MNIST into directory; return the arrays."""
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": np.arange(n_train, dtype=np.uint8) % 10,
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": (np.arange(n_test, dtype=np.uint8) * 3) % 10,
    }
    directory.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        magic = IMAGES_MAGIC if "images" in name else LABELS_MAGIC
        data = idx_bytes(array, magic)
        if gz:
            (directory / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (directory / name).write_bytes(data)
    return arrays


@pytest.mark.parametrize("dataset,subdir,gz", [
    ("mnist", "MNIST/raw", True), ("mnist", ".", False),
    ("fashion-mnist", "FashionMNIST/raw", False), ("fashion-mnist", ".", True),
    ("fashion-mnist", "fashion-mnist", True),  # Debian: /usr/share/datasets/fashion-mnist
])
def test_layouts_load_with_values_and_labels(tmp_path: Path, dataset: str, subdir: str,
                                             gz: bool) -> None:
    arrays = write_mnist(tmp_path / subdir, gz)
    spec = DATASET_INPUT_SPECS[dataset]
    splits = load_datasets(dataset, str(tmp_path), spec)
    assert (len(splits.train), len(splits.test), splits.num_classes) == (12, 6, 10)
    assert splits.val is None
    image, label = splits.test[4]
    assert image.shape == (1, 28, 28) and image.dtype.is_floating_point
    assert isinstance(label, int) and label == 2  # (4 * 3) % 10
    raw = arrays["t10k-images-idx3-ubyte"][4].astype(np.float64)
    expected = (raw / 255.0 - spec.mean[0]) / spec.std[0]
    np.testing.assert_allclose(image[0].numpy(), expected, rtol=1e-5, atol=1e-5)
    train_image, train_label = splits.train[7]
    assert train_label == 7  # no augmentation for MNIST: train equals the stored pixels too
    np.testing.assert_allclose(
        train_image[0].numpy(),
        (arrays["train-images-idx3-ubyte"][7] / 255.0 - spec.mean[0]) / spec.std[0], atol=1e-5)


def test_spec_with_other_size_and_channels_resizes(tmp_path: Path) -> None:
    write_mnist(tmp_path, gz=False)
    spec = InputSpec((3, 32, 32), 32, 32, (0.5,) * 3, (0.25,) * 3, "bilinear")
    image, _ = load_datasets("mnist", str(tmp_path), spec).train[0]
    assert image.shape == (3, 32, 32)
    assert bool((image[0] == image[2]).all())  # gray replicated to RGB


def test_read_idx_matches_array(tmp_path: Path) -> None:
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / "x-idx3-ubyte"
    path.write_bytes(idx_bytes(array, IMAGES_MAGIC))
    np.testing.assert_array_equal(read_idx(path, IMAGES_MAGIC), array)


def test_missing_root_and_files_are_data_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="needs DATASET_DIR"):
        load_datasets("mnist", None, MNIST_SPEC)
    with pytest.raises(DataError, match="does not exist"):
        load_datasets("mnist", str(tmp_path / "nowhere"), MNIST_SPEC)
    (tmp_path / "MNIST" / "raw").mkdir(parents=True)
    with pytest.raises(DataError, match=r"MNIST/raw/.*train-images-idx3-ubyte\[\.gz\]") as info:
        load_datasets("mnist", str(tmp_path), MNIST_SPEC)
    assert "\n" not in str(info.value)


def test_corrupt_idx_files_are_named(tmp_path: Path) -> None:
    write_mnist(tmp_path, gz=True)
    labels = tmp_path / "train-labels-idx1-ubyte.gz"
    labels.write_bytes(gzip.compress(idx_bytes(np.zeros(5, np.uint8), LABELS_MAGIC)))
    with pytest.raises(DataError, match="12 images but .* 5 labels"):
        load_datasets("mnist", str(tmp_path), MNIST_SPEC)
    labels.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(DataError, match="cannot read IDX file .*train-labels"):
        load_datasets("mnist", str(tmp_path), MNIST_SPEC)
    labels.write_bytes(gzip.compress(idx_bytes(np.zeros(12, np.uint8), IMAGES_MAGIC)[:20]))
    with pytest.raises(DataError, match="magic number 2049"):
        load_datasets("mnist", str(tmp_path), MNIST_SPEC)
    labels.write_bytes(gzip.compress(idx_bytes(np.zeros(12, np.uint8), LABELS_MAGIC)[:-3]))
    with pytest.raises(DataError, match="has 17 bytes, its header"):
        load_datasets("mnist", str(tmp_path), MNIST_SPEC)
