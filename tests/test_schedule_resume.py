"""A run resumed mid-schedule from a saved state ends bitwise identical to an uninterrupted one."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from compressor.schedule import build_scheduler
from tests.conftest import run_cli
from tests.test_pruning_pruners import run_schedule, tiny

SCHEDULE = {
    "pruners": {
        "agp": {"class": "AutomatedGradualPruner", "initial_sparsity": 0.1,
                "final_sparsity": 0.7, "weights": ["conv2.weight", "fc1.weight"]},
        "filters": {"class": "L2RankedStructureParameterPruner_AGP", "initial_sparsity": 0.1,
                    "final_sparsity": 0.5, "group_type": "Filters",
                    "weights": ["conv1.weight"]},
        "splice": {"class": "SplicingPruner", "low_thresh_mult": 0.9, "hi_thresh_mult": 1.1,
                   "sensitivity_multiplier": 0.05, "sensitivities": {"conv3.weight": 0.3}},
        "apoz": {"class": "ActivationAPoZRankedFilterPruner_AGP", "initial_sparsity": 0.1,
                 "final_sparsity": 0.3, "group_type": "Filters", "weights": ["fc2.weight"]}},
    "regularizers": {"l1": {"class": "L1Regularizer", "reg_regims": {"bn2.weight": 0.01}}},
    "lr_schedulers": {"lr": {"class": "ExponentialLR", "gamma": 0.7}},
    "policies": [
        {"pruner": {"instance_name": "agp"}, "starting_epoch": 0, "ending_epoch": 5,
         "frequency": 1},
        {"pruner": {"instance_name": "filters"}, "starting_epoch": 1, "ending_epoch": 5,
         "frequency": 2},
        {"pruner": {"instance_name": "splice", "args": {
            "keep_mask": True, "mini_batch_pruning_frequency": 1, "mask_on_forward_only": True}},
         "starting_epoch": 0, "ending_epoch": 4, "frequency": 1},
        {"pruner": {"instance_name": "apoz"}, "starting_epoch": 1, "ending_epoch": 5,
         "frequency": 1},
        {"regularizer": {"instance_name": "l1"}, "starting_epoch": 0, "ending_epoch": 6,
         "frequency": 1},
        {"lr_scheduler": {"instance_name": "lr"}, "starting_epoch": 0, "ending_epoch": 6,
         "frequency": 1}]}


def test_library_resume_is_bitwise_identical() -> None:
    full = tiny()
    run_schedule(full, SCHEDULE, epochs=6)

    first = tiny()
    sched, optimizer = run_schedule(first, SCHEDULE, epochs=3)
    buffer = io.BytesIO()
    torch.save({"model": first.state_dict(), "optimizer": optimizer.state_dict(),
                "compression": sched.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)

    resumed = tiny(seed=99)  # different initial weights: everything must come from the state
    resumed.load_state_dict(saved["model"])
    optimizer2 = torch.optim.SGD(resumed.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    optimizer2.load_state_dict(saved["optimizer"])
    sched2 = build_scheduler(SCHEDULE, resumed, optimizer2)
    sched2.load_state_dict(saved["compression"])
    run_schedule(resumed, SCHEDULE, epochs=6, start=3, scheduler=sched2, optimizer=optimizer2)

    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name
    assert full.conv2.weight.eq(0).float().mean() > 0.69


def test_state_for_a_different_schedule_is_refused() -> None:
    model = tiny()
    sched, _ = run_schedule(model, SCHEDULE, epochs=1)
    other = {"pruners": SCHEDULE["pruners"], "policies": SCHEDULE["policies"][:1]}
    with pytest.raises(Exception, match="does not match this schedule"):
        build_scheduler(other, model, torch.optim.SGD(model.parameters(), lr=0.1)
                        ).load_state_dict(sched.state_dict())


def _cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args, timeout=300)


def test_cli_agp_run_and_mid_schedule_resume(tmp_path: Path) -> None:
    schedule = tmp_path / "agp.yaml"
    schedule.write_text(yaml.safe_dump({
        "pruners": {"p": {"class": "AutomatedGradualPruner", "initial_sparsity": 0.2,
                          "final_sparsity": 0.6,
                          "weights": ["module.layer2.0.conv1.weight", "layer3.1.conv2.weight"]}},
        "lr_schedulers": {"l": {"class": "StepLR", "step_size": 1, "gamma": 0.5}},
        "policies": [{"pruner": {"instance_name": "p"}, "starting_epoch": 0,
                      "ending_epoch": 3, "frequency": 1},
                     {"lr_scheduler": {"instance_name": "l"}, "starting_epoch": 0,
                      "ending_epoch": 3, "frequency": 1}]}))
    common = ["-a", "resnet20_cifar", "--dataset", "synthetic", "-b", "32", "--etrs", "0.005",
              "--etes", "0.005", "--compress", str(schedule), "--deterministic", "--cpu",
              "-j", "0", "-o", str(tmp_path)]
    full = _cli(*common, "--epochs", "3", "-n", "full")
    assert full.returncode == 0, full.stderr
    half = _cli(*common, "--epochs", "2", "-n", "half")
    assert half.returncode == 0, half.stderr
    resumed = _cli(*common, "--epochs", "3", "-n", "resumed", "--resume-from",
                   str(tmp_path / "half" / "checkpoint.pth.tar"))
    assert resumed.returncode == 0, resumed.stderr
    a = torch.load(tmp_path / "full" / "checkpoint.pth.tar", weights_only=True)
    b = torch.load(tmp_path / "resumed" / "checkpoint.pth.tar", weights_only=True)
    for name, tensor in a["state_dict"].items():
        assert torch.equal(tensor, b["state_dict"][name]), name
    weight = a["state_dict"]["layer2.0.conv1.weight"]
    assert float(weight.eq(0).float().mean()) == pytest.approx(0.6, abs=0.002)
    assert a["optimizer"]["param_groups"][0]["lr"] == b["optimizer"]["param_groups"][0]["lr"]
    results = json.loads((tmp_path / "resumed" / "results.json").read_text())
    assert results["epoch"] == 2
