"""Every memory variant keeps the model's names and never replaces `forward` on an instance."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.fx
from torch import nn

from compressor.memory import apply_memory_variant, is_checkpointed, supported_variants
from compressor.models import create_model, get_arch_spec
from compressor.utils.errors import UsageError

pytestmark = pytest.mark.usefixtures("one_thread")

# One architecture per way a variant is applied: own models that opt in (CIFAR ResNets,
# pre-activation ResNets, VGGs, torchvision's Inception v3 as we build it), torchvision block
# containers (ResNet, MobileNet v2), dense blocks (DenseNet-BC, torchvision DenseNet), and
# in-place ABN.
CASES = [("resnet20_cifar", "recompute"), ("resnet20_cifar", "inplace-abn"),
         ("preact_resnet20_cifar", "recompute"), ("vgg11_bn_cifar", "recompute"),
         ("vgg11_bn_cifar", "inplace-abn"), ("densenet_bc_100_cifar", "recompute"),
         ("resnet18", "recompute"), ("mobilenet_v2", "recompute"),
         ("densenet121", "recompute"), ("inception_v3", "recompute")]


def _build(arch: str) -> nn.Module:
    spec = get_arch_spec(arch)
    attrs = {"aux_logits": False} if arch == "inception_v3" else None
    torch.manual_seed(0)
    return create_model(arch, spec.default_dataset, model_attrs=attrs)


@pytest.mark.parametrize("arch,variant", CASES)
def test_variant_keeps_names_and_instance_forwards(arch: str, variant: str) -> None:
    plain = _build(arch)
    variant_model = apply_memory_variant(copy.deepcopy(plain), get_arch_spec(arch), variant)
    patched = [name for name, m in variant_model.named_modules() if "forward" in vars(m)]
    assert patched == []
    assert [n for n, _ in variant_model.named_parameters()] == [
        n for n, _ in plain.named_parameters()]
    assert list(variant_model.state_dict()) == list(plain.state_dict())
    variant_model.load_state_dict(plain.state_dict())  # strict, both ways
    plain.load_state_dict(variant_model.state_dict())
    if variant == "recompute":
        assert any(is_checkpointed(m) for m in variant_model.modules())


@pytest.mark.parametrize("arch,module", [("resnet20_cifar", "layer3.2.conv2"),
                                         ("densenet_bc_40_cifar", "features.transition2.conv")])
def test_recompute_model_traces_with_fx_as_the_plain_one(arch: str, module: str) -> None:
    """Pruners trace the model with torch.fx: a recomputing model gives the plain graph."""
    plain = _build(arch)
    variant = apply_memory_variant(copy.deepcopy(plain), get_arch_spec(arch), "recompute")
    targets = [[str(node.target) for node in torch.fx.symbolic_trace(m).graph.nodes
                if node.op == "call_module"] for m in (plain, variant)]
    assert targets[0] == targets[1] and module in targets[0]


@pytest.mark.parametrize("arch", ["resnet18", "densenet_bc_40_cifar"])
def test_applying_a_variant_twice_changes_nothing_more(arch: str) -> None:
    model = _build(arch)
    apply_memory_variant(model, get_arch_spec(arch), "recompute")
    again = copy.deepcopy(model)
    apply_memory_variant(again, get_arch_spec(arch), "recompute")
    assert [type(m) for m in again.modules()] == [type(m) for m in model.modules()]


def test_efficient_is_no_longer_a_densenet_builder_attribute() -> None:
    assert supported_variants(_build("densenet_bc_100_cifar"),
                              get_arch_spec("densenet_bc_100_cifar")) == ("recompute",)
    with pytest.raises(UsageError, match="no model attribute 'efficient'"):
        create_model("densenet_bc_100_cifar", "cifar10", model_attrs={"efficient": True})
