"""Digits, synthetic data, the --vs/--etrs/--evs/--etes splits and the public names."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch.utils.data import Subset

from compressor.data import (
    DATASET_NAMES,
    DatasetSplits,
    build_transforms,
    load_datasets,
    needs_data_dir,
)
from compressor.data.splits import (
    TensorImageDataset,
    TransformedDataset,
    split_train_val,
    take_subset,
)
from compressor.models.registry import DATASETS
from compressor.utils.dataset_table import DATASET_INPUT_SPECS
from compressor.utils.errors import DataError, UsageError
from compressor.utils.input_spec import InputSpec

DIGITS_SPEC = DATASET_INPUT_SPECS["digits"]
SMALL_SPEC = InputSpec((3, 8, 8), 8, 8, (0.5,) * 3, (0.5,) * 3, "bilinear")


def _indices(dataset: object) -> list[int]:
    assert isinstance(dataset, Subset)
    return list(dataset.indices)


def test_names_match_the_registry() -> None:
    assert set(DATASET_NAMES) == set(DATASETS)
    assert [name for name in DATASET_NAMES if not needs_data_dir(name)] == ["digits", "synthetic"]
    with pytest.raises(UsageError, match="unknown dataset 'svhn'"):
        needs_data_dir("svhn")


def test_digits_split_shapes_and_normalization() -> None:
    splits = load_datasets("digits", None, DIGITS_SPEC)
    assert isinstance(splits, DatasetSplits)
    assert (len(splits.train), len(splits.test), splits.num_classes) == (1437, 360, 10)
    image, label = splits.test[0]
    assert image.shape == (1, 8, 8) and image.dtype == torch.float32 and isinstance(label, int)
    raw = torch.stack([splits.train[i][0] for i in range(len(splits.train))])
    pixels = raw * DIGITS_SPEC.std[0] + DIGITS_SPEC.mean[0]  # back to [0, 1]
    assert float(pixels.min()) == pytest.approx(0.0, abs=1e-6)
    assert float(pixels.max()) == pytest.approx(1.0, abs=1e-6)
    # Every pixel is v/16 for an integer v, as in load_digits().images.
    np.testing.assert_allclose((pixels * 16).numpy(), (pixels * 16).round().numpy(), atol=1e-4)
    assert float(pixels.mean()) == pytest.approx(0.3054, abs=1e-3)
    assert float(pixels.std()) == pytest.approx(0.3761, abs=1e-3)
    counts = np.bincount([splits.test[i][1] for i in range(len(splits.test))], minlength=10)
    assert counts.min() >= 35  # stratified: every class has its share of the 360 test images
    all_digits = load_digits().images.reshape(len(load_digits().images), -1) / 16.0
    first = pixels[0].reshape(-1).numpy()
    assert np.abs(all_digits - first).sum(axis=1).min() < 1e-4  # a real digit


def test_digits_test_set_does_not_move_with_the_seed() -> None:
    one = load_datasets("digits", None, DIGITS_SPEC, seed=1).test
    two = load_datasets("digits", None, DIGITS_SPEC, seed=2).test
    assert all(torch.equal(one[i][0], two[i][0]) for i in (0, 100, 359))


def test_validation_split_is_seeded_disjoint_and_uses_eval_transforms() -> None:
    splits = load_datasets("synthetic", None, SMALL_SPEC, validation_split=0.25, seed=3,
                           num_classes=4)
    train, val = _indices(splits.train), _indices(splits.val)
    assert (len(train), len(val)) == (768, 256)
    assert not set(train) & set(val) and sorted(train + val) == list(range(1024))
    again = load_datasets("synthetic", None, SMALL_SPEC, validation_split=0.25, seed=3,
                          num_classes=4)
    assert _indices(again.val) == val
    other = load_datasets("synthetic", None, SMALL_SPEC, validation_split=0.25, seed=4,
                          num_classes=4)
    assert _indices(other.val) != val
    assert split_train_val(10, 0.0, 0) == (list(range(10)), [])


def test_validation_of_cifar_is_not_augmented() -> None:
    images = torch.randint(0, 256, (10, 3, 32, 32), dtype=torch.uint8)
    raw = TensorImageDataset(images, torch.arange(10) % 10)
    spec = DATASET_INPUT_SPECS["cifar10"]
    val = take_subset(TransformedDataset(raw, build_transforms(spec, "cifar10", train=False)),
                      [2, 5], 1.0, 0, "validation")
    torch.manual_seed(0)
    first = val[1][0]
    torch.manual_seed(1)
    assert torch.equal(first, val[1][0])
    assert torch.allclose(first, (images[5] / 255.0 - 0.5) / 0.5, atol=1e-6)


def test_effective_sizes_are_seeded_subsets() -> None:
    kwargs = dict(validation_split=0.5, effective_train_size=0.25, effective_valid_size=0.5,
                  effective_test_size=0.1, seed=7, num_classes=10)
    splits = load_datasets("synthetic", None, SMALL_SPEC, **kwargs)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (128, 256, 25)
    full = load_datasets("synthetic", None, SMALL_SPEC, validation_split=0.5, seed=7,
                         num_classes=10)
    assert set(_indices(splits.train)) <= set(_indices(full.train))
    assert set(_indices(splits.val)) <= set(_indices(full.val))
    assert _indices(load_datasets("synthetic", None, SMALL_SPEC, **kwargs).test) == \
        _indices(splits.test)
    # --etes does not move the train/validation split.
    changed = load_datasets("synthetic", None, SMALL_SPEC, **{**kwargs, "effective_test_size": 1})
    assert _indices(changed.train) == _indices(splits.train)


def test_synthetic_samples_are_lazy_deterministic_and_labelled() -> None:
    spec = InputSpec((3, 299, 299), 342, 299, (0.5,) * 3, (0.5,) * 3, "bilinear")
    splits = load_datasets("synthetic", None, spec, num_classes=1000, seed=0)
    assert (len(splits.train), len(splits.test), splits.num_classes) == (1024, 256, 1000)
    image, label = splits.train[1023]
    assert image.shape == (3, 299, 299) and image.dtype == torch.float32 and 0 <= label < 1000
    again = load_datasets("synthetic", None, spec, num_classes=1000, seed=0)
    assert torch.equal(again.train[1023][0], image)
    assert not torch.equal(splits.test[0][0], splits.train[0][0])
    other_seed = load_datasets("synthetic", None, spec, num_classes=1000, seed=1)
    assert not torch.equal(other_seed.train[1023][0], image)
    labels = {load_datasets("synthetic", None, SMALL_SPEC, num_classes=3).test[i][1]
              for i in range(60)}
    assert labels == {0, 1, 2}


def test_bad_fractions_and_class_counts() -> None:
    with pytest.raises(UsageError, match="--vs"):
        load_datasets("synthetic", None, SMALL_SPEC, validation_split=1.0)
    with pytest.raises(UsageError, match="--etrs"):
        load_datasets("synthetic", None, SMALL_SPEC, effective_train_size=0.0)
    with pytest.raises(UsageError, match="--etes"):
        load_datasets("synthetic", None, SMALL_SPEC, effective_test_size=1.5)
    with pytest.raises(DataError, match="test set of 256 samples becomes empty"):
        load_datasets("synthetic", None, SMALL_SPEC, effective_test_size=0.001)
    with pytest.raises(DataError, match="10 classes but the model has 5 outputs"):
        load_datasets("digits", None, DIGITS_SPEC, num_classes=5)


def test_resize_only_when_the_spec_differs() -> None:
    image = torch.rand(1, 8, 8)
    same = build_transforms(DIGITS_SPEC, "digits", train=True)(image)
    assert torch.allclose(same, (image - DIGITS_SPEC.mean[0]) / DIGITS_SPEC.std[0], atol=1e-6)
    bigger = InputSpec((1, 16, 16), 16, 16, (0.0,), (1.0,), "nearest")
    resized = build_transforms(bigger, "digits", train=False)(image)
    assert resized.shape == (1, 16, 16) and torch.equal(resized[0, ::2, ::2], image[0])
    imagenet = InputSpec((3, 299, 299), 342, 299, (0.5,) * 3, (0.5,) * 3, "bilinear")
    photo = torch.randint(0, 256, (3, 400, 500), dtype=torch.uint8)
    assert build_transforms(imagenet, "imagenet", train=False)(photo).shape == (3, 299, 299)
    assert build_transforms(imagenet, "imagenet", train=True)(photo).shape == (3, 299, 299)
    with pytest.raises(UsageError, match="unknown interpolation 'cubic'"):
        build_transforms(InputSpec((1, 8, 8), 8, 8, (0.0,), (1.0,), "cubic"), "digits", False)


@pytest.mark.parametrize(("dataset", "spec", "images"), [
    ("digits", DIGITS_SPEC, torch.rand(1100, 1, 8, 8)),  # float pixels, normalize only
    ("mnist", InputSpec((3, 36, 36), 40, 36, (0.4,) * 3, (0.3,) * 3, "bilinear"),
     torch.randint(0, 256, (600, 1, 28, 28), dtype=torch.uint8)),  # RGB, resize, crop
    ("cifar10", InputSpec((1, 20, 20), 24, 20, (0.5,), (0.25,), "bicubic"),
     torch.randint(0, 256, (600, 3, 32, 32), dtype=torch.uint8)),  # grey, antialiased down
])
def test_a_deterministic_transform_runs_in_chunks_with_each_images_exact_result(
        dataset: str, spec: InputSpec, images: torch.Tensor) -> None:
    raw = TensorImageDataset(images, torch.arange(len(images)) % 10)
    transform = build_transforms(spec, dataset, train=False)
    chunked = TransformedDataset(raw, transform, batched=True)
    one_by_one = TransformedDataset(raw, transform)
    for index in (0, 1, 511, 512, len(raw) - 1, -1, -len(raw)):
        got, want = chunked[index], one_by_one[index]
        assert got[1] == want[1] and got[0].shape == tuple(spec.input_size)
        assert torch.equal(got[0], want[0]), index  # bitwise, not merely close
    got[0].add_(1.0)  # an item is the caller's own copy: the kept chunk is unchanged
    assert torch.equal(chunked[-1][0], one_by_one[-1][0])
    with pytest.raises(IndexError):
        chunked[len(raw)]


def test_augmentation_and_a_set_too_large_to_keep_go_image_by_image(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from compressor.data.image_transforms import is_deterministic

    assert not is_deterministic(build_transforms(SMALL_SPEC, "cifar10", train=True))  # crop, flip
    assert is_deterministic(build_transforms(SMALL_SPEC, "cifar10", train=False))
    raw = TensorImageDataset(torch.rand(700, 1, 8, 8), torch.zeros(700))
    transform = build_transforms(DIGITS_SPEC, "digits", train=False)
    monkeypatch.setattr(TransformedDataset, "MAX_CACHED_BYTES", 700 * 64 * 4 - 1)
    chunked = TransformedDataset(raw, transform, batched=True)
    assert torch.equal(chunked[3][0], transform(raw[3][0]))
    assert chunked._chunks is None  # nothing kept: one image at a time from then on
    assert torch.equal(chunked[650][0], transform(raw[650][0]))
