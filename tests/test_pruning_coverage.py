"""Pruning groups for any model: on hand-written models coupling channels through
squeeze-excitation, concatenations, grouped and depthwise convolutions and residual adds
(tests/fixtures/coupled_nets.py), the budget search's groups cover at least what Torch-Pruning's
dependency graph does, thin exactly, and the CLI meets a MACs budget on the model with all
four, named as a user's own code."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from compressor.budget.groups import (
    batchnorms_of,
    leader_ranking,
    mask_group_filters,
    prunable_groups,
)
from compressor.reports.metrics import layer_costs
from compressor.thinning.plan import find_thinning
from compressor.thinning.recipe import apply_thinning_recipe, module_sizes
from tests.conftest import run_cli, trained_like_batchnorms
from tests.fixtures import coupled_nets

FIXTURES = ("AllFourNet", "SEInvertedResidualNet", "DenseGroupedNet", "LayerScaleNet",
            "RepBranchNet", "GhostStreamNet", "HeadAttentionNet")
CODE = Path(coupled_nets.__file__).resolve()
COMMON = ("-j", "0", "-p", "0", "-b", "32", "--deterministic")
SPLITS = ("--etrs", "0.05", "--etes", "0.1", "--evs", "0.2")
DATA = ("--dataset", "synthetic", "--input-size", "3,32,32", "--num-classes", "10", *SPLITS)


def _model(name: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = trained_like_batchnorms(getattr(coupled_nets, name)()).eval()
    return model, torch.randn(4, 3, 32, 32)


@pytest.mark.parametrize("name", FIXTURES)
def test_our_groups_cover_what_torch_pruning_does(name: str) -> None:
    pytest.importorskip("torch_pruning", reason="the reference needs torch-pruning")
    from compressor.budget.coverage import pruning_coverage

    coverage = pruning_coverage(*_model(name))
    assert coverage.torch_pruning > 0
    assert coverage.ours >= coverage.torch_pruning, coverage


def _tiny_convnexts() -> dict[str, nn.Module]:
    """ConvNeXts of one block per stage, 48 channels in all: torchvision's (channels-last
    linear MLP, LayerNorm2d, a (C, 1, 1) layer scale) and timm's, channels-last (linear MLP,
    `gamma`) and not (1x1 convolutions)."""

    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    found: dict[str, nn.Module] = {"torchvision": ConvNeXt(
        [CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)], num_classes=10)}
    try:
        from timm.models.convnext import ConvNeXt as TimmConvNeXt
    except ImportError:
        return found
    for conv_mlp in (False, True):
        found[f"timm-conv_mlp={conv_mlp}"] = TimmConvNeXt(
            num_classes=10, depths=(1, 1, 1, 1), dims=(8, 8, 16, 16), conv_mlp=conv_mlp,
            ls_init_value=0.5)
    return found


def _out_channels(model: nn.Module) -> int:
    return sum(module_sizes(m)[0] for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d)))


def _masked_and_thinned(model: nn.Module, inputs: torch.Tensor
                        ) -> tuple[torch.Tensor, nn.Module]:
    """Mask the least important half of every prunable group of `model` (in place): the
    masked outputs, and a thinned copy."""
    groups = prunable_groups(model, inputs)
    batchnorms = batchnorms_of(model, groups)
    for group in groups:
        mask_group_filters(model, group, leader_ranking(model, group)[:group.channels // 2],
                           batchnorms)
    with torch.no_grad():
        masked = model(inputs)
    thinned = copy.deepcopy(model)
    recipe, _ = find_thinning(thinned, inputs, exact=True)
    apply_thinning_recipe(thinned, recipe)
    return masked, thinned


@pytest.mark.parametrize("kind", ["torchvision", "timm-conv_mlp=False", "timm-conv_mlp=True"])
def test_convnext_streams_under_layer_norm_are_ours_and_thin_as_renormalized(kind: str) -> None:
    """Every channel Torch-Pruning prunes is ours: the MLP's hidden channels and the residual
    stream a LayerNorm normalizes over. The stream's norms are masked with its filters (a
    pruned channel leaves them zero), and the thinned model computes exactly the masked one
    with each thinned LayerNorm normalizing its kept channels among themselves (the change
    removing a channel from a LayerNorm's statistics makes, and nothing else)."""
    pytest.importorskip("torch_pruning", reason="the reference needs torch-pruning")
    from compressor.budget.coverage import pruning_coverage
    from compressor.thinning import thin_model
    from compressor.thinning.recipe import is_channel_layer_norm
    from compressor.thinning.renormalize import renormalized

    models = _tiny_convnexts()
    if kind not in models:
        pytest.skip("timm is not installed")
    torch.manual_seed(0)
    model, inputs = models[kind].eval(), torch.randn(2, 3, 32, 32)
    coverage = pruning_coverage(model, inputs)
    assert coverage.channels == 336 and coverage.ours == coverage.torch_pruning == 336, coverage
    groups = prunable_groups(model, inputs)
    assert any(is_channel_layer_norm(model.get_submodule(norm))
               for group in groups for norm in group.norms)
    batchnorms = batchnorms_of(model, groups)
    for group in groups:
        mask_group_filters(model, group, leader_ranking(model, group)[:group.channels // 2],
                           batchnorms)
    thinned = copy.deepcopy(model)
    recipe, _ = find_thinning(thinned, inputs, exact=True)
    apply_thinning_recipe(thinned, recipe)
    assert _out_channels(model) - _out_channels(thinned) == 336 // 2
    with torch.no_grad(), renormalized(copy.deepcopy(model), recipe) as masked:
        torch.testing.assert_close(thinned(inputs), masked(inputs), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(model(inputs), masked(inputs))  # the statistics did change
    thin_model(model, inputs=inputs)  # its own check against the same reference passes
    assert _out_channels(model) == _out_channels(thinned)
    rebuilt = apply_thinning_recipe(_tiny_convnexts()[kind].eval(), recipe)
    rebuilt.load_state_dict(thinned.state_dict())  # a checkpoint's recipe replays, norms too
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(inputs), thinned(inputs))


def _macs(model: nn.Module) -> int:
    return sum(cost.macs for cost in layer_costs(model, torch.zeros(1, 3, 32, 32)))


def test_all_four_groups_thin_exactly_at_half_of_each_group() -> None:
    """Masked and thinned models compute the same outputs: the channels left untouched carry
    what they did, the grouped convolution keeps its groups and loses whole units."""
    model, inputs = _model("AllFourNet")
    shared = {g.layer: g for g in prunable_groups(model, inputs)}
    assert shared["grouped.0"].blocks == 4 and "se.expand.weight" in shared["grouped.0"].weights
    assert {"branch_a.0", "branch_b.0", "mix.0", "stem.0"} <= set(shared)
    masked, thinned = _masked_and_thinned(model, inputs)
    with torch.no_grad():
        torch.testing.assert_close(thinned(inputs), masked, atol=1e-5, rtol=1e-5)
    grouped = thinned.get_submodule("grouped.0")
    assert (grouped.groups, grouped.in_channels, grouped.out_channels) == (4, 32, 32)
    assert _macs(thinned) <= 0.5 * _macs(model)


def test_layer_scale_channels_are_sliced_with_their_stream() -> None:
    """A bare per-channel parameter (a layer scale's gamma) goes with the channels it scales:
    the residual stream is one group, the thinned model computes what the masked one did, and
    the recipe replays on a freshly built model, which then loads the thinned weights."""
    model, inputs = _model("LayerScaleNet")
    stream = next(g for g in prunable_groups(model, inputs) if g.layer == "stem.0")
    assert set(stream.weights) == {"stem.0.weight", "blocks.0.project.0.weight",
                                   "blocks.1.project.0.weight"}
    masked, thinned = _masked_and_thinned(model, inputs)
    with torch.no_grad():
        torch.testing.assert_close(thinned(inputs), masked, atol=1e-5, rtol=1e-5)
    assert thinned.blocks[0].scale.gamma.shape == (8, 1, 1)
    recipe, _ = find_thinning(copy.deepcopy(model), inputs, exact=True)
    assert set(recipe["parameters"]) == {"blocks.0.scale.gamma", "blocks.1.scale.gamma"}
    rebuilt = apply_thinning_recipe(coupled_nets.LayerScaleNet(), recipe)
    rebuilt.load_state_dict(thinned.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(inputs), masked, atol=1e-5, rtol=1e-5)


def test_identity_branch_norms_are_masked_with_the_stream_and_thin_exactly() -> None:
    """RepVGG's identity batch norm passes the stream's channels: masked with the filters
    (weight and bias), a pruned channel stays zero through it, so the stream is one group and
    its thinned model computes what the masked one did; the budget's schedule names the norms
    and its pruner keeps them masked while fine-tuning."""
    import compressor as cz
    from compressor.budget.schedule import budget_schedule

    model, inputs = _model("RepBranchNet")
    stream = next(g for g in prunable_groups(model, inputs) if g.layer == "stem.0")
    assert set(stream.norms) >= {"blocks.0.identity", "blocks.1.identity", "blocks.2.identity"}
    masked, thinned = _masked_and_thinned(copy.deepcopy(model), inputs)
    with torch.no_grad():
        torch.testing.assert_close(thinned(inputs), masked, atol=1e-5, rtol=1e-5)
    assert thinned.blocks[1].identity.num_features == 8
    schedule = budget_schedule([stream], [8], epochs=2)
    pruner = next(iter(schedule["pruners"].values()))
    assert pruner["norms"] == list(stream.norms)
    schedule["extensions"] = {}  # the masks alone (thinning is tested above)
    schedule["policies"] = [p for p in schedule["policies"] if "pruner" in p]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = cz.compression_scheduler(schedule, model, optimizer, example_inputs=inputs)
    scheduler.on_epoch_begin(0)
    identity = model.blocks[1].identity
    assert int((identity.weight == 0).sum()) == 8 and int((identity.bias == 0).sum()) == 8


def test_a_stream_twice_as_wide_as_its_producers_is_one_group_and_thins_exactly() -> None:
    """GhostNet's stream: the primary convolutions make its first half, their depthwise copies
    the second, a 1x1 shortcut all of it. One unit is a primary filter and two of the
    shortcut's (j and j + 16); masked and thinned models agree, the schedule's leader masks the
    wider layer's both channels, and the search prices a unit by every channel it removes."""
    import compressor as cz
    from compressor.api.identity import ensure_described
    from compressor.budget.prices import channel_prices
    from compressor.budget.schedule import budget_schedule

    model, inputs = _model("GhostStreamNet")
    stream = next(g for g in prunable_groups(model, inputs)
                  if "blocks.0.shortcut.0.weight" in g.weights)
    assert stream.channels == 16 and stream.blocks_of("blocks.0.shortcut.0.weight") == 2
    assert stream.blocks_of("blocks.1.ghost2.primary.0.weight") == 1
    assert {"blocks.0.shortcut.1", "blocks.1.ghost2.cheap.1"} <= set(stream.norms)
    masked, thinned = _masked_and_thinned(copy.deepcopy(model), inputs)
    with torch.no_grad():
        torch.testing.assert_close(thinned(inputs), masked, atol=1e-5, rtol=1e-5)
    assert thinned.blocks[0].shortcut[0].out_channels == 16
    assert thinned.blocks[1].ghost2.primary[0].out_channels == 8
    ensure_described(model, inputs, "the test")  # prices read MACs at the model's input
    prices = channel_prices(model, [stream])
    shortcut_macs = 16 * 16 * 16  # one filter of the 1x1 shortcut at 16 x 16
    assert prices["macs"][0] > 2 * shortcut_macs
    schedule = budget_schedule([stream], [4], epochs=2)
    schedule["extensions"] = {}  # the masks alone (thinning is tested above)
    schedule["policies"] = [p for p in schedule["policies"] if "pruner" in p]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = cz.compression_scheduler(schedule, model, optimizer, example_inputs=inputs)
    scheduler.on_epoch_begin(0)
    primary = model.get_parameter(stream.leader).flatten(1).abs().sum(1) == 0
    shortcut = model.blocks[0].shortcut[0].weight.flatten(1).abs().sum(1) == 0
    assert int(primary.sum()) == 4 and torch.equal(shortcut, primary.repeat(2))


def test_a_channel_reaching_a_concatenation_twice_thins_as_one() -> None:
    """GhostNet's stride-2 block: a ghost module's primary channel j is the concatenation's
    channel j and, through its depthwise copy, channel j + width; a depthwise convolution over
    the concatenation then reads both. Torch-Pruning names the two by different roots; they
    are one channel, pruned and thinned together, exactly."""
    class GhostDown(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = coupled_nets.conv_bn(3, 16, stride=2)
            self.ghost = coupled_nets.GhostModule(16, 24)
            self.down = coupled_nets.conv_bn(24, 24, stride=2, groups=24, act=False)
            self.head = coupled_nets.conv_bn(24, 16, kernel=1)
            self.fc = nn.Linear(16, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.head(self.down(self.ghost(self.stem(x))))
            return self.fc(x.mean((2, 3)))

    torch.manual_seed(0)
    model, inputs = trained_like_batchnorms(GhostDown()).eval(), torch.randn(4, 3, 32, 32)
    primary = next(g for g in prunable_groups(model, inputs)
                   if g.leader == "ghost.primary.0.weight")
    assert primary.channels == 12 and "down.1" in primary.norms
    masked, thinned = _masked_and_thinned(model, inputs)
    with torch.no_grad():
        torch.testing.assert_close(thinned(inputs), masked, atol=1e-5, rtol=1e-5)
    assert thinned.ghost.primary[0].out_channels == 6 and thinned.down[0].out_channels == 12


def test_a_norm_over_a_concatenation_is_not_masked_at_the_wrong_channels() -> None:
    """A dense layer's new channels reach the next layers' batch norms at an offset of the
    concatenation: those norms are no group's to mask (masking their first channels would zero
    the block's input); the pruned channels' constant is folded, exactly."""
    from torchvision.models import DenseNet

    torch.manual_seed(0)
    model = trained_like_batchnorms(DenseNet(growth_rate=4, block_config=(3,),
                                             num_init_features=8, bn_size=2,
                                             num_classes=10)).eval()
    inputs = torch.randn(2, 3, 32, 32)
    groups = prunable_groups(model, inputs)
    for group in groups:
        for norm in group.norms:
            assert model.get_submodule(norm).num_features % group.channels == 0
    before = {name: p.detach().clone() for name, p in model.named_parameters()
              if name.endswith("norm1.weight")}
    new = next(g for g in groups if g.layer == "features.denseblock1.denselayer1.conv2")
    mask_group_filters(model, new, torch.arange(2), batchnorms_of(model, groups))
    for name, value in before.items():
        assert torch.equal(model.get_parameter(name), value), name
    masked, thinned = _masked_and_thinned(model, inputs)
    with torch.no_grad():
        torch.testing.assert_close(thinned(inputs), masked, atol=1e-5, rtol=1e-5)


def test_a_recipe_naming_a_missing_parameter_is_refused() -> None:
    from compressor.utils.errors import CheckpointError

    recipe = {"version": 1, "modules": {},
              "parameters": {"blocks.0.scale.beta": {"dim": 0, "size": 16, "removed": [0]}}}
    with pytest.raises(CheckpointError, match="parameter 'blocks.0.scale.beta'"):
        apply_thinning_recipe(coupled_nets.LayerScaleNet(), recipe)


def test_composed_recipes_remove_parameter_channels_of_the_fresh_model() -> None:
    from compressor.thinning.recipe import compose_recipes

    first = {"version": 1, "modules": {},
             "parameters": {"g": {"dim": 0, "size": 8, "removed": [1, 3]}}}
    second = {"version": 1, "modules": {},
              "parameters": {"g": {"dim": 0, "size": 6, "removed": [1, 2]}}}
    # the thinned model's channels 1, 2 are the fresh model's 2, 4
    assert compose_recipes(first, second)["parameters"]["g"]["removed"] == [1, 2, 3, 4]


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """AllFourNet, the user's own code, trained one epoch on synthetic 32 px images."""
    root = tmp_path_factory.mktemp("coverage")
    result = run_cli("-a", f"{CODE}:AllFourNet", *DATA, *COMMON, "--epochs", "1", "--lr", "0.05",
                     "-o", str(root), "-n", "dense")
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "dense" / "checkpoint.pth.tar"


def test_the_cli_meets_half_the_macs_on_the_all_four_model(dense: Path) -> None:
    out = dense.parent.parent
    result = run_cli("-a", f"{CODE}:AllFourNet", "--resume-from", str(dense), *SPLITS, *COMMON,
                     "--target-macs", "0.5", "--epochs", "2", "--lr", "0.02",
                     "-o", str(out), "-n", "budget")
    report_path = out / "budget" / "budget.json"
    assert report_path.is_file(), result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    (macs,) = [row for row in report["budgets"] if row["quantity"] == "macs"]
    assert macs["met"] and macs["achieved"] <= 0.5, macs
    layers = {row["layer"]: row for row in report["layers"]}
    assert layers["grouped.0"]["channels_before"] == 64  # the grouped convolution's filters
    for row in report["layers"]:
        assert row["channels_after"] == row["channels_before"] - row["removed_chosen"]


def test_a_schedule_naming_a_norm_the_model_lacks_is_one_line() -> None:
    import compressor as cz
    from compressor.utils.errors import ScheduleError

    model, inputs = _model("RepBranchNet")
    schedule = {"version": 1, "pruners": {"p": {
        "class": "L1RankedStructureParameterPruner", "group_type": "Filters",
        "desired_sparsity": 0.5, "weights": ["stem.0.weight"], "norms": ["blocks.0.nope"]}},
        "policies": [{"pruner": {"instance_name": "p"}, "epochs": [0]}]}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ScheduleError, match="norms names 'blocks.0.nope', which is no batch "
                                            "norm of 16 channels"):
        cz.compression_scheduler(schedule, model, optimizer, example_inputs=inputs)
