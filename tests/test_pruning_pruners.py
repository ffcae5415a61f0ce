"""Each pruner reaches its sparsity after its schedule; masks survive optimizer steps."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from compressor.pruning import agp_sparsity, element_mask, sparsity
from compressor.pruning.base import PruneStep
from compressor.schedule import build_scheduler
from compressor.training.loop import train_one_epoch
from compressor.training.losses import cross_entropy


class Tiny(nn.Module):
    """conv(3->8) bn relu conv(8->8) bn relu pool fc(8->16) fc(16->4): every group type."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv2d(8, 16, 1, bias=False)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Two convs with a 1x1 shortcut, then two linear layers."""
        y = self.relu1(self.bn1(self.conv1(x)))
        y = self.relu2(self.bn2(self.conv2(y)) + self.conv3(y))
        return self.fc2(F.relu(self.fc1(self.pool(y).flatten(1))))


def tiny(seed: int = 0) -> Tiny:
    """A seeded Tiny model."""
    torch.manual_seed(seed)
    return Tiny()


def run_schedule(model: nn.Module, doc: dict, epochs: int, batches: int = 2, lr: float = 0.05,
                 seed: int = 1, scheduler=None, optimizer=None, start: int = 0):
    """Train `epochs` epochs of `batches` random minibatches through the scheduler callbacks."""
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9,
                                             weight_decay=1e-3)
    scheduler = scheduler or build_scheduler(doc, model, optimizer, source="test.yaml")
    for epoch in range(start, epochs):
        gen = torch.Generator().manual_seed(seed * 1000 + epoch)
        data = [(torch.randn(4, 3, 8, 8, generator=gen), torch.randint(0, 4, (4,), generator=gen))
                for _ in range(batches)]
        scheduler.on_epoch_begin(epoch)
        train_one_epoch(model, data, cross_entropy, optimizer, torch.device("cpu"), epoch,
                        hooks=scheduler)
        scheduler.on_epoch_end(epoch, metrics={"loss": 1.0, "top1": 50.0})
    return scheduler, optimizer


def policy(name: str, start: int = 0, end: int = 4, freq: int = 1, args: dict | None = None
           ) -> dict:
    """One pruner policy entry."""
    entry: dict = {"instance_name": name}
    if args:
        entry["args"] = args
    return {"pruner": entry, "starting_epoch": start, "ending_epoch": end, "frequency": freq}


def zero_groups(weight: torch.Tensor, dim: int) -> int:
    """Number of all-zero slices of `weight` along `dim`."""
    other = [d for d in range(weight.dim()) if d != dim]
    return int(weight.detach().abs().sum(dim=other).eq(0).sum())


def test_agp_cubic_schedule_reaches_final_at_last_pruning_epoch() -> None:
    step = lambda e: PruneStep(e, 0, 30, 2)  # noqa: E731
    assert agp_sparsity(0.1, 0.5, step(0)) == pytest.approx(0.1)
    assert agp_sparsity(0.1, 0.5, step(28)) == pytest.approx(0.5)
    assert agp_sparsity(0.1, 0.5, step(14)) == pytest.approx(0.5 - 0.4 * 0.5 ** 3)
    values = [agp_sparsity(0.05, 0.9, step(e)) for e in range(0, 30, 2)]
    assert values == sorted(values)
    # Distiller's span: start 1, end 11, freq 2 -> pruning at 1,3,5,7,9; final at 9.
    assert agp_sparsity(0.0, 0.6, PruneStep(9, 1, 11, 2)) == pytest.approx(0.6)


def test_element_mask_zeroes_exactly_the_smallest() -> None:
    weight = torch.randn(50, 40)
    mask = element_mask(weight, 0.3)
    assert sparsity(mask) == pytest.approx(math.floor(0.3 * 2000) / 2000)
    assert weight[mask == 0].abs().max() <= weight[mask == 1].abs().min()


def test_agp_reaches_final_sparsity_and_masks_survive_momentum() -> None:
    model = tiny()
    doc = {"pruners": {"p": {"class": "AutomatedGradualPruner", "initial_sparsity": 0.2,
                             "final_sparsity": 0.8,
                             "weights": ["module.conv2.weight", "fc1.weight"]}},
           "policies": [policy("p", 0, 6, 2)]}
    sched, _ = run_schedule(model, doc, epochs=8)
    for weight in (model.conv2.weight, model.fc1.weight):
        assert sparsity(weight) == pytest.approx(math.floor(0.8 * weight.numel()) / weight.numel())
    # Untouched weights stay dense.
    assert sparsity(model.conv1.weight) == 0.0
    assert set(sched.masks) == {"conv2.weight", "fc1.weight"}


def test_masks_are_enforced_after_every_optimizer_step() -> None:
    model = tiny()
    doc = {"pruners": {"p": {"class": "SparsityLevelParameterPruner",
                             "levels": {"conv2.weight": 0.5}}},
           "policies": [policy("p", 0, 1)]}
    sched, optimizer = run_schedule(model, doc, epochs=1)
    pruned = sched.masks["conv2.weight"] == 0
    # Without enforcement momentum and weight decay would move the pruned weights at once.
    loss = model(torch.randn(2, 3, 8, 8)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    assert model.conv2.weight[pruned].abs().sum() > 0
    sched.on_minibatch_end(5, 0, 1)  # epochs after the policy still enforce the mask
    assert model.conv2.weight[pruned].abs().sum() == 0
    run_schedule(model, doc, epochs=4, start=1, scheduler=sched, optimizer=optimizer)
    assert model.conv2.weight[pruned].abs().sum() == 0


@pytest.mark.parametrize("cls, group_type, weight, dim, level", [
    ("L1RankedStructureParameterPruner", "Filters", "conv2.weight", 0, 0.5),
    ("L2RankedStructureParameterPruner", "Channels", "conv2.weight", 1, 0.25),
    ("L1RankedStructureParameterPruner", "Rows", "fc1.weight", 0, 0.5),
    ("L2RankedStructureParameterPruner", "Cols", "fc2.weight", 1, 0.75),
])
def test_ranked_structure_pruners(cls: str, group_type: str, weight: str, dim: int,
                                  level: float) -> None:
    model = tiny()
    before = model.get_parameter(weight).detach().clone()
    doc = {"pruners": {"p": {"class": cls, "group_type": group_type, "desired_sparsity": level,
                             "weights": [weight]}},
           "policies": [{"pruner": {"instance_name": "p"}, "epochs": [0]}]}
    run_schedule(model, doc, epochs=2)
    param = model.get_parameter(weight)
    groups = param.shape[dim]
    assert zero_groups(param, dim) == int(level * groups)
    # The groups pruned were the weakest ones at pruning time.
    p = 1 if cls.startswith("L1") else 2
    other = [d for d in range(before.dim()) if d != dim]
    norms = before.abs().pow(p).sum(dim=other)
    pruned = param.detach().abs().sum(dim=other).eq(0)
    assert norms[pruned].max() <= norms[~pruned].min()


def test_structured_agp_with_leader_prunes_the_same_filters() -> None:
    model = tiny()
    doc = {"pruners": {"p": {"class": "L1RankedStructureParameterPruner_AGP",
                             "initial_sparsity": 0.25, "final_sparsity": 0.5,
                             "group_type": "Filters", "group_dependency": "Leader",
                             "weights": ["conv2.weight", "conv3.weight"]}},
           "policies": [policy("p", 0, 4, 1)]}
    run_schedule(model, doc, epochs=4)
    dead2 = model.conv2.weight.detach().abs().sum(dim=(1, 2, 3)).eq(0)
    dead3 = model.conv3.weight.detach().abs().sum(dim=(1, 2, 3)).eq(0)
    assert int(dead2.sum()) == 8 and torch.equal(dead2, dead3)


def test_blocks_group_type_prunes_whole_blocks() -> None:
    model = tiny()
    doc = {"pruners": {"p": {"class": "L1RankedStructureParameterPruner_AGP",
                             "initial_sparsity": 0.5, "final_sparsity": 0.5,
                             "group_type": "Blocks", "kwargs": {"block_shape": [1, 4, 1, 1]},
                             "weights": ["conv2.weight"]}},
           "policies": [policy("p", 0, 2)]}
    run_schedule(model, doc, epochs=2)
    blocks = model.conv2.weight.detach().reshape(16, 2, 4, 3, 3).abs().sum(dim=2)
    assert int(blocks.eq(0).sum()) == blocks.numel() // 2
    assert sparsity(model.conv2.weight) == pytest.approx(0.5)


def test_fold_batchnorm_ranks_filters_after_normalization() -> None:
    model = tiny()
    with torch.no_grad():
        model.conv1.weight.copy_(torch.ones_like(model.conv1.weight))
        model.conv1.weight[3] *= 10.0  # the largest filter, but its batch norm scale is tiny
        model.bn1.weight.fill_(1.0)
        model.bn1.weight[3] = 1e-4
    doc = {"pruners": {"p": {"class": "L1RankedStructureParameterPruner",
                             "group_type": "Filters", "desired_sparsity": 0.125,
                             "weights": ["conv1.weight"]}},
           "policies": [{"pruner": {"instance_name": "p", "args": {"fold_batchnorm": True}},
                         "epochs": [0]}]}
    sched = build_scheduler(doc, model, torch.optim.SGD(model.parameters(), lr=0.0))
    sched.on_epoch_begin(0)
    assert model.conv1.weight[3].abs().sum() == 0
    assert zero_groups(model.conv1.weight, 0) == 1


def test_sensitivity_and_magnitude_pruners() -> None:
    model = tiny()
    weight = model.fc1.weight.detach().clone()
    doc = {"pruners": {"s": {"class": "SensitivityPruner", "sensitivities": {"fc1.weight": 0.5}},
                       "m": {"class": "MagnitudeParameterPruner",
                             "thresholds": {"conv1.weight": 0.1}}},
           "policies": [{"pruner": {"instance_name": "s"}, "epochs": [0]},
                        {"pruner": {"instance_name": "m"}, "epochs": [0]}]}
    sched = build_scheduler(doc, model, torch.optim.SGD(model.parameters(), lr=0.0))
    conv = model.conv1.weight.detach().clone()
    sched.on_epoch_begin(0)
    expected = weight.abs().le(0.5 * weight.std())
    assert torch.equal(model.fc1.weight.eq(0), expected)
    assert torch.equal(model.conv1.weight.eq(0), conv.abs().le(0.1))


def test_random_level_pruner_stays_in_its_range() -> None:
    model = tiny()
    doc = {"pruners": {"r": {"class": "RandomLevelStructureParameterPruner",
                             "sparsity_range": [0.25, 0.5], "group_type": "Filters",
                             "weights": ["conv2.weight"]}},
           "policies": [{"pruner": {"instance_name": "r"}, "epochs": [0]}]}
    torch.manual_seed(3)
    run_schedule(model, doc, epochs=1)
    assert 4 <= zero_groups(model.conv2.weight, 0) <= 8


def test_bernoulli_masks_the_forward_pass_only() -> None:
    model = tiny()
    doc = {"pruners": {"b": {"class": "BernoulliFilterPruner_AGP", "initial_sparsity": 0.5,
                             "final_sparsity": 0.5, "group_type": "Filters",
                             "weights": ["conv2.weight"]}},
           "policies": [policy("b", 0, 2, args={
               "mini_batch_pruning_frequency": 1, "discard_masks_at_minibatch_end": True,
               "mask_on_forward_only": True, "use_double_copies": True,
               "mask_gradients": True})]}
    seen = []
    model.conv2.register_forward_pre_hook(
        lambda module, args: seen.append(zero_groups(module.weight, 0)))
    torch.manual_seed(0)
    sched, _ = run_schedule(model, doc, epochs=2, batches=3)
    assert all(count > 0 for count in seen[:1]) and max(seen) > 0  # filters dropped in forward
    assert zero_groups(model.conv2.weight, 0) == 0  # but the weights themselves stay dense
    assert sched.masks == {}


def test_splicing_keeps_its_mask_at_the_end() -> None:
    model = tiny()
    doc = {"pruners": {"s": {"class": "SplicingPruner", "low_thresh_mult": 0.9,
                             "hi_thresh_mult": 1.1, "sensitivity_multiplier": 0.1,
                             "sensitivities": {"conv2.weight": 0.2}}},
           "policies": [policy("s", 0, 3, args={"keep_mask": True,
                                                "mini_batch_pruning_frequency": 1,
                                                "mask_on_forward_only": True})]}
    sched, _ = run_schedule(model, doc, epochs=3)
    assert "conv2.weight" in sched.masks
    level = sparsity(model.conv2.weight)
    assert 0.2 < level < 0.9
    assert level == pytest.approx(sparsity(sched.masks["conv2.weight"]))


def test_apoz_prunes_the_filters_that_never_fire() -> None:
    model = tiny()
    with torch.no_grad():
        model.bn1.bias[[1, 5]] = -100.0  # these channels are always zero after the ReLU
    doc = {"pruners": {"a": {"class": "ActivationAPoZRankedFilterPruner_AGP",
                             "initial_sparsity": 0.25, "final_sparsity": 0.25,
                             "group_type": "Filters", "weights": ["conv1.weight"]}},
           "policies": [policy("a", 1, 3)]}
    run_schedule(model, doc, epochs=2, lr=0.0)
    dead = model.conv1.weight.detach().abs().sum(dim=(1, 2, 3)).eq(0)
    assert dead.nonzero().flatten().tolist() == [1, 5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_kth_smallest_is_torchs_kthvalue(dtype: torch.dtype) -> None:
    from compressor.pruning.groups import kth_smallest

    generator = torch.Generator().manual_seed(0)
    values = torch.randn(5000, generator=generator).to(dtype).abs()
    values[:300] = 0.0  # ties, as pruned weights give
    for k in (1, 2, 300, 301, 2500, 4999, 5000):
        found = kth_smallest(values, k)
        assert found.dtype == dtype and torch.equal(found, values.kthvalue(k).values), k
