"""End-to-end: --kd-* training through the CLI, with a pruning schedule; exact resume; refusals."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest
import torch
import yaml

from compressor.assembly.state import assemble_checkpoint
from compressor.cli.args_distillation import KD_LOSS_DEFAULTS
from compressor.cli.parser import get_args_parser
from compressor.models import create_model
from compressor.models.description import description_of
from compressor.training.checkpoint import load_checkpoint, save_checkpoint
from tests.conftest import assert_user_error, run_cli, run_main
from tests.test_cli_train_resume import _assert_tensors_equal, _metrics

COMMON = ("-b", "64", "-j", "0", "--lr", "0.05", "--deterministic", "--etrs", "0.3", "-p", "0")
SCHEDULE = {
    "version": 1,
    "pruners": {"agp": {"class": "AutomatedGradualPruner", "initial_sparsity": 0.2,
                        "final_sparsity": 0.6, "weights": ["conv2.weight", "conv3.weight"]}},
    "policies": [{"pruner": {"instance_name": "agp"}, "starting_epoch": 0, "ending_epoch": 2,
                  "frequency": 1}]}


def _teacher(path: Path, seed: int, num_classes: int = 10) -> Path:
    """A simplenet_digits teacher of another width, trained with another normalization."""
    torch.manual_seed(seed)
    model = create_model("simplenet_digits", "digits", num_classes=num_classes,
                         model_attrs={"width": 16})
    checkpoint = assemble_checkpoint(model, args={})
    spec = description_of(model).input_spec
    checkpoint["input_spec"] = {**spec.to_dict(), "mean": [0.5], "std": [0.25]}
    save_checkpoint(path, checkpoint)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """KD + AGP for 2 epochs straight, and 1 epoch resumed to 2."""
    out = tmp_path_factory.mktemp("kd")
    teacher = _teacher(out / "teacher.pth.tar", seed=1)
    schedule = out / "agp.yaml"
    schedule.write_text(yaml.safe_dump(SCHEDULE))
    kd = ("--kd-resume", str(teacher), "--kd-temp", "4", "--kd-dw", "0.7", "--kd-sw", "0.3")
    train = ("-a", "simplenet_digits", *COMMON, *kd, "--compress", str(schedule), "-o", str(out))
    for name, epochs in (("full", "2"), ("first", "1")):
        result = run_cli(*train, "--epochs", epochs, "-n", name)
        assert result.returncode == 0, result.stderr
    resumed = run_cli("--resume-from", str(out / "first" / "checkpoint.pth.tar"), "--epochs", "2",
                      *COMMON, *kd, "--compress", str(schedule), "-o", str(out), "-n", "resumed")
    assert resumed.returncode == 0, resumed.stderr
    return {"out": out, "teacher": teacher, "full": out / "full", "first": out / "first",
            "resumed": out / "resumed"}


def test_kd_resume_is_bitwise_identical(runs: dict[str, Path]) -> None:
    full = load_checkpoint(runs["full"] / "checkpoint.pth.tar")
    resumed = load_checkpoint(runs["resumed"] / "checkpoint.pth.tar")
    for key in ("state_dict", "optimizer", "compression", "distillation"):
        _assert_tensors_equal(full[key], resumed[key], key)
    assert _metrics(runs["full"]) == _metrics(runs["resumed"])


def test_checkpoint_records_the_settings_not_the_teacher(runs: dict[str, Path]) -> None:
    checkpoint = torch.load(runs["full"] / "checkpoint.pth.tar", weights_only=True)
    record = checkpoint["distillation"]
    assert record["teacher_path"] == str(runs["teacher"])
    assert record["teacher_arch"] == "simplenet_digits" and len(record["teacher_sha256"]) == 64
    assert (record["temperature"], record["distill_weight"], record["student_weight"],
            record["start_epoch"]) == (4.0, 0.7, 0.3, 0)
    student = create_model("simplenet_digits", "digits")
    assert list(checkpoint["state_dict"]) == list(student.state_dict())
    assert checkpoint["model_attrs"] == {"width": 32}
    results = json.loads((runs["full"] / "results.json").read_text())
    assert results["sparsity"] > 0.1  # the schedule pruned while the teacher taught
    log = (runs["full"] / "log.txt").read_text()
    assert "re-preprocessed to (1, 8, 8), mean (0.5,), std (0.25,)" in log


def test_resume_refuses_another_teacher_file(runs: dict[str, Path]) -> None:
    other = _teacher(runs["out"] / "other.pth.tar", seed=2)
    result = run_cli("--resume-from", str(runs["first"] / "checkpoint.pth.tar"), "--epochs", "2",
                     *COMMON, "--kd-resume", str(other), "--kd-temp", "4", "--kd-dw", "0.7",
                     "--kd-sw", "0.3", "-o", str(runs["out"]), "-n", "other")
    assert_user_error(result, "distilled from the teacher", f"--kd-resume {runs['teacher']}")


def test_resume_without_the_kd_flags_is_refused(runs: dict[str, Path]) -> None:
    result = run_cli("--resume-from", str(runs["first"] / "checkpoint.pth.tar"), "--epochs", "2",
                     *COMMON, "-o", str(runs["out"]), "-n", "dropped")
    assert_user_error(result, "was distilled from epoch 0", f"--kd-resume {runs['teacher']}",
                      "--reset-optimizer")


@pytest.mark.parametrize("flags,fragments,runner", [
    # refused while parsing the command line: no need for a subprocess's torch import
    (("--kd-teacher", "simplenet_digits", "--kd-pretrained", "--kd-tw", "0.5"),
     ("--kd-teacher-wt is not supported",), run_main),
    (("--kd-teacher", "simplenet_digits"), ("needs weights", "--kd-pretrained"), run_main),
    (("--kd-temp", "4"), ("--kd-temperature sets how a teacher teaches", "--kd-resume"),
     run_main),
    (("--kd-start-epoch", "1"), ("--kd-start-epoch sets how a teacher teaches",), run_main),
    (("--kd-resume", "{five}"), ("predicts 5 classes", "student simplenet_digits predicts 10"),
     run_cli),
])
def test_refusals_are_one_line_errors(tmp_path: Path, flags: tuple[str, ...],
                                      fragments: tuple[str, ...],
                                      runner: Callable[..., CompletedProcess[str]]) -> None:
    five = _teacher(tmp_path / "five.pth.tar", seed=3, num_classes=5)
    flags = tuple(flag.replace("{five}", str(five)) for flag in flags)
    result = runner("-a", "simplenet_digits", "--epochs", "1", *COMMON, *flags,
                    "-o", str(tmp_path), "-n", "refused")
    assert_user_error(result, *fragments)
    assert not (tmp_path / "refused" / "checkpoint.pth.tar").exists()


def test_loss_defaults_are_the_parsers() -> None:
    """The 'given without a teacher' check compares with the parser's own defaults."""
    defaults = get_args_parser().parse_args([])
    for dest, default in KD_LOSS_DEFAULTS.values():
        assert getattr(defaults, dest) == default
