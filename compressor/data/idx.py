"""MNIST-format datasets from their IDX files, plain or .gz, in the common directory layouts.

Accepted layouts (first match wins): the row's subdirectories of ROOT (for mnist:
ROOT/MNIST/raw/ as torchvision writes it, ROOT/MNIST/, ROOT/mnist/ as Debian's
/usr/share/datasets has it) and ROOT itself, each holding train-images-idx3-ubyte,
train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, with or without .gz.
"""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import torch

from compressor.data.files import reading
from compressor.data.splits import LoadRequest, RawSplits, TensorImageDataset
from compressor.utils.errors import DataError

__all__ = ["read_idx", "find_idx_dir", "load_idx_dataset", "IMAGES_MAGIC", "LABELS_MAGIC"]

IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions
LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension
_TRAIN, _TEST = "train", "t10k"


def _names(prefixes: tuple[str, ...]) -> list[str]:
    return [f"{prefix}-{kind}" for prefix in prefixes
            for kind in ("images-idx3-ubyte", "labels-idx1-ubyte")]


def _read_bytes(path: Path) -> bytes:
    if path.suffix == ".gz":
        with gzip.open(path, "rb") as handle:
            return handle.read()
    return path.read_bytes()


def _parse_idx(path: Path, data: bytes, magic: int) -> np.ndarray:
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    found = int.from_bytes(data[:4], "big") if len(data) >= 4 else None
    if found != magic:
        raise DataError(f"{path} is not an IDX file with magic number {magic} (found {found}); "
                        "pass the directory that holds the original MNIST-format files")
    if len(data) < header:
        raise DataError(f"IDX file {path} is truncated in its header; replace it")
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    expected = header + math.prod(shape)
    if len(data) != expected:
        raise DataError(f"IDX file {path} has {len(data)} bytes, its header {shape} needs "
                        f"{expected}; replace it with an intact copy")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def read_idx(path: str | Path, magic: int) -> np.ndarray:
    """The unsigned-byte array stored in an IDX file (big-endian header), checked against magic."""
    path = Path(path)
    with reading(path, "IDX file"):
        return _parse_idx(path, _read_bytes(path), magic)


def _file(directory: Path, name: str) -> Path | None:
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def find_idx_dir(root: Path, dataset: str, subdirs: tuple[str, ...],
                 prefixes: tuple[str, ...] = (_TRAIN, _TEST)) -> Path:
    """The first accepted directory under root that holds the IDX files of these splits."""
    names = _names(prefixes)
    for sub in (*subdirs, "."):
        directory = root / sub
        if all(_file(directory, name) for name in names):
            return directory
    layouts = ", ".join(f"ROOT/{sub}/" for sub in subdirs[:2])
    listed = ", ".join(f"{name}[.gz]" for name in names)
    raise DataError(f"no {dataset} IDX files in {root} (looked in {layouts} and ROOT); pass the "
                    f"directory that holds {listed}")


def _load_pair(directory: Path, prefix: str, native_side: int | None,
               num_classes: int) -> TensorImageDataset:
    images_path = _file(directory, f"{prefix}-images-idx3-ubyte")
    labels_path = _file(directory, f"{prefix}-labels-idx1-ubyte")
    assert images_path is not None and labels_path is not None  # found by find_idx_dir
    images = read_idx(images_path, IMAGES_MAGIC)
    labels = read_idx(labels_path, LABELS_MAGIC)
    if len(images) == 0:
        raise DataError(f"IDX file {images_path} holds no images; replace it with an intact copy")
    side = native_side if native_side is not None else images.shape[1]
    if images.shape[1:] != (side, side) or side == 0:
        raise DataError(f"IDX file {images_path} holds {images.shape[1]}x{images.shape[2]} "
                        f"images, this dataset's are {side}x{side}; use the original file")
    if len(images) != len(labels):
        raise DataError(f"{images_path} holds {len(images)} images but {labels_path} holds "
                        f"{len(labels)} labels; use files from the same release")
    if labels.size and labels.max() >= num_classes:
        raise DataError(f"{labels_path} has label {int(labels.max())}, this dataset's labels are "
                        f"0..{num_classes - 1}; use the original label file")
    tensor = torch.from_numpy(images.copy()).unsqueeze(1)  # N x 1 x H x W uint8
    return TensorImageDataset(tensor, torch.from_numpy(labels.astype(np.int64)))


def load_idx_dataset(request: LoadRequest, *, subdirs: tuple[str, ...]) -> RawSplits:
    """Raw (1xHxW uint8 tensor, label) splits of an MNIST-format dataset (test only on request)."""
    spec = request.dataset
    assert request.root is not None and spec.num_classes is not None  # needs_dir, fixed classes
    side = spec.native_format[1] if spec.native_format is not None else None
    prefixes = (_TRAIN, _TEST) if request.train else (_TEST,)
    directory = find_idx_dir(request.root, spec.name, subdirs, prefixes)
    train = _load_pair(directory, _TRAIN, side, spec.num_classes) if request.train else None
    test = _load_pair(directory, _TEST, side, spec.num_classes)
    return RawSplits(train, test, spec.num_classes)
