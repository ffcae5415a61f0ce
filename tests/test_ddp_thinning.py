"""Thinning inside a torchrun (DDP) run: the wrapper is rebuilt around the thinned parameters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from compressor.training.checkpoint import load_checkpoint
from tests.conftest import CORPUS, requires_corpus, run_cli, run_torchrun

SCHEDULE = "agp-pruning/resnet20_filters.schedule_agp.yaml"


def _two_epoch_schedule(tmp_path: Path) -> Path:
    """Distiller's schedule squeezed into 2 epochs: prune at 0, thin (and prune more) at 1."""
    doc = yaml.safe_load((CORPUS / SCHEDULE).read_text())
    epochs = {"low_pruner": [0], "net_thinner": [1], "fine_pruner": [1], "fc_pruner": [1],
              "pruning_lr": [0, 1]}
    for policy in doc["policies"]:
        (kind,) = [key for key in policy if key in ("pruner", "extension", "lr_scheduler")]
        for key in ("starting_epoch", "ending_epoch", "frequency"):
            policy.pop(key, None)
        policy["epochs"] = epochs[policy[kind]["instance_name"]]
    path = tmp_path / "resnet20_filters_2epochs.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@requires_corpus
def test_filter_remover_under_torchrun_matches_single_process_evaluation(tmp_path: Path) -> None:
    schedule = _two_epoch_schedule(tmp_path)
    result = run_torchrun(2, "-a", "resnet20_cifar", "--dataset", "synthetic", "--epochs", "2",
                          "-b", "16", "--vs", "0", "--etrs", "0.03", "--etes", "0.1", "-j", "0",
                          "--cpu", "--deterministic", "-p", "0", "--lr", "0.05",
                          "--compress", str(schedule), "-o", str(tmp_path), "-n", "ddp")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "DDP wrapper rebuilt" in result.stdout
    run_dir = tmp_path / "ddp"
    checkpoint = load_checkpoint(run_dir / "checkpoint.pth.tar")
    (step,) = checkpoint["model_attrs"]["transforms"]
    assert step["name"] == "thinning"
    removed = step["recipe"]["modules"]["layer2.0.conv1"]["out"]
    assert len(removed) == 16  # low_pruner's 50% of 32 filters, gone from the model
    assert checkpoint["state_dict"]["layer2.0.conv1.weight"].shape[0] == 16
    ddp = json.loads((run_dir / "results.json").read_text())
    single = run_cli("--resume-from", str(run_dir / "checkpoint.pth.tar"), "-e", "-j", "0",
                     "--cpu", "-b", "16", "--etes", "0.1", "-o", str(tmp_path), "-n", "single")
    assert single.returncode == 0, single.stderr[-3000:]
    evaluated = json.loads((tmp_path / "single" / "results.json").read_text())
    assert evaluated["samples"] == ddp["samples"] == 25
    assert evaluated["top1"] == pytest.approx(ddp["top1"])
    assert evaluated["loss"] == pytest.approx(ddp["loss"], rel=1e-5)
