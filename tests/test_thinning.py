"""Thinning removes zeroed filters/channels exactly, and its recipe rebuilds the thin model."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from compressor.models import create_model, description_of
from compressor.thinning import apply_thinning_recipe, compose_recipes, thin_model
from compressor.utils.errors import CheckpointError
from tests.conftest import trained_like_batchnorms


def _trained_like(arch: str, dataset: str) -> nn.Module:
    """A model whose batch norms carry non-trivial statistics and shifts, as after training."""
    torch.manual_seed(0)
    return trained_like_batchnorms(create_model(arch, dataset))


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _check_thin(model: nn.Module, arch: str, dataset: str) -> dict:
    """Thin `model`; assert equal outputs and that a fresh build + recipe loads the weights."""
    x = torch.randn(3, *description_of(model).input_spec.input_size)
    with torch.no_grad():
        reference = model(x)
    before = _params(model)
    recipe = thin_model(model)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference, atol=1e-5, rtol=0)
    assert _params(model) < before
    rebuilt = apply_thinning_recipe(create_model(arch, dataset), recipe).eval()
    rebuilt.load_state_dict(model.state_dict())  # strict: every shape matches
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), reference, atol=1e-5, rtol=0)
    return recipe


def test_resnet20_filters_exact_and_residual_kept():
    model = _trained_like("resnet20_cifar", "cifar10")
    with torch.no_grad():
        for block in (*model.layer1, *model.layer2, *model.layer3):
            block.conv1.weight[::2] = 0
        model.layer1[0].conv2.weight[0] = 0  # one residual producer alone: must stay
    recipe = _check_thin(model, "resnet20_cifar", "cifar10")
    assert recipe["modules"]["layer1.0.conv2"]["out"] == []
    assert model.layer1[0].conv2.out_channels == 16
    # Channels whose constant (relu of the bn shift) is zero are gone; others are kept
    # because a zero-padded conv2 reads them.
    removed = [len(e["out"]) for n, e in recipe["modules"].items() if n.endswith("conv1")]
    assert sum(removed) > 0
    assert model.layer1[0].bn1.num_features == model.layer1[0].conv1.out_channels
    assert model.layer1[0].conv2.in_channels == model.layer1[0].conv1.out_channels


def test_resnet20_inexact_mode_removes_every_zeroed_filter():
    model = _trained_like("resnet20_cifar", "cifar10")
    with torch.no_grad():
        for block in (*model.layer1, *model.layer2, *model.layer3):
            block.conv1.weight[::2] = 0
    thin_model(model, exact=False)
    for block in (*model.layer1, *model.layer2, *model.layer3):
        assert block.conv1.out_channels == block.conv2.in_channels == block.bn1.weight.numel()
        assert block.conv1.out_channels * 2 == block.conv2.out_channels


def test_resnet20_channels_remove_upstream_filters():
    model = _trained_like("resnet20_cifar", "cifar10")
    with torch.no_grad():
        for block in (*model.layer1, *model.layer2, *model.layer3):
            block.conv2.weight[:, 1::2] = 0
    recipe = _check_thin(model, "resnet20_cifar", "cifar10")
    first = model.layer1[0]
    assert first.conv1.out_channels == first.conv2.in_channels == first.bn1.num_features == 8
    assert recipe["modules"]["layer1.0.conv1"]["out"] == list(range(1, 16, 2))


def test_residual_stream_thinned_together():
    model = _trained_like("resnet20_cifar", "cifar10")
    with torch.no_grad():  # channel 3 of stage 3's stream is read by nobody
        for block in model.layer3:
            block.conv1.weight[:, 3] = 0
        model.fc.weight[:, 3] = 0
    _check_thin(model, "resnet20_cifar", "cifar10")
    assert model.fc.in_features == 63
    assert all(b.conv2.out_channels == 63 and b.bn2.num_features == 63 for b in model.layer3)
    assert model.layer3[0].downsample[0].out_channels == 63


def test_vgg16_bn_filters():
    model = _trained_like("vgg16_bn_cifar", "cifar10")
    convs = [m for m in model.features if isinstance(m, nn.Conv2d)]
    with torch.no_grad():
        for conv in convs:
            conv.weight[::4] = 0
            conv.bias[::4] = 0
        # the BN shift of the last conv's dead channels reaches the classifier via a flatten:
        # it is folded exactly into the classifier's bias, so those channels can go too.
    _check_thin(model, "vgg16_bn_cifar", "cifar10")
    assert model.classifier.in_features == model.features[-4].out_channels < 512


def test_simplenet_filters_rows_and_bias_fold():
    model = _trained_like("simplenet_mnist", "mnist")
    with torch.no_grad():
        model.conv1.weight[:5] = 0  # bias kept: relu(bias) folded into conv2 (no padding)
        model.conv2.weight[10:20] = 0
        model.fc1.weight[100:300] = 0
    recipe = _check_thin(model, "simplenet_mnist", "mnist")
    assert model.conv1.out_channels == 15 and model.conv2.in_channels == 15
    assert model.conv2.out_channels == 40 and model.fc1.in_features == 40 * 16
    assert model.fc1.out_features == 300 and model.fc2.in_features == 300
    assert recipe["modules"]["fc2"]["in"] == list(range(100, 300))


def test_recipes_of_two_thinnings_compose():
    model = _trained_like("simplenet_mnist", "mnist")
    with torch.no_grad():
        model.conv2.weight[:10] = 0
    first = thin_model(model)
    assert first["modules"]["conv2"]["out"] == list(range(10))
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        model.conv2.weight[:5] = 0  # indices of the thinned model: originals 10..14
        reference = model(x)
    second = thin_model(model)
    assert second["modules"]["conv2"]["out"] == list(range(5))  # this thinning's own indices
    recipe = compose_recipes(first, second)
    assert recipe["modules"]["conv2"]["out"] == list(range(15))
    rebuilt = apply_thinning_recipe(create_model("simplenet_mnist", "mnist"), recipe).eval()
    rebuilt.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), reference, atol=1e-5, rtol=0)


def test_nothing_zero_changes_nothing():
    model = _trained_like("resnet20_cifar", "cifar10")
    state = copy.deepcopy(model.state_dict())
    recipe = thin_model(model)
    assert recipe["modules"] == {}
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_recipe_for_another_arch_is_refused():
    model = _trained_like("simplenet_mnist", "mnist")
    with torch.no_grad():
        model.conv2.weight[:10] = 0
    recipe = thin_model(model)
    with pytest.raises(CheckpointError, match="conv2"):
        apply_thinning_recipe(create_model("resnet20_cifar", "cifar10"), recipe)
