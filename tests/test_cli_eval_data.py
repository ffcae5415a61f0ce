"""-e reads the test split only: an ImageFolder with val/ alone, or a tiny train/, evaluates."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from tests.conftest import assert_user_error, run_cli


def _images(folder: Path, count: int) -> None:
    folder.mkdir(parents=True)
    for i in range(count):
        Image.new("RGB", (40, 30), (30 * i, 90, 200)).save(folder / f"{i}.JPEG")


def test_evaluate_needs_no_training_set(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for wnid in ("n01443537", "n15075141"):  # goldfish (1), toilet tissue (999)
        _images(data / "val" / wnid, 2)
    result = run_cli(str(data), "-a", "squeezenet1_1", "-e", "-b", "4", "-j", "0",
                     "-o", str(tmp_path / "out"), "-n", "eval")
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "out" / "eval" / "results.json").read_text())["top1"] >= 0
    _images(data / "train" / "n01443537", 1)  # far too small for the default --vs 0.1
    result = run_cli(str(data), "-a", "squeezenet1_1", "-e", "-b", "4", "-j", "0",
                     "-o", str(tmp_path / "out"), "-n", "eval2")
    assert result.returncode == 0, result.stderr


def test_val_only_folders_without_wnids_are_refused(tmp_path: Path) -> None:
    # A 1000-class model and 2 folders: which 2 of its 1000 outputs they are is unknown.
    # (Without --dataset imagenet, such folders are a dataset of their own: test_cli_folder.)
    data = tmp_path / "data"
    for name in ("cat", "dog"):
        _images(data / "val" / name, 1)
    result = run_cli(str(data), "-a", "squeezenet1_1", "--dataset", "imagenet", "-e", "-j", "0",
                     "-o", str(tmp_path / "out"))
    assert_user_error(result, "2 class folders", "not ImageNet WordNet ids", "wnid")
