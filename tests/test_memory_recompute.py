"""The "recompute" variant trains exactly the plain network: every arch that has it."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from compressor.memory import (
    MEMORY_VARIANTS,
    apply_memory_variant,
    enable_checkpointing,
    is_checkpointed,
    measure_saved_bytes,
    training_divergence,
)
from compressor.models import create_model, get_arch_spec, list_archs
from compressor.utils.errors import UsageError

RECOMPUTE_ARCHS = [a for a in list_archs() if get_arch_spec(a).checkpoint_blocks]
# Trained side by side with its plain model: one arch for each implementation of a block class
# (the cheapest that has it: a class recomputes the same way in every arch that uses it), plus
# inception_v3 and densenet121 (torchvision's own blocks); the test below checks that every
# arch with the variant has only classes these cover, and resnet152 is checked to recompute
# every one of its blocks.
EXACT = ["resnet20_cifar", "preact_resnet20_cifar", "densenet_bc_40_cifar", "vgg11_bn_cifar",
         "mobilenet_v2", "resnet18", "preact_resnet18", "preact_resnet50", "resnext50_32x4d",
         "inception_v3", "densenet121", "resnext101_32x4d"]
REQUIRED = {"resnet56_cifar", "vgg16_bn_cifar", "resnet50", "mobilenet_v2", "inception_v3",
            "densenet_bc_100_cifar", "densenet121"}



pytestmark = pytest.mark.usefixtures("one_thread")

def _plain(arch: str, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, torch.Tensor]:
    """A plain model and a small batch for it (Inception without its aux head at 75x75)."""
    spec = get_arch_spec(arch)
    attrs = {"aux_logits": False} if arch == "inception_v3" else None
    torch.manual_seed(0)
    model = create_model(arch, spec.default_dataset, model_attrs=attrs).to(dtype)
    size = 75 if arch == "inception_v3" else 32
    channels = spec.input_spec(spec.default_dataset).channels
    return model, torch.randn(2, channels, size, size, dtype=dtype)


def test_the_exact_tests_cover_every_block_class_of_the_registry() -> None:
    assert REQUIRED <= set(RECOMPUTE_ARCHS)
    assert MEMORY_VARIANTS == ("recompute", "inplace-abn")
    def classes(arch: str) -> set[tuple[str, str]]:
        spec = get_arch_spec(arch)
        return {(spec.family, block) for block in spec.checkpoint_blocks}

    covered = set().union(*(classes(arch) for arch in EXACT))
    for arch in RECOMPUTE_ARCHS:
        assert classes(arch) <= covered, arch


@pytest.mark.parametrize("arch", EXACT)
def test_recompute_trains_exactly_as_plain(arch: str) -> None:
    plain, x = _plain(arch)
    variant = apply_memory_variant(copy.deepcopy(plain), get_arch_spec(arch), "recompute")
    assert list(variant.state_dict()) == list(plain.state_dict())
    diff = training_divergence(plain, variant, x, steps=2)
    diff.pop("grad_scale")
    # outputs, input and parameter gradients, parameters and BN running_mean / running_var /
    # num_batches_tracked (a double update would show here) after each of two SGD steps:
    # bit for bit, since a recomputation runs the very same kernels on the very same values
    assert diff == dict.fromkeys(diff, 0.0), diff
    assert all(int(b) == 2 for name, b in variant.named_buffers()
               if name.endswith("num_batches_tracked"))
    assert measure_saved_bytes(variant, x).saved_bytes < measure_saved_bytes(
        plain, x).saved_bytes


def test_every_named_block_of_a_large_model_is_recomputed() -> None:
    spec = get_arch_spec("resnet152")
    model = create_model("resnet152", "imagenet")
    blocks = [m for m in model.modules() if type(m).__name__ in spec.checkpoint_blocks]
    assert enable_checkpointing(model, spec.checkpoint_blocks) == len(blocks) == 50


@pytest.mark.parametrize("arch", ["resnet20_cifar", "densenet_bc_100_cifar"])
def test_float64_exactness_over_three_steps(arch: str) -> None:
    plain, x = _plain(arch, torch.float64)
    variant = apply_memory_variant(copy.deepcopy(plain), get_arch_spec(arch), "recompute")
    diff = training_divergence(plain, variant, x, steps=3)
    diff.pop("grad_scale")
    assert diff == dict.fromkeys(diff, 0.0), diff


def test_densenet_with_dropout_draws_the_same_masks() -> None:
    torch.manual_seed(0)
    plain = create_model("densenet_bc_100_cifar", "cifar10", model_attrs={"drop_rate": 0.2})
    efficient = apply_memory_variant(
        create_model("densenet_bc_100_cifar", "cifar10", model_attrs={"drop_rate": 0.2}),
        get_arch_spec("densenet_bc_100_cifar"), "recompute")
    efficient.load_state_dict(plain.state_dict())
    diff = training_divergence(plain, efficient, torch.randn(2, 3, 32, 32), steps=2)
    diff.pop("grad_scale")
    assert diff == dict.fromkeys(diff, 0.0), diff


def test_densenet_efficient_keeps_a_sixth_and_fixes_torchvisions_double_update() -> None:
    plain, x = _plain("densenet_bc_100_cifar")
    efficient = apply_memory_variant(copy.deepcopy(plain), get_arch_spec("densenet_bc_100_cifar"),
                                     "recompute")
    torchvision_style = copy.deepcopy(plain)
    for module in torchvision_style.modules():
        if hasattr(module, "memory_efficient"):
            module.memory_efficient = True
    saved = {name: measure_saved_bytes(m, x).saved_bytes
             for name, m in (("plain", plain), ("efficient", efficient),
                             ("torchvision", torchvision_style))}
    assert saved["efficient"] <= 0.17 * saved["plain"], saved
    assert saved["efficient"] < saved["torchvision"] < saved["plain"], saved
    counts = {name: int(m.features.denseblock1.denselayer1.norm1.num_batches_tracked)
              for name, m in (("plain", plain), ("efficient", efficient),
                              ("torchvision", torchvision_style))}
    assert counts == {"plain": 1, "efficient": 1, "torchvision": 2}


def test_large_input_densenet_and_torchvision_builder_attribute() -> None:
    model = create_model("densenet_bc_100_cifar", "imagenet", model_attrs={"small_inputs": False})
    assert model.features.conv0.kernel_size == (7, 7) and hasattr(model.features, "pool0")
    small = create_model("densenet_bc_100_cifar", "cifar10")
    assert small.features.conv0.kernel_size == (3, 3) and not hasattr(small.features, "pool0")
    assert small(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_segments_of_a_sequential_and_deepcopy_keep_working() -> None:
    model = create_model("vgg11_bn_cifar", "cifar10")
    assert enable_checkpointing(model, ["Conv2d"]) == 8  # one segment per convolution
    assert is_checkpointed(model)
    clone = copy.deepcopy(model)
    clone.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(clone.eval()(x), model.eval()(x))
    with torch.no_grad():  # no recomputation without autograd: plain forward
        assert clone(x).shape == (2, 10)


def test_unknown_and_unsupported_variants_are_usage_errors() -> None:
    spec = get_arch_spec("simplenet_mnist")
    model = create_model("simplenet_mnist", "mnist")
    with pytest.raises(UsageError, match="no 'recompute' variant"):
        apply_memory_variant(model, spec, "recompute")
    with pytest.raises(UsageError, match="unknown memory-efficient variant 'swap'"):
        apply_memory_variant(model, spec, "swap")
