"""ImageFolder data written here as JPEGs: transforms, class indices, layout and corrupt files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from compressor.data import load_datasets
from compressor.utils.errors import DataError
from compressor.utils.input_spec import InputSpec

SPEC = InputSpec((3, 24, 24), 28, 24, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), "bicubic")


def write_folder(root: Path, classes: dict[str, int], color_of: dict[str, tuple]) -> None:
    """root/<class>/img<i>.JPEG: `count` solid-colour 40x30 images per class."""
    for name, count in classes.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            Image.new("RGB", (40, 30), color_of[name]).save(root / name / f"img{i}.JPEG")


COLORS = {"ant": (255, 0, 0), "bee": (0, 255, 0), "cat": (0, 0, 255)}


@pytest.fixture
def imagenet_root(tmp_path: Path) -> Path:
    write_folder(tmp_path / "train", {"ant": 3, "bee": 2, "cat": 3}, COLORS)
    write_folder(tmp_path / "val", {"bee": 2, "cat": 1}, COLORS)  # no 'ant' in val
    return tmp_path


def test_folders_transforms_and_class_indices(imagenet_root: Path) -> None:
    splits = load_datasets("imagenet", str(imagenet_root), SPEC, num_classes=1000)
    assert (len(splits.train), len(splits.test), splits.num_classes) == (8, 3, 3)
    labels = sorted(label for _, label in splits.test)
    assert labels == [1, 1, 2]  # val/ indexed with train/'s classes although 'ant' is missing
    image, label = splits.test[2]
    assert image.shape == (3, 24, 24) and image.dtype == torch.float32 and label == 2
    blue = (1.0 - SPEC.mean[2]) / SPEC.std[2]
    assert abs(float(image[2].mean()) - blue) < 0.05  # solid blue survives JPEG + resize
    torch.manual_seed(0)
    train_image, _ = splits.train[0]
    assert train_image.shape == (3, 24, 24)


def test_grayscale_spec_gets_one_channel(imagenet_root: Path) -> None:
    spec = InputSpec((1, 16, 16), 16, 16, (0.5,), (0.5,), "bilinear")
    image, _ = load_datasets("imagenet", str(imagenet_root), spec).test[0]
    assert image.shape == (1, 16, 16)


def test_missing_layout_is_named(tmp_path: Path) -> None:
    write_folder(tmp_path / "train", {"ant": 1}, COLORS)
    with pytest.raises(DataError, match=r"missing .*val; expected ROOT/train/ and ROOT/val/"):
        load_datasets("imagenet", str(tmp_path), SPEC)
    (tmp_path / "val").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "val" / "flat.JPEG")  # flat val/ as downloaded
    with pytest.raises(DataError, match=r"val.*ImageFolder layout"):
        load_datasets("imagenet", str(tmp_path), SPEC)
    write_folder(tmp_path / "val", {"dog": 1}, {"dog": (1, 2, 3)})
    with pytest.raises(DataError, match="class folders not in train/: dog"):
        load_datasets("imagenet", str(tmp_path), SPEC)


@pytest.mark.parametrize("content", ["truncated", "garbage"])
def test_corrupt_image_names_the_file(imagenet_root: Path, content: str) -> None:
    bad = imagenet_root / "val" / "bee" / "img1.JPEG"
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2] if content == "truncated" else b"not a jpeg at all")
    splits = load_datasets("imagenet", str(imagenet_root), SPEC)
    with pytest.raises(DataError, match="corrupt image file .*img1.JPEG: .*; remove or") as info:
        for index in range(len(splits.test)):
            splits.test[index]
    assert "\n" not in str(info.value) and str(bad) in str(info.value)


def test_corrupt_image_message_survives_a_worker(imagenet_root: Path) -> None:
    bad = imagenet_root / "val" / "cat" / "img0.JPEG"
    bad.write_bytes(b"garbage")
    splits = load_datasets("imagenet", str(imagenet_root), SPEC)
    loader = DataLoader(splits.test, batch_size=3, num_workers=1)
    with pytest.raises(DataError) as info:
        next(iter(loader))
    lines = [line for line in str(info.value).splitlines() if "corrupt image file" in line]
    # The worker re-raises DataError(message + traceback); the last such line is ours.
    assert lines[-1].startswith("compressor.utils.errors.DataError: corrupt image file ")
    assert str(bad) in lines[-1]


def test_class_folder_without_images_is_named(imagenet_root: Path) -> None:
    (imagenet_root / "train" / "dog").mkdir()
    (imagenet_root / "train" / "dog" / "notes.txt").write_text("not an image")
    with pytest.raises(DataError, match=r"no images in .*train/dog; expected ROOT/train/"):
        load_datasets("imagenet", str(imagenet_root), SPEC)
