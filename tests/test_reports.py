"""Reports as library calls: confusion counting and its all-reduce, the sparsity table, the
TensorBoard scalars and their hook, and the class names that the dataset table provides."""

from __future__ import annotations

import csv
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from compressor.data import load_datasets, load_test_dataset
from compressor.reports import confusion_matrix, confusion_report, open_epoch_reports
from compressor.reports.confusion import confusion_counts, format_confusion
from compressor.reports.epoch import EpochReports
from compressor.reports.sparsity import layer_sparsities, masks_sparsity_table
from compressor.reports.tensorboard import (
    TensorBoardLog,
    compression_scalars,
    require_tensorboard,
    row_scalars,
)
from compressor.utils.config import ReportConfig
from compressor.utils.dataset_table import (
    CIFAR10_NAMES,
    DATASET_INPUT_SPECS,
    DATASET_SPECS,
    FASHION_MNIST_NAMES,
)
from compressor.utils.errors import UsageError
from tests.test_data_cifar import write_cifar10
from tests.test_data_idx import write_mnist

# Three classes; argmax of each row: 0, 2, 2, 1, 1 (targets 0, 1, 2, 1, 0).
LOGITS = torch.tensor([[5.0, 1, 0], [0, 1, 3], [0, 0, 1], [0, 4, 1], [1, 2, 0]])
TARGETS = torch.tensor([0, 1, 2, 1, 0])
EXPECTED = [[1, 1, 0], [0, 1, 1], [0, 0, 1]]  # rows true, columns predicted


def _batches() -> list[tuple[Tensor, Tensor]]:
    """The logits as 'inputs' of an nn.Identity model, in two batches."""
    return [(LOGITS[:3], TARGETS[:3]), (LOGITS[3:], TARGETS[3:])]


def test_confusion_counts_rows_true_columns_predicted() -> None:
    counts = confusion_counts(LOGITS, TARGETS, 3).view(3, 4)
    assert counts[:, :3].tolist() == EXPECTED
    assert counts[:, 3].tolist() == [0, 0, 0]  # nothing predicted outside the classes
    assert int(counts.sum()) == len(TARGETS)


def test_predictions_beyond_the_classes_go_to_other() -> None:
    logits = torch.tensor([[0.0, 0, 9], [3.0, 0, 0]])  # a 3-output model on a 2-class dataset
    matrix = confusion_matrix(nn.Identity(), [(logits, torch.tensor([1, 0]))],
                              torch.device("cpu"), num_classes=2)
    assert matrix.tolist() == [[1, 0, 0], [0, 0, 1]]
    assert "other" in format_confusion(matrix, ["a", "b"]).splitlines()[0]


def test_confusion_matrix_is_summed_by_reduce_once() -> None:
    calls: list[Tensor] = []

    def double(tensor: Tensor) -> Tensor:  # two ranks that counted the same shard
        calls.append(tensor.clone())
        return tensor * 2

    matrix = confusion_matrix(nn.Identity(), _batches(), torch.device("cpu"), 3, reduce=double)
    assert len(calls) == 1 and calls[0].dtype == torch.int64
    assert matrix[:, :3].tolist() == [[2 * v for v in row] for row in EXPECTED]
    alone = confusion_matrix(nn.Identity(), _batches(), torch.device("cpu"), 3)
    assert alone[:, :3].tolist() == EXPECTED


def test_confusion_report_files_and_summary(tmp_path: Path) -> None:
    summary = confusion_report(nn.Identity(), _batches(), torch.device("cpu"), num_classes=3,
                               class_names=("cat", "dog", "eel"), run_dir=tmp_path)
    assert summary["confusion_samples"] == 5
    assert summary["per_class_top1"] == {"cat": 50.0, "dog": 50.0, "eel": 100.0}
    rows = list(csv.reader((tmp_path / "confusion.csv").open()))
    assert rows[0] == ["true \\ predicted", "cat", "dog", "eel"]  # no empty `other` column
    assert [[int(v) for v in row[1:]] for row in rows[1:]] == EXPECTED
    assert (tmp_path / "confusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # other ranks (no run directory) count and reduce alike but write nothing
    elsewhere = tmp_path / "rank1"
    elsewhere.mkdir()
    confusion_report(nn.Identity(), _batches(), torch.device("cpu"), num_classes=3,
                     run_dir=None)
    assert not list(elsewhere.iterdir())


def test_table_headers_are_names_when_they_fit_else_indices() -> None:
    matrix = torch.zeros(10, 11, dtype=torch.int64)
    matrix[:, :10] += torch.eye(10, dtype=torch.int64)
    header = format_confusion(matrix, FASHION_MNIST_NAMES).splitlines()[0]
    assert "T-shirt/top" in header and "Ankle boot" in header and "other" not in header
    long = [f"a rather long class name {i}" for i in range(10)]
    table = format_confusion(matrix, long)
    assert "rather" not in table.splitlines()[0] and "|   9 |" in table.splitlines()[0]
    assert "3 a rather long class name 3" in table  # rows keep the names


def test_many_classes_print_the_most_frequent_confusions() -> None:
    matrix = torch.zeros(50, 51, dtype=torch.int64)
    matrix[:, :50] += 3 * torch.eye(50, dtype=torch.int64)
    matrix[7, 9] = 4
    text = format_confusion(matrix, [f"c{i}" for i in range(50)])
    assert "confusion.csv" in text and "| c7     | c9          |       4 |" in text
    assert len(text.splitlines()) == 4  # message, header, rule, the one confusion


def test_masks_sparsity_table_rows_and_totals() -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 3, bias=False), nn.Flatten(), nn.Linear(2, 2))
    with torch.no_grad():
        model[0].weight.fill_(1.0)
        model[0].weight[0].zero_()  # 9 of 18 zero
        model[2].weight.copy_(torch.tensor([[0.0, 1], [1, 1]]))
    mask = torch.ones_like(model[0].weight)
    mask[0] = 0
    rows = layer_sparsities(model, {"0.weight": mask})
    assert [(r.name, r.shape, r.mask, r.weight) for r in rows] == [
        ("0.weight", (2, 1, 3, 3), 50.0, 50.0), ("2.weight", (2, 2), None, 25.0)]
    table = masks_sparsity_table(rows, with_masks=True).splitlines()
    assert "Mask sparsity (%)" in table[0] and "Weight sparsity (%)" in table[0]
    assert table[2].split("|")[1:5] == [" 0.weight ", " 2x1x3x3 ", "               50.00 ",
                                        "                 50.00 "]
    assert table[3].split("|")[3].strip() == "-"
    assert table[-1].split("|")[3].strip() == "50.00"  # masks: over the masked layer
    assert table[-1].split("|")[4].strip() == f"{100 * 10 / 22:.2f}"  # weights: 10 of 22
    plain = masks_sparsity_table(layer_sparsities(model), with_masks=False)
    assert "Mask" not in plain and "25.00" in plain


def test_row_scalars_name_metrics_by_split() -> None:
    row = {"epoch": 3, "lr": 0.1, "train_loss": 2.0, "train_top1": 50.0, "val_loss": 1.5,
           "val_top5": 90.0, "train_time": 1.25, "train_cpu_time": 2.5}
    assert row_scalars(row) == {"lr": 0.1, "loss/train": 2.0, "top1/train": 50.0,
                                "loss/val": 1.5, "top5/val": 90.0, "time/train": 1.25,
                                "cpu_time/train": 2.5}


class _Ranges:
    """What a quantizer would offer: its ranges, as the documented hook."""

    def tensorboard_scalars(self) -> dict[str, float]:
        return {"conv1.weight/max": 0.5}


class _Policy:
    def __init__(self, name: str, quantizer: Any) -> None:
        self.instance_name, self.quantizer = name, quantizer


class _Schedule:
    def __init__(self) -> None:
        shared = _Ranges()
        self.policies = [_Policy("q", shared), _Policy("q_again", shared), _Policy("lr", None)]
        self.masks: dict[str, Tensor] = {}


def test_compression_objects_offer_scalars_through_the_hook() -> None:
    assert compression_scalars(_Schedule()) == {"compression/q/conv1.weight/max": 0.5}
    assert compression_scalars(None) == {}


class _FakeWriter:
    """Records what SummaryWriter would write."""

    def __init__(self, log_dir: str, purge_step: int) -> None:
        self.log_dir, self.purge_step = log_dir, purge_step
        self.scalars: list[tuple[str, float, int]] = []
        self.closed = False

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, value, step))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_epoch_reports_write_each_epoch_and_close(tmp_path: Path) -> None:
    made: list[_FakeWriter] = []

    def open_writer(**kwargs: Any) -> _FakeWriter:
        made.append(_FakeWriter(**kwargs))
        return made[-1]

    model = nn.Sequential(nn.Linear(2, 2))
    reports = EpochReports(tensorboard=TensorBoardLog(open_writer, tmp_path / "tensorboard"))
    with reports:
        for epoch in (4, 5):  # resumed at epoch 4
            reports.epoch_end(epoch, {"epoch": epoch, "lr": 0.1, "val_top1": 10.0 * epoch},
                              model, _Schedule())
    (writer,) = made
    assert writer.purge_step == 4 and writer.closed
    assert ("top1/val", 50.0, 5) in writer.scalars and ("lr", 0.1, 4) in writer.scalars
    assert ("sparsity/weights/0.weight", 0.0, 5) in writer.scalars
    assert ("compression/q/conv1.weight/max", 0.5, 4) in writer.scalars


def test_masks_sparsity_logs_on_rank_zero_only(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    config = ReportConfig(masks_sparsity=True)
    with caplog.at_level("INFO", logger="compressor"):
        with open_epoch_reports(config, None, model) as other_rank:
            other_rank.epoch_end(0, {"epoch": 0}, model, None)
        assert not caplog.records
        with open_epoch_reports(config, tmp_path, model) as reports:
            reports.epoch_end(0, {"epoch": 0}, model, None)
    assert "epoch 0: weight sparsity per layer" in caplog.text and "0.weight" in caplog.text
    assert not (tmp_path / "tensorboard").exists()


def test_missing_tensorboard_is_a_usage_error_naming_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    with pytest.raises(UsageError, match=r"pip install -e '\.\[tensorboard\]'"):
        require_tensorboard()
    with pytest.raises(UsageError):  # on every rank, before any training
        open_epoch_reports(ReportConfig(tensorboard=True), None, nn.Linear(1, 1))


def test_dataset_table_names_fill_the_splits(tmp_path: Path) -> None:
    assert all(len(spec.class_names) in (0, spec.num_classes) for spec in DATASET_SPECS.values())
    assert len(set(DATASET_SPECS["cifar100"].class_names)) == 100
    digits = load_test_dataset("digits", None, DATASET_INPUT_SPECS["digits"])
    assert digits.class_names == tuple("0123456789")
    write_mnist(tmp_path / "FashionMNIST" / "raw", gz=False)
    fashion = load_datasets("fashion-mnist", str(tmp_path), DATASET_INPUT_SPECS["fashion-mnist"])
    assert fashion.class_names == FASHION_MNIST_NAMES
    assert fashion.class_names[0] == "T-shirt/top" and fashion.class_names[9] == "Ankle boot"
    synthetic = load_test_dataset("synthetic", None, DATASET_INPUT_SPECS["cifar10"],
                                  num_classes=10)
    assert synthetic.class_names == ()


def test_cifar_names_come_from_the_meta_file_when_present(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    spec = DATASET_INPUT_SPECS["cifar10"]
    assert load_test_dataset("cifar10", str(tmp_path), spec).class_names == CIFAR10_NAMES
    names = [f"kind{i}".encode() for i in range(10)]  # bytes, as Python 2 wrote them
    (tmp_path / "batches.meta").write_bytes(pickle.dumps(
        {b"label_names": names, b"num_vis": np.int64(3072)}, protocol=2))
    assert load_datasets("cifar10", str(tmp_path), spec).class_names == tuple(
        f"kind{i}" for i in range(10))
    (tmp_path / "batches.meta").write_bytes(pickle.dumps({"label_names": ["a", "b"]}))
    assert load_test_dataset("cifar10", str(tmp_path), spec).class_names == CIFAR10_NAMES
