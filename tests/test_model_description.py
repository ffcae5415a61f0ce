"""ModelDescription, the transforms table and the one checkpoint module: rebuild from records."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from compressor.assembly.builder import build_model
from compressor.assembly.recipes import TRANSFORMS, apply_transform
from compressor.assembly.setup import load_model
from compressor.assembly.state import assemble_checkpoint
from compressor.models import create_model
from compressor.models.description import ModelDescription, TransformStep, description_of
from compressor.thinning.transform import thin
from compressor.training.checkpoint import (
    FORMAT_VERSION,
    load_checkpoint,
    read_description,
    save_checkpoint,
    save_run_checkpoint,
)
from compressor.utils.errors import CheckpointError


def _prune_filters(model: torch.nn.Module, layer: str, filters: list[int]) -> None:
    """Zero filters of a conv and its batch norm, as a filter pruner leaves them."""
    conv = model.get_submodule(f"{layer}.conv1")
    bn = model.get_submodule(f"{layer}.bn1")
    with torch.no_grad():
        conv.weight[filters] = 0.0
        bn.weight[filters] = 0.0
        bn.bias[filters] = 0.0


def test_description_is_set_once_and_holds_no_module_attributes() -> None:
    model = create_model("resnet20_cifar", "cifar10")
    description = description_of(model)
    assert (description.arch, description.dataset, description.num_classes) == (
        "resnet20_cifar", "cifar10", 10)
    for name in ("arch", "dataset", "input_spec", "model_attrs", "num_classes"):
        assert name not in vars(model), name
    assert description.model_attrs() == {}  # no transforms: the key is left out


def test_transforms_are_recorded_in_order_and_replayed(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = apply_transform(create_model("resnet20_cifar", "cifar10"), "memory_efficient",
                            "recompute")
    _prune_filters(model, "layer1.0", [1, 3, 5])
    recipe = thin(model)
    description = description_of(model)
    assert [step.name for step in description.transforms] == ["memory_efficient", "thinning"]
    assert description.recipe("thinning") == recipe
    attrs = description.model_attrs()
    assert attrs["transforms"][0] == {"name": "memory_efficient", "recipe": "recompute"}
    path = tmp_path / "thin.pth.tar"
    save_checkpoint(path, assemble_checkpoint(model, args={"seed": 0}, epoch=0))
    rebuilt = load_model(path)
    assert description_of(rebuilt) == description
    x = torch.randn(2, 3, 32, 32)
    model.eval()
    rebuilt.eval()
    assert torch.equal(model(x), rebuilt(x))
    assert rebuilt.layer1[0].conv1.out_channels == 13


def test_thinning_twice_composes_into_one_recipe() -> None:
    torch.manual_seed(0)
    model = create_model("resnet20_cifar", "cifar10")
    _prune_filters(model, "layer1.0", [2])
    thin(model)
    _prune_filters(model, "layer1.0", [0])  # index 0 of the thinned layer
    composed = thin(model)
    assert [step.name for step in description_of(model).transforms] == ["thinning"]
    assert composed["modules"]["layer1.0.conv1"]["out"] == [0, 2]
    fresh = build_model(description_of(model))
    assert fresh.layer1[0].conv1.out_channels == 14


def test_format_version_1_checkpoints_still_load(tmp_path: Path) -> None:
    model = create_model("resnet20_cifar", "cifar10")
    state = assemble_checkpoint(model, args={}, epoch=0)
    state.update(format_version=1, model_attrs={"memory_efficient": "inplace-abn",
                                                "thinning": None})
    path = tmp_path / "v1.pth.tar"
    save_checkpoint(path, state)
    description = read_description(load_checkpoint(path), path)
    assert description.transforms == (TransformStep("memory_efficient", "inplace-abn"),)
    assert description.builder_attrs == {}
    assert FORMAT_VERSION == 2


def test_unknown_or_malformed_transforms_are_one_line_errors(tmp_path: Path) -> None:
    model = create_model("simplenet_digits", "digits")
    for attrs, fragment in (({"transforms": [{"name": "warp", "recipe": 1}]}, "unknown model "
                             "transform 'warp'"),
                            ({"transforms": "thin"}, "not a list")):
        state = assemble_checkpoint(model, args={}, epoch=0)
        state["model_attrs"] = attrs
        path = tmp_path / "bad.pth.tar"
        save_checkpoint(path, state)
        with pytest.raises(CheckpointError, match=fragment):
            load_model(path)
    assert set(TRANSFORMS) == {"memory_efficient", "thinning", "quantization"}


@pytest.mark.parametrize("seed", range(12))
def test_random_bytes_as_a_checkpoint_are_a_checkpoint_error(tmp_path: Path, seed: int) -> None:
    # seed 2 made the weights-only unpickler raise IndexError, which escaped as a traceback
    path = tmp_path / "random.pth.tar"
    path.write_bytes(random.Random(seed).randbytes(2000))
    with pytest.raises(CheckpointError, match=str(path)):
        load_checkpoint(path)


def test_best_is_a_link_that_keeps_its_epoch_when_the_checkpoint_moves_on(tmp_path: Path) -> None:
    model = create_model("simplenet_digits", "digits")
    best, last = tmp_path / "best.pth.tar", tmp_path / "checkpoint.pth.tar"
    save_run_checkpoint(tmp_path, assemble_checkpoint(model, args={}, epoch=3), is_best=True)
    assert best.samefile(last)  # one copy on disk
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pth.tar", "checkpoint.pth.tar"]
    save_run_checkpoint(tmp_path, assemble_checkpoint(model, args={}, epoch=4), is_best=False)
    assert not best.samefile(last)
    assert load_checkpoint(best)["epoch"] == 3 and load_checkpoint(last)["epoch"] == 4
    save_run_checkpoint(tmp_path, assemble_checkpoint(model, args={}, epoch=5), is_best=True)
    assert load_checkpoint(best)["epoch"] == 5 and best.samefile(last)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pth.tar", "checkpoint.pth.tar"]


def test_best_is_a_copy_where_the_file_system_has_no_links(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", refuse)
    model = create_model("simplenet_digits", "digits")
    save_run_checkpoint(tmp_path, assemble_checkpoint(model, args={}, epoch=3), is_best=True)
    best, last = tmp_path / "best.pth.tar", tmp_path / "checkpoint.pth.tar"
    assert not best.samefile(last) and best.read_bytes() == last.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pth.tar", "checkpoint.pth.tar"]


def test_description_round_trips_through_plain_values() -> None:
    model = create_model("inception_v3", "imagenet", num_classes=10)
    description = description_of(model)
    again = ModelDescription.from_model_attrs(
        description.arch, description.dataset, description.num_classes,
        description.input_spec, description.model_attrs())
    assert again == description
    assert again.to_dict()["model_attrs"] == {"transform_input": False, "aux_logits": True}


def test_densenet_efficient_builder_attribute_becomes_the_recompute_variant() -> None:
    spec = create_model("densenet_bc_100_cifar", "cifar10")
    description = ModelDescription.from_model_attrs(
        "densenet_bc_100_cifar", "cifar10", 10, description_of(spec).input_spec,
        {"small_inputs": True, "efficient": True, "drop_rate": 0.0})
    assert "efficient" not in description.builder_attrs
    assert description.transforms == (TransformStep("memory_efficient", "recompute"),)
