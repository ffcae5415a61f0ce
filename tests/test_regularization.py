"""Regularizers add the right loss terms in their epochs only, and threshold/keep masks."""

from __future__ import annotations

import pytest
import torch

from compressor.regularization import GroupLassoRegularizer, GroupVarianceRegularizer, L1Regularizer
from compressor.schedule import build_scheduler
from tests.test_pruning_pruners import run_schedule, tiny


def test_loss_terms_match_their_definitions() -> None:
    weight = torch.randn(6, 4, 3, 3)
    params = {"w": weight}
    assert L1Regularizer("l1", {"w": (0.1, None)}).loss(params) == pytest.approx(
        0.1 * weight.abs().sum().item())
    filters = weight.reshape(6, -1).norm(dim=1)
    channels = weight.transpose(0, 1).reshape(4, -1).norm(dim=1)
    kernels = weight.reshape(24, -1).norm(dim=1)
    lasso = GroupLassoRegularizer
    assert lasso("g", {"w": (0.2, "Filters")}).loss(params) == pytest.approx(
        0.2 * filters.sum().item(), rel=1e-5)
    assert lasso("g", {"w": (0.2, "Channels")}).loss(params) == pytest.approx(
        0.2 * channels.sum().item(), rel=1e-5)
    assert lasso("g", {"w": (0.2, "2D")}).loss(params) == pytest.approx(
        0.2 * kernels.sum().item(), rel=1e-5)
    assert lasso("g", {"w": (0.2, "4D")}).loss(params) == pytest.approx(
        0.2 * weight.norm().item(), rel=1e-5)
    assert GroupVarianceRegularizer("v", {"w": (0.3, "Channels")}).loss(params) == pytest.approx(
        0.3 * channels.var().item(), rel=1e-5)


def test_threshold_masks_zero_groups_below_strength() -> None:
    weight = torch.ones(4, 2, 3, 3)
    weight[1] *= 0.01
    masks = GroupLassoRegularizer("g", {"w": (0.1, "Filters")}, "Mean_Abs").threshold_masks(
        {"w": weight})
    assert masks["w"].sum(dim=(1, 2, 3)).tolist() == [18, 0, 18, 18]


def doc(keep_mask: bool = False, criteria: str | None = None) -> dict:
    """A group-lasso schedule on conv2's channels for epochs 1 and 2."""
    entry = {"class": "GroupLassoRegularizer", "reg_regims": {"module.conv2.weight":
                                                              [0.05, "Channels"]}}
    if criteria:
        entry["threshold_criteria"] = criteria
    return {"regularizers": {"r": entry},
            "policies": [{"regularizer": {"instance_name": "r", "args": {"keep_mask": keep_mask}},
                          "starting_epoch": 1, "ending_epoch": 3, "frequency": 1}]}


def test_term_is_added_only_in_active_epochs() -> None:
    model = tiny()
    sched = build_scheduler(doc(), model, torch.optim.SGD(model.parameters(), lr=0.1))
    loss = torch.tensor(1.0)
    assert sched.before_backward_pass(0, 0, 1, loss) is loss  # Distiller's: loss + terms
    total = sched.before_backward_pass(1, 0, 1, loss)
    expected = 0.05 * model.conv2.weight.transpose(0, 1).reshape(8, -1).norm(dim=1).sum()
    assert torch.allclose(total - loss, expected)
    total.backward()
    assert model.conv2.weight.grad is not None
    assert sched.before_backward_pass(3, 0, 1, loss) is loss


def test_regularization_shrinks_groups_and_keep_mask_freezes_them() -> None:
    model = tiny()
    with torch.no_grad():
        model.conv2.weight[:, [2, 6]] *= 0.01  # two weak input channels
    sched, _ = run_schedule(model, doc(keep_mask=True, criteria="Mean_Abs"), epochs=5)
    dead = model.conv2.weight.detach().abs().sum(dim=(0, 2, 3)).eq(0)
    assert dead[[2, 6]].all()
    assert "conv2.weight" in sched.masks  # kept after the policy's last epoch (2)


@pytest.mark.parametrize("criteria", ["Mean_Abs", "Max"])
def test_threshold_keeps_a_group_only_strictly_above_the_strength(criteria: str) -> None:
    # Distiller's threshold masks keep |group| > strength: a group exactly at it is zeroed.
    weight = torch.full((3, 2, 3, 3), 0.5)
    weight[1] = 0.25
    weight[2] = 0.5 + 2 ** -20
    grouped = GroupLassoRegularizer("g", {"w": (0.5, "Filters")}, criteria)
    assert grouped.threshold_masks({"w": weight})["w"].amax(dim=(1, 2, 3)).tolist() == [0, 0, 1]
    elements = torch.tensor([0.25, 0.5, 0.5 + 2 ** -20])
    l1 = L1Regularizer("l1", {"w": (0.5, None)}, criteria)
    assert l1.threshold_masks({"w": elements})["w"].tolist() == [0, 0, 1]
