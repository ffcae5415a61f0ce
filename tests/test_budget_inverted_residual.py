"""Budget search and thinning on inverted-residual networks: every expansion group (expand conv
-> BN -> act -> depthwise -> BN -> act -> project) is prunable and thins exactly, both as the
search masks it and as the fine-tune's schedule prunes it (structure pruners, then a
FilterRemover). EfficientNet-Lite0's convolutions pad inside their forward (TF "same"
padding, Conv2dStaticSamePadding); a small model of that kind stands in when the `lite` extra
is not installed. Also: a constant channel is never folded into such a padded convolution, and
float32 rounding is not mistaken for a thinning error."""

from __future__ import annotations

import copy
import importlib.util
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from compressor.budget import prunable_groups
from compressor.budget.groups import (
    ChannelGroup,
    batchnorms_of,
    group_masked,
    leader_ranking,
    mask_group_filters,
)
from compressor.budget.schedule import budget_schedule, schedule_text
from compressor.budget.search import build_candidate
from compressor.models import create_model, description_of
from compressor.models.description import ModelDescription, describe
from compressor.pruning.graph import following_batchnorms
from compressor.schedule import load_schedule
from compressor.thinning import thin_model
from compressor.thinning.recipe import is_depthwise, module_sizes
from compressor.utils.config import OptimizerConfig, make_optimizer
from compressor.utils.input_spec import InputSpec
from tests.conftest import trained_like_batchnorms

SIDE = 64
SPEC = InputSpec((3, SIDE, SIDE), 73, SIDE, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
LITE = pytest.param("efficientnet_lite0", marks=pytest.mark.skipif(
    importlib.util.find_spec("efficientnet_lite_pytorch") is None,
    reason="efficientnet_lite0 needs the lite extra: pip install -e '.[lite]'"))
ARCHS = ["same_pad_tiny", "mobilenet_v2", LITE]


class SamePadConv(nn.Conv2d):
    """A convolution that pads its input TF-style ("same", one more row and column after the
    input than before it at stride 2) inside its forward, as efficientnet's
    Conv2dStaticSamePadding does: not a torch.nn class, so torch.fx traces into it."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1
                 ) -> None:
        super().__init__(cin, cout, kernel, stride=stride, groups=groups, bias=False)
        total = kernel - stride  # "same" padding of an even-sized input
        self.static_padding = nn.ZeroPad2d((total // 2, total - total // 2) * 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Pad, then convolve without padding."""
        return F.conv2d(self.static_padding(x), self.weight, self.bias, self.stride, 0,
                        self.dilation, self.groups)


def _unit(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1,
          act: bool = True) -> list[nn.Module]:
    layers = [SamePadConv(cin, cout, kernel, stride, groups), nn.BatchNorm2d(cout)]
    return layers + [nn.ReLU6()] if act else layers


class InvertedResidual(nn.Module):
    """Expand (1x1), depthwise (3x3), project (1x1, linear), with a residual where shapes
    allow it."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4) -> None:
        super().__init__()
        hidden = cin * expand
        self.block = nn.Sequential(*_unit(cin, hidden, 1), *_unit(hidden, hidden, 3, stride,
                                                                   hidden),
                                   *_unit(hidden, cout, 1, act=False))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block, plus its input when shapes allow."""
        return x + self.block(x) if self.residual else self.block(x)


class SamePadTiny(nn.Module):
    """A tiny EfficientNet-Lite-like network: padded-in-forward convolutions throughout."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(*_unit(3, 8, 3, 2), InvertedResidual(8, 8, 1),
                                      InvertedResidual(8, 16, 2), InvertedResidual(16, 16, 1),
                                      *_unit(16, 32, 1))
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Features, global average pool, classifier."""
        return self.fc(self.features(x).mean((2, 3)))


def _model(arch: str) -> nn.Module:
    """`arch` at SIDE pixels, seeded, with trained-like batch norms, in eval mode."""
    torch.manual_seed(0)
    if arch == "same_pad_tiny":
        model = describe(SamePadTiny(), ModelDescription(arch, "synthetic", 10, SPEC))
    else:
        model = create_model(arch, "imagenet", num_classes=10, input_spec=SPEC)
    return trained_like_batchnorms(model)


def _inputs(seed: int = 1) -> torch.Tensor:
    return torch.randn(2, *SPEC.input_size, generator=torch.Generator().manual_seed(seed))


def _depthwise(model: nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if is_depthwise(module)]


def _expansion_groups(model: nn.Module, groups: list[ChannelGroup]) -> list[ChannelGroup]:
    """The groups whose channels pass a depthwise convolution (expansion, stem -> first block)."""
    depthwise = set(_depthwise(model))
    return [g for g in groups if any(name in depthwise for name, _ in g.members)]


@pytest.fixture(scope="module", params=ARCHS)
def arch_groups(request: pytest.FixtureRequest) -> tuple[str, list[ChannelGroup]]:
    """An arch and its prunable groups (found once per arch: the probe takes seconds)."""
    arch = request.param
    return arch, prunable_groups(_model(arch), _inputs(0))


def _counts(groups: list[ChannelGroup]) -> list[int]:
    """Different counts per group (a quarter of its channels, give or take)."""
    return [max(1, g.channels // 4 + (index % 3) - 1) for index, g in enumerate(groups)]


def test_every_depthwise_channel_is_in_a_prunable_expansion_group(
        arch_groups: tuple[str, list[ChannelGroup]]) -> None:
    arch, groups = arch_groups
    model = _model(arch)
    expansions = _expansion_groups(model, groups)
    covered = {name for g in expansions for name, _ in g.members}
    assert set(_depthwise(model)) <= covered, sorted(set(_depthwise(model)) - covered)
    for group in expansions:  # ranked by the layer that feeds the depthwise convolution
        assert not is_depthwise(model.get_submodule(group.layer)), group.weights


def test_the_search_candidate_thins_exactly_what_its_masks_remove(
        arch_groups: tuple[str, list[ChannelGroup]]) -> None:
    arch, groups = arch_groups
    model = _model(arch)
    groups = _expansion_groups(model, groups)
    counts = _counts(groups)
    rankings = [leader_ranking(model, g) for g in groups]
    batchnorms = batchnorms_of(model, groups)
    thinned = build_candidate(model, tuple(groups), tuple(counts), rankings, batchnorms,
                              _inputs(0))
    x = _inputs(2)  # not the batch the thinning looked at
    with ExitStack() as masks, torch.no_grad():
        for group, count, ranking in zip(groups, counts, rankings, strict=True):
            masks.enter_context(group_masked(model, group, ranking[:count], batchnorms))
        torch.testing.assert_close(thinned(x), model(x), atol=1e-4, rtol=1e-4)
    for group, count in zip(groups, counts, strict=True):
        for name, role in group.members:
            assert module_sizes(thinned.get_submodule(name))[role == "in"] == \
                group.channels - count, (arch, group.layer, name)


def test_the_budget_schedule_prunes_and_thins_the_expansion_groups_exactly(
        arch_groups: tuple[str, list[ChannelGroup]], tmp_path: Path) -> None:
    arch, groups = arch_groups
    model = _model(arch)
    expansions = _expansion_groups(model, groups)
    # the first (stem -> first depthwise), a middle and the last: each pruner traces the model
    groups = [expansions[i] for i in sorted({0, len(expansions) // 2, len(expansions) - 1})]
    counts = _counts(groups)
    rankings = [leader_ranking(model, g) for g in groups]
    masked = copy.deepcopy(model)
    batchnorms = batchnorms_of(masked, groups)
    for group, count, ranking in zip(groups, counts, rankings, strict=True):
        mask_group_filters(masked, group, ranking[:count], batchnorms)
    path = tmp_path / "budget_schedule.yaml"
    path.write_text(schedule_text(budget_schedule(groups, counts, epochs=2)))
    scheduler = load_schedule(path, model, make_optimizer(model.parameters(), OptimizerConfig()))
    scheduler.on_epoch_begin(0)  # the one pruning epoch: masks at their final level, then thins
    recipe = description_of(model).recipe("thinning")["modules"]
    for group, count, ranking in zip(groups, counts, rankings, strict=True):
        gone = sorted(ranking[:count].tolist())  # the pruners' choice is the search's
        for name, role in group.members:
            assert recipe[name]["in" if role == "in" else "out"] == gone, (arch, name)
    x = _inputs(3)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), masked(x), atol=1e-4, rtol=1e-4)


def test_the_batch_norm_after_a_convolution_that_pads_in_its_forward_is_found() -> None:
    # the structure pruners and the search mask it with the filters (else it turns a pruned
    # channel into a constant that the next padding makes position-dependent)
    model = SamePadTiny()
    first = model.features[0]
    assert isinstance(first, SamePadConv)
    assert following_batchnorms(model, ["features.0", "features.3.block.3"]) == {
        "features.0": "features.1", "features.3.block.3": "features.3.block.4"}


class FunctionalSamePadConv(nn.Conv2d):
    """A 3x3 convolution that pads with F.pad in its forward (as timm's Conv2dSame): no
    padding attribute nor padding module says so."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Pad one pixel on every side, then convolve without padding."""
        return F.conv2d(F.pad(x, (1, 1, 1, 1)), self.weight, self.bias, self.stride, 0,
                        self.dilation, self.groups)


class _ConstantBeforePaddedConv(nn.Module):
    """conv1 -> BN -> ReLU -> a 3x3 convolution that zero-pads in its forward -> pool -> fc."""

    def __init__(self, padded: type[nn.Conv2d]) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = padded(8, 8, 3)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layers in a row."""
        return self.fc(self.conv2(F.relu(self.bn(self.conv1(x)))).mean((2, 3)))


@pytest.mark.parametrize("padded", [SamePadConv, FunctionalSamePadConv])
def test_a_constant_channel_is_not_folded_into_a_convolution_that_pads_in_its_forward(
        padded: type[nn.Conv2d]) -> None:
    torch.manual_seed(0)
    model = _ConstantBeforePaddedConv(padded).eval()
    with torch.no_grad():
        model.conv1.weight[2] = 0.0  # its BN (not masked) makes channel 2 a positive constant
        model.bn.bias.fill_(0.5)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        reference = model(x)
    recipe = thin_model(model, inputs=x)  # the padding makes the constant position-dependent
    assert model.conv1.out_channels == 8 and not recipe["modules"].get("conv1", {}).get("out")
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference)


def test_float32_rounding_of_large_activations_is_not_a_thinning_error() -> None:
    """Activations near 1e4 feed logits near 10 (the next layer's weights sum to zero): float32
    rounds the logits by ~1e-3, far above 1e-5 of them, and the folded constants of the dead
    features (rows zeroed, bias kept) are summed in another order than the dense layer's."""
    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(16, 512), nn.Linear(512, 3)
    with torch.no_grad():
        fc1.bias.fill_(1e4)
        fc1.weight[::2] = 0.0  # half the features: a constant, relu(bias), folded into fc2
        fc2.weight.sub_(fc2.weight.mean(dim=1, keepdim=True))
    model = nn.Sequential(fc1, nn.ReLU(), fc2).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(x.double())
        rounding = float((model(x).double() - exact).abs().max())
    assert rounding > 1e-5 * float(exact.abs().max())  # what the check must not mistake
    thin_model(model, inputs=x)
    assert model[0].out_features == 256
    with torch.no_grad():  # the thinned model rounds no worse than the dense one did
        assert float((model(x).double() - exact).abs().max()) <= 4 * rounding
