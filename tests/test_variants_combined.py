"""An in-place-ABN model filter-pruned by a schedule, thinned, and rebuilt from its checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compressor.models import ModelDescription
from compressor.training.checkpoint import load_checkpoint
from tests.conftest import run_cli

COMMON = ("--dataset", "synthetic", "-b", "32", "-j", "0", "--deterministic", "-p", "0",
          "--vs", "0", "--etrs", "0.06", "--etes", "0.25")
SCHEDULE = """
version: 1
pruners:
  filter_pruner:
    class: L1RankedStructureParameterPruner
    group_type: Filters
    desired_sparsity: 0.5
    weights: [layer1.0.conv1.weight, layer2.1.conv1.weight, layer3.2.conv1.weight]
policies:
  - pruner:
      instance_name: filter_pruner
    epochs: [0]
"""


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def test_inplace_abn_prunes_thins_and_rebuilds(tmp_path: Path) -> None:
    (tmp_path / "filters.yaml").write_text(SCHEDULE)
    result = run_cli("-a", "resnet20_cifar", "--memory-efficient", "inplace-abn", *COMMON,
                     "--epochs", "1", "--lr", "0.05", "--compress", str(tmp_path / "filters.yaml"),
                     "-o", str(tmp_path), "-n", "pruned")
    assert result.returncode == 0, result.stderr[-3000:]
    pruned = _results(tmp_path / "pruned")
    result = run_cli("--resume-from", str(tmp_path / "pruned" / "checkpoint.pth.tar"),
                     "--thinnify", *COMMON, "-o", str(tmp_path), "-n", "thin")
    assert result.returncode == 0, result.stderr[-3000:]
    thin = _results(tmp_path / "thin")
    assert thin["thinned_filters"] == 8 + 16 + 32
    assert thin["loss"] == pytest.approx(pruned["loss"], rel=1e-4)  # thinning is exact
    checkpoint = load_checkpoint(tmp_path / "thin" / "checkpoint.pth.tar")
    description = ModelDescription.from_checkpoint(checkpoint)
    assert [step.name for step in description.transforms] == ["memory_efficient", "thinning"]
    assert description.recipe("memory_efficient") == "inplace-abn"
    result = run_cli("--resume-from", str(tmp_path / "thin" / "checkpoint.pth.tar"), "-e",
                     *COMMON, "-o", str(tmp_path), "-n", "eval")
    assert result.returncode == 0, result.stderr[-3000:]
    evaluated = _results(tmp_path / "eval")
    assert evaluated["params"] == thin["params"] < pruned["params"]
    assert evaluated["loss"] == pytest.approx(thin["loss"], rel=1e-6)
    assert evaluated["top1"] == pytest.approx(thin["top1"])
