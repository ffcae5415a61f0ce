"""Accuracy as a budget: a model at chance is never "met", the accuracy floor holds for the
float and the int8 model, --target-accuracy-drop compresses as far as accuracy allows, and the
best epoch (not the last) is the model a budget run hands over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from compressor.reports.budget_report import budget_report, budget_table, collapsed, unmet_line
from compressor.reports.numbers import significant
from compressor.training.best import BestEpoch
from compressor.training.checkpoint import load_checkpoint
from tests.conftest import assert_user_error, run_cli, run_main, trained_digits

COMMON = ("-j", "0", "-p", "0", "-b", "64", "--deterministic")


def _state() -> dict:
    return {"targets": {"macs": 0.5}, "dense_figures": {"macs": 100.0}, "dense_val_top1": 90.0,
            "dense_test_top1": 89.0, "max_drop": 2.0, "groups": [], "chosen": [],
            "evaluations": {}}


def test_chance_is_one_and_a_half_times_one_over_the_classes() -> None:
    assert collapsed(15.0, 10) and not collapsed(15.1, 10)
    assert collapsed(50.0, 3) and not collapsed(51.0, 3)
    assert not collapsed(0.0, 1)


def test_the_floor_holds_for_the_float_and_the_int8_model() -> None:
    scores = {"val_top1": 89.0, "test_top1": 88.0, "int8_val_top1": 86.5,
              "int8_test_top1": 86.0, "model_epoch": 3, "num_classes": 10}
    report = budget_report(_state(), nn.Linear(2, 2), {"macs": 49.0}, scores, "a", "d", {})
    accuracy = report["accuracy"]
    assert accuracy["drops"] == {"float": 1.0, "int8": 3.5} and accuracy["model"] == "int8"
    assert accuracy["met"] is False and not report["met"] and report["final_test_top1"] == 86.0
    line = unmet_line(report, Path("run"))
    assert "int8 validation top-1 dropped 3.50 points, floor 2.00" in line
    assert "float validation" not in line and "best.pth.tar" in line
    table = budget_table(report)
    assert "val top-1 drop, int8 (pts)" in table and "test top-1, int8, epoch 3 (%)" in table


def test_the_table_names_fractions_as_fractions_and_figures_with_units() -> None:
    """A latency row's target and achieved are fractions of dense, its figures milliseconds;
    sizes are bytes (not "latency (s)" above a column of ratios)."""
    state = {**_state(), "targets": {"latency": 0.5, "size": 0.5},
             "dense_figures": {"latency": 0.004, "size": 2000.0}}
    scores = {"val_top1": 89.0, "test_top1": 88.0, "model_epoch": 1, "num_classes": 10}
    report = budget_report(state, nn.Linear(2, 2), {"latency": 0.0018, "size": 900.0}, scores,
                           "a", "d", {})
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in budget_table(report).splitlines()[2:]}
    assert rows["latency"] == ["0.500", "0.450", "4.000 ms", "1.800 ms", "yes"]
    assert rows["size"] == ["0.500", "0.450", "2,000 B", "900 B", "yes"]
    assert "(s)" not in budget_table(report)
    # the speed on the run's device: faster, or said plainly that it is not
    for ratio, verdict in ((0.5, "2.00x faster"), (1.05, "NOT faster here")):
        report["speed"] = {"device": "cuda:0", "batch": 1, "threads": 1, "ratio": ratio,
                           "dense_seconds": 0.002, "final_seconds": 0.002 * ratio,
                           "faster": ratio < 1}
        rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
                for line in budget_table(report).splitlines()[2:]}
        assert rows["latency on cuda:0, batch 1 (measured)"][1:] == [
            f"{ratio:.3f}", "2.000 ms", f"{significant(2 * ratio)} ms", verdict]


def test_a_model_at_chance_is_never_met_even_with_every_budget_held() -> None:
    state = {**_state(), "max_drop": None}
    scores = {"val_top1": 12.0, "test_top1": 11.0, "model_epoch": 0, "num_classes": 10}
    report = budget_report(state, nn.Linear(2, 2), {"macs": 40.0}, scores, "a", "d", {})
    assert report["budgets"][0]["met"] and report["accuracy"]["collapsed"]
    assert not report["met"]
    assert "at chance (10.00% for 10 classes)" in unmet_line(report, Path("run"))


def test_random_labels_have_no_accuracy_to_guard() -> None:
    state = {**_state(), "max_drop": None}
    scores = {"val_top1": 0.1, "test_top1": 0.1, "model_epoch": 0, "num_classes": 1000}
    report = budget_report(state, nn.Linear(2, 2), {"macs": 40.0}, scores, "a", "synthetic",
                           {})
    assert report["accuracy"]["collapsed"] is None and report["met"]


def test_the_best_epoch_is_the_most_compressed_then_the_most_accurate() -> None:
    model = nn.Linear(3, 1)
    rows = [{"epoch": 0, "val_top1": 95.0, "nonzero_params": 4, "params": 4},
            {"epoch": 1, "val_top1": 80.0, "nonzero_params": 2, "params": 4},
            {"epoch": 2, "val_top1": 85.0, "nonzero_params": 2, "params": 4},
            {"epoch": 3, "val_top1": 82.0, "nonzero_params": 2, "params": 4}]
    best = BestEpoch([], -1, keep_weights=True)
    kept = {}
    for row in rows:
        with torch.no_grad():
            model.weight.fill_(row["epoch"])
        if best.update(row, model):
            kept[row["epoch"]] = True
    assert list(kept) == [0, 1, 2] and best.epoch == 2
    assert best.restore(model, 3, None) == 2
    assert torch.all(model.weight == 2)
    resumed = BestEpoch(rows[:3], 2, keep_weights=False)
    assert not resumed.update(rows[3], model) and resumed.top1 == 85.0


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained simplenet_digits checkpoint."""
    return trained_digits(tmp_path_factory.mktemp("accuracy"), *COMMON)


@pytest.mark.slow
def test_target_accuracy_drop_compresses_as_far_as_accuracy_allows(dense: Path) -> None:
    out = dense.parent.parent
    result = run_cli("--resume-from", str(dense), "--target-accuracy-drop", "2", "--minimize",
                     "macs", "--epochs", "2", "--lr", "0.02", *COMMON, "-o", str(out),
                     "-n", "bounded")
    assert result.returncode in (0, 1), result.stderr[-3000:]
    report = json.loads((out / "bounded" / "budget.json").read_text())
    (macs,) = report["budgets"]
    assert macs["target"] is None and macs["achieved"] < 0.9  # compressed, no fraction given
    assert report["accuracy"]["max_drop"] == 2.0
    assert "| MACs" in result.stdout and "minimized" in result.stdout
    evaluations = report["search"]["evaluations"]
    assert evaluations > 3
    spent = report["search"]["batch_norm_recalibration"]  # every candidate re-estimated
    assert spent["enabled"] and spent["candidates"] >= evaluations - 1 and spent["seconds"] > 0
    assert "batch-norm statistics re-estimated for each of" in result.stdout
    checkpoint = load_checkpoint(out / "bounded" / "checkpoint.pth.tar")
    state = checkpoint["budget"]
    dense_top1 = state["evaluations"][",".join("0" * len(state["groups"]))]["top1"]
    chosen = state["evaluations"][",".join(str(n) for n in state["chosen"])]
    assert dense_top1 - chosen["top1"] <= 2.0  # the chosen candidate is within the bound
    further = [e for e in state["evaluations"].values() if e["phase"] == "search"
               and sum(e["removed"]) > sum(chosen["removed"])]
    assert further and all(dense_top1 - e["top1"] > 2.0 for e in further)
    if result.returncode == 1:  # the fine-tuned model itself dropped more: said in one line
        assert "validation top-1 dropped" in result.stderr
    assert report["accuracy"]["model_epoch"] == load_checkpoint(
        out / "bounded" / "best.pth.tar")["epoch"]
    # every number the run reports is the model it hands over: best.pth.tar, evaluated alone
    again = run_cli("-e", "--resume-from", str(out / "bounded" / "best.pth.tar"), *COMMON,
                    "-o", str(out), "-n", "bounded-eval")
    assert again.returncode == 0, again.stderr[-3000:]
    evaluated = json.loads((out / "bounded-eval" / "results.json").read_text())
    assert evaluated["top1"] == report["float_test_top1"]


@pytest.mark.slow
def test_a_collapsed_budget_run_exits_non_zero_naming_the_cause(dense: Path) -> None:
    out = dense.parent.parent
    result = run_cli("--resume-from", str(dense), "--target-macs", "0.5", "--epochs", "1",
                     "--lr", "100", "--no-kd", *COMMON, "-o", str(out), "-n", "collapsed")
    assert result.returncode == 1, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "at chance" in lines[0] and "lower --lr" in lines[0], lines
    report = json.loads((out / "collapsed" / "budget.json").read_text())
    assert report["budgets"][0]["met"] and not report["met"]
    assert report["accuracy"]["collapsed"]
    assert "NO (chance)" in result.stdout


@pytest.mark.parametrize(("flags", "words"), [
    (("--minimize", "macs", "--target-macs", "0.5"), "add --target-accuracy-drop PTS"),
    (("--target-accuracy-drop", "1", "--target-macs", "0.5"), "give one of them"),
    (("--target-accuracy-drop", "1", "--max-accuracy-drop", "1"), "drop --max-accuracy-drop"),
    (("--target-accuracy-drop", "1", "--latency-batch", "4"), "add --target-latency"),
    (("--target-accuracy-drop", "x"), "--target-accuracy-drop: 'x' is not a number"),
    (("--target-accuracy-drop", "1", "--minimize", "speed"), "invalid choice: 'speed'"),
])
def test_bad_accuracy_budgets_are_one_line(flags: tuple[str, ...], words: str,
                                           tmp_path: Path) -> None:
    result = run_main("-a", "simplenet_digits", "--pretrained", *flags, "-o", str(tmp_path))
    assert_user_error(result, words)
    assert not any(tmp_path.iterdir())
