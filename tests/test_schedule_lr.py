"""LR schedulers follow Distiller's closed forms; the dry run previews targets and rates."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

from compressor.schedule import build_scheduler, format_dry_run
from tests.conftest import run_cli
from tests.test_pruning_pruners import tiny


def lr_schedule(entry: dict, start: int = 0, end: int = 100, lr: float = 1.0):
    """A scheduler with one LR policy, and its optimizer."""
    model = tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    doc = {"lr_schedulers": {"l": entry},
           "policies": [{"lr_scheduler": {"instance_name": "l"}, "starting_epoch": start,
                         "ending_epoch": end, "frequency": 1}]}
    return build_scheduler(doc, model, optimizer), optimizer


def rates(entry: dict, epochs: int, start: int = 0, metrics=None) -> list[float]:
    """The learning rate used in each epoch."""
    sched, optimizer = lr_schedule(entry, start)
    seen = []
    for epoch in range(epochs):
        seen.append(optimizer.param_groups[0]["lr"])
        values = metrics(epoch) if metrics else {"loss": 1.0, "top1": 1.0}
        sched.on_epoch_end(epoch, metrics=values)
    return seen


@pytest.mark.parametrize("entry, expected", [
    ({"class": "StepLR", "step_size": 2, "gamma": 0.5}, [1, 1, .5, .5, .25, .25]),
    ({"class": "MultiStepLR", "milestones": [1, 4], "gamma": 0.1}, [1, .1, .1, .1, .01, .01]),
    ({"class": "MultiStepMultiGammaLR", "milestones": [2, 3], "gammas": [0.1, 0.5]},
     [1, 1, .1, .05, .05, .05]),
    ({"class": "ExponentialLR", "gamma": 0.5}, [1, .5, .25, .125, .0625, .03125]),
    ({"class": "CosineAnnealingLR", "T_max": 4},
     [(1 + math.cos(math.pi * e / 4)) / 2 for e in range(6)]),
])
def test_closed_form_rates(entry: dict, expected: list[float]) -> None:
    assert rates(entry, 6) == pytest.approx(expected)


def test_policy_starting_late_jumps_to_the_absolute_epoch_rate() -> None:
    # Distiller sets lr(epoch + 1) from the closed form once the policy is active.
    assert rates({"class": "ExponentialLR", "gamma": 0.5}, 5, start=2) == pytest.approx(
        [1, 1, 1, 0.125, 0.0625])


def test_reduce_on_plateau_reads_the_validation_loss() -> None:
    entry = {"class": "ReduceLROnPlateau", "patience": 1, "factor": 0.1}
    seen = rates(entry, 6, metrics=lambda epoch: {"loss": 1.0, "top1": 0.0})
    assert seen[:3] == [1.0, 1.0, 1.0] and seen[3] == pytest.approx(0.1)


def test_lr_state_survives_a_rebuilt_optimizer() -> None:
    sched, optimizer = lr_schedule({"class": "StepLR", "step_size": 1, "gamma": 0.5})
    sched.on_epoch_end(0)
    state = sched.state_dict()
    sched2, optimizer2 = lr_schedule({"class": "StepLR", "step_size": 1, "gamma": 0.5}, lr=0.5)
    sched2.load_state_dict(state)
    sched2.on_epoch_end(1)
    assert optimizer2.param_groups[0]["lr"] == pytest.approx(0.25)


def table_cells(text: str) -> list[list[str]]:
    """The body cells of a github-format table."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.split("|")[1:-1]] for line in lines[2:]]


def test_dry_run_lists_targets_and_rates() -> None:
    model = tiny()
    doc = {"pruners": {"agp": {"class": "AutomatedGradualPruner", "initial_sparsity": 0.1,
                               "final_sparsity": 0.7, "weights": ["conv2.weight"]}},
           "lr_schedulers": {"lr": {"class": "StepLR", "step_size": 3, "gamma": 0.1}},
           "policies": [{"pruner": {"instance_name": "agp"}, "starting_epoch": 0,
                         "ending_epoch": 5, "frequency": 2},
                        {"lr_scheduler": {"instance_name": "lr"}, "starting_epoch": 0,
                         "ending_epoch": 10, "frequency": 1}]}
    sched = build_scheduler(doc, model, torch.optim.SGD(model.parameters(), lr=0.2))
    before = model.conv2.weight.detach().clone()
    text = format_dry_run(sched, 6)
    rows = table_cells(text)
    assert rows[0] == ["0", "0.2", "0.1000"]
    assert rows[1] == ["1", "0.2", ""]
    assert float(rows[2][2]) == pytest.approx(0.7 + (0.1 - 0.7) * 0.5 ** 3, abs=1e-4)
    assert float(rows[3][1]) == pytest.approx(0.02) and float(rows[4][2]) == 0.7
    # The preview changes nothing.
    assert torch.equal(model.conv2.weight, before) and sched.optimizer.param_groups[0]["lr"] == 0.2


def test_cli_dry_run_needs_no_data(tmp_path: Path) -> None:
    schedule = tmp_path / "agp.yaml"
    schedule.write_text(yaml.safe_dump({
        "pruners": {"p": {"class": "AutomatedGradualPruner", "initial_sparsity": 0.05,
                          "final_sparsity": 0.8, "weights": ["module.layer1.0.conv1.weight"]}},
        "lr_schedulers": {"l": {"class": "ExponentialLR", "gamma": 0.5}},
        "policies": [{"pruner": {"instance_name": "p"}, "starting_epoch": 0,
                      "ending_epoch": 3, "frequency": 1},
                     {"lr_scheduler": {"instance_name": "l"}, "starting_epoch": 0,
                      "ending_epoch": 3, "frequency": 1}]}))
    result = run_cli(
        "-a", "resnet20_cifar", "--compress", str(schedule), "--dry-run", "--lr", "0.4",
        "--epochs", "4", "--cpu", "-o", str(tmp_path / "runs"), timeout=120)
    assert result.returncode == 0, result.stderr
    assert table_cells(result.stdout) == [["0", "0.4", "0.0500"], ["1", "0.2", "0.7063"],
                                          ["2", "0.1", "0.8000"], ["3", "0.05", ""]]
    assert not (tmp_path / "runs").exists()


def test_step_follows_torchs_api() -> None:
    sched, optimizer = lr_schedule({"class": "StepLR", "step_size": 2, "gamma": 0.5})
    lr = sched.policies[0].scheduler
    assert lr.last_epoch == 0  # as a torch scheduler after construction
    lr.step()
    lr.step()
    assert lr.last_epoch == 2 and optimizer.param_groups[0]["lr"] == pytest.approx(0.5)
    assert lr.get_last_lr() == pytest.approx([0.5])
    lr.step(5)  # torch's closed-form form: jump to an absolute epoch
    assert lr.last_epoch == 5 and optimizer.param_groups[0]["lr"] == pytest.approx(0.25)
    plateau, optimizer = lr_schedule({"class": "ReduceLROnPlateau", "patience": 0})
    reducer = plateau.policies[0].scheduler
    reducer.step(1.0)
    reducer.step(2.0)  # torch's step(metrics): worse than the best, no patience left
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1) and reducer.last_epoch == 2
