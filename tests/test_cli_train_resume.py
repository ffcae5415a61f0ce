"""End-to-end: train on the embedded digits, resume exactly, evaluate from the checkpoint alone."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import yaml

from compressor.training.checkpoint import REQUIRED_KEYS, load_checkpoint, save_checkpoint
from tests.conftest import run_cli

TRAIN = ("-a", "simplenet_digits", "-b", "64", "-j", "0", "--lr", "0.05", "--deterministic",
         "--etrs", "0.5", "-p", "0")
METRIC_COLUMNS = ("epoch", "lr", "train_loss", "train_top1", "train_top5", "val_loss", "val_top1",
                  "val_top5")


def _metrics(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv") as handle:
        return [{key: row[key] for key in METRIC_COLUMNS} for row in csv.DictReader(handle)]


def _assert_tensors_equal(a: object, b: object, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            _assert_tensors_equal(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_tensors_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One 2-epoch run, and a 1-epoch run resumed to 2 epochs."""
    out = tmp_path_factory.mktemp("runs")
    # forked from the tests' zygote (test_cli_zygote checks a run there equals a new
    # interpreter's, the bare entry script end to end)
    full = run_cli(*TRAIN, "--epochs", "2", "-o", str(out), "-n", "full")
    assert full.returncode == 0, full.stderr
    first = run_cli(*TRAIN, "--epochs", "1", "-o", str(out), "-n", "first")
    assert first.returncode == 0, first.stderr
    resumed = run_cli("--resume-from", str(out / "first" / "checkpoint.pth.tar"), "--epochs", "2",
                      "-b", "64", "-j", "0", "--lr", "0.05", "--deterministic", "--etrs", "0.5",
                      "-p", "0", "-o", str(out), "-n", "resumed")
    assert resumed.returncode == 0, resumed.stderr
    return {"full": out / "full", "first": out / "first", "resumed": out / "resumed", "out": out}


@pytest.mark.slow
def test_run_directory_holds_every_file(runs: dict[str, Path]) -> None:
    run_dir = runs["full"]
    for name in ("checkpoint.pth.tar", "best.pth.tar", "log.txt", "args.yaml", "metrics.csv",
                 "results.json"):
        assert (run_dir / name).is_file(), name
    results = json.loads((run_dir / "results.json").read_text())
    for key in ("arch", "dataset", "epoch", "top1", "top5", "loss", "best_top1", "best_epoch",
                "params"):
        assert key in results
    assert results["arch"] == "simplenet_digits" and results["dataset"] == "digits"
    assert results["epoch"] == 1
    assert len(_metrics(run_dir)) == 2
    args = yaml.safe_load((run_dir / "args.yaml").read_text())
    assert args["seed"] == 0 and args["arch"] == "simplenet_digits"
    assert "epoch 1" in (run_dir / "log.txt").read_text()


def test_checkpoint_is_plain_and_complete(runs: dict[str, Path]) -> None:
    checkpoint = torch.load(runs["full"] / "checkpoint.pth.tar", weights_only=True)
    for key in (*REQUIRED_KEYS, "optimizer", "lr_scheduler", "compression", "epoch",
                "best_top1", "best_epoch", "rng", "args"):
        assert key in checkpoint, key
    assert checkpoint["input_spec"]["input_size"] == [1, 8, 8]
    assert not any(name.startswith("module.") for name in checkpoint["state_dict"])


def test_resume_is_bitwise_identical(runs: dict[str, Path]) -> None:
    full = load_checkpoint(runs["full"] / "checkpoint.pth.tar")
    resumed = load_checkpoint(runs["resumed"] / "checkpoint.pth.tar")
    assert full["epoch"] == resumed["epoch"] == 1
    _assert_tensors_equal(full["state_dict"], resumed["state_dict"], "state_dict")
    _assert_tensors_equal(full["optimizer"], resumed["optimizer"], "optimizer")
    assert _metrics(runs["full"]) == _metrics(runs["resumed"])
    first = _metrics(runs["first"])
    assert first == _metrics(runs["full"])[:1]


def test_evaluate_from_checkpoint_alone(runs: dict[str, Path]) -> None:
    result = run_cli("--resume-from", str(runs["full"] / "checkpoint.pth.tar"), "-e", "-j", "0",
                     "-o", str(runs["out"]), "-n", "eval")
    assert result.returncode == 0, result.stderr
    evaluated = json.loads((runs["out"] / "eval" / "results.json").read_text())
    trained = json.loads((runs["full"] / "results.json").read_text())
    assert evaluated["arch"] == "simplenet_digits" and evaluated["dataset"] == "digits"
    assert evaluated["top1"] == pytest.approx(trained["top1"])
    assert evaluated["loss"] == pytest.approx(trained["loss"], rel=1e-6)


def test_resume_uses_the_checkpoint_input_spec(runs: dict[str, Path], tmp_path: Path) -> None:
    """A checkpoint whose preprocessing differs from today's registry is evaluated with its own."""
    checkpoint = load_checkpoint(runs["full"] / "checkpoint.pth.tar")
    shifted = dict(checkpoint, input_spec={**checkpoint["input_spec"], "mean": [0.9]})
    save_checkpoint(tmp_path / "shifted.pth.tar", shifted)
    losses = {}
    for name, path in (("own", runs["full"] / "checkpoint.pth.tar"),
                       ("shifted", tmp_path / "shifted.pth.tar")):
        result = run_cli("--resume-from", str(path), "-e", "-j", "0", "-o", str(tmp_path),
                         "-n", name)
        assert result.returncode == 0, result.stderr
        losses[name] = json.loads((tmp_path / name / "results.json").read_text())["loss"]
        args = yaml.safe_load((tmp_path / name / "args.yaml").read_text())
        assert args["input_spec"]["mean"] == ([0.9] if name == "shifted" else [0.3054])
    assert losses["own"] != pytest.approx(losses["shifted"])


def test_load_weights_only_and_reset_optimizer(runs: dict[str, Path], tmp_path: Path) -> None:
    checkpoint = runs["full"] / "checkpoint.pth.tar"
    weights_only = run_cli("-a", "simplenet_digits", "--exp-load-weights-from", str(checkpoint),
                           "-e", "-j", "0", "-o", str(tmp_path), "-n", "weights")
    assert weights_only.returncode == 0, weights_only.stderr
    results = json.loads((tmp_path / "weights" / "results.json").read_text())
    trained = json.loads((runs["full"] / "results.json").read_text())
    assert results["top1"] == pytest.approx(trained["top1"])
    reset = run_cli("--resume-from", str(checkpoint), "--reset-optimizer", "--epochs", "1",
                    "-b", "64", "-j", "0", "--etrs", "0.2", "-o", str(tmp_path), "-n", "reset")
    assert reset.returncode == 0, reset.stderr
    assert load_checkpoint(tmp_path / "reset" / "checkpoint.pth.tar")["epoch"] == 0
