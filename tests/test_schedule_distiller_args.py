"""Distiller's schedule semantics: '*' default keys, strict threshold boundaries, every
pruner_args key, policy kinds, and the per-weight pruners' statistics."""

from __future__ import annotations

import pytest
import torch

from compressor.pruning import SensitivityPruner, SplicingPruner
from compressor.pruning.base import PruneStep
from compressor.schedule import build_scheduler
from compressor.utils.errors import ScheduleError
from tests.test_pruning_pruners import tiny

WEIGHTS = ["conv1.weight", "conv2.weight", "conv3.weight", "fc1.weight", "fc2.weight"]


def build(doc: dict, model=None):
    """Build `doc` against `model` (a Tiny model by default)."""
    model = model or tiny()
    return build_scheduler(doc, model, torch.optim.SGD(model.parameters(), lr=0.0), "s.yaml")


def one_pruner(entry: dict, args: dict | None = None, epochs: list[int] | None = None) -> dict:
    """A schedule with pruner 'p' = `entry`, active in `epochs` (default [0]) with `args`."""
    ref: dict = {"instance_name": "p"}
    if args is not None:
        ref["args"] = args
    return {"pruners": {"p": entry}, "policies": [{"pruner": ref, "epochs": epochs or [0]}]}


def test_magnitude_default_threshold_covers_every_weight() -> None:
    model = tiny()
    before = {name: model.get_parameter(name).detach().clone() for name in WEIGHTS}
    sched = build(one_pruner({"class": "MagnitudeParameterPruner",
                              "thresholds": {"*": 0.1, "module.fc1.weight": 0.2}}), model)
    assert sorted(sched.policies[0].pruner.weights) == sorted(WEIGHTS)
    sched.on_epoch_begin(0)
    for name in WEIGHTS:
        threshold = 0.2 if name == "fc1.weight" else 0.1
        assert torch.equal(model.get_parameter(name).eq(0), before[name].abs().le(threshold))
    assert model.bn1.weight.ne(0).all()  # one-dimensional parameters are not weights to prune


def test_default_level_and_sensitivity_with_named_overrides() -> None:
    model = tiny()
    sched = build(one_pruner({"class": "SparsityLevelParameterPruner",
                              "levels": {"*": 0.5, "conv1.weight": 0.0}}), model)
    sched.on_epoch_begin(0)
    assert "conv1.weight" not in sched.masks and model.conv1.weight.ne(0).all()
    for name in WEIGHTS[1:]:
        weight = model.get_parameter(name)
        assert int(weight.eq(0).sum()) == weight.numel() // 2
    for cls in ("SensitivityPruner", "SplicingPruner"):
        entry = {"class": cls, "sensitivities": {"*": 0.3, "fc2.weight": 0.1}}
        if cls == "SplicingPruner":
            entry.update(low_thresh_mult=0.9, hi_thresh_mult=1.1)
        pruner = build(one_pruner(entry)).policies[0].pruner
        assert pruner.values == {**dict.fromkeys(WEIGHTS, 0.3), "fc2.weight": 0.1}


def test_default_key_is_refused_where_distiller_has_none() -> None:
    doc = {"regularizers": {"r": {"class": "L1Regularizer", "reg_regims": {"*": 0.1}}}}
    with pytest.raises(ScheduleError, match="does not accept Distiller's '\\*'"):
        build(doc)


def test_sensitivity_pruner_takes_the_std_once() -> None:
    weight = torch.randn(64, 32)
    pruner = SensitivityPruner("s", {"w": 1.0})
    step = PruneStep(0, 0, 2, 1)
    first = pruner.compute_masks({"w": weight}, step)["w"]
    assert torch.equal(first.eq(0), weight.abs().le(weight.std()))
    pruned = weight * first  # the zeros raise the std; Distiller's threshold stays put
    second = pruner.compute_masks({"w": pruned}, PruneStep(1, 0, 2, 1))["w"]
    assert torch.equal(second, first)
    assert pruner.state_dict()["stats"]["w"].item() == pytest.approx(weight.std().item())


def test_splicing_splices_back_at_the_high_threshold() -> None:
    pruner = SplicingPruner("s", {"w": 0.0}, low_thresh_mult=0.5, hi_thresh_mult=1.0)
    pruner.load_state_dict({"stats": {"w": torch.tensor([0.5, 0.0])}})  # threshold 0.5
    weight = torch.tensor([0.2, 0.3, 0.5, 0.6])
    step = PruneStep(0, 0, 1, 1, current_masks={"w": torch.zeros(4)})
    assert pruner.compute_masks({"w": weight}, step)["w"].tolist() == [0.0, 0.0, 1.0, 1.0]


AGP = {"class": "AutomatedGradualPruner", "initial_sparsity": 0.5, "final_sparsity": 0.5,
       "weights": ["conv2.weight"]}


def test_levels_arg_overrides_the_pruners_levels_for_its_policy() -> None:
    model = tiny()
    entry = {"class": "SparsityLevelParameterPruner", "levels": {"conv1.weight": 0.25}}
    doc = {"pruners": {"p": entry}, "policies": [
        {"pruner": {"instance_name": "p", "args": {"levels": {"conv2.weight": 0.5}}},
         "epochs": [0]},
        {"pruner": {"instance_name": "p"}, "epochs": [1]}]}
    sched = build(doc, model)
    sched.on_epoch_begin(0)
    assert model.conv1.weight.ne(0).all()
    assert int(model.conv2.weight.eq(0).sum()) == model.conv2.weight.numel() // 2
    sched.on_epoch_begin(1)  # the other policy keeps the pruner's own levels
    assert int(model.conv1.weight.eq(0).sum()) == model.conv1.weight.numel() // 4
    with pytest.raises(ScheduleError, match="'levels' overrides the levels of a "
                                            "SparsityLevelParameterPruner, not of a "
                                            "AutomatedGradualPruner"):
        build(one_pruner(AGP, {"levels": {"conv2.weight": 0.5}}))


def test_skip_first_minibatch_prunes_from_the_second_minibatch() -> None:
    model = tiny()
    sched = build(one_pruner(AGP, {"skip_first_minibatch": True}, epochs=[0, 1]), model)
    sched.on_epoch_begin(0)
    sched.on_minibatch_begin(0, 0, 4)
    assert model.conv2.weight.ne(0).all()
    sched.on_minibatch_begin(0, 1, 4)
    sched.on_minibatch_end(0, 1, 4)
    assert int(model.conv2.weight.eq(0).sum()) == model.conv2.weight.numel() // 2


@pytest.mark.parametrize("double_copies", [False, True])
def test_use_double_copies_keeps_the_dense_weights(double_copies: bool) -> None:
    model = tiny()
    dense = model.conv2.weight.detach().clone()
    args = {"mask_on_forward_only": True, "use_double_copies": double_copies}
    sched = build(one_pruner(AGP, args), model)
    sched.on_epoch_begin(0)
    sched.on_minibatch_begin(0, 0, 1)
    pruned = model.conv2.weight.eq(0)
    assert int(pruned.sum()) == dense.numel() // 2  # the forward pass sees the masked weights
    sched.before_parameter_optimization(0, 0, 1)
    # Two copies: the optimizer updates the dense weights. One copy: the masked ones.
    still_zero = model.conv2.weight.eq(0)
    assert torch.equal(still_zero, torch.zeros_like(pruned) if double_copies else pruned)


@pytest.mark.parametrize("key", ["keep_mask", "mask_on_forward_only", "use_double_copies",
                                 "discard_masks_at_minibatch_end", "fold_batchnorm",
                                 "skip_first_minibatch"])
def test_every_boolean_pruner_arg_is_accepted(key: str) -> None:
    build(one_pruner(AGP, {key: True, "mini_batch_pruning_frequency": 16}))


def test_mask_gradients_needs_mask_on_forward_only() -> None:
    with pytest.raises(ScheduleError, match="mask_gradients needs mask_on_forward_only"):
        build(one_pruner(AGP, {"mask_gradients": True}))


@pytest.mark.parametrize("kind, fragments", [
    ("quantiser", ["unknown policy kind 'quantiser'", "did you mean 'quantizer'?"]),
    ("prunner", ["unknown policy kind 'prunner'", "did you mean 'pruner'?"]),
    ("foo", ["unknown policy kind 'foo'", "pruner, regularizer"]),
    ("quantizer", ["'p' is a pruner, not a quantizer"]),
])
def test_unknown_policy_kinds_are_refused(kind: str, fragments: list[str]) -> None:
    doc = {"pruners": {"p": AGP}, "policies": [{kind: {"instance_name": "p"}, "epochs": [0]}]}
    with pytest.raises(ScheduleError) as info:
        build(doc)
    message = str(info.value)
    assert message.startswith("s.yaml: policies[0]") and "\n" not in message
    for fragment in fragments:
        assert fragment in message
