"""torchrun with 2 CPU processes: DDP training, all-reduced metrics, rank 0 alone writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compressor.training.checkpoint import load_checkpoint
from tests.conftest import run_cli, run_torchrun


@pytest.mark.slow
def test_two_process_training_matches_single_process_evaluation(tmp_path: Path) -> None:
    result = run_torchrun(2, "-a", "simplenet_digits", "--epochs", "2", "-b", "32", "-j", "0",
                          "--cpu", "--deterministic", "-p", "0", "--etrs", "0.5",
                          "-o", str(tmp_path), "-n", "ddp", launcher="torchrun")
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddp"]  # rank 1 wrote nothing
    run_dir = tmp_path / "ddp"
    results = json.loads((run_dir / "results.json").read_text())
    assert results["samples"] == 360  # the whole test set, each sample counted once
    assert results["top1"] > 50
    assert result.stdout.count("top-1 (%)") == 1  # one results table, from rank 0
    checkpoint = load_checkpoint(run_dir / "checkpoint.pth.tar")
    assert checkpoint["epoch"] == 1
    assert not any(key.startswith("module.") for key in checkpoint["state_dict"])
    single = run_cli("--resume-from", str(run_dir / "checkpoint.pth.tar"), "-e", "-j", "0",
                     "-o", str(tmp_path), "-n", "single")
    assert single.returncode == 0, single.stderr
    evaluated = json.loads((tmp_path / "single" / "results.json").read_text())
    assert evaluated["top1"] == pytest.approx(results["top1"])
    assert evaluated["loss"] == pytest.approx(results["loss"], rel=1e-5)


@pytest.mark.slow
def test_inception_v3_with_aux_outputs_trains_under_ddp(tmp_path: Path) -> None:
    result = run_torchrun(2, "-a", "inception_v3", "--dataset", "synthetic", "--epochs", "1",
                          "-b", "4", "-j", "0", "--cpu", "--vs", "0", "--etrs", "0.008",
                          "--etes", "0.008", "--lr", "0.01", "-p", "0", "-o", str(tmp_path),
                          "-n", "inception", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "inception" / "results.json").read_text())
    assert results["arch"] == "inception_v3" and results["samples"] == 2
    checkpoint = load_checkpoint(tmp_path / "inception" / "checkpoint.pth.tar")
    assert checkpoint["input_spec"]["input_size"] == [3, 299, 299]
    assert checkpoint["model_attrs"] == {"transform_input": False, "aux_logits": True}
    assert any(key.startswith("AuxLogits.") for key in checkpoint["state_dict"])
