"""CIFAR-10/100 from python batch pickles written here, and the refusal of code-carrying pickles."""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from compressor.data import build_transforms, load_datasets
from compressor.data.cifar import safe_load_batch
from compressor.utils.dataset_table import DATASET_INPUT_SPECS
from compressor.utils.errors import DataError

CIFAR10_SPEC = DATASET_INPUT_SPECS["cifar10"]


def _int(value: int) -> bytes:
    return b"J" + struct.pack("<i", value)


def _str(text: bytes) -> bytes:
    return b"U" + bytes([len(text)]) + text


def py2_batch(data: np.ndarray, labels: list[int]) -> bytes:
    """A pickle as Python 2 and numpy 1 wrote the CIFAR batches (numpy.core, 8-bit strings)."""
    dtype = (b"cnumpy\ndtype\n" + _str(b"u1") + _int(0) + _int(1) + b"\x87R"
             + b"(" + _int(3) + _str(b"|") + b"NNN" + _int(-1) + _int(-1) + _int(0) + b"tb")
    raw = data.tobytes()
    array = (b"cnumpy.core.multiarray\n_reconstruct\n" + b"cnumpy\nndarray\n" + _int(0)
             + b"\x85" + _str(b"b") + b"\x87R"
             + b"(" + _int(1) + _int(data.shape[0]) + _int(data.shape[1]) + b"\x86" + dtype
             + b"\x89" + b"T" + struct.pack("<i", len(raw)) + raw + b"tb")
    label_list = b"](" + b"".join(_int(v) for v in labels) + b"e"
    return (b"\x80\x02}(" + _str(b"batch_label") + _str(b"testing batch 1 of 1")
            + _str(b"data") + array + _str(b"labels") + label_list + b"u.")


def write_cifar10(directory: Path, per_batch: int = 4) -> dict[str, np.ndarray]:
    """Five train batches and a test batch of random images, in the py2 pickle format."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    written = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, per_batch)]
        (directory / name).write_bytes(py2_batch(data, labels))
        written[name] = data
        written[name + ":labels"] = np.array(labels)
    return written


def test_py2_batch_format_loads_with_the_restricted_unpickler(tmp_path: Path) -> None:
    data = np.arange(2 * 3072, dtype=np.int64).astype(np.uint8).reshape(2, 3072)
    path = tmp_path / "batch"
    path.write_bytes(py2_batch(data, [3, 7]))
    batch = safe_load_batch(path)
    np.testing.assert_array_equal(batch["data"], data)
    assert batch["labels"] == [3, 7] and batch["data"].dtype == np.uint8


@pytest.mark.parametrize("subdir", ["cifar-10-batches-py", "."])
def test_cifar10_layouts_values_and_labels(tmp_path: Path, subdir: str) -> None:
    written = write_cifar10(tmp_path / subdir)
    splits = load_datasets("cifar10", str(tmp_path), CIFAR10_SPEC)
    assert (len(splits.train), len(splits.test), splits.num_classes) == (20, 4, 10)
    image, label = splits.test[2]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    assert label == int(written["test_batch:labels"][2])
    expected = (written["test_batch"][2].reshape(3, 32, 32) / 255.0 - 0.5) / 0.5
    np.testing.assert_allclose(image.numpy(), expected, atol=1e-5)
    assert splits.train[9][1] == int(written["data_batch_3:labels"][1])  # batches in order


def test_cifar100_numpy2_pickle_with_fine_labels(tmp_path: Path) -> None:
    directory = tmp_path / "cifar-100-python"
    directory.mkdir()
    for name, n in (("train", 6), ("test", 3)):
        batch = {b"data": np.full((n, 3072), 255, np.uint8), b"fine_labels": [99] * n,
                 b"coarse_labels": [19] * n}
        (directory / name).write_bytes(pickle.dumps(batch, protocol=5))
    splits = load_datasets("cifar100", str(tmp_path), DATASET_INPUT_SPECS["cifar100"])
    assert (len(splits.train), len(splits.test), splits.num_classes) == (6, 3, 100)
    image, label = splits.test[0]
    spec = DATASET_INPUT_SPECS["cifar100"]
    assert label == 99
    for channel in range(3):
        value = (1.0 - spec.mean[channel]) / spec.std[channel]
        assert torch.allclose(image[channel], torch.full((32, 32), value), atol=1e-5)


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.marker}",)


def test_code_carrying_batch_is_refused_without_running_it(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    marker = tmp_path / "pwned"
    payload = {"data": _RunsCode(marker), "labels": [0]}
    (tmp_path / "data_batch_2").write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(DataError, match=r"refusing to load .*data_batch_2.*system") as info:
        load_datasets("cifar10", str(tmp_path), CIFAR10_SPEC)
    assert not marker.exists()
    assert "\n" not in str(info.value)
    # Sanity check of the test itself: a plain pickle.load would have run the command.
    pickle.loads((tmp_path / "data_batch_2").read_bytes())
    assert marker.exists()


def test_wrong_layout_and_damaged_batches(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cifar-10-batches-py.*pass the directory"):
        load_datasets("cifar10", str(tmp_path), CIFAR10_SPEC)
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"")
    with pytest.raises(DataError, match="extract .*cifar-10-python.tar.gz"):
        load_datasets("cifar10", str(tmp_path), CIFAR10_SPEC)
    write_cifar10(tmp_path)
    (tmp_path / "test_batch").write_bytes(b"\x80\x02}(truncated")
    with pytest.raises(DataError, match="cannot read CIFAR batch file .*test_batch"):
        load_datasets("cifar10", str(tmp_path), CIFAR10_SPEC)
    (tmp_path / "test_batch").write_bytes(pickle.dumps({"data": np.zeros((2, 5), np.uint8)}))
    with pytest.raises(DataError, match="lacks N x 3072"):
        load_datasets("cifar10", str(tmp_path), CIFAR10_SPEC)


def test_cifar_train_augmentation_is_seeded_by_torch(tmp_path: Path) -> None:
    image = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8)
    train_tf = build_transforms(CIFAR10_SPEC, "cifar10", train=True)
    torch.manual_seed(5)
    first = [train_tf(image) for _ in range(8)]
    torch.manual_seed(5)
    again = [train_tf(image) for _ in range(8)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert any(not torch.equal(first[0], other) for other in first[1:])  # crops/flips vary
    eval_tf = build_transforms(CIFAR10_SPEC, "cifar10", train=False)
    assert torch.allclose(eval_tf(image), (image / 255.0 - 0.5) / 0.5, atol=1e-6)
