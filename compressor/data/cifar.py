"""CIFAR-10/100 from the python batch files, read with an unpickler that admits only data.

The batch files are pickles; a plain pickle.load would run any code a tampered file carries.
The restricted unpickler resolves only the few globals numpy arrays need and refuses
everything else, before anything is called.
"""

from __future__ import annotations

import importlib
import io
import pickle
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from compressor.data.splits import TensorImageDataset
from compressor.errors import DataError

__all__ = ["RestrictedUnpickler", "safe_load_batch", "find_cifar_dir", "load_cifar"]

# (module, name) -> (module to import, attribute): numpy 1 and numpy 2 spellings of the same.
_ALLOWED_GLOBALS: MappingProxyType[tuple[str, str], tuple[str, str]] = MappingProxyType({
    ("numpy.core.multiarray", "_reconstruct"): ("multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"): ("multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"): ("multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"): ("multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"): ("numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"): ("numeric", "_frombuffer"),
    ("numpy", "ndarray"): ("numpy", "ndarray"),
    ("numpy", "dtype"): ("numpy", "dtype"),
    ("_codecs", "encode"): ("_codecs", "encode"),  # bytes in Python 3 protocol-2 pickles
})
_LAYOUTS: MappingProxyType[str, tuple[Any, ...]] = MappingProxyType({
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"],
                "labels", 10, "cifar-10-python.tar.gz"),
    "cifar100": ("cifar-100-python", ["train"], ["test"], "fine_labels", 100,
                 "cifar-100-python.tar.gz"),
})


def _resolve(kind: str, name: str) -> Any:
    if kind in ("multiarray", "numeric"):
        # numpy 2 moved numpy.core to numpy._core; import whichever this numpy has.
        try:
            module = importlib.import_module(f"numpy._core.{kind}")
        except ImportError:
            module = importlib.import_module(f"numpy.core.{kind}")
    else:
        module = importlib.import_module(kind)
    return getattr(module, name)


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler for plain containers, bytes and numpy arrays; any other global is refused."""

    def __init__(self, file: io.BufferedIOBase, path: Path) -> None:
        super().__init__(file, encoding="latin1")
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        """Resolve only the allow-listed numpy globals; raise DataError for anything else."""
        target = _ALLOWED_GLOBALS.get((module, name))
        if target is None:
            raise DataError(f"refusing to load {self.path}: it references {module}.{name}, which "
                            "a CIFAR batch file never does; replace it with the original file")
        return _resolve(*target)


def safe_load_batch(path: Path) -> dict[str, Any]:
    """One CIFAR python batch file as a dict with str keys, loaded without running code."""
    try:
        with open(path, "rb") as handle:
            batch = RestrictedUnpickler(handle, path).load()
    except DataError:
        raise
    except Exception as exc:  # pickle raises many types on damaged input
        raise DataError(f"cannot read CIFAR batch file {path}: {type(exc).__name__}: {exc}; "
                        "replace it with the original file") from None
    if not isinstance(batch, dict):
        raise DataError(f"{path} is not a CIFAR batch (no dict inside); replace it")
    return {key.decode("latin1") if isinstance(key, bytes) else key: value
            for key, value in batch.items()}


def find_cifar_dir(root: Path, dataset: str) -> Path:
    """ROOT/cifar-10-batches-py (or cifar-100-python), or ROOT itself, holding the batches."""
    subdir, train_files, test_files, _, _, archive = _LAYOUTS[dataset]
    for directory in (root / subdir, root):
        if all((directory / name).is_file() for name in train_files + test_files):
            return directory
    hint = (f"extract {root / archive} there first" if (root / archive).is_file() else
            f"pass the directory that holds {subdir}/ (from {archive})")
    raise DataError(f"no {dataset} batch files ({', '.join(train_files + test_files)}) in "
                    f"{root / subdir} or {root}; {hint}")


def _load_split(directory: Path, names: list[str], label_key: str,
                num_classes: int) -> TensorImageDataset:
    images, labels = [], []
    for name in names:
        path = directory / name
        batch = safe_load_batch(path)
        data, batch_labels = batch.get("data"), batch.get(label_key)
        if not isinstance(data, np.ndarray) or data.ndim != 2 or data.shape[1] != 3 * 32 * 32 \
                or batch_labels is None or len(batch_labels) != len(data):
            raise DataError(f"{path} lacks N x 3072 'data' with N '{label_key}'; replace it with "
                            "the original file")
        images.append(np.asarray(data, dtype=np.uint8).reshape(-1, 3, 32, 32))
        labels.append(np.asarray(batch_labels, dtype=np.int64))
    label_array = np.concatenate(labels)
    if label_array.size and (label_array.min() < 0 or label_array.max() >= num_classes):
        raise DataError(f"labels in {directory} fall outside 0..{num_classes - 1}; check that "
                        "the files belong to this dataset")
    return TensorImageDataset(torch.from_numpy(np.concatenate(images)),
                              torch.from_numpy(label_array))


def load_cifar(root: Path, dataset: str) -> tuple[TensorImageDataset, TensorImageDataset, int]:
    """Raw (3x32x32 uint8 tensor, label) train and test sets, and the number of classes."""
    _, train_files, test_files, label_key, num_classes, _ = _LAYOUTS[dataset]
    directory = find_cifar_dir(root, dataset)
    return (_load_split(directory, train_files, label_key, num_classes),
            _load_split(directory, test_files, label_key, num_classes), num_classes)
