"""Distiller's preact CIFAR ResNets, MobileNet v1 and alexnet_bn: shapes, sizes, names."""

from __future__ import annotations

import pytest
import torch

from compressor.models import create_model, list_archs
from compressor.reports.metrics import count_macs
from compressor.thinning import thin_model

PREACT = [f"preact_resnet{d}_cifar" for d in (20, 32, 44, 56, 110)]
MOBILENETS = ["mobilenet", "mobilenet_075", "mobilenet_050", "mobilenet_025"]


def test_all_registered():
    assert set(PREACT + MOBILENETS + ["alexnet_bn"]) <= set(list_archs())


@pytest.mark.parametrize("arch", PREACT)
def test_preact_forward_backward(arch):
    model = create_model(arch, "cifar10")
    out = model(torch.randn(2, 3, 32, 32))
    out.sum().backward()
    assert out.shape == (2, 10)
    depth = int(arch[len("preact_resnet"):-len("_cifar")])
    assert sum(1 for n, _ in model.named_modules() if n.endswith(".conv2")) == (depth - 2) // 2


def test_preact_module_names_and_conv_downsample():
    model = create_model("preact_resnet20_cifar", "cifar10")
    names = dict(model.named_modules())
    for name in ("conv1", "layer1.0.pre_bn", "layer1.0.pre_relu", "layer1.0.conv1",
                 "layer1.0.bn", "layer1.0.relu", "layer1.0.conv2", "final_bn", "final_relu",
                 "fc"):
        assert name in names
    assert sum(p.numel() for p in model.parameters()) == 269_722  # shortcut has no params
    conv = create_model("preact_resnet20_cifar", "cifar10",
                        model_attrs={"conv_downsample": True})
    assert isinstance(dict(conv.named_modules())["layer2.0.downsample"], torch.nn.Conv2d)
    assert conv(torch.randn(1, 3, 32, 32)).shape == (1, 10)
    assert create_model("preact_resnet20_cifar", "fashion-mnist")(
        torch.randn(1, 1, 28, 28)).shape == (1, 10)


@pytest.mark.parametrize("arch,params,macs", [
    ("mobilenet", 4_231_976, 568_740_352),  # 4.2M params, 569M mult-adds (Howard et al.)
    ("mobilenet_025", 470_072, 41_030_272),
])
def test_mobilenet_size_and_cost(arch, params, macs):
    model = create_model(arch, "imagenet")
    assert sum(p.numel() for p in model.parameters()) == params
    assert count_macs(model) == macs


@pytest.mark.parametrize("arch", MOBILENETS)
def test_mobilenet_schedule_names(arch):
    model = create_model(arch, "imagenet")
    params = dict(model.named_parameters())
    # agp-pruning/mobilenet.imagenet.schedule_agp.yaml prunes the pointwise convs and the FC.
    for index in range(4, 14):
        assert params[f"model.{index}.3.weight"].shape[2:] == (1, 1)
        assert params[f"model.{index}.0.weight"].shape[1] == 1  # depthwise
    assert "fc.weight" in params


def test_alexnet_bn_shapes_and_names():
    model = create_model("alexnet_bn", "imagenet").eval()
    names = dict(model.named_modules())
    # quantization/quant_aware_train/alexnet_bn_dorefa.yaml overrides these
    assert isinstance(names["features.0"], torch.nn.Conv2d)
    assert isinstance(names["features.1"], torch.nn.ReLU)
    assert isinstance(names["classifier.5"], torch.nn.ReLU)
    assert isinstance(names["classifier.6"], torch.nn.Linear)
    assert names["features.2"].groups == 2
    assert sum(p.numel() for p in model.parameters()) == 60_981_320
    with torch.no_grad():
        assert model(torch.randn(1, 3, 224, 224)).shape == (1, 1000)


def test_mobilenet_pointwise_filters_thin_through_depthwise():
    model = create_model("mobilenet_025", "imagenet").eval()
    with torch.no_grad():
        model.model[4][3].weight[::2] = 0
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        reference = model(x)
    thin_model(model)
    assert model.model[5][0].groups == model.model[5][0].out_channels == 32
    assert model.model[5][3].in_channels == 32
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference, atol=1e-5, rtol=0)


def test_preact_padded_shortcut_left_alone():
    torch.manual_seed(0)
    model = create_model("preact_resnet20_cifar", "cifar10").eval()
    with torch.no_grad():
        model.conv1.weight[3] = 0
        for block in model.layer1:
            block.conv2.weight[3] = 0
            block.conv1.weight[:, 3] = 0
        model.layer2[0].conv1.weight[:, 3] = 0
        for block in model.layer2:
            block.conv1.weight[::2] = 0
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        reference = model(x)
    thin_model(model)
    assert model.conv1.out_channels == 16  # the zero-padded shortcut fixes stage 1's width
    assert model.layer2[1].conv1.out_channels == 16
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference, atol=1e-5, rtol=0)
