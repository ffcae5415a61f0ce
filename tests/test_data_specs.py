"""The dataset table is the one source of dataset names, classes, specs, formats and loaders."""

from __future__ import annotations

import ast
from pathlib import Path
from types import MappingProxyType

import pytest
import torch

from compressor.cli.parser import get_args_parser
from compressor.data import DATASET_NAMES, build_transforms, load_datasets, load_test_dataset
from compressor.data import load as data_load
from compressor.data.splits import LoadRequest, RawSplits, TensorImageDataset
from compressor.models.registry import DATASETS
from compressor.utils import dataset_table as datasets
from compressor.utils.dataset_table import (
    DATASET_INPUT_SPECS,
    DATASET_NUM_CLASSES,
    DATASET_SPECS,
    NO_AUGMENT,
    DatasetSpec,
    dataset_names,
    dataset_spec,
)
from compressor.utils.errors import UsageError
from compressor.utils.input_spec import InputSpec
from tests.conftest import ROOT

TINY_SPEC = InputSpec((1, 4, 4), 4, 4, (0.5,), (0.25,), "nearest")


def load_tiny(request: LoadRequest, *, count: int) -> RawSplits:
    """A loader for the fake row: `count` 1x4x4 images per split, labels 0..2."""
    images = torch.arange(count * 16, dtype=torch.uint8).reshape(count, 1, 4, 4)
    labels = torch.arange(count) % 3
    split = TensorImageDataset(images, labels)
    return RawSplits(split if request.train else None, split, 3)


TINY = DatasetSpec("tiny", 3, TINY_SPEC, (1, 4), False, NO_AUGMENT, "tiny", (),
                   MappingProxyType({"count": 6}))


def test_every_consumer_lists_the_table() -> None:
    names = dataset_names()
    assert names == tuple(DATASET_SPECS) == DATASET_NAMES
    assert set(names) == set(DATASETS)  # the registry's dataset names
    dataset_action = next(action for action in get_args_parser()._actions
                          if action.dest == "dataset")
    assert tuple(dataset_action.choices) == names
    for name, spec in DATASET_SPECS.items():
        assert spec.name == name
        if spec.input_spec is not None:
            assert DATASET_INPUT_SPECS[name] is spec.input_spec  # the same object, not a copy
        if spec.num_classes is not None:
            assert DATASET_NUM_CLASSES[name] == spec.num_classes
        assert data_load.needs_data_dir(name) is spec.needs_dir
    # synthetic data and a user's folder take their input spec from the arch; the folder's
    # classes come from its class folders, the synthetic ones from the model
    assert set(DATASET_INPUT_SPECS) == set(DATASET_NUM_CLASSES) == set(names) - {"synthetic",
                                                                                 "folder"}
    with pytest.raises(UsageError, match="unknown dataset 'svhn'; use one of: digits, mnist"):
        dataset_spec("svhn")


def test_a_new_row_is_visible_to_cli_loaders_and_transforms(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets, "DATASET_SPECS",
                        MappingProxyType({**DATASET_SPECS, "tiny": TINY}))
    monkeypatch.setattr(data_load, "LOADERS",
                        MappingProxyType({**data_load.LOADERS, "tiny": load_tiny}))
    assert "tiny" in dataset_names()
    args = get_args_parser().parse_args(["--dataset", "tiny", "-a", "x"])
    assert args.dataset == "tiny"
    assert not data_load.needs_data_dir("tiny")
    splits = load_datasets("tiny", None, TINY_SPEC, validation_split=0.5, num_classes=3)
    assert (len(splits.train), len(splits.val), len(splits.test), splits.num_classes) == \
        (3, 3, 6, 3)
    image, label = load_test_dataset("tiny", None, TINY_SPEC).test[4]
    assert label == 1 and image.shape == (1, 4, 4)
    expected = (torch.arange(64, 80, dtype=torch.float32).reshape(1, 4, 4) / 255 - 0.5) / 0.25
    assert torch.allclose(image, expected, atol=1e-6)
    bigger = InputSpec((1, 8, 8), 8, 8, (0.0,), (1.0,), "nearest")
    assert build_transforms(bigger, "tiny", train=False)(torch.zeros(1, 4, 4)).shape == (1, 8, 8)


def test_unknown_augmentation_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown augmentation 'mixup'"):
        DatasetSpec("x", 2, TINY_SPEC, (1, 4), False, "mixup", TINY.loader)


def _imported_modules(path: Path) -> set[str]:
    """Modules a file imports at run time (imports under `if TYPE_CHECKING:` are left out)."""
    names: set[str] = set()
    pending: list[ast.AST] = [ast.parse(path.read_text())]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
                and node.test.id == "TYPE_CHECKING":
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        pending.extend(ast.iter_child_nodes(node))
    return names


def test_models_and_the_table_import_no_data_loader() -> None:
    files = [*(ROOT / "compressor" / "models").rglob("*.py"),
             ROOT / "compressor" / "utils" / "dataset_table.py"]
    for path in files:
        data_imports = {name for name in _imported_modules(path)
                        if name == "compressor.data" or name.startswith("compressor.data.")}
        assert not data_imports, (path, data_imports)
    assert all(spec.loader in data_load.LOADERS for spec in DATASET_SPECS.values())
