"""Every schedule error is one line naming the file, the entry and the fix; names resolve."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from compressor.models.factory import create_model
from compressor.schedule import build_scheduler, load_schedule
from compressor.utils.errors import ScheduleError
from tests.conftest import run_cli
from tests.test_pruning_pruners import tiny

AGP = {"class": "AutomatedGradualPruner", "initial_sparsity": 0.1, "final_sparsity": 0.5,
       "weights": ["conv2.weight"]}
POLICY = {"pruner": {"instance_name": "p"}, "starting_epoch": 0, "ending_epoch": 4,
          "frequency": 1}


def build(doc: dict):
    """Build against the Tiny model."""
    model = tiny()
    return build_scheduler(doc, model, torch.optim.SGD(model.parameters(), lr=0.1), "s.yaml")


def with_pruner(**changes) -> dict:
    """A valid one-pruner schedule with the pruner entry changed."""
    entry = {**AGP, **changes}
    return {"version": 1, "pruners": {"p": {k: v for k, v in entry.items() if v is not None}},
            "policies": [POLICY]}


@pytest.mark.parametrize("doc, fragments", [
    (with_pruner(**{"class": "AutomaticGradualPruner"}),
     ["pruners.p", "unknown class 'AutomaticGradualPruner'", "AutomatedGradualPruner"]),
    (with_pruner(final_sparsit=0.5), ["pruners.p", "unknown key 'final_sparsit'"]),
    (with_pruner(weights=["layer9.conv.weight"]),
     ["pruners.p", "'layer9.conv.weight'", "matches nothing"]),
    (with_pruner(final_sparsity=1.0), ["pruners.p", "final_sparsity", "outside [0.0, 1.0)"]),
    (with_pruner(initial_sparsity=-0.1), ["initial_sparsity", "outside"]),
    (with_pruner(initial_sparsity=0.6), ["final_sparsity 0.5 is below initial_sparsity 0.6"]),
    (with_pruner(weights=[]), ["'weights' must be a non-empty list"]),
    ({"pruners": {"p": AGP}, "policies": [{**POLICY, "ending_epoch": 0}]},
     ["policies[0]", "ending_epoch 0 is not after starting_epoch 0"]),
    ({"pruners": {"p": AGP}, "policies": [{**POLICY, "pruner": {"instance_name": "q"}}]},
     ["policies[0].pruner", "instance 'q' is not defined", "defined: p"]),
    ({"pruners": {"p": AGP}, "policies": [{**POLICY, "frequncy": 2}]},
     ["policies[0]", "unknown key 'frequncy'"]),
    ({"pruners": {"p": AGP}, "policies": [{**POLICY, "pruner": {
        "instance_name": "p", "args": {"keep_masks": True}}}]},
     ["policies[0].pruner.args", "unknown key 'keep_masks'"]),
    ({"pruners": {"p": AGP}, "polices": []}, ["top level", "unknown key 'polices'"]),
    ({"quantizers": {"q": {"class": "DorefaQuantizer", "bits_weights": 40}}},
     ["quantizers.q", "bits_weights", "40"]),
    ({"quantizers": {"q": {"class": "RangeLinearQuantizer"}}},
     ["quantizers.q", "retired in Distiller 0.3"]),
    ({"regularizers": {"p": AGP}}, ["belongs under 'pruners'"]),
    ({"regularizers": {"r": {"class": "GroupLassoRegularizer",
                             "reg_regims": {"conv2.weight": [0.1, "Rows"]}}}},
     ["regularizers.r", "conv2.weight"]),
    ({"lr_schedulers": {"l": {"class": "StepLR", "gama": 0.1, "step_size": 2}}},
     ["lr_schedulers.l", "unknown key 'gama'"]),
    ({"pruners": {"p": {"class": "L1RankedStructureParameterPruner", "desired_sparsity": 0.5,
                        "group_type": "Rows", "weights": ["conv2.weight"]}}},
     ["pruners.p", "Rows"]),
    ({"version": 2}, ["version 2 is not supported"]),
])
def test_validation_errors_name_file_entry_and_fix(doc: dict, fragments: list[str]) -> None:
    with pytest.raises(ScheduleError) as info:
        build(doc)
    message = str(info.value)
    assert "\n" not in message and message.startswith("s.yaml: ")
    assert "; " in message  # problem; fix
    for fragment in fragments:
        assert fragment in message


def test_distiller_name_forms_resolve_to_the_unwrapped_model() -> None:
    model = create_model("vgg11_cifar", "cifar10")
    doc = {"pruners": {"p": {**AGP, "weights": ["features.module.0.weight",
                                                "module.classifier.weight"]}},
           "policies": [POLICY]}
    sched = build_scheduler(doc, torch.nn.DataParallel(model),
                            torch.optim.SGD(model.parameters(), lr=0.1))
    assert sched.policies[0].pruner.weights == ("features.0.weight", "classifier.weight")


def test_unused_instance_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    build({"pruners": {"p": AGP}, "policies": []})
    assert "'p' is defined but no policy uses it" in caplog.text


def test_load_schedule_file_errors(tmp_path: Path) -> None:
    model = tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ScheduleError, match="cannot read the schedule"):
        load_schedule(tmp_path / "missing.yaml", model, optimizer)
    bad = tmp_path / "bad.yaml"
    bad.write_text("pruners:\n  p: [1, 2\n")
    with pytest.raises(ScheduleError, match=r"bad.yaml: invalid YAML at line \d"):
        load_schedule(bad, model, optimizer)
    unsafe = tmp_path / "unsafe.yaml"
    unsafe.write_text("pruners: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ScheduleError, match="invalid YAML"):
        load_schedule(unsafe, model, optimizer)


def test_cli_reports_schedule_errors_with_exit_status_2(tmp_path: Path) -> None:
    schedule = tmp_path / "typo.yaml"
    schedule.write_text(yaml.safe_dump(with_pruner(weights=["module.layer1.0.conv9.weight"])))
    result = run_cli(
        "-a", "resnet20_cifar", "--dataset", "synthetic", "--compress", str(schedule),
        "--dry-run", "--cpu", "-o", str(tmp_path / "runs"), timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "typo.yaml: pruners.p:" in lines[0] and "module.layer1.0.conv9.weight" in lines[0]
    assert "did you mean layer1.0.conv" in lines[0]
