"""Reports end to end (the real CLI in a subprocess, on the embedded digits): --tensorboard
scalars, --masks-sparsity tables in log.txt, --confusion files, and the missing-package error."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import assert_user_error, run_cli, run_main

TINY = ("-a", "simplenet_digits", "-b", "64", "-j", "0", "--etrs", "0.2", "--cpu", "-p", "0",
        "--deterministic")
SCHEDULE = {
    "version": 1,
    "pruners": {"agp": {"class": "AutomatedGradualPruner", "initial_sparsity": 0.2,
                        "final_sparsity": 0.5, "weights": ["conv2.weight", "conv3.weight"]}},
    "policies": [{"pruner": {"instance_name": "agp"}, "starting_epoch": 0, "ending_epoch": 2,
                  "frequency": 1}],
}


def _scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files in log_dir: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def _confusion_total(path: Path) -> int:
    rows = list(csv.reader(path.open()))
    return sum(int(value) for row in rows[1:] for value in row[1:])


@pytest.fixture(scope="module")
def pruned_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two epochs of AGP pruning with every report on."""
    out = tmp_path_factory.mktemp("reports")
    schedule = out / "agp.yaml"
    schedule.write_text(yaml.safe_dump(SCHEDULE))
    result = run_cli(*TINY, "--epochs", "2", "--compress", str(schedule), "--tensorboard",
                     "--masks-sparsity", "--confusion", "-o", str(out), "-n", "run")
    assert result.returncode == 0, result.stderr[-3000:]
    return out / "run"


def test_tensorboard_holds_the_epoch_scalars(pruned_run: Path) -> None:
    pytest.importorskip("tensorboard")
    scalars = _scalars(pruned_run / "tensorboard")
    for tag in ("loss/train", "loss/val", "top1/train", "top1/val", "top5/val", "lr",
                "time/train", "sparsity/weights/conv1.weight", "sparsity/weights/conv2.weight",
                "sparsity/masks/conv2.weight", "sparsity/weights/total"):
        assert [step for step, _ in scalars[tag]] == [0, 1], tag
    metrics = list(csv.DictReader((pruned_run / "metrics.csv").open()))
    for step, row in enumerate(metrics):  # metrics.csv stays the source of truth
        assert scalars["top1/val"][step][1] == pytest.approx(float(row["val_top1"]))
        assert scalars["loss/train"][step][1] == pytest.approx(float(row["train_loss"]))
    assert [value for _, value in scalars["sparsity/masks/conv2.weight"]] == pytest.approx(
        [20.0, 50.0], abs=0.01)  # AGP from 20% to 50% over two epochs
    assert "sparsity/masks/conv1.weight" not in scalars  # not pruned
    results = json.loads((pruned_run / "results.json").read_text())
    assert scalars["sparsity/weights/total"][-1][1] == pytest.approx(
        100 * results["sparsity"], abs=1e-3)


def test_masks_sparsity_table_is_logged_every_epoch(pruned_run: Path) -> None:
    log = (pruned_run / "log.txt").read_text()
    for epoch in (0, 1):
        table = log.split(f"epoch {epoch}: mask sparsity per layer\n", 1)[1]
        lines = table.splitlines()
        assert "Mask sparsity (%)" in lines[0] and "Weight sparsity (%)" in lines[0]
        assert lines[2].split("|")[1].strip() == "conv1.weight"
        assert lines[2].split("|")[3].strip() == "-"  # conv1 carries no mask
        expected = "20.00" if epoch == 0 else "50.00"
        assert lines[3].split("|")[1:4] == [" conv2.weight ", " 64x32x3x3  ",
                                            f"               {expected} "]


def test_confusion_of_the_trained_and_the_evaluated_model(pruned_run: Path,
                                                         tmp_path: Path) -> None:
    results = json.loads((pruned_run / "results.json").read_text())
    assert _confusion_total(pruned_run / "confusion.csv") == results["samples"]
    assert results["confusion_samples"] == results["samples"] == 360
    assert (pruned_run / "confusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    evaluated = run_cli("--resume-from", str(pruned_run / "checkpoint.pth.tar"), "-e", "-j",
                        "0", "--cpu", "--etes", "0.5", "--confusion", "-o", str(tmp_path),
                        "-n", "eval")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    run_dir = tmp_path / "eval"
    results = json.loads((run_dir / "results.json").read_text())
    header = next(csv.reader((run_dir / "confusion.csv").open()))
    assert header == ["true \\ predicted", *"0123456789"]
    assert _confusion_total(run_dir / "confusion.csv") == results["samples"] == 180
    top1 = results["per_class_top1"]
    assert set(top1) == set("0123456789")
    assert (run_dir / "confusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "confusion matrix (180 samples; rows true, columns predicted)" in evaluated.stdout


def test_resumed_run_continues_the_event_steps(pruned_run: Path, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    copy = tmp_path / "run"
    copy.mkdir()
    for path in pruned_run.rglob("*"):
        if path.is_file():
            target = copy / path.relative_to(pruned_run)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    (copy / "results.json").unlink()
    schedule = tmp_path / "agp.yaml"
    schedule.write_text(yaml.safe_dump(SCHEDULE))
    result = run_cli(*TINY, "--epochs", "3", "--compress", str(schedule), "--tensorboard",
                     "--resume-from", str(copy / "checkpoint.pth.tar"), "-o", str(tmp_path),
                     "-n", "run")  # continue in the run's own directory
    assert result.returncode == 0, result.stderr[-3000:]
    assert [step for step, _ in _scalars(copy / "tensorboard")["top1/val"]] == [0, 1, 2]


def test_missing_tensorboard_is_one_line_before_training(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # a None entry makes `import` fail as if the package were not installed
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    result = run_main(*TINY, "--epochs", "1", "--tensorboard", "-o", str(tmp_path), "-n", "run")
    assert_user_error(result, "--tensorboard", "pip install -e '.[tensorboard]'")
    assert not (tmp_path / "run").exists()  # refused before the run directory was made


def test_epoch_reports_without_training_are_refused(tmp_path: Path) -> None:
    for flag in ("--tensorboard", "--masks-sparsity"):
        result = run_main("-a", "simplenet_digits", "-e", flag, "-o", str(tmp_path))
        assert_user_error(result, flag, "-e")
    assert not any(tmp_path.iterdir())
