"""The `folder` dataset: a user's class folders of real PNG/JPEG files, their classes, the
inference that tells them from ImageNet's, and the layouts and files it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from compressor.data import load_datasets, load_test_dataset
from compressor.data.folder import folder_num_classes, infer_dataset
from compressor.utils.errors import DataError, UsageError
from compressor.utils.input_spec import InputSpec

SPEC = InputSpec((3, 16, 16), 16, 16, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "bilinear")
GRAY_SPEC = InputSpec((1, 16, 16), 16, 16, (0.5,), (0.5,), "bilinear")
CLASSES = ("ant", "bee", "cat")
COLORS = {"ant": (250, 10, 10), "bee": (10, 250, 10), "cat": (10, 10, 250)}
WNIDS = ("n01440764", "n01443537")


def write_images(folder: Path, count: int, color: tuple[int, int, int] = (90, 140, 200)) -> None:
    """`count` 24x24 images: RGB JPEGs, grayscale PNGs and RGBA PNGs in turn."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        image = Image.new("RGB", (24, 24), color)
        kind = i % 3
        if kind == 0:
            image.save(folder / f"{i}.jpg", quality=95)
        else:
            image.convert("L" if kind == 1 else "RGBA").save(folder / f"{i}.png")


def write_tree(root: Path, splits: dict[str, int], classes: tuple[str, ...] = CLASSES) -> Path:
    for split, count in splits.items():
        for name in classes:
            write_images(root / split / name, count, COLORS.get(name, (90, 140, 200)))
    return root


def _labels(dataset: torch.utils.data.Dataset) -> list[int]:
    return sorted(int(dataset[i][1]) for i in range(len(dataset)))


def test_classes_come_from_the_folders_and_any_image_mode_gets_the_spec_channels(
        tmp_path: Path) -> None:
    root = write_tree(tmp_path, {"train": 3, "val": 3})
    splits = load_datasets("folder", root, SPEC)
    assert splits.class_names == CLASSES and splits.num_classes == 3
    assert (len(splits.train), len(splits.test)) == (9, 9)
    assert _labels(splits.test) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # val/ant/: 0.jpg RGB, 1.png grayscale (equal channels), 2.png RGBA (its colour kept)
    red, gray, rgba = (splits.test[i][0] for i in range(3))
    assert red.shape == gray.shape == rgba.shape == (3, 16, 16)
    assert float(red[0].mean()) > 0.9 and float(red[2].mean()) < -0.9
    assert torch.allclose(gray[0], gray[1]) and torch.allclose(gray[1], gray[2])
    assert torch.allclose(rgba, red, atol=0.05)
    one = load_test_dataset("folder", root, GRAY_SPEC).test
    assert {tuple(one[i][0].shape) for i in range(len(one))} == {(1, 16, 16)}


def test_without_val_the_vs_split_is_the_test_split(tmp_path: Path) -> None:
    root = write_tree(tmp_path, {"train": 4})
    splits = load_datasets("folder", root, SPEC, validation_split=0.25)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (9, 3, 3)
    assert splits.test is splits.val
    with pytest.raises(DataError, match=r"no val/ split, and --vs 0 .*add val/<class>/ images"):
        load_datasets("folder", root, SPEC)
    # the fix is to add the held-out images, not a circular "point DATASET_DIR at ... val/"
    with pytest.raises(DataError, match=r"missing .*val; evaluation \(-e\) reads val/<class>/ "
                       r"images: add .*val/<class>/ images held out from training"):
        load_test_dataset("folder", root, SPEC)


def test_evaluation_reads_val_alone_in_the_recorded_class_order(tmp_path: Path) -> None:
    root = write_tree(tmp_path, {"val": 1}, classes=("bee", "cat"))
    (root / "train" / "ant").mkdir(parents=True)
    (root / "train" / "ant" / "0.jpg").write_bytes(b"never read")
    recorded = load_test_dataset("folder", root, SPEC, class_names=CLASSES)
    assert recorded.class_names == CLASSES and _labels(recorded.test) == [1, 2]
    write_images(root / "val" / "dog", 1)
    with pytest.raises(DataError, match="class folders not in the model's classes.*: dog"):
        load_test_dataset("folder", root, SPEC, class_names=CLASSES)


def test_hidden_folders_are_no_class(tmp_path: Path) -> None:
    root = write_tree(tmp_path, {"train": 1, "val": 1})
    (root / "train" / ".ipynb_checkpoints").mkdir()
    assert infer_dataset(root) == "folder" and folder_num_classes(root, None) == 3
    assert load_datasets("folder", root, SPEC).class_names == CLASSES


def test_inference_tells_wnids_from_other_names(tmp_path: Path) -> None:
    wnids = write_tree(tmp_path / "wnids", {"val": 1}, classes=WNIDS)
    assert infer_dataset(wnids) == "imagenet"
    assert infer_dataset(write_tree(tmp_path / "own", {"train": 1}, ("a", "b"))) == "folder"
    mixed = write_tree(tmp_path / "mixed", {"val": 1}, classes=(WNIDS[0], "bee"))
    with pytest.raises(DataError, match="mixes ImageNet WordNet-id class folders .*"
                                        "pass --dataset folder"):
        infer_dataset(mixed)
    # named explicitly, a mixed folder is a folder of the user's classes
    assert load_test_dataset("folder", mixed, SPEC).class_names == ("bee", WNIDS[0])
    cifar = tmp_path / "cifar" / "cifar-10-batches-py"
    cifar.mkdir(parents=True)
    (cifar / "data_batch_1").write_bytes(b"")
    assert infer_dataset(tmp_path / "cifar") is None
    assert infer_dataset(tmp_path / "absent") is None


def test_class_count_and_num_classes(tmp_path: Path) -> None:
    root = write_tree(tmp_path, {"train": 1})
    assert folder_num_classes(root, None) == 3
    assert folder_num_classes(root, 7) == 7  # spare outputs are allowed
    with pytest.raises(UsageError, match="--num-classes 2 is fewer than the 3 class folders"):
        folder_num_classes(root, 2)
    with pytest.raises(UsageError, match="pass DATASET_DIR"):
        folder_num_classes(None, None)
    with pytest.raises(DataError, match="does not exist"):
        folder_num_classes(tmp_path / "absent", None)


@pytest.mark.parametrize(("split", "fragment"), [
    ("val", r"val has class folders that .*train lacks: dog"),
    ("train", r"train has class folders that .*val lacks: dog"),
])
def test_train_and_val_must_have_the_same_classes(tmp_path: Path, split: str,
                                                  fragment: str) -> None:
    root = write_tree(tmp_path, {"train": 1, "val": 1})
    write_images(root / split / "dog", 1)
    for call in (lambda: folder_num_classes(root, None),
                 lambda: load_datasets("folder", root, SPEC),
                 lambda: load_datasets("folder", root, SPEC, class_names=(*CLASSES, "dog"))):
        with pytest.raises(DataError, match=fragment):
            call()


def test_an_empty_class_folder_is_named(tmp_path: Path) -> None:
    root = write_tree(tmp_path, {"train": 1})
    (root / "train" / "dog").mkdir()
    (root / "train" / "dog" / "notes.txt").write_text("no image here")
    with pytest.raises(DataError, match=r"no images in .*train/dog; put images in every class"):
        load_datasets("folder", root, SPEC, validation_split=0.5)


@pytest.mark.parametrize("content", [b"not an image at all", b""])
def test_an_unreadable_image_is_refused_when_the_data_loads(tmp_path: Path,
                                                            content: bytes) -> None:
    root = write_tree(tmp_path, {"train": 2, "val": 1})
    bad = root / "train" / "bee" / "1.png"
    bad.write_bytes(content)
    with pytest.raises(DataError, match="corrupt image file .*1.png: .*; remove or replace it"):
        load_datasets("folder", root, SPEC)  # not later, when an epoch reads it
    assert isinstance(load_test_dataset("folder", root, SPEC).test[0][0], torch.Tensor)


def test_a_jpeg_cut_short_in_its_pixels_is_refused_when_the_data_loads(tmp_path: Path) -> None:
    """Its header is whole (PIL's verify passes it): only decoding finds the missing scans."""
    root = write_tree(tmp_path, {"train": 2, "val": 1})
    noise = torch.randint(0, 256, (96, 128, 3), generator=torch.Generator().manual_seed(0),
                          dtype=torch.uint8).numpy()
    whole = root / "train" / "cat" / "whole.jpg"
    Image.fromarray(noise).save(whole, quality=90)
    data = whole.read_bytes()
    (root / "train" / "cat" / "cut.jpg").write_bytes(data[:len(data) // 2])
    with Image.open(root / "train" / "cat" / "cut.jpg") as cut:
        cut.verify()  # what a header check alone would accept
    with pytest.raises(DataError, match="corrupt image file .*cut.jpg: image file is truncated"):
        load_datasets("folder", root, SPEC)
