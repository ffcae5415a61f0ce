"""ImageNet-style data: ROOT/train/<class>/* and ROOT/val/<class>/* read with ImageFolder.

Labels come from compressor.data.imagenet_classes (wnid folders keep ImageNet-1k's indices;
val/ is indexed with train/'s classes, so a class missing from val/ does not shift the labels).
Evaluation reads ROOT/val/ only: of ROOT/train/ it lists at most the folder names. An
unreadable image raises a one-line DataError naming its path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from PIL import Image, UnidentifiedImageError
from torchvision.datasets import ImageFolder

from compressor.data.imagenet_classes import (
    check_known,
    class_folders,
    imagenet_wnids,
    label_order,
)
from compressor.data.splits import LoadRequest, RawSplits
from compressor.utils.errors import DataError

__all__ = ["load_rgb_image", "image_problem", "ClassFolder", "empty_class_folders",
           "labelled_folder", "load_imagenet_dataset"]

_LAYOUT_HINT = "expected ROOT/train/ and ROOT/val/ class folders (ImageFolder layout)"


def _reason(exc: Exception) -> str:
    if isinstance(exc, UnidentifiedImageError):
        return "not an image format PIL can read"
    return " ".join(str(exc).split()) or type(exc).__name__  # keep the message one line


def _unreadable(path: str, exc: Exception) -> DataError:
    return DataError(f"corrupt image file {path}: {_reason(exc)}; remove or replace it")


# What PIL raises for a file it cannot read (UnidentifiedImageError is an OSError).
_READ_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def load_rgb_image(path: str) -> Image.Image:
    """Open and decode an image as RGB; a corrupt or unreadable file raises DataError."""
    try:
        with Image.open(path) as image:
            image.load()  # decode now, so truncated data fails here and not in a transform
            return image.convert("RGB")
    except _READ_ERRORS as exc:
        raise _unreadable(path, exc) from None


# A JPEG is checked by decoding it at 1/8 scale (its DCT scaling: a fraction of a full decode),
# which still reads every scan, so a file cut short in its pixel data fails
_CHECK_SCALE = 8


def image_problem(path: str) -> str | None:
    """Why PIL cannot read an image file, truncated pixel data included (decoded once, JPEGs
    at reduced scale); None when it can."""
    try:
        with Image.open(path) as image:
            width, height = image.size
            image.draft("RGB", (max(1, width // _CHECK_SCALE), max(1, height // _CHECK_SCALE)))
            image.load()
    except _READ_ERRORS as exc:
        return _reason(exc)
    return None


class ClassFolder(ImageFolder):
    """An ImageFolder whose labels are given: label i is the folder named class_names[i]."""

    def __init__(self, root: str, class_names: Sequence[str]) -> None:
        self._class_names = list(class_names)
        super().__init__(root, loader=load_rgb_image, allow_empty=True)

    def find_classes(self, directory: str | Path) -> tuple[list[str], dict[str, int]]:
        """The given classes (folders absent from `directory` simply hold no samples)."""
        return self._class_names, {name: i for i, name in enumerate(self._class_names)}


def empty_class_folders(folder: ClassFolder, folders: Sequence[str]) -> list[str]:
    """The class `folders` of `folder` that hold no image."""
    labelled = {label for _, label in folder.samples}
    return [name for name in folders if folder.class_to_idx[name] not in labelled]


def labelled_folder(path: Path, class_names: Sequence[str], folders: Sequence[str],
                    hint: str = _LAYOUT_HINT) -> ClassFolder:
    """The images of `path` labelled by `class_names`; every one of its class `folders` must
    hold at least one (`hint` ends the message that names an empty one)."""
    folder = ClassFolder(str(path), class_names)
    empty = empty_class_folders(folder, folders)
    if empty:
        raise DataError(f"no images in {path / empty[0]}"
                        f"{f' and {len(empty) - 1} more class folders' if len(empty) > 1 else ''}"
                        f"; {hint}")
    return folder


def _listed(path: Path) -> list[str]:
    folders = class_folders(path)
    if not folders:
        raise DataError(f"no class folders in {path}; {_LAYOUT_HINT}")
    return folders


def _source(order: Sequence[str], request: LoadRequest, folders_of: str) -> str:
    """What the labels come from, for the message about a class folder that has none."""
    if request.class_names:
        return "the model's classes (recorded in its checkpoint)"
    if tuple(order) == imagenet_wnids():
        return "the ImageNet-1k WordNet ids"
    return folders_of


def _train_and_val(root: Path, request: LoadRequest) -> RawSplits:
    missing = [str(root / name) for name in ("train", "val") if not (root / name).is_dir()]
    if missing:
        raise DataError(f"missing {' and '.join(missing)}; {_LAYOUT_HINT}")
    train_folders, val_folders = _listed(root / "train"), _listed(root / "val")
    order = label_order(train_folders, root / "train", num_classes=request.num_classes,
                        pretrained=request.pretrained, class_names=request.class_names,
                        complete=True)
    check_known(train_folders, order, root / "train", _source(order, request, "train/"))
    check_known(val_folders, order, root / "val", _source(order, request, "train/"))
    return RawSplits(labelled_folder(root / "train", order, train_folders),
                     labelled_folder(root / "val", order, val_folders), len(order), order)


def _val_only(root: Path, request: LoadRequest) -> RawSplits:
    val = root / "val"
    if not val.is_dir():
        raise DataError(f"missing {val}; evaluation reads ROOT/val/<class>/ images (ImageFolder "
                        "layout)")
    val_folders = _listed(val)
    # train/'s folder names (no image is read) say which classes the model was trained on.
    train_folders = class_folders(root / "train") if (root / "train").is_dir() else []
    names, where = (train_folders, root / "train") if train_folders else (val_folders, val)
    order = label_order(names, where, num_classes=request.num_classes,
                        pretrained=request.pretrained, class_names=request.class_names,
                        complete=bool(train_folders))
    check_known(val_folders, order, val, _source(order, request, f"{where.name}/"))
    return RawSplits(None, labelled_folder(val, order, val_folders), len(order), order)


def load_imagenet_dataset(request: LoadRequest) -> RawSplits:
    """Raw (PIL RGB image, label) train and val splits (val only when evaluating)."""
    assert request.root is not None  # imagenet needs DATASET_DIR
    return (_train_and_val if request.train else _val_only)(request.root, request)
