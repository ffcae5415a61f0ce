"""ImageNet-style data: ROOT/train/<class>/* and ROOT/val/<class>/* read with ImageFolder.

The validation folders are indexed with the training classes (a class missing from val/ does
not shift the labels), and an unreadable image raises a one-line DataError naming its path.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from PIL import Image, UnidentifiedImageError
from torchvision.datasets import ImageFolder

from compressor.errors import DataError

__all__ = ["load_rgb_image", "ClassFolder", "load_image_folders"]

_LAYOUT_HINT = "expected ROOT/train/ and ROOT/val/ class folders (ImageFolder layout)"


def load_rgb_image(path: str) -> Image.Image:
    """Open and decode an image as RGB; a corrupt or unreadable file raises DataError."""
    try:
        with Image.open(path) as image:
            image.load()  # decode now, so truncated data fails here and not in a transform
            return image.convert("RGB")
    except UnidentifiedImageError:
        reason = "not an image format PIL can read"
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__  # keep the message one line
    raise DataError(f"corrupt image file {path}: {reason}; remove or replace it")


class ClassFolder(ImageFolder):
    """An ImageFolder whose class-to-index map may be fixed (val/ uses train/'s classes)."""

    def __init__(self, root: str, class_to_idx: Mapping[str, int] | None = None) -> None:
        self._fixed_classes = dict(class_to_idx) if class_to_idx is not None else None
        super().__init__(root, loader=load_rgb_image, allow_empty=class_to_idx is not None)

    def find_classes(self, directory: str | Path) -> tuple[list[str], dict[str, int]]:
        """train/'s classes when fixed (checking val/ adds none), else the folder names."""
        found, mapping = super().find_classes(directory)
        if self._fixed_classes is None:
            return found, mapping
        unknown = sorted(set(found) - set(self._fixed_classes))
        if unknown:
            raise DataError(f"{directory} has class folders not in train/: "
                            f"{', '.join(unknown[:5])}; use the same class names in both")
        return sorted(self._fixed_classes, key=self._fixed_classes.get), self._fixed_classes


def _folder(path: Path, class_to_idx: Mapping[str, int] | None) -> ClassFolder:
    try:
        folder = ClassFolder(str(path), class_to_idx)
    except FileNotFoundError as exc:
        reason = " ".join(str(exc).split())
        raise DataError(f"no usable images in {path} ({reason}); {_LAYOUT_HINT}") from None
    if len(folder) == 0:
        raise DataError(f"no images in {path}; {_LAYOUT_HINT}")
    return folder


def load_image_folders(root: Path) -> tuple[ClassFolder, ClassFolder, int]:
    """Raw (PIL RGB image, label) train and val sets and the number of training classes."""
    missing = [str(root / name) for name in ("train", "val") if not (root / name).is_dir()]
    if missing:
        raise DataError(f"missing {' and '.join(missing)}; {_LAYOUT_HINT}")
    train = _folder(root / "train", None)
    test = _folder(root / "val", train.class_to_idx)
    return train, test, len(train.classes)
