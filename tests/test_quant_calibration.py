"""Post-training calibration reads a seeded fraction of the training split by default (with
evaluation transforms), so the test split it is evaluated on stays unseen; Distiller's
test-set calibration stays behind --qe-calibration-split test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from compressor.data import load_calibration_dataset, load_datasets
from compressor.models import create_model
from compressor.models.description import description_of
from tests.conftest import assert_user_error, run_cli, run_main
from tests.test_cli_eval_data import _images

QUANTIZE = ("-a", "simplenet_digits", "-e", "--qe", "-b", "64", "-j", "0")


def _results(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


def test_the_calibration_split_is_the_training_split_seen_as_evaluation_sees_it() -> None:
    spec = description_of(create_model("simplenet_digits", "digits")).input_spec
    calibration = load_calibration_dataset("digits", None, spec, seed=0)
    splits = load_datasets("digits", None, spec, seed=0)
    assert len(calibration) == len(splits.train)  # --vs 0: all of train
    assert len(calibration) != len(splits.test)
    torch.manual_seed(0)  # augmentation would draw from it: evaluation transforms do not
    first = calibration[3][0]
    torch.manual_seed(1)
    assert torch.equal(first, calibration[3][0])


def test_results_say_which_split_calibrated(tmp_path: Path) -> None:
    for split in ("train", "test"):
        extra = () if split == "train" else ("--qe-calibration-split", "test")
        result = run_cli(*QUANTIZE, *extra, "-o", str(tmp_path), "-n", split)
        assert result.returncode == 0, result.stderr[-2000:]
        results = _results(tmp_path / split)
        assert results["calibration_split"] == split
        assert results["stats_source"] == f"calibration on 5.00% of the {split} split"
    # the statistics differ: they were taken on other images
    checkpoints = [torch.load(tmp_path / s / "quantized_checkpoint.pth.tar", weights_only=True)
                   for s in ("train", "test")]
    stats = [c["model_attrs"]["transforms"][-1]["recipe"]["stats"] for c in checkpoints]
    assert stats[0]["conv1"]["output"]["max"] != stats[1]["conv1"]["output"]["max"]


def test_a_missing_training_split_is_one_line_naming_the_flag(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for wnid in ("n01443537", "n15075141"):
        _images(data / "val" / wnid, 2)
    result = run_cli(str(data), "-a", "squeezenet1_1", "-e", "--qe", "-b", "4", "-j", "0",
                     "-o", str(tmp_path / "out"), "-n", "q")
    assert_user_error(result, "--qe-calibration-split test")
    assert not (tmp_path / "out").exists()  # refused before any file was written


@pytest.mark.parametrize(("extra", "words"), [
    (("--qe-calibration-split", "test"), "add -e --qe"),
    (("-e", "--qe", "--qe-dynamic", "--qe-calibration-split", "test"), "drop it"),
])
def test_the_flag_is_refused_where_nothing_calibrates(tmp_path: Path, extra: tuple[str, ...],
                                                      words: str) -> None:
    result = run_main("-a", "simplenet_digits", *extra, "-o", str(tmp_path))
    assert_user_error(result, "--qe-calibration-split", words)
