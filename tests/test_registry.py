"""Every registered architecture: a consistent spec; the non-torchvision ones build and train."""

from __future__ import annotations

import pytest
import torch
from torchvision.models import list_models

from compressor.models import create_model, get_arch_spec, list_archs, register_model
from compressor.models.description import description_of
from compressor.models.registry import DATASETS
from compressor.training.losses import LOSSES, get_loss, main_logits
from compressor.utils.errors import UsageError

OWN_ARCHS = [name for name in list_archs() if get_arch_spec(name).family != "torchvision"]
# A sample of torchvision families small enough for a CPU test (all 80 are registered).
TORCHVISION_SAMPLE = ["resnet18", "mobilenet_v2", "squeezenet1_1", "googlenet",
                      "shufflenet_v2_x0_5"]
DISTILLER_NAMES = ["resnet20_cifar", "resnet32_cifar", "resnet44_cifar", "resnet56_cifar",
                   "resnet110_cifar", "plain20_cifar", "vgg11_cifar", "vgg13_cifar",
                   "vgg16_cifar", "vgg19_cifar", "vgg11_bn_cifar", "vgg13_bn_cifar",
                   "vgg16_bn_cifar", "vgg19_bn_cifar", "simplenet_mnist"]


def test_distiller_and_torchvision_names_are_registered() -> None:
    names = set(list_archs())
    assert set(DISTILLER_NAMES) <= names
    assert set(list_models(module=__import__("torchvision").models)) <= names
    assert "simplenet_digits" in names


@pytest.mark.parametrize("arch", list_archs())
def test_spec_is_consistent(arch: str) -> None:
    spec = get_arch_spec(arch)
    assert spec.loss in LOSSES
    assert spec.datasets and set(spec.datasets) <= set(DATASETS)
    for dataset in spec.datasets:
        input_spec = spec.input_spec(dataset)
        assert len(input_spec.mean) == len(input_spec.std) == input_spec.channels
        assert input_spec.crop_size == input_spec.input_size[1] == input_spec.input_size[2]
        assert input_spec.resize_size >= input_spec.crop_size


@pytest.mark.parametrize("arch", OWN_ARCHS + TORCHVISION_SAMPLE)
def test_builds_and_trains_at_its_input_spec(arch: str) -> None:
    torch.manual_seed(0)
    spec = get_arch_spec(arch)
    model = create_model(arch, spec.default_dataset)
    description = description_of(model)
    assert (description.arch, description.dataset) == (arch, spec.default_dataset)
    assert description.input_spec == spec.input_spec(spec.default_dataset)
    inputs = torch.randn(2, *description_of(model).input_spec.input_size, requires_grad=True)
    model.train()
    output = model(inputs)
    loss = get_loss(spec.loss)(output, torch.tensor([0, 1]))
    loss.backward()
    assert main_logits(output).shape == (2, description_of(model).num_classes)
    assert inputs.grad is not None and torch.isfinite(inputs.grad).all()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("arch", list_archs())
def test_every_arch_takes_its_own_input_spec(arch: str) -> None:
    """Built without weights (meta device) and run on a batch of its InputSpec's size, every
    registered architecture gives its logits: vit_h_14's spec is its weights' 518 px, and its
    model, built from scratch, took 224 only. RegNet's builder reads tensor values: it is
    built for real, at its spec, by the tests that quantize it."""
    spec = get_arch_spec(arch)
    input_spec = spec.input_spec(spec.default_dataset)
    try:
        with torch.device("meta"):
            model = create_model(arch, spec.default_dataset).eval()
    except NotImplementedError:
        assert arch.startswith("regnet_"), arch
        return
    with torch.device("meta"), torch.no_grad():
        output = main_logits(model(torch.empty(1, *input_spec.input_size)))
    assert output.shape == (1, description_of(model).num_classes)


def test_unknown_arch_and_attr_and_dataset_are_errors() -> None:
    with pytest.raises(UsageError, match="did you mean resnet20_cifar"):
        get_arch_spec("resnet20_cifr")
    with pytest.raises(UsageError, match="no model attribute 'depth'"):
        create_model("simplenet_digits", "digits", model_attrs={"depth": 3})
    with pytest.raises(UsageError, match="does not support dataset 'imagenet'"):
        create_model("resnet20_cifar", "imagenet")


def test_duplicate_registration_is_refused() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_model("resnet20_cifar", datasets=("cifar10",))(lambda **kw: None)


def test_cifar_resnet_adapts_to_one_channel_28px() -> None:
    model = create_model("resnet20_cifar", "fashion-mnist")
    assert description_of(model).input_spec.input_size == (1, 28, 28)
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)
