"""Pruning under torchrun (2 CPU processes): random pruners and APoZ apply the same masks on
every rank (the scheduler checks it each epoch), so the DDP run's final test metrics equal a
single-process evaluation of its checkpoint."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from compressor.training.checkpoint import load_checkpoint
from tests.conftest import CORPUS, requires_corpus, run_cli, run_torchrun

# Tiny synthetic runs: 72 training samples (36 per rank), 16 test samples; with -b 4 a rank has
# 9 minibatches per epoch, so mini_batch_pruning_frequency 16 recomputes masks mid-epoch 1.
TINY = ("--dataset", "synthetic", "--etrs", "0.07", "--etes", "0.0625", "--vs", "0", "-j", "0",
        "--cpu", "-p", "0", "--deterministic", "--lr", "0.01")


def _train_ddp_then_evaluate_alone(tmp_path: Path, arch: str, schedule: Path, epochs: int,
                                   batch_size: int) -> tuple[str, Path]:
    """Train under torchrun, check the per-epoch mask agreement and the metrics; returns the
    DDP run's output and directory."""
    result = run_torchrun(2, "-a", arch, "--compress", str(schedule), "--epochs", str(epochs),
                          "-b", str(batch_size), *TINY, "-o", str(tmp_path), "-n", "ddp")
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    for epoch in range(epochs):
        assert output.count(f"masks identical on 2 ranks at epoch {epoch} ") == 1, output[-3000:]
    run_dir = tmp_path / "ddp"
    trained = json.loads((run_dir / "results.json").read_text())
    single = run_cli("--resume-from", str(run_dir / "checkpoint.pth.tar"), "-e", "-j", "0",
                     "--cpu", "--etes", "0.0625", "-o", str(tmp_path), "-n", "single")
    assert single.returncode == 0, single.stderr[-3000:]
    evaluated = json.loads((tmp_path / "single" / "results.json").read_text())
    assert evaluated["samples"] == trained["samples"] == 16
    assert evaluated["top1"] == pytest.approx(trained["top1"])
    assert evaluated["loss"] == pytest.approx(trained["loss"], rel=1e-5)
    return output, run_dir


def _starting_at_epoch_1(tmp_path: Path, schedule: str) -> Path:
    """The corpus schedule with its policies moved to start at epoch 1 (a 2-epoch run)."""
    doc = yaml.safe_load((CORPUS / schedule).read_text())
    for policy in doc["policies"]:
        policy["starting_epoch"] = 1
    path = tmp_path / Path(schedule).name
    path.write_text(yaml.safe_dump(doc))
    return path


@requires_corpus
@pytest.mark.parametrize("schedule, arch, batch_size, shifted", [
    # DropFilter (BernoulliFilterPruner_AGP, forward-only masks), moved from epoch 15 to 1.
    ("drop_filter/plain20_cifar_dropfilter_training.yaml", "plain20_cifar", 16, True),
    # RandomLevelStructureParameterPruner from epoch 0, masks recomputed every 16 minibatches.
    ("drop_filter/resnet20_cifar_randomlevel_training.yaml", "resnet20_cifar", 4, False),
], ids=["dropfilter", "randomlevel"])
def test_random_pruners_apply_the_same_masks_on_every_rank(tmp_path: Path, schedule: str,
                                                           arch: str, batch_size: int,
                                                           shifted: bool) -> None:
    path = _starting_at_epoch_1(tmp_path, schedule) if shifted else CORPUS / schedule
    epochs = 2
    output, _ = _train_ddp_then_evaluate_alone(tmp_path, arch, path, epochs, batch_size)
    last = f"masks identical on 2 ranks at epoch {epochs - 1} (checksum "
    assert output.split(last, 1)[1].split(")", 1)[0] != "0"  # the pruning epoch had masks


def test_apoz_ranks_filters_on_statistics_of_all_ranks(tmp_path: Path) -> None:
    schedule = tmp_path / "apoz.yaml"
    weights = ["module.layer1.0.conv1.weight", "module.layer2.0.conv1.weight",
               "module.layer3.0.conv1.weight"]
    schedule.write_text(yaml.safe_dump({
        "version": 1,
        "pruners": {"apoz": {"class": "ActivationAPoZRankedFilterPruner_AGP",
                             "initial_sparsity": 0.2, "final_sparsity": 0.5,
                             "group_type": "Filters", "weights": weights}},
        "policies": [{"pruner": {"instance_name": "apoz"}, "starting_epoch": 0,
                      "ending_epoch": 3, "frequency": 1}]}))
    _, run_dir = _train_ddp_then_evaluate_alone(tmp_path, "resnet20_cifar", schedule, 3, 8)
    checkpoint = load_checkpoint(run_dir / "checkpoint.pth.tar")
    counts = checkpoint["compression"]["pruners"]["apoz"]["counts"]
    # The last epoch's counts, summed over both ranks before the checkpoint: 36 images per
    # rank, 32x32 positions per channel in layer1.
    assert float(counts["layer1.0.conv1.weight"]) == 2 * 36 * 32 * 32
    state = checkpoint["state_dict"]["layer2.0.conv1.weight"]
    pruned = state.flatten(1).abs().amax(dim=1).eq(0)
    assert int(pruned.sum()) == math.floor(0.5 * 32)
