"""MNIST and Fashion-MNIST from their IDX files, plain or .gz, in the common directory layouts.

Accepted layouts (first match wins): ROOT/{MNIST,FashionMNIST}/raw/ (torchvision),
ROOT/{MNIST,FashionMNIST}/, ROOT/{mnist,fashion-mnist}/ (Debian's /usr/share/datasets) and
ROOT itself, each holding train-images-idx3-ubyte, train-labels-idx1-ubyte,
t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, with or without .gz.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np
import torch

from compressor.data.splits import TensorImageDataset
from compressor.errors import DataError

__all__ = ["read_idx", "find_idx_dir", "load_mnist_like", "IMAGES_MAGIC", "LABELS_MAGIC"]

IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions
LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension
_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
          "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_SUBDIRS = {"mnist": ("MNIST/raw", "MNIST", "mnist"),
            "fashion-mnist": ("FashionMNIST/raw", "FashionMNIST", "fashion-mnist")}


def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as handle:
                return handle.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"cannot read IDX file {path}: {exc}; replace it with an intact "
                        "copy") from None


def read_idx(path: str | Path, magic: int) -> np.ndarray:
    """The unsigned-byte array stored in an IDX file (big-endian header), checked against magic."""
    path = Path(path)
    data = _read_bytes(path)
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    found = int.from_bytes(data[:4], "big") if len(data) >= 4 else None
    if found != magic:
        raise DataError(f"{path} is not an IDX file with magic number {magic} (found {found}); "
                        "pass the directory that holds the original MNIST-format files")
    if len(data) < header:
        raise DataError(f"IDX file {path} is truncated in its header; replace it")
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(shape))
    if len(data) != expected:
        raise DataError(f"IDX file {path} has {len(data)} bytes, its header {shape} needs "
                        f"{expected}; replace it with an intact copy")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def _file(directory: Path, name: str) -> Path | None:
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def find_idx_dir(root: Path, dataset: str) -> Path:
    """The first accepted directory under root that holds all four IDX files."""
    for sub in (*_SUBDIRS[dataset], "."):
        directory = root / sub
        if all(_file(directory, name) for name in _FILES):
            return directory
    layouts = ", ".join(f"ROOT/{sub}/" for sub in _SUBDIRS[dataset][:2])
    raise DataError(f"no {dataset} IDX files in {root} (looked in {layouts} and ROOT); pass the "
                    "directory that holds train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte"
                    "[.gz], t10k-images-idx3-ubyte[.gz] and t10k-labels-idx1-ubyte[.gz]")


def _load_pair(directory: Path, prefix: str) -> TensorImageDataset:
    images_path = _file(directory, f"{prefix}-images-idx3-ubyte")
    labels_path = _file(directory, f"{prefix}-labels-idx1-ubyte")
    assert images_path is not None and labels_path is not None  # found by find_idx_dir
    images = read_idx(images_path, IMAGES_MAGIC)
    labels = read_idx(labels_path, LABELS_MAGIC)
    if len(images) != len(labels):
        raise DataError(f"{images_path} holds {len(images)} images but {labels_path} holds "
                        f"{len(labels)} labels; use files from the same release")
    if labels.size and labels.max() > 9:
        raise DataError(f"{labels_path} has label {int(labels.max())}, MNIST-format labels are "
                        "0..9; use the original label file")
    tensor = torch.from_numpy(images.copy()).unsqueeze(1)  # N x 1 x H x W uint8
    return TensorImageDataset(tensor, torch.from_numpy(labels.astype(np.int64)))


def load_mnist_like(root: Path, dataset: str) -> tuple[TensorImageDataset, TensorImageDataset]:
    """Raw (1xHxW uint8 tensor, label) train and test sets of mnist or fashion-mnist."""
    directory = find_idx_dir(root, dataset)
    return _load_pair(directory, "train"), _load_pair(directory, "t10k")
