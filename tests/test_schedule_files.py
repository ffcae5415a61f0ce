"""Whatever file --compress names, a failure to read or parse it is one ScheduleError line that
names the file; odd values inside a parsed schedule are refused the same way, quickly."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import torch
import yaml

from compressor.schedule import build_scheduler, load_schedule
from compressor.utils.errors import ScheduleError
from tests.test_pruning_pruners import tiny


def schedule_error(path: Path) -> str:
    """The one-line message load_schedule raises for `path`."""
    model = tiny()
    with pytest.raises(ScheduleError) as info:
        load_schedule(path, model, torch.optim.SGD(model.parameters(), lr=0.1))
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ") and "; " in message
    return message


def test_random_bytes(tmp_path: Path) -> None:
    path = tmp_path / "noise.yaml"
    path.write_bytes(random.Random(0).randbytes(4096))
    assert "not a text file" in schedule_error(path)


def test_binary_file_that_is_valid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "model.pth"
    path.write_bytes(b"PK\x03\x04\x00\x00archive/data.pkl\x00\x01\x02")
    assert "invalid YAML" in schedule_error(path)


@pytest.mark.parametrize("seed", range(8))
def test_random_printable_text(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = tmp_path / "garbage.yaml"
    path.write_text("".join(rng.choice(":-[]{}&*!|>'\"%@`#,? \n\tab1") for _ in range(300)))
    schedule_error(path)


def test_directory(tmp_path: Path) -> None:
    assert "is a directory" in schedule_error(tmp_path)


def test_missing_file(tmp_path: Path) -> None:
    assert "cannot read the schedule" in schedule_error(tmp_path / "missing.yaml")


@pytest.mark.parametrize("text, fragment", [
    ("", "the schedule is empty"),
    ("# only a comment\n", "the schedule is empty"),
    ("- pruner: p\n- pruner: q\n", "the top level is a list, not a mapping"),
    ("just a sentence\n", "the top level is a str, not a mapping"),
    ("[" * 600 + "]" * 600, "nested too deeply"),
    ("version: 1\npruners:\n  p: {class: AutomatedGradualPruner}\n  date: 2001-13-45\n",
     "invalid YAML value"),
    ("version: !!int 'one'\n", "invalid YAML value"),
    ("pruners:\n  p: [1, 2\n", "invalid YAML at line"),
    ("? [a, b]\n: 1\n", "invalid YAML at line"),
])
def test_unparsable_or_non_mapping_yaml(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    assert fragment in schedule_error(path)


def test_huge_shared_yaml_value_gives_a_short_message_fast(tmp_path: Path) -> None:
    # Aliases share one list a million names long: the message must not spell it out.
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 6)]
    doc = yaml.safe_load("\n".join(lines))
    start = time.perf_counter()
    with pytest.raises(ScheduleError) as info:
        build(pruners={"p": {"class": "AutomatedGradualPruner", "initial_sparsity": 0.1,
                             "final_sparsity": 0.5, "weights": [doc["a5"]]}})
    assert time.perf_counter() - start < 1.0
    assert len(str(info.value)) < 400 and "not a parameter name" in str(info.value)


def build(**sections: object):
    """Build a schedule of `sections` against the Tiny model."""
    model = tiny()
    return build_scheduler(dict(sections), model, torch.optim.SGD(model.parameters(), lr=0.1),
                           "s.yaml")


@pytest.mark.parametrize("entry, fragment", [
    ({"class": "StepLR", "step_size": 0}, "'step_size' is 0, outside"),
    ({"class": "StepLR", "step_size": "ten"}, "'step_size' must be an integer"),
    ({"class": "CosineAnnealingLR", "T_max": float("inf")}, "'T_max' must be an integer"),
    ({"class": "MultiStepLR", "milestones": 30}, "'milestones' is 30"),
    ({"class": "MultiStepLR", "milestones": [10, "x"]}, "'milestones' must be an integer"),
    ({"class": "ReduceLROnPlateau", "patience": "x"}, "'patience' must be an integer"),
    ({"class": "ReduceLROnPlateau", "mode": "up"}, "'mode' is 'up'"),
    ({"class": "MultiStepMultiGammaLR", "milestones": [1, 2], "gammas": [0.1]},
     "invalid arguments for MultiStepMultiGammaLR"),
])
def test_lr_scheduler_arguments_are_checked_when_loading(entry: dict, fragment: str) -> None:
    with pytest.raises(ScheduleError, match="lr_schedulers.l") as info:
        build(lr_schedulers={"l": entry})
    assert fragment in str(info.value)


def test_far_epochs_are_refused() -> None:
    agp = {"class": "AutomatedGradualPruner", "initial_sparsity": 0.1, "final_sparsity": 0.5,
           "weights": ["conv2.weight"]}
    with pytest.raises(ScheduleError, match="'ending_epoch' is 1000000000000, outside"):
        build(pruners={"p": agp}, policies=[{"pruner": {"instance_name": "p"},
                                             "starting_epoch": 0, "ending_epoch": 10 ** 12}])
