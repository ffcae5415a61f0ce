"""Pruners' randomness is derived from (run seed, epoch, minibatch, pruner): never from the global
generator, which training seeds per rank; APoZ statistics stay on the device; filter pruning of
a model torch.fx cannot trace fails when the schedule is loaded."""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from compressor.pruning import (
    ActivationAPoZRankedFilterPruner,
    BernoulliFilterPruner,
    RandomLevelStructureParameterPruner,
)
from compressor.pruning.base import PruneStep
from compressor.schedule import build_scheduler
from compressor.utils import distributed
from compressor.utils.distributed import (
    ReplicaMismatchError,
    checksum,
    shared_generator,
    verify_identical,
)
from compressor.utils.errors import ScheduleError
from tests.test_pruning_pruners import run_schedule, tiny


def _masks(pruner, model: nn.Module, step: PruneStep) -> dict[str, torch.Tensor]:
    return pruner.compute_masks(dict(model.named_parameters()), step)


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_bernoulli_masks_ignore_the_global_generator_and_follow_seed_epoch_minibatch() -> None:
    model = tiny()
    pruner = BernoulliFilterPruner("b", ["conv1.weight", "conv2.weight"], level=0.5)
    pruner.attach(model)

    def masks(seed: int = 7, epoch: int = 3, minibatch: int = 0, global_seed: int = 0):
        torch.manual_seed(global_seed)  # what training does, per epoch *and rank*
        return _masks(pruner, model, PruneStep(epoch, 0, 10, 1, model, seed=seed,
                                               minibatch=minibatch))

    reference = masks()
    assert _equal(reference, masks(global_seed=12345))  # another rank: the same masks
    assert _equal(reference, masks())  # derived, not stateful: a resume draws the same
    for other in (masks(seed=8), masks(epoch=4), masks(minibatch=5)):
        assert not _equal(reference, other)


def test_random_level_ignores_the_global_generator_and_follows_seed_epoch_minibatch() -> None:
    pruner = RandomLevelStructureParameterPruner("r", ["conv2.weight"], group_type="Filters",
                                                 sparsity_range=[0.1, 0.9])

    def level(seed: int = 7, epoch: int = 3, minibatch: int = 0, global_seed: int = 0) -> float:
        torch.manual_seed(global_seed)
        return pruner.level(PruneStep(epoch, 0, 10, 1, seed=seed, minibatch=minibatch))

    reference = level()
    assert 0.1 <= reference <= 0.9
    assert reference == level(global_seed=12345) == level()
    assert len({reference, level(seed=8), level(epoch=4), level(minibatch=5)}) == 4


def test_pruners_with_equal_steps_but_different_names_draw_differently() -> None:
    model = tiny()
    step = PruneStep(0, 0, 10, 1, model, seed=1)
    a = BernoulliFilterPruner("a", ["conv2.weight"], level=0.5)
    b = BernoulliFilterPruner("b", ["conv2.weight"], level=0.5)
    assert not _equal(_masks(a, model, step), _masks(b, model, step))


def test_shared_generator_is_keyed_not_stateful() -> None:
    first = torch.rand(4, generator=shared_generator(3, "x", 1))
    assert torch.equal(first, torch.rand(4, generator=shared_generator(3, "x", 1)))
    assert not torch.equal(first, torch.rand(4, generator=shared_generator(3, "x", 2)))
    assert not torch.equal(first, torch.rand(4, generator=shared_generator(3, "x1")))


def test_checksum_sees_positions_not_just_counts() -> None:
    mask = torch.zeros(3000)
    mask[:10] = 1
    moved = mask.roll(1)
    assert checksum(mask).dtype == torch.float64
    assert float(checksum(mask)) != float(checksum(moved))
    assert float(checksum(mask)) == float(checksum(mask.clone()))
    verify_identical({"m": mask}, "masks", torch.device("cpu"))  # alone: nothing to compare


def test_masks_that_differ_across_ranks_stop_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two ranks simulated in one process: the all-reduce (MAX) sees the other rank's vector.
    monkeypatch.setattr(distributed, "is_distributed", lambda: True)
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    other: list[torch.Tensor] = []
    monkeypatch.setattr(distributed.dist, "all_reduce",
                        lambda tensor, op: other.append(tensor.clone()))

    def masks(rank: int) -> dict[str, torch.Tensor]:
        mask = torch.ones(40)
        mask[rank] = 0.0  # what a rank-seeded random pruner does
        return {"0:same:fc.weight": torch.ones(3), "1:drop:conv.weight": mask}

    verify_identical(masks(1), "masks", torch.device("cpu"), "at epoch 5")  # records rank 1
    monkeypatch.setattr(distributed.dist, "all_reduce",
                        lambda tensor, op: tensor.copy_(torch.maximum(tensor, other[0])))
    verify_identical(masks(1), "masks", torch.device("cpu"), "at epoch 5")  # agree: passes
    with pytest.raises(ReplicaMismatchError) as info:
        verify_identical(masks(0), "masks", torch.device("cpu"), "at epoch 5")
    message = str(info.value)
    assert "masks differ across the 2 ranks at epoch 5 (1 differ" in message, message
    assert "'1:drop:conv.weight'" in message and "shared_generator" in message


def test_scheduler_passes_its_seed_to_the_pruners() -> None:
    doc = {"pruners": {"b": {"class": "BernoulliFilterPruner", "desired_sparsity": 0.5,
                             "group_type": "Filters", "weights": ["conv2.weight"]}},
           "policies": [{"pruner": {"instance_name": "b"}, "epochs": [0]}]}

    def masks(seed: int, global_seed: int) -> torch.Tensor:
        model = tiny()
        sched = build_scheduler(doc, model, torch.optim.SGD(model.parameters(), lr=0.1),
                                seed=seed)
        torch.manual_seed(global_seed)
        sched.on_epoch_begin(0)
        return sched.masks["conv2.weight"]

    assert torch.equal(masks(1, 0), masks(1, 99))
    assert not torch.equal(masks(1, 0), masks(2, 0))


# -- APoZ statistics --------------------------------------------------------------------------

def _apoz(model: nn.Module) -> ActivationAPoZRankedFilterPruner:
    pruner = ActivationAPoZRankedFilterPruner("a", ["conv1.weight", "conv2.weight"],
                                              initial_sparsity=0.25, final_sparsity=0.25)
    pruner.attach(model)
    return pruner


def test_apoz_hook_accumulates_on_the_activation_device_without_host_transfers() -> None:
    # On the meta device any host transfer (.cpu(), .item(), float()) raises: the hook may
    # only launch device work.
    model = tiny().to("meta").train()
    pruner = _apoz(model)
    for _ in range(3):
        model(torch.empty(4, 3, 8, 8, device="meta"))
    assert {z.device.type for z in pruner._local_zeros.values()} == {"meta"}
    assert pruner._local_zeros["conv2.weight"].shape == (16,)
    assert pruner._local_counts == {"conv1.weight": 3 * 4 * 8 * 8, "conv2.weight": 3 * 4 * 8 * 8}
    pruner.detach()


def test_apoz_statistics_round_trip_through_a_checkpoint() -> None:
    model = tiny().train()
    pruner = _apoz(model)
    with torch.no_grad():
        model(torch.randn(4, 3, 8, 8))
    pruner.sync()  # what the scheduler does at each epoch's end
    with torch.no_grad():
        model(torch.randn(4, 3, 8, 8))  # unsynced: still part of the state
    buffer = io.BytesIO()
    torch.save(pruner.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert state["counts"]["conv1.weight"].dtype == torch.float64
    assert float(state["counts"]["conv1.weight"]) == 2 * 4 * 8 * 8

    restored = ActivationAPoZRankedFilterPruner("a", ["conv1.weight", "conv2.weight"],
                                                initial_sparsity=0.25, final_sparsity=0.25)
    restored.attach(tiny())
    restored.load_state_dict(state)
    again = restored.state_dict()
    for key in ("zeros", "counts"):
        for name, value in state[key].items():
            assert torch.equal(again[key][name], value), (key, name)
    step = PruneStep(1, 0, 4, 1, model)
    params = dict(model.named_parameters())
    assert _equal(pruner.compute_masks(params, step), restored.compute_masks(params, step))


def test_apoz_ranks_on_statistics_gathered_since_the_last_masks() -> None:
    model = tiny()
    with torch.no_grad():
        model.bn1.bias[[2, 6]] = -100.0  # always zero after the ReLU
    doc = {"pruners": {"a": {"class": "ActivationAPoZRankedFilterPruner_AGP",
                             "initial_sparsity": 0.25, "final_sparsity": 0.25,
                             "group_type": "Filters", "weights": ["conv1.weight"]}},
           "policies": [{"pruner": {"instance_name": "a"}, "starting_epoch": 1,
                         "ending_epoch": 3, "frequency": 1}]}
    sched, _ = run_schedule(model, doc, epochs=2, lr=0.0)
    pruner = sched.instances["a"]
    # epoch 1's counts (2 batches of 4x8x8), summed over ranks at the epoch's end
    assert pruner._local_counts == {} and float(pruner.counts["conv1.weight"]) == 2 * 4 * 8 * 8
    dead = model.conv1.weight.detach().abs().sum(dim=(1, 2, 3)).eq(0)
    assert dead.nonzero().flatten().tolist() == [2, 6]


# -- models torch.fx cannot trace -------------------------------------------------------------

class Untraceable(nn.Module):
    """conv bn relu, then a branch on the data: torch.fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Data-dependent control flow."""
        y = F.relu(self.bn(self.conv(x)))
        if y.sum() > 0:
            y = y * 2
        return self.fc(y.mean(dim=(2, 3)))


@pytest.mark.parametrize("cls, extra", [
    ("L1RankedStructureParameterPruner", {"desired_sparsity": 0.5}),
    ("ActivationAPoZRankedFilterPruner_AGP", {"initial_sparsity": 0.1, "final_sparsity": 0.5}),
    ("BernoulliFilterPruner", {"desired_sparsity": 0.5}),
])
def test_filter_pruning_of_an_untraceable_model_fails_at_schedule_load(cls: str,
                                                                       extra: dict) -> None:
    model = Untraceable()
    doc = {"pruners": {"filters": {"class": cls, "group_type": "Filters",
                                   "weights": ["conv.weight"], **extra}},
           "policies": [{"pruner": {"instance_name": "filters"}, "epochs": [0]}]}
    with pytest.raises(ScheduleError) as info:
        build_scheduler(doc, model, torch.optim.SGD(model.parameters(), lr=0.1))
    message = str(info.value)
    assert "\n" not in message
    for fragment in ("'filters'", "torch.fx cannot trace Untraceable", "control flow",
                     "AutomatedGradualPruner"):
        assert fragment in message, message


def test_untraceable_model_still_takes_element_and_channel_pruning() -> None:
    model = Untraceable()
    doc = {"pruners": {
        "agp": {"class": "AutomatedGradualPruner", "initial_sparsity": 0.1,
                "final_sparsity": 0.5, "weights": ["conv.weight"]},
        "channels": {"class": "L1RankedStructureParameterPruner", "group_type": "Channels",
                     "desired_sparsity": 0.25, "weights": ["fc.weight"]}},
        "policies": [{"pruner": {"instance_name": "agp"}, "starting_epoch": 0,
                      "ending_epoch": 2, "frequency": 1},
                     {"pruner": {"instance_name": "channels"}, "epochs": [0]}]}
    sched = build_scheduler(doc, model, torch.optim.SGD(model.parameters(), lr=0.1))
    sched.on_epoch_begin(0)
    assert set(sched.masks) == {"conv.weight", "fc.weight"}


def test_apoz_drops_the_counts_of_a_layer_thinned_since() -> None:
    model = tiny().train()
    pruner = _apoz(model)
    with torch.no_grad():
        model(torch.randn(4, 3, 8, 8))
    pruner.sync()
    pruner.detach()
    model.conv1 = nn.Conv2d(3, 6, 3, padding=1, bias=False)  # as thinning leaves it
    model.bn1 = nn.BatchNorm2d(6)
    model.conv2 = nn.Conv2d(6, 16, 3, padding=1, bias=False)
    model.conv3 = nn.Conv2d(6, 16, 1, bias=False)
    pruner.attach(model)
    assert set(pruner.counts) == {"conv2.weight"}  # conv1's 8-filter counts are gone
    with torch.no_grad():
        model(torch.randn(4, 3, 8, 8))
    pruner.sync()
    assert pruner.zeros["conv1.weight"].shape == (6,)
    assert float(pruner.counts["conv2.weight"]) == 2 * 4 * 8 * 8
