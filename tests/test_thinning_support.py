"""Thinning on every family of the registry: exact, or refused in one line naming the layer
(a channel shuffle, a grouped convolution sharing the pruned channels); schedules that would
thin what cannot be thinned are refused when they load."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from compressor.models import create_model, description_of, get_arch_spec
from compressor.reports.sensitivity import prune_tensor
from compressor.schedule import load_schedule
from compressor.thinning import apply_thinning_recipe, thin_model
from compressor.thinning.support import channel_shuffles, is_grouped
from compressor.utils.config import OptimizerConfig, make_optimizer
from compressor.utils.errors import ScheduleError, UsageError
from tests.conftest import run_cli, trained_like_batchnorms

# One architecture per family (the registry holds 114; their blocks repeat within a family),
# with the side of the input each is thinned at (torchvision's pool adaptively: small inputs).
FAMILIES = {
    "resnet20_cifar": None, "preact_resnet20_cifar": None, "plain20_cifar": None,
    "vgg11_bn_cifar": None, "simplenet_mnist": None, "simplenet_digits": None,
    "densenet_bc_100_cifar": None, "mobilenet_025": 64, "preact_resnet18": 64,
    "alexnet_bn": None, "resnet18": 64, "mobilenet_v2": 64, "mobilenet_v3_small": 64,
    "efficientnet_b0": 64, "mnasnet0_5": 64, "squeezenet1_1": 64, "googlenet": 64,
    "regnet_x_400mf": 64, "resnext50_32x4d": 64,
    "shufflenet_v2_x0_5": 64, "convnext_tiny": 64,
}
THIN_LAYERS = 3  # plain convolutions zeroed at 30% of their filters (L1-ranked)


def _zeroed(arch: str, side: int | None) -> tuple[nn.Module, torch.Tensor, list[str]]:
    """A trained-like model with 30% of the filters of a few plain convolutions zeroed."""
    torch.manual_seed(0)
    model = trained_like_batchnorms(create_model(arch, get_arch_spec(arch).default_dataset))
    channels, height, width = description_of(model).input_spec.input_size
    shape = (channels, side, side) if side else (channels, height, width)
    convs = [(name, module) for name, module in model.named_modules()
             if isinstance(module, nn.Conv2d) and module.groups == 1 and module.out_channels > 3]
    chosen = convs[1:1 + THIN_LAYERS]
    with torch.no_grad():
        for _, module in chosen:
            module.weight.copy_(prune_tensor(module.weight, "filter", 0.3))
    return model, torch.randn(2, *shape), [name for name, _ in chosen]


@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_thinning_is_exact_or_refused_in_one_line(arch: str) -> None:
    model, inputs, _ = _zeroed(arch, FAMILIES[arch])
    with torch.no_grad():
        reference = model(inputs)
    before = sum(p.numel() for p in model.parameters())
    try:
        recipe = thin_model(model, inputs=inputs)
    except UsageError as exc:
        message = str(exc)
        assert "\n" not in message and ("grouped convolution" in message
                                        or "channel shuffle" in message), message
        assert any(is_grouped(m) for m in model.modules()) or channel_shuffles(model, inputs)
        assert sum(p.numel() for p in model.parameters()) == before  # left as it was
        return
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), reference, atol=1e-4, rtol=1e-4)
    rebuilt = apply_thinning_recipe(create_model(arch, get_arch_spec(arch).default_dataset),
                                    recipe)
    rebuilt.load_state_dict(model.state_dict())  # every thinned shape replays from the recipe
    assert sum(p.numel() for p in model.parameters()) <= before


def test_channel_shuffle_is_named() -> None:
    model, inputs, _ = _zeroed("shufflenet_v2_x0_5", 64)
    assert channel_shuffles(model, inputs)[0] == "stage2.0"
    with pytest.raises(UsageError, match="channel shuffle in 'stage2.0'"):
        thin_model(model, inputs=inputs)


def test_grouped_convolution_sharing_pruned_filters_is_named() -> None:
    torch.manual_seed(0)
    model = create_model("resnext50_32x4d", "imagenet").eval()
    conv1 = model.get_submodule("layer1.0.conv1")
    with torch.no_grad():
        conv1.weight.copy_(prune_tensor(conv1.weight, "filter", 0.25))
    with pytest.raises(UsageError, match="'layer1.0.conv1', shared with grouped convolution "
                                         r"'layer1.0.conv2' \(groups=32\)"):
        thin_model(model, inputs=torch.randn(2, 3, 64, 64))


SCHEDULE = """
version: 1
pruners:
  filters:
    class: L1RankedStructureParameterPruner
    group_type: Filters
    desired_sparsity: 0.3
    weights: [{weight}]
extensions:
  net_thinner:
    class: FilterRemover
    thinning_func_str: remove_filters
policies:
  - pruner:
      instance_name: filters
    epochs: [0]
{thinner}"""
THINNER = """  - extension:
      instance_name: net_thinner
    epochs: [0]
"""


def _schedule(tmp_path: Path, weight: str, thins: bool) -> Path:
    path = tmp_path / "schedule.yaml"
    path.write_text(SCHEDULE.format(weight=weight, thinner=THINNER if thins else ""))
    return path


@pytest.mark.parametrize(("arch", "weight", "words"), [
    ("resnext50_32x4d", "layer1.0.conv1.weight", "grouped convolution 'layer1.0.conv2'"),
    ("shufflenet_v2_x0_5", "conv1.0.weight", "channel shuffle in 'stage2.0'"),
])
def test_a_schedule_that_would_thin_the_unthinnable_is_refused_at_load(
        tmp_path: Path, arch: str, weight: str, words: str) -> None:
    model = create_model(arch, "imagenet")
    optimizer = make_optimizer(model.parameters(), OptimizerConfig(lr=0.1))
    with pytest.raises(ScheduleError, match=words):
        load_schedule(_schedule(tmp_path, weight, thins=True), model, optimizer)
    # without a thinner the same pruning is fine: the masks keep the zeros
    load_schedule(_schedule(tmp_path, weight, thins=False), model, optimizer)


def test_cli_dry_run_refuses_the_schedule_in_one_line(tmp_path: Path) -> None:
    schedule = _schedule(tmp_path, "layer1.0.conv1.weight", thins=True)
    result = run_cli("-a", "resnext50_32x4d", "--dataset", "synthetic", "--compress",
                     str(schedule), "--dry-run", "--epochs", "1", "-o", str(tmp_path))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "grouped convolution 'layer1.0.conv2'" in lines[0]
