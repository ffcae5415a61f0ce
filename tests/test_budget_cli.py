"""A budget run through the real CLI: the budget met with its evidence (budget.json, table,
pareto.png, budget_schedule.yaml that reruns to the same channel counts), resume after SIGKILL
mid-search ending alike, an unmet budget in one line with the model saved, bad budgets refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from compressor.assembly.setup import load_model
from compressor.assembly.state import assemble_checkpoint
from compressor.cli.parser import parse_args
from compressor.models import create_model
from compressor.training.checkpoint import save_checkpoint
from tests.conftest import (
    ROOT,
    assert_user_error,
    run_cli,
    run_main,
    run_torchrun,
    start_killable,
    trained_digits,
    trained_like_batchnorms,
)

COMMON = ("-j", "0", "-p", "0", "-b", "64", "--deterministic")
BUDGET = ("--target-macs", "0.4", "--epochs", "2", "--lr", "0.02", *COMMON)


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained simplenet_digits checkpoint (the model every budget run starts from)."""
    return trained_digits(tmp_path_factory.mktemp("budget"), *COMMON)


@pytest.fixture(scope="module")
def budget_run(dense: Path) -> Path:
    """The budget run of docs/compress-to-budget.md's first command, on the digits."""
    result = run_cli("--resume-from", str(dense), *BUDGET, "-o", str(dense.parent.parent),
                     "-n", "budget")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| MACs" in result.stdout and "yes" in result.stdout  # the table on stdout
    return dense.parent.parent / "budget"


def _untrained(path: Path) -> Path:
    """A simplenet_digits checkpoint written in-process (refusals and reports need no training)."""
    torch.manual_seed(0)
    model = trained_like_batchnorms(create_model("simplenet_digits", "digits"))
    save_checkpoint(path, assemble_checkpoint(model, args={}, epoch=0, best_top1=0.0,
                                              best_epoch=0))
    return path


def _filters(path: Path) -> dict[str, int]:
    model = load_model(path)
    return {name: module.weight.shape[0] for name, module in model.named_modules()
            if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear))}


@pytest.mark.slow  # the tests on the shared budget run stay together in one worker
def test_the_budget_holds_with_its_evidence(budget_run: Path, dense: Path) -> None:
    report = json.loads((budget_run / "budget.json").read_text())
    (macs,) = report["budgets"]
    assert macs["quantity"] == "macs" and macs["target"] == 0.4 and macs["met"]
    assert macs["achieved"] <= 0.4 and macs["final"] / macs["dense"] == pytest.approx(
        macs["achieved"])
    assert report["met"] and report["fine_tune"]["distillation"]
    assert report["search"]["evaluations"] > len(report["layers"])  # probes and candidates
    after = _filters(budget_run / "checkpoint.pth.tar")
    before = _filters(dense)
    for row in report["layers"]:
        assert row["channels_before"] == before[row["layer"]]
        assert row["channels_after"] == after[row["layer"]]
    assert any(row["channels_after"] < row["channels_before"] for row in report["layers"])
    results = json.loads((budget_run / "results.json").read_text())
    assert results["budget_met"] and results["macs"] == macs["final"]
    assert (budget_run / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the checkpoint rebuilds the thin model alone, and is evaluated like any other
    evaluated = run_cli("-e", "--resume-from", str(budget_run / "checkpoint.pth.tar"), *COMMON,
                        "-o", str(budget_run.parent), "-n", "evaluated")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]


@pytest.mark.slow
def test_a_channel_multiple_is_kept_by_every_pruned_layer_and_recorded(dense: Path) -> None:
    """--channel-multiple 16 on the CPU (8 is CUDA's default, 1 the CPU's): every layer the
    run thinned keeps a multiple of 16 channels, and budget.json says so."""
    result = run_cli("--resume-from", str(dense), *BUDGET, "--channel-multiple", "16",
                     "-o", str(dense.parent.parent), "-n", "multiple")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((dense.parent.parent / "multiple" / "budget.json").read_text())
    assert report["met"] and report["search"]["channel_multiple"] == 16
    # the speed on this device, measured though no latency was budgeted, and said plainly
    speed = report["speed"]
    assert speed["device"] == "cpu" and speed["batch"] == 1 and speed["ratio"] > 0
    verdict = "x faster" if speed["faster"] else "NOT faster here"
    assert "latency on cpu, batch 1 (measured)" in result.stdout and verdict in result.stdout
    thinned = [row for row in report["layers"] if row["channels_after"] < row["channels_before"]]
    assert thinned and all(row["channels_after"] % 16 == 0 for row in thinned), thinned


@pytest.mark.slow
def test_the_written_schedule_reruns_to_the_same_channel_counts(budget_run: Path,
                                                                dense: Path) -> None:
    schedule = budget_run / "budget_schedule.yaml"
    result = run_cli("-a", "simplenet_digits", "--exp-load-weights-from", str(dense),
                     "--compress", str(schedule), "--epochs", "2", "--lr", "0.02", *COMMON,
                     "-o", str(budget_run.parent), "-n", "rerun")
    assert result.returncode == 0, result.stderr[-3000:]
    assert _filters(budget_run.parent / "rerun" / "checkpoint.pth.tar") == _filters(
        budget_run / "checkpoint.pth.tar")


@pytest.mark.slow
def test_a_search_killed_midway_resumes_to_the_same_model(budget_run: Path, dense: Path,
                                                          tmp_path: Path) -> None:
    run_dir = tmp_path / "killed"
    kill = start_killable([str(ROOT / "compress_classifier.py"), "--resume-from", str(dense),
                           *BUDGET, "-o", str(tmp_path), "-n", run_dir.name],
                          run_dir / "checkpoint.pth.tar")
    kill()
    state = torch.load(run_dir / "checkpoint.pth.tar", weights_only=True)
    assert state["epoch"] == -1 and "chosen" not in state["budget"]  # killed in the search
    resumed = run_cli("--resume-from", str(run_dir / "checkpoint.pth.tar"), *BUDGET,
                      "-o", str(tmp_path), "-n", run_dir.name)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ours = torch.load(run_dir / "checkpoint.pth.tar", weights_only=True)
    reference = torch.load(budget_run / "checkpoint.pth.tar", weights_only=True)
    assert ours["budget"]["chosen"] == reference["budget"]["chosen"]
    assert ours["state_dict"].keys() == reference["state_dict"].keys()
    for key, value in reference["state_dict"].items():
        assert torch.equal(ours["state_dict"][key], value), key


def test_an_unmet_budget_says_by_how_much_and_keeps_the_best_model(tmp_path: Path) -> None:
    dense = _untrained(tmp_path / "dense.pth.tar")
    result = run_cli("--resume-from", str(dense), "--target-params", "0.001", "--epochs", "1",
                     *COMMON, "-o", str(tmp_path), "-n", "unmet")
    assert result.returncode == 1, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "budget not met: params at" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads((tmp_path / "unmet" / "budget.json").read_text())
    assert not report["met"] and not report["budgets"][0]["met"]
    assert (tmp_path / "unmet" / "checkpoint.pth.tar").is_file()


@pytest.mark.parametrize(("flags", "words"), [
    (("--target-macs", "0"), "--target-macs: must be a number in (0, 1)"),
    (("--target-macs", "1"), "--target-macs: must be a number in (0, 1)"),
    (("--target-latency", "nan"), "--target-latency: nan is not a finite number"),
    (("--target-params", "-0.5"), "--target-params: must be a number in (0, 1)"),
    (("--target-size", "half"), "--target-size: 'half' is not a number"),
    (("--target-macs", "0.5", "-e"), "-e trains nothing"),
    (("--target-macs", "0.5", "--compress", "x.yaml"), "drop --compress"),
    (("--latency-batch", "8", "--target-macs", "0.5"), "add --target-latency"),
    (("--greedy",), "--greedy needs --greedy-target-density"),
    (("--max-accuracy-drop", "-1", "--target-macs", "0.5"),
     "--max-accuracy-drop/--max-drop: must be a number in [0, 100]"),
])
def test_bad_budgets_are_one_line(flags: tuple[str, ...], words: str, tmp_path: Path) -> None:
    # refused while parsing, before the checkpoint is read
    assert_user_error(run_main("--resume-from", str(tmp_path / "dense.pth.tar"), *flags), words)


def test_a_budget_needs_trained_weights_and_a_validation_split(tmp_path: Path) -> None:
    dense = _untrained(tmp_path / "dense.pth.tar")
    assert_user_error(run_main("-a", "simplenet_digits", "--target-macs", "0.5"),
                      "compresses a trained model")
    assert_user_error(run_main("--resume-from", str(dense), "--target-macs", "0.5", "--vs", "0",
                               "-o", str(tmp_path), "-n", "novs"), "pass --vs 0.1")
    assert not (tmp_path / "novs").exists()


@pytest.mark.parametrize("flag", [("--latency-batch", "8"), ("--max-accuracy-drop", "1"),
                                  ("--no-kd",), ("--channel-multiple", "8")])
def test_budget_flags_on_a_checkpoint_that_is_not_a_budget_run_are_refused(
        flag: tuple[str, ...], tmp_path: Path) -> None:
    dense = _untrained(tmp_path / "dense.pth.tar")
    for mode in ((), ("-e",)):
        result = run_main("--resume-from", str(dense), *mode, *flag, "--epochs", "1",
                          "-o", str(tmp_path), "-n", "ignored")
        assert_user_error(result, f"{flag[0]} belongs to a budget run", "is not one")
        assert not (tmp_path / "ignored").exists()


def test_distillers_greedy_flags_map_onto_a_macs_budget() -> None:
    args = parse_args(["-a", "resnet20_cifar", "--pretrained", "--greedy",
                       "--greedy-target-density", "0.5"])
    assert args.target_macs == 0.5


@pytest.mark.slow
def test_a_budget_run_under_torchrun_times_latency_once_and_ranks_agree(tmp_path: Path
                                                                        ) -> None:
    dense = _untrained(tmp_path / "dense.pth.tar")
    result = run_torchrun(2, "--resume-from", str(dense), "--target-macs", "0.5",
                          "--target-latency", "0.9", "--latency-batch", "4", "--epochs", "2",
                          *COMMON, "-o", str(tmp_path), "-n", "ddp")
    # a latency budget is timed on a shared machine: met or not, the run reports it (exit 1)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    assert "masks identical on 2 ranks" in result.stdout  # every rank pruned the same filters
    report = json.loads((tmp_path / "ddp" / "budget.json").read_text())
    assert report["latency"] == {"batch": 4, "threads": 1, "device": "cpu"}
    assert {row["quantity"] for row in report["budgets"]} == {"macs", "latency"}
    assert next(r for r in report["budgets"] if r["quantity"] == "macs")["met"]
    assert report["met"] == (result.returncode == 0)
