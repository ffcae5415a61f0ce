"""In-place activated batch norm: gradcheck, the unfused reference, and the CIFAR models."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.autograd import gradcheck

from compressor.memory import (
    InPlaceABN,
    InPlaceABNFunction,
    apply_memory_variant,
    convert_to_inplace_abn,
    measure_saved_bytes,
    training_divergence,
)
from compressor.models import create_model, get_arch_spec, list_archs
from compressor.utils.errors import UsageError

ACTIVATIONS = (("leaky_relu", 0.01), ("elu", 1.0), ("identity", 0.0))
# Every architecture that can be built with in-place ABN: the CIFAR ResNets and _bn VGGs.
IABN_ARCHS = [a for a in list_archs() if get_arch_spec(a).family == "resnet_cifar"
              or (get_arch_spec(a).family == "vgg_cifar" and a.endswith("_bn_cifar"))]



pytestmark = pytest.mark.usefixtures("one_thread")

@pytest.mark.parametrize("activation,param", ACTIVATIONS)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_gradcheck_float64(activation: str, param: float, training: bool, residual: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4, 3, 3, dtype=torch.float64, requires_grad=True)
    # one channel with gamma exactly 0 and one negative: the inversion must handle both
    weight = torch.tensor([1.3, 0.0, -0.7, 0.9], dtype=torch.float64, requires_grad=True)
    bias = torch.randn(4, dtype=torch.float64, requires_grad=True)
    res = torch.randn(2, 4, 3, 3, dtype=torch.float64, requires_grad=True) if residual else None
    mean, var = torch.randn(4, dtype=torch.float64), torch.rand(4, dtype=torch.float64) + 0.5

    def function(x, weight, bias, res):
        return InPlaceABNFunction.apply(x, weight, bias, res, mean.clone(), var.clone(), training,
                                        0.1, 1e-5, activation, param)

    assert gradcheck(function, (x, weight, bias, res))


@pytest.mark.parametrize("activation,param", ACTIVATIONS)
def test_matches_unfused_reference_and_saves_only_its_output(activation: str,
                                                            param: float) -> None:
    torch.manual_seed(1)
    fused = InPlaceABN(6, activation=activation, activation_param=param).double()
    with torch.no_grad():
        fused.weight.uniform_(0.5, 1.5)
        fused.bias.uniform_(-0.5, 0.5)
    reference = copy.deepcopy(fused)
    reference.fused = False
    model_a, model_b = (nn.Sequential(nn.Conv2d(3, 6, 3), m).double() for m in (reference, fused))
    model_b.load_state_dict(model_a.state_dict())
    x = torch.randn(4, 3, 8, 8, dtype=torch.float64)
    diff = training_divergence(model_a, model_b, x, steps=3)
    diff.pop("grad_scale")
    assert max(diff.values()) < 1e-12, diff
    assert torch.equal(fused.num_batches_tracked, torch.tensor(3))
    # conv saves nothing but its (excluded) input; the fused op saves its output + 2C stats
    report = measure_saved_bytes(model_b, x)
    assert report.saved_bytes == 4 * 6 * 6 * 6 * 8 + 2 * 6 * 8
    # unfused: BN input + stats, and the activation's output (nothing more for identity)
    unfused = measure_saved_bytes(model_a, x).saved_bytes
    assert unfused == report.saved_bytes * (1 if activation == "identity" else 2) - (
        0 if activation == "identity" else 2 * 6 * 8)


def test_batchnorm_state_dict_loads_and_relu_is_refused() -> None:
    bn = nn.BatchNorm2d(5)
    bn.running_mean.fill_(0.5)
    fused = InPlaceABN(5)
    fused.load_state_dict(bn.state_dict())
    assert torch.equal(fused.running_mean, bn.running_mean)
    with pytest.raises(UsageError, match="not invertible"):
        InPlaceABN(5, activation="relu")


def test_conversion_keeps_names_and_turns_relu_into_leaky_relu() -> None:
    model = create_model("resnet20_cifar", "cifar10")
    names = list(model.state_dict())
    converted = convert_to_inplace_abn(copy.deepcopy(model))
    assert converted == 19  # stem + 2 per block (9 blocks); downsample BNs have no activation
    variant = apply_memory_variant(model, get_arch_spec("resnet20_cifar"), "inplace-abn")
    assert list(variant.state_dict()) == names
    assert isinstance(variant.layer1[0].bn2, InPlaceABN)
    assert isinstance(variant.layer1[0].relu2, nn.Identity)
    assert variant.layer1[0].bn2.activation == "leaky_relu"
    assert not isinstance(variant.layer2[0].downsample[1], InPlaceABN)


@pytest.mark.parametrize("arch", IABN_ARCHS)
def test_cifar_model_trains_as_its_unfused_reference(arch: str) -> None:
    """Fused vs. the same network with BatchNorm + LeakyReLU(0.01) run by standard autograd.

    The forward pass is the same computation; the backward recovers the BN input from the
    output, so in float32 the gradients agree to round-off (relative 1e-5), not bitwise.
    """
    torch.manual_seed(0)
    plain = create_model(arch, "cifar10")
    reference, variant = copy.deepcopy(plain), copy.deepcopy(plain)
    convert_to_inplace_abn(reference, fused=False)
    apply_memory_variant(variant, get_arch_spec(arch), "inplace-abn")
    x = torch.randn(2, 3, 32, 32)
    diff = training_divergence(reference, variant, x, steps=1)
    assert diff["outputs"] == 0 and diff["buffers"] == 0, diff
    assert diff["param_grads"] <= 1e-5 * diff["grad_scale"], diff
    assert diff["input_grad"] <= 1e-5 * diff["grad_scale"], diff
    assert measure_saved_bytes(variant, x).saved_bytes < measure_saved_bytes(
        plain, x).saved_bytes


@pytest.mark.parametrize("arch", ["resnet20_cifar"])
def test_cifar_model_float64_exactness_over_steps(arch: str) -> None:
    torch.manual_seed(0)
    plain = create_model(arch, "cifar10").double()
    reference, variant = copy.deepcopy(plain), copy.deepcopy(plain)
    convert_to_inplace_abn(reference, fused=False)
    convert_to_inplace_abn(variant)
    diff = training_divergence(reference, variant, torch.randn(2, 3, 32, 32).double(), steps=3)
    diff.pop("grad_scale")
    assert max(diff.values()) <= 1e-10, diff


@pytest.mark.parametrize("arch", ["vgg16_cifar", "resnet50", "densenet_bc_100_cifar"])
def test_unsupported_architectures_are_usage_errors(arch: str) -> None:
    spec = get_arch_spec(arch)
    model = create_model(arch, spec.default_dataset)
    with pytest.raises(UsageError, match="no 'inplace-abn' variant"):
        apply_memory_variant(model, spec, "inplace-abn")
