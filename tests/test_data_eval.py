"""load_test_dataset: evaluation reads the test split alone, with the labels the model learned."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image
from torchvision.models import ResNet18_Weights

from compressor.data import load_datasets, load_test_dataset
from compressor.data.imagenet_classes import imagenet_wnids
from compressor.utils.dataset_table import DATASET_INPUT_SPECS
from compressor.utils.errors import DataError
from compressor.utils.input_spec import InputSpec
from tests.test_data_cifar import write_cifar10
from tests.test_data_idx import write_mnist

SPEC = InputSpec((3, 16, 16), 18, 16, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), "bilinear")
SMALL = InputSpec((3, 8, 8), 8, 8, (0.5,) * 3, (0.5,) * 3, "bilinear")
GOLDFISH, CHIHUAHUA, TOILET_TISSUE = "n01443537", "n02085620", "n15075141"


def write_classes(root: Path, names: list[str], per_class: int = 1) -> None:
    """root/<name>/<i>.JPEG: small images whose colour encodes the class position."""
    for position, name in enumerate(names):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.new("RGB", (20, 20), (position * 40 % 256, i * 60, 90)).save(
                root / name / f"{i}.JPEG")


def _labels(dataset: torch.utils.data.Dataset) -> list[int]:
    return sorted(dataset[i][1] for i in range(len(dataset)))


def _same_samples(one: torch.utils.data.Dataset, two: torch.utils.data.Dataset) -> bool:
    return len(one) == len(two) and all(
        torch.equal(one[i][0], two[i][0]) and one[i][1] == two[i][1] for i in range(len(one)))


@pytest.mark.parametrize("dataset,spec", [("digits", DATASET_INPUT_SPECS["digits"]),
                                          ("synthetic", SMALL)])
def test_same_test_set_as_load_datasets(dataset: str, spec: InputSpec) -> None:
    kwargs = dict(effective_test_size=0.1, seed=3, num_classes=10)
    full = load_datasets(dataset, None, spec, validation_split=0.2, **kwargs)
    alone = load_test_dataset(dataset, None, spec, **kwargs)
    assert alone.num_classes == full.num_classes == 10
    assert _same_samples(alone.test, full.test)


def test_mnist_reads_only_the_t10k_files(tmp_path: Path) -> None:
    write_mnist(tmp_path, gz=True, n_train=12, n_test=6)
    spec = DATASET_INPUT_SPECS["mnist"]
    full = load_datasets("mnist", str(tmp_path), spec)
    (tmp_path / "train-images-idx3-ubyte.gz").unlink()
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(b"garbage")
    alone = load_test_dataset("mnist", str(tmp_path), spec)
    assert _same_samples(alone.test, full.test)
    with pytest.raises(DataError, match="no mnist IDX files .*train-images-idx3-ubyte"):
        load_datasets("mnist", str(tmp_path), spec)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match=r"no mnist IDX files .* t10k-images-idx3-ubyte\[\.gz\], "
                                        r"t10k-labels-idx1-ubyte\[\.gz\]$"):
        load_test_dataset("mnist", str(tmp_path), spec)


def test_cifar_reads_only_the_test_batch(tmp_path: Path) -> None:
    write_cifar10(tmp_path / "cifar-10-batches-py")
    spec = DATASET_INPUT_SPECS["cifar10"]
    full = load_datasets("cifar10", str(tmp_path), spec)
    for i in range(1, 6):
        (tmp_path / "cifar-10-batches-py" / f"data_batch_{i}").unlink()
    assert _same_samples(load_test_dataset("cifar10", str(tmp_path), spec).test, full.test)
    assert len(load_test_dataset("cifar10", str(tmp_path), spec, effective_test_size=0.5).test) \
        == 2
    with pytest.raises(DataError, match="no cifar10 batch files"):
        load_datasets("cifar10", str(tmp_path), spec)


def test_imagenet_val_only_and_a_tiny_train_folder(tmp_path: Path) -> None:
    write_classes(tmp_path / "val", ["ant", "bee", "cat"], per_class=2)
    alone = load_test_dataset("imagenet", str(tmp_path), SPEC, num_classes=3)
    assert (len(alone.test), alone.num_classes) == (6, 3)
    assert alone.class_names == ("ant", "bee", "cat") and _labels(alone.test) == [0, 0, 1, 1, 2, 2]
    # One training image: --vs 0.1 of it is refused when training, evaluation never sees it.
    write_classes(tmp_path / "train", ["ant", "bee", "cat"])
    (tmp_path / "train" / "cat" / "0.JPEG").write_bytes(b"not read when evaluating")
    with pytest.raises(DataError, match="--vs 0.1 of 3 training samples"):
        load_datasets("imagenet", str(tmp_path), SPEC, validation_split=0.1, num_classes=3)
    assert _labels(load_test_dataset("imagenet", str(tmp_path), SPEC, num_classes=3).test) == \
        [0, 0, 1, 1, 2, 2]


def test_val_missing_a_class_keeps_the_training_indices(tmp_path: Path) -> None:
    write_classes(tmp_path / "train", ["ant", "bee", "cat"])
    write_classes(tmp_path / "val", ["bee", "cat"])
    trained = load_datasets("imagenet", str(tmp_path), SPEC, num_classes=1000)
    alone = load_test_dataset("imagenet", str(tmp_path), SPEC, num_classes=1000)
    assert _labels(alone.test) == _labels(trained.test) == [1, 2]  # train/'s names, not val/'s
    assert alone.class_names == trained.class_names == ("ant", "bee", "cat")
    recorded = load_test_dataset("imagenet", str(tmp_path), SPEC, num_classes=1000,
                                 class_names=["cat", "bee", "ant"])
    assert _labels(recorded.test) == [0, 1]  # the checkpoint's own order wins
    with pytest.raises(DataError, match="class folders not in the model's classes .*: cat"):
        load_test_dataset("imagenet", str(tmp_path), SPEC, class_names=["ant", "bee"])
    for name in ("ant", "bee", "cat"):
        for image in (tmp_path / "train" / name).iterdir():
            image.unlink()
        (tmp_path / "train" / name).rmdir()
    # Without train/ a missing val class would shift the labels: refused, not guessed.
    with pytest.raises(DataError, match=r"val has 2 class folders, the model has 3 classes; a "
                                        r"3-class model cannot know their indices: add .*train/"):
        load_test_dataset("imagenet", str(tmp_path), SPEC, num_classes=3)


def test_wnid_list_is_imagenet_1k_in_torchvision_order() -> None:
    wnids = imagenet_wnids()
    assert len(wnids) == len(set(wnids)) == 1000 and list(wnids) == sorted(wnids)
    assert (wnids[0], wnids[-1]) == ("n01440764", TOILET_TISSUE)
    categories = ResNet18_Weights.IMAGENET1K_V1.meta["categories"]
    named = {GOLDFISH: "goldfish", CHIHUAHUA: "Chihuahua", TOILET_TISSUE: "toilet tissue",
             "n02123045": "tabby", "n04008634": "projectile", "n07920052": "espresso"}
    for wnid, name in named.items():
        assert categories[wnids.index(wnid)] == name


def test_wnid_subset_keeps_pretrained_indices(tmp_path: Path) -> None:
    write_classes(tmp_path / "train", [GOLDFISH, CHIHUAHUA, TOILET_TISSUE])
    write_classes(tmp_path / "val", [CHIHUAHUA, TOILET_TISSUE])
    splits = load_datasets("imagenet", str(tmp_path), SPEC, num_classes=1000, pretrained=True)
    assert _labels(splits.train) == [1, 151, 999] and _labels(splits.test) == [151, 999]
    assert splits.num_classes == 1000 and splits.class_names == imagenet_wnids()
    alone = load_test_dataset("imagenet", str(tmp_path), SPEC, num_classes=1000, pretrained=True)
    assert _labels(alone.test) == [151, 999]
    # A model with as many outputs as folders (e.g. trained on Imagenette) keeps sorted order.
    assert _labels(load_test_dataset("imagenet", str(tmp_path), SPEC, num_classes=3).test) == \
        [1, 2]


def test_pretrained_weights_refuse_folders_without_wnids(tmp_path: Path) -> None:
    write_classes(tmp_path / "val", ["cat", "dog", CHIHUAHUA])
    with pytest.raises(DataError) as info:
        load_test_dataset("imagenet", str(tmp_path), SPEC, num_classes=1000, pretrained=True)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'val'} has 3 class folders, 2 of them not ImageNet "
                              "WordNet ids (cat, dog); a 1000-class model cannot know their "
                              "indices: name the folders by wnid")
    write_classes(tmp_path / "train", ["cat", "dog", CHIHUAHUA])
    with pytest.raises(DataError, match="train has 3 class folders, 2 of them not ImageNet"):
        load_datasets("imagenet", str(tmp_path), SPEC, num_classes=1000, pretrained=True)
    # Trained from scratch on these folders, a 1000-output model learned sorted indices.
    assert _labels(load_test_dataset("imagenet", str(tmp_path), SPEC, num_classes=1000).test) \
        == [0, 1, 2]
    # As many folders as the weights have classes: sorted order, as ImageFolder does.
    assert _labels(load_test_dataset("imagenet", str(tmp_path), SPEC, num_classes=3,
                                     pretrained=True).test) == [0, 1, 2]
