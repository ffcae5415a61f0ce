"""End-to-end: prune filters with a schedule, --thinnify, then evaluate/fine-tune the thin model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from compressor.models import ModelDescription
from compressor.training.checkpoint import load_checkpoint
from tests.conftest import assert_user_error, run_cli

COMMON = ("-b", "64", "-j", "0", "--deterministic", "-p", "0")
SCHEDULE = """
version: 1
pruners:
  filter_pruner:
    class: L1RankedStructureParameterPruner
    group_type: Filters
    desired_sparsity: 0.5
    weights: [module.conv2.weight, conv3.weight]
policies:
  - pruner:
      instance_name: filter_pruner
    epochs: [0]
"""


@pytest.fixture(scope="module")
def pruned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simplenet_digits run whose conv2/conv3 have half their filters zeroed."""
    root = tmp_path_factory.mktemp("thin")
    (root / "filters.yaml").write_text(SCHEDULE)
    result = run_cli("-a", "simplenet_digits", *COMMON, "--epochs", "1", "--lr", "0.05",
                     "--etrs", "0.5",
                     "--compress", str(root / "filters.yaml"), "-o", str(root), "-n", "pruned")
    assert result.returncode == 0, result.stderr[-3000:]
    return root


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def test_thinnify_then_evaluate_from_checkpoint_alone(pruned: Path):
    dense = _results(pruned / "pruned")
    assert dense["sparsity"] > 0.4
    result = run_cli("--resume-from", str(pruned / "pruned" / "checkpoint.pth.tar"),
                     "--thinnify", *COMMON, "-o", str(pruned), "-n", "thin")
    assert result.returncode == 0, result.stderr[-3000:]
    thin = _results(pruned / "thin")
    assert thin["params"] < 0.6 * dense["params"] and thin["macs"] < dense["macs"]
    assert thin["thinned_filters"] > 0 and thin["sparsity"] < dense["sparsity"]
    assert thin["top1"] == pytest.approx(dense["top1"], abs=1e-6)  # thinning is exact
    assert thin["loss"] == pytest.approx(dense["loss"], abs=1e-4)
    checkpoint = load_checkpoint(pruned / "thin" / "checkpoint.pth.tar")
    recipe = ModelDescription.from_checkpoint(checkpoint).recipe("thinning")
    assert recipe["modules"]["conv3"]["out"]
    assert checkpoint["state_dict"]["conv3.weight"].shape[0] < 128

    result = run_cli("--resume-from", str(pruned / "thin" / "checkpoint.pth.tar"), "-e",
                     "-j", "0", "-o", str(pruned), "-n", "eval")
    assert result.returncode == 0, result.stderr[-3000:]
    evaluated = _results(pruned / "eval")
    assert evaluated["params"] == thin["params"]
    # args.yaml holds the arguments: the recipe (every removed index) stays in the checkpoint
    args_yaml = (pruned / "eval" / "args.yaml").read_text()
    assert len(args_yaml) < 4096 and "add_bias" not in args_yaml
    steps = yaml.safe_load(args_yaml)["model_attrs"]["transforms"]
    assert steps == [{"name": "thinning", "recipe": steps[0]["recipe"]}]
    assert "in the checkpoint" in steps[0]["recipe"]
    assert evaluated["top1"] == pytest.approx(thin["top1"], abs=1e-6)

    # fine-tuning the thin model continues from the thinned checkpoint's epoch
    result = run_cli("--resume-from", str(pruned / "thin" / "checkpoint.pth.tar"), *COMMON,
                     "--epochs", "2", "--lr", "0.01", "-o", str(pruned), "-n", "tune")
    assert result.returncode == 0, result.stderr[-3000:]
    tuned = load_checkpoint(pruned / "tune" / "checkpoint.pth.tar")
    assert tuned["epoch"] == 1 and _results(pruned / "tune")["params"] == thin["params"]
    assert ModelDescription.from_checkpoint(tuned).recipe("thinning") == recipe



def test_thinnify_refuses_a_layer_pruned_to_nothing_in_one_line(pruned: Path, tmp_path: Path):
    """Every conv2 filter (and its batch norm) zeroed: thinning would leave conv2 empty."""
    checkpoint = load_checkpoint(pruned / "pruned" / "checkpoint.pth.tar")
    state = checkpoint["state_dict"]
    for name in ("conv2.weight", "bn2.weight", "bn2.bias"):
        state[name] = torch.zeros_like(state[name])
    torch.save(checkpoint, tmp_path / "emptied.pth.tar")
    result = run_cli("--resume-from", str(tmp_path / "emptied.pth.tar"), "--thinnify",
                     *COMMON, "-o", str(tmp_path), "-n", "thin")
    assert_user_error(result, "thinning would remove all 64 filters of 'conv2'",
                      "keep at least one")
    assert not (tmp_path / "thin" / "checkpoint.pth.tar").exists()
