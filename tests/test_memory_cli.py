"""End-to-end: --memory-efficient trains as plain, resumes, runs under DDP, and -e rebuilds it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from compressor.models import ModelDescription
from compressor.training.checkpoint import load_checkpoint
from tests.conftest import run_cli, run_torchrun

TRAIN = ("-a", "resnet20_cifar", "--dataset", "synthetic", "-b", "16", "-j", "0", "--cpu",
         "--vs", "0", "--etrs", "0.05", "--etes", "0.05", "--lr", "0.05", "--deterministic",
         "-p", "0")


def _variant(checkpoint: dict) -> str | None:
    """The memory variant a checkpoint records (read through its ModelDescription)."""
    return ModelDescription.from_checkpoint(checkpoint).recipe("memory_efficient")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain 2-epoch run, and a recompute run of 1 epoch resumed (flag-less) to 2 epochs."""
    out = tmp_path_factory.mktemp("memory_runs")
    plain = run_cli(*TRAIN, "--epochs", "2", "-o", str(out), "-n", "plain")
    assert plain.returncode == 0, plain.stderr[-3000:]
    first = run_cli(*TRAIN, "--epochs", "1", "--memory-efficient", "recompute", "-o", str(out),
                    "-n", "first")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run_cli("--resume-from", str(out / "first" / "checkpoint.pth.tar"), "--epochs", "2",
                      *TRAIN[4:], "-o", str(out), "-n", "resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return out


def test_the_variant_is_persisted_and_rebuilt_on_resume(runs: Path) -> None:
    first = load_checkpoint(runs / "first" / "checkpoint.pth.tar")
    resumed = load_checkpoint(runs / "resumed" / "checkpoint.pth.tar")
    assert _variant(first) == "recompute"
    assert _variant(resumed) == "recompute"
    assert resumed["epoch"] == 1


def test_resumed_recompute_run_ends_with_the_plain_runs_weights(runs: Path) -> None:
    plain = load_checkpoint(runs / "plain" / "checkpoint.pth.tar")["state_dict"]
    resumed = load_checkpoint(runs / "resumed" / "checkpoint.pth.tar")["state_dict"]
    assert list(plain) == list(resumed)  # the plain parameter names
    for name, tensor in plain.items():
        assert torch.allclose(tensor.double(), resumed[name].double(), rtol=0, atol=1e-6), name
    plain_results = json.loads((runs / "plain" / "results.json").read_text())
    resumed_results = json.loads((runs / "resumed" / "results.json").read_text())
    assert resumed_results["loss"] == pytest.approx(plain_results["loss"], abs=1e-6)


def test_two_process_inplace_abn_run_and_evaluation_rebuild_the_variant(tmp_path: Path) -> None:
    result = run_torchrun(2, *TRAIN, "--epochs", "1", "--memory-efficient", "inplace-abn",
                          "-o", str(tmp_path), "-n", "ddp")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "ddp"
    checkpoint = load_checkpoint(run_dir / "checkpoint.pth.tar")
    assert _variant(checkpoint) == "inplace-abn"
    assert not any(key.startswith("module.") for key in checkpoint["state_dict"])
    assert "layer1.0.bn1.running_mean" in checkpoint["state_dict"]
    trained = json.loads((run_dir / "results.json").read_text())
    # In-place ABN runs leaky ReLU: only a rebuilt variant evaluates to the same loss.
    evaluated = run_cli("--resume-from", str(run_dir / "checkpoint.pth.tar"), "-e", "-j", "0",
                        "--cpu", "--etes", "0.05", "-o", str(tmp_path), "-n", "eval")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["loss"] == pytest.approx(trained["loss"], rel=1e-5)
    plain_model = run_cli("--resume-from", str(run_dir / "checkpoint.pth.tar"), "-e", "-j", "0",
                          "--cpu", "--etes", "0.05", "--memory-efficient", "recompute",
                          "-o", str(tmp_path), "-n", "other")
    assert plain_model.returncode == 0, plain_model.stderr[-3000:]
    other = json.loads((tmp_path / "other" / "results.json").read_text())
    assert other["loss"] != pytest.approx(trained["loss"], rel=1e-5)


def test_unsupported_variant_is_one_line_and_exit_status_2(tmp_path: Path) -> None:
    result = run_cli("-a", "vgg16_cifar", *TRAIN[2:], "--epochs", "1", "--memory-efficient",
                     "inplace-abn", "-o", str(tmp_path), "-n", "bad")
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no 'inplace-abn' variant" in lines[0], result.stderr


def test_two_process_recompute_run_matches_its_single_process_evaluation(tmp_path: Path) -> None:
    result = run_torchrun(2, *TRAIN, "--epochs", "1", "--memory-efficient", "recompute",
                          "-o", str(tmp_path), "-n", "ddp")
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoint = load_checkpoint(tmp_path / "ddp" / "checkpoint.pth.tar")
    assert _variant(checkpoint) == "recompute"
    # every rank updated its batch norms once per step: no double update under DDP either
    steps = int(checkpoint["state_dict"]["bn1.num_batches_tracked"])
    assert steps == 2  # 51 samples, batch 16 per rank, 2 ranks
    trained = json.loads((tmp_path / "ddp" / "results.json").read_text())
    evaluated = run_cli("--resume-from", str(tmp_path / "ddp" / "checkpoint.pth.tar"), "-e",
                        "-j", "0", "--cpu", "--etes", "0.05", "-o", str(tmp_path), "-n", "eval")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["loss"] == pytest.approx(trained["loss"], rel=1e-5)
