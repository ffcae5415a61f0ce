"""Thinning a memory-efficient variant (in-place ABN), and layers that would lose everything."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from compressor.memory import InPlaceABN, apply_memory_variant
from compressor.models import create_model, get_arch_spec
from compressor.thinning import apply_thinning_recipe, thin_model
from compressor.utils.errors import UsageError
from tests.conftest import trained_like_batchnorms

pytestmark = pytest.mark.usefixtures("one_thread")


def _inplace_abn_resnet20() -> nn.Module:
    """resnet20_cifar as in-place ABN, with batch-norm statistics and shifts as after training."""
    torch.manual_seed(0)
    model = apply_memory_variant(create_model("resnet20_cifar", "cifar10"),
                                 get_arch_spec("resnet20_cifar"), "inplace-abn")
    return trained_like_batchnorms(model)


def _prune_filters(conv: nn.Conv2d, bn: nn.Module, filters: slice) -> None:
    """Zero filters and their batch norm's gamma and beta, as a filter pruner does."""
    with torch.no_grad():
        conv.weight[filters] = 0
        bn.weight[filters] = 0
        bn.bias[filters] = 0


def test_inplace_abn_model_thins_exactly_and_its_recipe_replays() -> None:
    model = _inplace_abn_resnet20()
    blocks = (*model.layer1, *model.layer2, *model.layer3)
    for block in blocks:
        _prune_filters(block.conv1, block.bn1, slice(0, None, 2))
    # A dead channel whose beta is negative: in-place ABN emits leaky_relu(beta) = 0.01 * beta,
    # not ReLU's 0, and the zero-padded conv2 reads it, so exact thinning must keep it.
    with torch.no_grad():
        model.layer1[1].bn1.bias[2] = -0.5
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        reference = model(x)
    before = sum(p.numel() for p in model.parameters())
    recipe = thin_model(model, inputs=x)
    assert isinstance(model.layer1[0].bn1, InPlaceABN)
    assert model.layer1[0].conv1.out_channels == model.layer1[0].bn1.num_features == 8
    assert model.layer1[0].conv2.in_channels == 8
    assert model.layer1[1].conv1.out_channels == 9  # the leaky constant channel stays
    assert 2 not in recipe["modules"]["layer1.1.conv1"]["out"]
    assert sum(p.numel() for p in model.parameters()) < before
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference, atol=1e-5, rtol=0)

    fresh = apply_memory_variant(create_model("resnet20_cifar", "cifar10"),
                                 get_arch_spec("resnet20_cifar"), "inplace-abn")
    rebuilt = apply_thinning_recipe(fresh, recipe).eval()
    rebuilt.load_state_dict(model.state_dict())  # strict: every name and shape matches
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), reference, atol=1e-5, rtol=0)


def test_thinned_inplace_abn_model_still_trains_as_its_unfused_reference() -> None:
    model = _inplace_abn_resnet20()
    for block in model.layer2:
        _prune_filters(block.conv1, block.bn1, slice(0, 16))
    thin_model(model, inputs=torch.randn(2, 3, 32, 32))
    assert all(block.bn1.num_features == 16 for block in model.layer2)
    model.train()
    x = torch.randn(4, 3, 32, 32)
    unfused = copy.deepcopy(model)
    for module in unfused.modules():
        if isinstance(module, InPlaceABN):
            module.fused = False
    for m in (model, unfused):
        m(x).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), unfused.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("variant", [None, "inplace-abn"])
def test_removing_every_filter_of_a_layer_is_refused_naming_it(variant: str | None) -> None:
    model = _inplace_abn_resnet20() if variant else create_model("resnet20_cifar",
                                                                  "cifar10").eval()
    _prune_filters(model.layer1[0].conv1, model.layer1[0].bn1, slice(None))
    _prune_filters(model.layer2[0].conv1, model.layer2[0].bn1, slice(0, None, 2))
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(UsageError, match=r"would remove all 16 filters of 'layer1\.0\.conv1'; "
                                         r"keep at least one \(lower the pruner's sparsity"):
        thin_model(model, inputs=torch.randn(2, 3, 32, 32))
    after = model.state_dict()
    assert list(after) == list(state)
    assert all(torch.equal(state[k], v) for k, v in after.items())  # left unchanged


def test_removing_every_input_of_a_layer_is_refused_naming_the_zeroed_layer() -> None:
    model = create_model("simplenet_mnist", "mnist").eval()
    with torch.no_grad():
        model.fc2.weight.zero_()  # no fc1 output is read: fc1 would keep no row at all
    with pytest.raises(UsageError, match="all 500 input channels of 'fc2'"):
        thin_model(model, inputs=torch.randn(2, 1, 28, 28))
