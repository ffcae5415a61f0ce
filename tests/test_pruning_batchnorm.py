"""Filter pruning silences the whole output channel (bias, following batch norm), so exact
thinning removes every pruned filter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from compressor.models import create_model
from compressor.schedule import build_scheduler, load_schedule
from compressor.thinning import thin_model
from tests.test_pruning_pruners import run_schedule, tiny

ROOT = Path(__file__).resolve().parents[1]


def _dead(weight: torch.Tensor) -> torch.Tensor:
    """True for every all-zero filter (row) of `weight`."""
    return weight.detach().flatten(1).abs().amax(dim=1).eq(0)


@pytest.mark.parametrize("cls, group_type, weight, coupled", [
    ("L1RankedStructureParameterPruner", "Filters", "conv1.weight", ["bn1.weight", "bn1.bias"]),
    ("L1RankedStructureParameterPruner", "Rows", "fc1.weight", ["fc1.bias"]),
    ("L2RankedStructureParameterPruner", "Channels", "conv2.weight", []),
])
def test_pruned_outputs_mask_their_bias_and_batchnorm(cls: str, group_type: str, weight: str,
                                                      coupled: list[str]) -> None:
    model = tiny()
    with torch.no_grad():  # shifts that a pruned channel would otherwise still emit
        model.bn1.bias.uniform_(0.5, 1.0)
        model.fc1.bias.uniform_(0.5, 1.0)
    doc = {"pruners": {"p": {"class": cls, "group_type": group_type, "desired_sparsity": 0.5,
                             "weights": [weight]}},
           "policies": [{"pruner": {"instance_name": "p"}, "epochs": [0]}]}
    sched, _ = run_schedule(model, doc, epochs=3)  # optimizer steps after the pruning epoch
    assert set(sched.masks) == {weight, *coupled}
    pruned = model.get_parameter(weight)
    dead = _dead(pruned.transpose(0, 1) if group_type == "Channels" else pruned)
    assert int(dead.sum()) == dead.numel() // 2
    for name in coupled:
        param = model.get_parameter(name).detach()
        assert param[dead].eq(0).all() and param[~dead].ne(0).all(), name
    if group_type == "Channels":  # input channels: the producer is left alone
        assert model.bn1.bias.detach().ne(0).all()


def test_batchnorm_masks_survive_a_resume() -> None:
    doc = {"pruners": {"p": {"class": "L1RankedStructureParameterPruner_AGP",
                             "initial_sparsity": 0.25, "final_sparsity": 0.5,
                             "group_type": "Filters", "weights": ["conv2.weight"]}},
           "policies": [{"pruner": {"instance_name": "p"}, "starting_epoch": 0,
                         "ending_epoch": 4, "frequency": 2}]}
    model = tiny()
    sched, _ = run_schedule(model, doc, epochs=3)
    state = sched.state_dict()
    dead = _dead(model.conv2.weight)
    assert int(dead.sum()) == 8
    resumed = tiny(seed=5)
    resumed.load_state_dict(model.state_dict())
    with torch.no_grad():
        resumed.bn2.bias.fill_(1.0)  # as if the saved weights had drifted
    optimizer = torch.optim.SGD(resumed.parameters(), lr=0.05, momentum=0.9)
    sched2 = build_scheduler(doc, resumed, optimizer)
    sched2.load_state_dict(state)
    assert resumed.bn2.bias.detach()[dead].eq(0).all()
    assert resumed.bn2.weight.detach()[dead].eq(0).all()


def test_resnet20_filters50_thins_every_pruned_filter_exactly() -> None:
    torch.manual_seed(0)
    model = create_model("resnet20_cifar", "cifar10")
    with torch.no_grad():  # non-zero shifts, as after training
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.bias.uniform_(-0.3, 0.3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    sched = load_schedule(ROOT / "configs/filters/resnet20_cifar_filters50.yaml", model,
                          optimizer)
    for epoch in (0, 18):  # the first pruning epoch, then the last one (final sparsity 0.5)
        sched.on_epoch_begin(epoch)
        model.train()
        for batch in range(2):
            sched.on_minibatch_begin(epoch, batch, 2)
            loss = F.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.randint(0, 10, (4,)))
            optimizer.zero_grad()
            loss.backward()
            sched.before_parameter_optimization(epoch, batch, 2)
            optimizer.step()
            sched.on_minibatch_end(epoch, batch, 2)
    blocks = [*model.layer1, *model.layer2, *model.layer3]
    kept = [int((~_dead(block.conv1.weight)).sum()) for block in blocks]
    assert kept == [8, 8, 8, 16, 16, 16, 32, 32, 32]
    model.eval()
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        masked = model(x)
    recipe = thin_model(model, exact=True)
    assert [block.conv1.out_channels for block in blocks] == kept
    assert [block.bn1.num_features for block in blocks] == kept
    assert [block.conv2.in_channels for block in blocks] == kept
    removed = {name: len(e["out"]) for name, e in recipe["modules"].items()
               if e["type"] == "Conv2d" and e["out"]}
    assert removed == {f"layer{stage}.{i}.conv1": 8 * 2 ** (stage - 1)
                       for stage in (1, 2, 3) for i in range(3)}
    with torch.no_grad():
        torch.testing.assert_close(model(x), masked, atol=1e-5, rtol=0)
