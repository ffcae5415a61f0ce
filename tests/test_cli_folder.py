"""End-to-end: a DATASET_DIR of one's own class folders trains, evaluates from its checkpoint
alone and reports its classes (no top-5 for 5 classes or fewer); bad folders are one line."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch

from compressor.reports.sensitivity import write_sensitivity_csv
from compressor.training.loop import MetricSums, reports_top5
from tests.conftest import assert_user_error, run_cli
from tests.test_data_folder import CLASSES, WNIDS, write_images, write_tree

TINY = ("--epochs", "1", "-b", "8", "-j", "0", "-p", "0")


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def _csv_header(path: Path) -> list[str]:
    with open(path, newline="") as handle:
        return next(csv.reader(handle))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """simplenet_mnist (1 channel, 28 px) trained one epoch on 3 classes of RGB/L/RGBA files."""
    root = tmp_path_factory.mktemp("folder")
    write_tree(root / "data", {"train": 6, "val": 2})
    result = run_cli(str(root / "data"), "-a", "simplenet_mnist", *TINY, "--confusion",
                     "-o", str(root / "out"), "-n", "train")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "top-5" not in result.stdout and "top-1" in result.stdout
    return root


def test_the_folder_is_a_dataset_of_its_own(trained: Path) -> None:
    run_dir = trained / "out" / "train"
    results = _results(run_dir)
    assert (results["dataset"], results["num_classes"]) == ("folder", 3)
    assert results["class_names"] == list(CLASSES) and results["samples"] == 6
    assert "top5" not in results and 0.0 <= results["top1"] <= 100.0
    assert list(results["per_class_top1"]) == list(CLASSES)
    header = _csv_header(run_dir / "metrics.csv")
    assert "val_top1" in header and not [name for name in header if "top5" in name]
    assert _csv_header(run_dir / "confusion.csv")[1:4] == list(CLASSES)
    checkpoint = torch.load(run_dir / "checkpoint.pth.tar", weights_only=True)
    assert (checkpoint["dataset"], checkpoint["num_classes"]) == ("folder", 3)
    assert checkpoint["args"]["class_names"] == list(CLASSES)
    assert checkpoint["input_spec"]["input_size"] in ([1, 28, 28], (1, 28, 28))


def test_evaluate_from_the_checkpoint_alone_reads_val_in_the_recorded_order(
        trained: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    for name in CLASSES[1:]:  # no 'ant' in val/: sorted val/ alone would make bee label 0
        shutil.copytree(trained / "data" / "val" / name, data / "val" / name)
    write_images(data / "train" / "ant", 1)
    (data / "train" / "ant" / "0.jpg").write_bytes(b"train/ is not read by -e")
    result = run_cli(str(data), "--resume-from",
                     str(trained / "out" / "train" / "checkpoint.pth.tar"), "-e", "-j", "0",
                     "--confusion", "-o", str(tmp_path / "out"), "-n", "eval")
    assert result.returncode == 0, result.stderr[-3000:]
    results = _results(tmp_path / "out" / "eval")
    assert (results["dataset"], results["class_names"]) == ("folder", list(CLASSES))
    assert results["confusion_samples"] == 4 and "top5" not in results
    per_class = results["per_class_top1"]
    assert per_class["ant"] is None and per_class["bee"] is not None
    assert per_class["cat"] is not None


def test_imagenet_arch_on_a_train_only_folder_with_spare_outputs(tmp_path: Path) -> None:
    data = write_tree(tmp_path / "data", {"train": 6})
    result = run_cli(str(data), "-a", "resnet18", "--input-size", "3,32,32", "--num-classes",
                     "4", "--vs", "0.25", *TINY, "-o", str(tmp_path / "out"), "-n", "r18")
    assert result.returncode == 0, result.stderr[-3000:]
    results = _results(tmp_path / "out" / "r18")
    assert (results["dataset"], results["num_classes"]) == ("folder", 4)
    assert results["class_names"] == list(CLASSES) and "top5" not in results
    assert results["samples"] == 4  # the --vs quarter of train/ is the test split


def _mixed(data: Path) -> None:
    write_images(data / "train" / WNIDS[0], 1)


def _empty_class(data: Path) -> None:
    (data / "train" / "dog").mkdir()
    (data / "val" / "dog").mkdir()


def _val_only_class(data: Path) -> None:
    write_images(data / "val" / "dog", 1)


def _train_only_class(data: Path) -> None:
    write_images(data / "train" / "dog", 1)


def _unreadable(data: Path) -> None:
    (data / "train" / "cat" / "1.png").write_bytes(b"\x89PNG but no image")


def _three_problems(data: Path) -> None:
    """An empty class folder (in both splits), a corrupt and a truncated image: named in one
    line, together."""
    _empty_class(data)
    _unreadable(data)
    whole = (data / "train" / "cat" / "0.jpg").read_bytes()
    (data / "train" / "cat" / "0.jpg").write_bytes(whole[:len(whole) // 2])


BAD = {
    "mixed": (_mixed, (), ("mixes ImageNet WordNet-id", "--dataset folder")),
    "empty": (_empty_class, (), ("no images in", "dog", "put images in")),
    "val-only class": (_val_only_class, (), ("val has class folders that", "train lacks: dog")),
    "train-only class": (_train_only_class, (), ("train has class folders", "val lacks: dog")),
    "unreadable": (_unreadable, (), ("corrupt image file", "1.png", "remove or replace it")),
    "three problems": (_three_problems, (), (
        "4 problems in", "train/dog", "val/dog", "cat/0.jpg", "cat/1.png",
        "put images in every class folder", "remove or replace the corrupt files")),
    "few classes": (lambda data: None, ("--num-classes", "2"), ("--num-classes 2 is fewer",)),
    "no test split": (lambda data: shutil.rmtree(data / "val"), ("--vs", "0"),
                      ("no val/ split", "--vs")),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_folder_is_one_line_and_writes_nothing(tmp_path: Path, case: str) -> None:
    spoil, flags, fragments = BAD[case]
    data = write_tree(tmp_path / "data", {"train": 2, "val": 1})
    spoil(data)
    result = run_cli(str(data), "-a", "simplenet_mnist", *flags, *TINY,
                     "-o", str(tmp_path / "out"))
    assert_user_error(result, *fragments)
    assert not (tmp_path / "out").exists()


def test_dataset_folder_needs_dataset_dir(tmp_path: Path) -> None:
    result = run_cli("-a", "simplenet_mnist", "--dataset", "folder", *TINY,
                     "-o", str(tmp_path / "out"))
    assert_user_error(result, "dataset 'folder'", "pass DATASET_DIR")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("classes", [3, 5, 6, 10])
def test_top5_only_with_more_than_five_classes(classes: int) -> None:
    sums = MetricSums(torch.device("cpu"))
    target = torch.arange(8) % classes
    sums.update(torch.eye(classes)[target], target, torch.tensor(0.5))
    metrics = sums.result()
    assert ("top5" in metrics) is reports_top5(classes) is (classes > 5)
    assert metrics["top1"] == 100.0


def test_sensitivity_csv_follows_the_metrics(tmp_path: Path) -> None:
    row = {"parameter": "conv1.weight", "sparsity": 0.5, "top1": 50.0, "loss": 1.0}
    write_sensitivity_csv([row], tmp_path / "few.csv")
    assert _csv_header(tmp_path / "few.csv") == ["parameter", "sparsity", "top1", "loss"]
    write_sensitivity_csv([{**row, "top5": 90.0}], tmp_path / "many.csv")
    assert _csv_header(tmp_path / "many.csv")[2:] == ["top1", "top5", "loss"]


def test_images_much_smaller_than_the_input_get_one_line_naming_input_size(
        trained: Path, tmp_path: Path) -> None:
    """24 px images for a model of 56 px: one line says they are upscaled and names the flag;
    at the model's own 28 px (under twice the images') nothing is said."""
    data = trained / "data"
    result = run_cli("-e", "--resume-from", str(trained / "out" / "train" / "checkpoint.pth.tar"),
                     str(data), "-j", "0", "-o", str(tmp_path), "-n", "own")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "upscaled" not in result.stdout
    result = run_cli(str(data), "-a", "resnet20_cifar", "--input-size", "3,56,56", *TINY,
                     "-o", str(tmp_path), "-n", "large")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if "upscaled" in line]
    assert len(lines) == 1 and "are about 24 px and the model's input is 56 px" in lines[0]
    assert "--input-size 3,24,24 runs the model at their size" in lines[0]
