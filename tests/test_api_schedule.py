"""cz.compression_scheduler in one's own training loop: the command line's CompressionScheduler,
with Distiller's callbacks, so a plain PyTorch loop computes exactly what the CLI computes."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

import compressor as cz
from compressor.data import load_datasets
from compressor.schedule.scheduler import PolicyLoss
from compressor.training.dataloaders import epoch_seed, eval_loader, seed_everything, train_loader
from compressor.utils.dataset_table import DATASET_SPECS
from compressor.utils.distributed import DistContext
from compressor.utils.errors import ScheduleError, UsageError
from tests.conftest import run_cli

# A model of the user's own, as a file the CLI imports with -a model.py:Net.
MODEL_CODE = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(x.flatten(1))
'''

# AGP on two layers, an L1 regularizer (a loss term) and a step LR: every kind of callback acts
SCHEDULE = {
    "version": 1,
    "pruners": {"agp": {"class": "AutomatedGradualPruner", "initial_sparsity": 0.1,
                        "final_sparsity": 0.6, "weights": ["conv2.weight", "fc.weight"]}},
    "regularizers": {"l1": {"class": "L1Regularizer", "reg_regims": {"conv1.weight": 0.001}}},
    "lr_schedulers": {"step": {"class": "StepLR", "step_size": 2, "gamma": 0.5}},
    "policies": [
        {"pruner": {"instance_name": "agp"}, "starting_epoch": 0, "ending_epoch": 3,
         "frequency": 1},
        {"regularizer": {"instance_name": "l1"}, "starting_epoch": 0, "ending_epoch": 3,
         "frequency": 1},
        {"lr_scheduler": {"instance_name": "step"}, "starting_epoch": 0, "ending_epoch": 3,
         "frequency": 1},
    ],
}
SEED, EPOCHS, BATCH, LR, MOMENTUM, WD = 7, 3, 64, 0.1, 0.9, 1e-4


def user_model(tmp_path: Path) -> type[nn.Module]:
    """The Net class of model.py (the file the CLI is given)."""
    (tmp_path / "model.py").write_text(MODEL_CODE)
    return runpy.run_path(str(tmp_path / "model.py"))["Net"]


def train_with_callbacks(model: nn.Module, schedule_path: Path) -> cz.CompressionScheduler:
    """A plain PyTorch loop, written as for Distiller, on the CLI's digits split and order."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    scheduler = cz.compression_scheduler(schedule_path, model, optimizer, seed=SEED)
    data = load_datasets("digits", None, DATASET_SPECS["digits"].input_spec,
                         validation_split=0.0, seed=SEED, num_classes=10)
    cpu = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    criterion = nn.CrossEntropyLoss()
    for epoch in range(EPOCHS):
        seed_everything(epoch_seed(SEED, epoch))
        scheduler.on_epoch_begin(epoch, optimizer)
        loader = train_loader(data.train, BATCH, 0, SEED, epoch, cpu)
        model.train()
        for i, (x, y) in enumerate(loader):
            scheduler.on_minibatch_begin(epoch, i, len(loader), optimizer)
            loss = criterion(model(x), y)
            loss = scheduler.before_backward_pass(epoch, i, len(loader), loss,
                                                  optimizer=optimizer)
            optimizer.zero_grad()
            loss.backward()
            scheduler.before_parameter_optimization(epoch, i, len(loader), optimizer)
            optimizer.step()
            scheduler.on_minibatch_end(epoch, i, len(loader), optimizer)
        metrics = cz.evaluate(model, eval_loader(data.test, BATCH, 0, cpu))
        scheduler.on_epoch_end(epoch, optimizer, metrics={"min": metrics["loss"],
                                                          "max": metrics["top1"]})
    return scheduler


def test_own_loop_computes_what_the_cli_computes(tmp_path: Path, one_thread: None) -> None:
    net = user_model(tmp_path)
    torch.manual_seed(0)
    initial = net(num_classes=10)
    torch.save(initial.state_dict(), tmp_path / "init.pth")
    schedule_path = tmp_path / "agp.yaml"
    schedule_path.write_text(yaml.safe_dump(SCHEDULE))
    result = run_cli("-a", f"{tmp_path / 'model.py'}:Net", "--dataset", "digits",
                     "--compress", str(schedule_path), "--epochs", str(EPOCHS), "-b", str(BATCH),
                     "--lr", str(LR), "--momentum", str(MOMENTUM), "--wd", str(WD), "--det",
                     "--seed", str(SEED), "-j", "0", "--vs", "0",
                     # the loop below is the schedule's callbacks alone: the CLI's batch-norm
                     # re-estimation of short epochs is off to compare them bit for bit
                     "--bn-recalibrate", "0",
                     "--exp-load-weights-from", str(tmp_path / "init.pth"),
                     "-o", str(tmp_path / "logs"), "-n", "cli")
    assert result.returncode == 0, result.stderr[-3000:]
    cli = torch.load(tmp_path / "logs" / "cli" / "checkpoint.pth.tar", weights_only=True)

    model = net(num_classes=10)
    model.load_state_dict(torch.load(tmp_path / "init.pth", weights_only=True))
    scheduler = train_with_callbacks(model, schedule_path)

    ours = scheduler.state_dict()["policies"]
    theirs = cli["compression"]["policies"]
    assert set(ours[0]["masks"]) == {"conv2.weight", "fc.weight"}
    for name, mask in ours[0]["masks"].items():
        assert torch.equal(mask, theirs[0]["masks"][name]), name
    assert 0.55 < 1 - float(ours[0]["masks"]["fc.weight"].mean()) < 0.65  # AGP's final 0.6
    # one process, one thread, the same operations in the same order: bit for bit
    state = model.state_dict()
    assert set(state) == set(cli["state_dict"])
    for name, tensor in cli["state_dict"].items():
        assert torch.equal(state[name], tensor), name
    assert scheduler.optimizer.param_groups[0]["lr"] == pytest.approx(LR * 0.5)


def tiny() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


def l1_schedule() -> dict:
    return {"regularizers": {"l1": {"class": "L1Regularizer", "reg_regims": {"0.weight": 0.5}}},
            "policies": [{"regularizer": {"instance_name": "l1"}, "starting_epoch": 0,
                          "ending_epoch": 1, "frequency": 1}]}


def test_before_backward_pass_returns_the_loss_with_its_terms_as_distiller_does() -> None:
    model = tiny()
    scheduler = cz.compression_scheduler(l1_schedule(), model, torch.optim.Adam(model.parameters()))
    loss = torch.tensor(2.0)
    total = scheduler.before_backward_pass(0, 0, 1, loss)
    expected = 0.5 * model[0].weight.abs().sum()
    assert torch.allclose(total, loss + expected)
    parts = scheduler.before_backward_pass(0, 0, 1, loss, return_loss_components=True)
    assert isinstance(parts, PolicyLoss)
    assert [component.name for component in parts.loss_components] == ["L1Regularizer_loss"]
    assert torch.allclose(parts.loss_components[0].value, expected)
    assert scheduler.before_backward_pass(1, 0, 1, loss) is loss  # outside the policy's epochs


def test_a_torchvision_model_with_adam_prunes_from_a_dict() -> None:
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(num_classes=4)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    doc = {"pruners": {"p": {"class": "MagnitudeParameterPruner",
                             "thresholds": {"module.layer1.0.conv1.weight": 0.05}}},
           "policies": [{"pruner": {"instance_name": "p"}, "epochs": [0]}]}
    scheduler = cz.compression_scheduler(doc, model, optimizer)
    scheduler.on_epoch_begin(0)
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([0, 3])
    scheduler.on_minibatch_begin(0, 0, 1)
    loss = scheduler.before_backward_pass(0, 0, 1, nn.functional.cross_entropy(model(x), y))
    optimizer.zero_grad()
    loss.backward()
    scheduler.before_parameter_optimization(0, 0, 1)
    optimizer.step()
    scheduler.on_minibatch_end(0, 0, 1)
    scheduler.on_epoch_end(0)
    weight = model.layer1[0].conv1.weight
    assert torch.equal(weight == 0, scheduler.masks["layer1.0.conv1.weight"] == 0)
    assert (weight == 0).any()


def test_bad_schedules_raise_the_clis_one_line_errors(tmp_path: Path) -> None:
    model = tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    bad = {"pruners": {"p": {"class": "AutomaticGradualPruner"}}}
    with pytest.raises(ScheduleError, match="did you mean 'AutomatedGradualPruner'"):
        cz.compression_scheduler(bad, model, optimizer)
    with pytest.raises(ScheduleError, match=r"missing\.yaml: cannot read the schedule"):
        cz.compression_scheduler(tmp_path / "missing.yaml", model, optimizer)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"regularizers": {"l1": {
        "class": "L1Regularizer", "reg_regims": {"conv9.weight": 0.1}}}}))
    with pytest.raises(ScheduleError) as raised:
        cz.compression_scheduler(tmp_path / "bad.yaml", model, optimizer)
    assert str(raised.value).startswith(f"{tmp_path / 'bad.yaml'}: ")
    assert "\n" not in str(raised.value)
    with pytest.raises(ScheduleError, match="pass example_inputs"):
        cz.compression_scheduler({"extensions": {"t": {"class": "FilterRemover",
                                          "thinning_func_str": "remove_filters"}}},
                    model, optimizer)
    with pytest.raises(UsageError, match="not a torch optimizer"):
        cz.compression_scheduler(l1_schedule(), model, "sgd")  # type: ignore[arg-type]


def test_the_optimizer_passed_to_a_callback_must_be_the_schedules() -> None:
    model = tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = cz.compression_scheduler(l1_schedule(), model, optimizer)
    other = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(UsageError, match="not the one the schedule was built with"):
        scheduler.on_minibatch_end(0, 0, 1, other)
    with pytest.raises(UsageError, match="pass metrics as a keyword"):
        scheduler.on_epoch_end(0, {"loss": 1.0})  # type: ignore[arg-type]
