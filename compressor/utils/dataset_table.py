"""The dataset table: one DatasetSpec row holds everything the framework knows about a dataset.

The command line's --dataset choices, the model registry (classes, default input spec), the
loaders (compressor.data.load) and the image transforms (compressor.data.image_transforms) all read
this table; adding a dataset is one row here plus, for a new file format, its loader function
in compressor.data and one line in compressor.data.load.LOADERS.

The table is plain data and a leaf: the model registry reads it, and models never import data.
A row names its file format by a key of compressor.data.load.LOADERS.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from compressor.utils.errors import UsageError
from compressor.utils.input_spec import IMAGENET_MEAN, IMAGENET_STD, InputSpec

__all__ = [
    "DatasetSpec", "DATASET_SPECS", "dataset_spec", "dataset_names", "SYNTHETIC", "FOLDER",
    "DATASET_INPUT_SPECS", "DATASET_NUM_CLASSES",
    "NO_AUGMENT", "PAD_CROP_FLIP", "RESIZED_CROP_FLIP", "AUGMENTATIONS", "DIGIT_NAMES",
    "FASHION_MNIST_NAMES", "CIFAR10_NAMES", "CIFAR100_NAMES",
]

SYNTHETIC = "synthetic"
FOLDER = "folder"  # a user's image folder: classes from its folders, input spec from the arch
# Training augmentations, built by compressor.data.image_transforms.
NO_AUGMENT = "none"
PAD_CROP_FLIP = "pad-crop-flip"  # RandomCrop(crop, padding=4) + flip: Distiller's CIFAR
RESIZED_CROP_FLIP = "resized-crop-flip"  # RandomResizedCrop(crop) + flip: ImageNet
AUGMENTATIONS = (NO_AUGMENT, PAD_CROP_FLIP, RESIZED_CROP_FLIP)


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset: classes, default preprocessing, stored format, augmentation and loader."""

    name: str
    num_classes: int | None  # None: as many as the model has (synthetic)
    input_spec: InputSpec | None  # Distiller's preprocessing; None: the arch's default dataset's
    native_format: tuple[int, int | None] | None  # (channels, side) as stored, side None when
    # it varies; None: samples are generated ready to use (no transform at all)
    needs_dir: bool  # read from DATASET_DIR (False: embedded or generated)
    augment: str  # one of AUGMENTATIONS
    loader: str  # its file format: a key of compressor.data.load.LOADERS
    class_names: tuple[str, ...] = ()  # label i is class_names[i]; () when the loader knows
    # them (ImageFolder's folders) or nobody does (synthetic)
    loader_options: Mapping[str, Any] = field(default_factory=dict)  # keywords the loader takes

    def __post_init__(self) -> None:
        if self.augment not in AUGMENTATIONS:
            raise ValueError(f"dataset '{self.name}': unknown augmentation '{self.augment}'")
        if self.class_names and len(self.class_names) != self.num_classes:
            raise ValueError(f"dataset '{self.name}': {len(self.class_names)} class names for "
                             f"{self.num_classes} classes")


# Class names in label order (the loaders fill DatasetSplits.class_names from these).
DIGIT_NAMES = tuple(str(digit) for digit in range(10))
FASHION_MNIST_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                       "Sneaker", "Bag", "Ankle boot")
CIFAR10_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                 "truck")
# The fine labels of CIFAR-100's meta file (fine_label_names), which a loader prefers if present.
CIFAR100_NAMES = tuple("""
    apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus
    butterfly camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch
    crab crocodile cup dinosaur dolphin elephant flatfish forest fox girl hamster house kangaroo
    keyboard lamp lawn_mower leopard lion lizard lobster man maple_tree motorcycle mountain mouse
    mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain plate poppy
    porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper
    snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television
    tiger tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm""".split())


def _idx(name: str, subdirs: tuple[str, ...], mean: float, std: float,
         class_names: tuple[str, ...]) -> DatasetSpec:
    return DatasetSpec(name, 10, InputSpec((1, 28, 28), 28, 28, (mean,), (std,), "bilinear"),
                       (1, 28), True, NO_AUGMENT, "idx", class_names,
                       MappingProxyType({"subdirs": subdirs}))


def _cifar(name: str, spec: InputSpec, classes: int, subdir: str, train: tuple[str, ...],
           test: tuple[str, ...], label_key: str, archive: str, meta: tuple[str, str],
           class_names: tuple[str, ...]) -> DatasetSpec:
    options = MappingProxyType({"subdir": subdir, "train_files": train, "test_files": test,
                                "label_key": label_key, "archive": archive, "meta": meta})
    return DatasetSpec(name, classes, spec, (3, 32), True, PAD_CROP_FLIP, "cifar", class_names,
                       options)


# Distiller's own preprocessing for its small datasets, so its checkpoints evaluate as trained.
DATASET_SPECS: MappingProxyType[str, DatasetSpec] = MappingProxyType({spec.name: spec for spec in (
    DatasetSpec("digits", 10, InputSpec((1, 8, 8), 8, 8, (0.3054,), (0.3761,), "nearest"),
                (1, 8), False, NO_AUGMENT, "digits", DIGIT_NAMES),
    _idx("mnist", ("MNIST/raw", "MNIST", "mnist"), 0.1307, 0.3081, DIGIT_NAMES),
    _idx("fashion-mnist", ("FashionMNIST/raw", "FashionMNIST", "fashion-mnist"), 0.2860, 0.3530,
         FASHION_MNIST_NAMES),
    _cifar("cifar10", InputSpec((3, 32, 32), 32, 32, (0.5,) * 3, (0.5,) * 3, "bilinear"), 10,
           "cifar-10-batches-py", tuple(f"data_batch_{i}" for i in range(1, 6)),
           ("test_batch",), "labels", "cifar-10-python.tar.gz", ("batches.meta", "label_names"),
           CIFAR10_NAMES),
    _cifar("cifar100", InputSpec((3, 32, 32), 32, 32, (0.5071, 0.4865, 0.4409),
                                 (0.2673, 0.2564, 0.2762), "bilinear"), 100,
           "cifar-100-python", ("train",), ("test",), "fine_labels", "cifar-100-python.tar.gz",
           ("meta", "fine_label_names"), CIFAR100_NAMES),
    DatasetSpec("imagenet", 1000,
                InputSpec((3, 224, 224), 256, 224, IMAGENET_MEAN, IMAGENET_STD, "bilinear"),
                (3, None), True, RESIZED_CROP_FLIP, "imagenet"),
    # ROOT/train/<class>/ (and ROOT/val/<class>/) of any images, named as the user likes
    DatasetSpec(FOLDER, None, None, (3, None), True, RESIZED_CROP_FLIP, "folder"),
    DatasetSpec(SYNTHETIC, None, None, None, False, NO_AUGMENT, "synthetic"),
)})


def dataset_names() -> tuple[str, ...]:
    """Every dataset name, in table order (the --dataset choices)."""
    return tuple(DATASET_SPECS)


def dataset_spec(name: str) -> DatasetSpec:
    """The row of a dataset; an unknown name is a UsageError that lists the known ones."""
    try:
        return DATASET_SPECS[name]
    except KeyError:
        raise UsageError(f"unknown dataset '{name}'; use one of: "
                         f"{', '.join(DATASET_SPECS)}") from None


# Views of the table: datasets with their own preprocessing and class count (the synthetic
# dataset takes both from the architecture's default dataset).
DATASET_INPUT_SPECS: MappingProxyType[str, InputSpec] = MappingProxyType({
    name: spec.input_spec for name, spec in DATASET_SPECS.items() if spec.input_spec is not None})

DATASET_NUM_CLASSES: MappingProxyType[str, int] = MappingProxyType({
    name: spec.num_classes for name, spec in DATASET_SPECS.items()
    if spec.num_classes is not None})
