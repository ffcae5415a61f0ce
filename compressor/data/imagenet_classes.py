"""Which label each ImageFolder class folder gets, so that a model's outputs mean what it learned.

Sorted folder order (ImageFolder's) is right only when the folders are exactly the classes the
model was trained on. Pretrained ImageNet weights index the 1000 ImageNet-1k classes in the
sorted order of their WordNet ids (n01440764 tench = 0 ... n15075141 toilet tissue = 999, the
order of torchvision's and Keras's weights), so folders named by wnid get those indices, also
when they are a subset. Folders whose indices cannot be known are refused, never guessed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from compressor.utils.errors import DataError

__all__ = ["IMAGENET_CLASSES", "imagenet_wnids", "class_folders", "label_order", "check_known"]

IMAGENET_CLASSES = 1000
_WNIDS_FILE = "imagenet_wnids.txt"  # package data: the 1000 wnids, one a line, sorted
_EXAMPLE_WNID = "n01440764"


def imagenet_wnids() -> tuple[str, ...]:
    """The ImageNet-1k WordNet ids in canonical order: wnid i is class i of pretrained weights."""
    text = resources.files("compressor.data").joinpath(_WNIDS_FILE).read_text(encoding="ascii")
    return tuple(text.split())


def class_folders(directory: Path) -> list[str]:
    """The sorted names of the sub-directories of `directory` (ImageFolder's classes)."""
    try:
        return sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    except OSError as exc:
        raise DataError(f"cannot list class folders of {directory} ({exc.strerror or exc}); "
                        "check the path and its permissions") from None


def _sample(names: Sequence[str]) -> str:
    return ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")


def _refuse_unknown_indices(names: Sequence[str], where: Path, num_classes: int,
                            complete: bool) -> DataError:
    count = len(names)
    fixes = [] if complete else [f"add {where.parent / 'train'}/ with the training class folders"]
    if num_classes == IMAGENET_CLASSES:
        wnids = set(imagenet_wnids())
        odd = [name for name in names if name not in wnids]
        problem = f"{len(odd)} of them not ImageNet WordNet ids ({_sample(odd)})"
        fixes = [f"name the folders by wnid (e.g. {_EXAMPLE_WNID})", *fixes]
    else:
        problem = f"the model has {num_classes} classes"
        fixes.append(f"give {where} folders for all {num_classes} classes")
    fixes.append(f"train a {count}-class model")
    return DataError(f"{where} has {count} class folders, {problem}; a {num_classes}-class model "
                     f"cannot know their indices: {', '.join(fixes[:-1])} or {fixes[-1]}")


def label_order(names: Sequence[str], where: Path, *, num_classes: int | None,
                pretrained: bool, class_names: Sequence[str] | None,
                complete: bool) -> tuple[str, ...]:
    """Class names in label order (label i = result[i]) for the class folders `names` of `where`.

    Args:
        names: the class folders found (of train/ when training, else of train/ or val/).
        where: the directory they were found in, for messages.
        num_classes: the model's outputs (None: unknown, sorted order is used).
        pretrained: the weights are ImageNet-1k's (--pretrained), so their indices are fixed.
        class_names: the model's own label order when its checkpoint records one: used as is.
        complete: `names` lists every class the model was trained on (train/'s folders), so
            sorted order gives the training labels even when there are fewer than num_classes.

    Raises:
        DataError: when the labels would be a guess (see the module docstring).
    """
    if class_names:
        return tuple(class_names)
    if num_classes == IMAGENET_CLASSES:
        wnids = imagenet_wnids()
        if names and set(names) <= set(wnids):
            return wnids
    if num_classes is None or len(names) >= num_classes:
        return tuple(sorted(names))  # more folders than outputs: refused by the caller
    if pretrained or not complete:
        raise _refuse_unknown_indices(names, where, num_classes, complete)
    return tuple(sorted(names))


def check_known(folders: Sequence[str], order: Sequence[str], where: Path, source: str) -> None:
    """Refuse class folders of `where` that have no label in `order` (they would be skipped)."""
    unknown = sorted(set(folders) - set(order))
    if unknown:
        raise DataError(f"{where} has class folders not in {source}: {_sample(unknown)}; use the "
                        "same class names in both")
