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

from compressor.data.files import reading
from compressor.data.splits import LoadRequest, RawSplits, TensorImageDataset
from compressor.utils.errors import DataError

__all__ = ["RestrictedUnpickler", "safe_load_batch", "find_cifar_dir", "meta_class_names",
           "load_cifar_dataset"]

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
    with reading(path, "CIFAR batch file"), open(path, "rb") as handle:
        batch = RestrictedUnpickler(handle, path).load()
    if not isinstance(batch, dict):
        raise DataError(f"{path} is not a CIFAR batch (no dict inside); replace it")
    return {key.decode("latin1") if isinstance(key, bytes) else key: value
            for key, value in batch.items()}


def find_cifar_dir(root: Path, subdir: str, files: tuple[str, ...], archive: str,
                   dataset: str) -> Path:
    """ROOT/<subdir> (e.g. cifar-10-batches-py), or ROOT itself, holding the batch files."""
    for directory in (root / subdir, root):
        if all((directory / name).is_file() for name in files):
            return directory
    hint = (f"extract {root / archive} there first" if (root / archive).is_file() else
            f"pass the directory that holds {subdir}/ (from {archive})")
    raise DataError(f"no {dataset} batch files ({', '.join(files)}) in {root / subdir} or "
                    f"{root}; {hint}")


def _batch_arrays(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    batch = safe_load_batch(path)
    data, labels = batch.get("data"), batch.get(label_key)
    with reading(path, "CIFAR batch file"):
        if not isinstance(data, np.ndarray) or data.ndim != 2 or data.shape[1] != 3 * 32 * 32 \
                or not isinstance(labels, list | tuple | np.ndarray) or len(labels) != len(data):
            raise DataError(f"{path} lacks N x 3072 'data' with N '{label_key}'; replace it with "
                            "the original file")
        return (np.asarray(data, dtype=np.uint8).reshape(-1, 3, 32, 32),
                np.asarray(labels, dtype=np.int64).reshape(-1))


def _load_split(directory: Path, names: tuple[str, ...], label_key: str,
                num_classes: int) -> TensorImageDataset:
    images, labels = zip(*(_batch_arrays(directory / name, label_key) for name in names),
                         strict=True)
    label_array = np.concatenate(labels)
    if label_array.size == 0:
        raise DataError(f"the batch files {', '.join(names)} in {directory} hold no images; "
                        "replace them with the original files")
    if label_array.min() < 0 or label_array.max() >= num_classes:
        raise DataError(f"labels in {directory} fall outside 0..{num_classes - 1}; check that "
                        "the files belong to this dataset")
    return TensorImageDataset(torch.from_numpy(np.concatenate(images)),
                              torch.from_numpy(label_array))


def meta_class_names(path: Path, key: str, num_classes: int) -> tuple[str, ...]:
    """The class names of a CIFAR meta file (batches.meta, meta); () when absent or unusable."""
    if not path.is_file():
        return ()
    names = safe_load_batch(path).get(key)
    if not isinstance(names, list | tuple) or len(names) != num_classes:
        return ()
    decoded = [name.decode("latin1") if isinstance(name, bytes) else name for name in names]
    return tuple(decoded) if all(isinstance(name, str) for name in decoded) else ()


def load_cifar_dataset(request: LoadRequest, *, subdir: str, train_files: tuple[str, ...],
                       test_files: tuple[str, ...], label_key: str, archive: str,
                       meta: tuple[str, str] | None = None) -> RawSplits:
    """Raw (3x32x32 uint8 tensor, label) splits of CIFAR-10/100 (the test split only on request).

    meta: (file, key) of the class names, read when the file is there (else the table's names).
    """
    spec = request.dataset
    assert request.root is not None and spec.num_classes is not None  # needs_dir, fixed classes
    files = (*train_files, *test_files) if request.train else test_files
    directory = find_cifar_dir(request.root, subdir, files, archive, spec.name)
    train = (_load_split(directory, train_files, label_key, spec.num_classes)
             if request.train else None)
    names = meta_class_names(directory / meta[0], meta[1], spec.num_classes) if meta else ()
    return RawSplits(train, _load_split(directory, test_files, label_key, spec.num_classes),
                     spec.num_classes, names)
