"""What a run prints last: figures formatted once and never re-parsed by tabulate (no
1.16895e+07 params, no 1.72343e+06 loss), top-5 only past 5 classes, the dataset as the user
names it; and the other report tables keep the digits they were formatted with."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from compressor.cli.results_table import dataset_label, results_table
from compressor.models import create_model
from compressor.reports.budget_report import budget_table
from compressor.reports.confusion import format_confusion
from compressor.reports.numbers import significant
from compressor.reports.summary import print_summary
from tests.conftest import run_cli
from tests.test_data_folder import write_tree

# resnet18 on ImageNet, with a diverged loss
RESNET18 = {"arch": "resnet18", "dataset": "imagenet", "num_classes": 1000, "top1": 69.758,
            "top5": 89.0779, "loss": 1723430.0, "sparsity": 0.5, "params": 11_689_512,
            "macs": 1_814_073_856, "samples": 50_000, "time": 3723.46}


def _cells(table: str) -> dict[str, str]:
    """label -> value of a two-column GitHub table (header and rule left out)."""
    rows = [line.split("|")[1:-1] for line in table.splitlines()[2:]]
    return {label.strip(): value.strip() for label, value in rows}


def test_each_figure_prints_as_formatted() -> None:
    table = results_table(RESNET18, "imagenet")
    assert table.splitlines()[0].startswith("| resnet18 on imagenet ")
    assert _cells(table) == {
        "top-1 (%)": "69.76", "top-5 (%)": "89.08", "loss": "1,723,430",
        "weight sparsity (%)": "50.00", "params": "11,689,512", "MACs": "1,814,073,856",
        "test samples": "50,000", "time (s)": "3,723.5"}
    assert "e+" not in table


def test_losses_keep_four_significant_digits() -> None:
    assert [significant(value) for value in (1.4739133, 0.000123456, 9.99996, 0.0, 25.0)] == \
        ["1.474", "0.0001235", "10.00", "0", "25.00"]
    assert _cells(results_table({**RESNET18, "loss": 0.000123456}, "imagenet"))["loss"] == \
        "0.0001235"


def test_rows_follow_what_the_run_measured() -> None:
    few_classes = {key: value for key, value in RESNET18.items() if key != "top5"}
    assert "top-5 (%)" not in _cells(results_table(few_classes, "imagenet"))
    quantized = {**RESNET18, "kernels": "int8", "bits_activations": 8, "bits_weights": 8,
                 "stats_file": "logs/q/acts_quantization_stats.yaml"}
    cells = _cells(results_table(quantized, "imagenet"))
    assert (cells["kernels"], cells["bits (acts/wts)"]) == ("int8", "8/8")
    calibrated = {"arch": "resnet18", "dataset": "imagenet", "params": 11_689_512,
                  "stats_file": "s.yaml", "time": 2.0}  # --qe-calibration alone: no accuracy
    assert list(_cells(results_table(calibrated, "imagenet"))) == ["stats", "params", "time (s)"]


def test_the_dataset_is_named_as_the_user_knows_it(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_images").mkdir()
    assert dataset_label("folder", str(tmp_path / "my_images") + "/") == "folder my_images"
    monkeypatch.chdir(tmp_path / "my_images")
    assert dataset_label("folder", ".") == "folder my_images"
    assert dataset_label("digits", None) == "digits"
    assert dataset_label("cifar10", "data/cifar10") == "cifar10"


def test_the_other_tables_keep_their_digits() -> None:
    report = {"budgets": [
        {"quantity": "macs", "target": 0.5, "achieved": 0.4987, "dense": 1_814_073_856,
         "final": 904_000_000, "met": True},
        {"quantity": "latency", "target": 0.5, "achieved": 0.51, "dense": 0.0123456,
         "final": 0.0062963, "met": False}],
        "accuracy": {"max_drop": None, "drop": 1.234, "dense_val_top1": 70.0,
                     "final_val_top1": 68.766, "met": None},
        "dense_test_top1": 69.8, "final_test_top1": 68.5}
    budget = budget_table(report)
    assert " 0.500 |" in budget and "1,814,073,856" in budget and "6.296 ms" in budget
    assert "e+" not in budget and "e-" not in budget
    model = create_model("simplenet_digits", "digits")
    with torch.no_grad():
        model.conv1.weight[: model.conv1.weight.shape[0] // 2] = 0
    row = next(line for line in print_summary(model, "sparsity").splitlines()
               if "conv1.weight" in line)
    assert [cell.strip() for cell in row.split("|")[3:8]] == \
        ["288", "144", "50.00", "0.00", "50.00"]
    matrix = 3 * torch.eye(3, dtype=torch.int64)
    rows = format_confusion(matrix, ["007", "010", "1e3"]).splitlines()[2:]
    assert [row.split("|")[1].strip() for row in rows] == ["007", "010", "1e3"]


def test_a_run_prints_the_table(tmp_path: Path) -> None:
    """10 digit classes keep top-5 everywhere; a 3-class folder names its directory."""
    result = run_cli("-a", "simplenet_digits", "--dataset", "digits", "--epochs", "1", "-b", "64",
                     "-j", "0", "-p", "0", "--etrs", "0.5", "-o", str(tmp_path / "logs"),
                     "-n", "digits")
    assert result.returncode == 0, result.stderr[-3000:]
    table = result.stdout[result.stdout.index("| simplenet_digits on digits "):]
    cells = _cells(table)
    run_dir = tmp_path / "logs" / "digits"
    results = json.loads((run_dir / "results.json").read_text())
    assert cells["top-5 (%)"] == f"{results['top5']:.2f}"
    assert cells["loss"] == significant(results["loss"])
    assert (cells["params"], cells["MACs"]) == ("94,186", "2,379,008")
    with open(run_dir / "metrics.csv", newline="") as handle:
        assert "val_top5" in next(csv.reader(handle))
    write_tree(tmp_path / "my_images", {"train": 1, "val": 2})
    result = run_cli(str(tmp_path / "my_images"), "-a", "simplenet_mnist", "-e", "-b", "8",
                     "-j", "0", "-o", str(tmp_path / "logs"), "-n", "folder")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| simplenet_mnist on folder my_images " in result.stdout
    assert "top-5" not in result.stdout
    assert "top5" not in json.loads((tmp_path / "logs" / "folder" / "results.json").read_text())
