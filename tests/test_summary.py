"""Summaries and results metrics: per-layer tables, totals, MACs at each arch's input spec."""

from __future__ import annotations

import pytest
import torch

from compressor.models import InputSpec, create_model, description_of, get_arch_spec
from compressor.reports.metrics import (
    count_macs,
    layer_costs,
    model_file_bytes,
    model_file_size,
    model_metrics,
)
from compressor.reports.summary import print_summary
from compressor.utils.errors import UsageError


def test_simplenet_metrics_by_hand():
    model = create_model("simplenet_mnist", "mnist")
    with torch.no_grad():
        model.fc1.weight[:250] = 0
    metrics = model_metrics(model)
    weights = 20 * 25 + 50 * 20 * 25 + 800 * 500 + 500 * 10
    biases = 20 + 50 + 500 + 10
    assert metrics["params"] == weights + biases
    assert metrics["nonzero_params"] == weights + biases - 250 * 800
    assert metrics["sparsity"] == pytest.approx(250 * 800 / weights)
    # conv1 24x24x20 outputs of 25 MACs, conv2 8x8x50 of 500, fc1 500x800, fc2 10x500
    assert metrics["macs"] == 24 * 24 * 20 * 25 + 8 * 8 * 50 * 500 + 500 * 800 + 10 * 500
    assert metrics["model_file_size_compressed"] < metrics["model_file_size"]


def test_masked_weights_are_counted_in_place():
    # Masks are applied in place to the plain weights: the zeros are what every report counts.
    model = create_model("resnet20_cifar", "cifar10")
    dense = create_model("resnet20_cifar", "cifar10")
    with torch.no_grad():
        model.layer1[0].conv1.weight[:8] = 0
    metrics, dense_metrics = model_metrics(model), model_metrics(dense)
    assert metrics["params"] == dense_metrics["params"]
    assert metrics["nonzero_params"] == dense_metrics["nonzero_params"] - 8 * 16 * 9
    assert model_file_size(model)[0] == pytest.approx(model_file_size(dense)[0], rel=0.01)
    assert model_file_bytes(model) == model_file_size(model)[0]  # the size alone, uncompressed
    table = print_summary(model, "sparsity")
    row = next(line for line in table.splitlines() if "layer1.0.conv1.weight" in line)
    assert "50.00" in row  # half of the filters and half of the elements are zero
    modules = print_summary(model, "modules")
    assert "layer1.0.conv1 " in modules and "weight (16, 16, 3, 3)" in modules


def test_macs_at_the_models_own_input_spec():
    assert get_arch_spec("inception_v3").input_spec("imagenet").input_size == (3, 299, 299)
    small = create_model("resnet20_cifar", "cifar10")
    spec = description_of(small).input_spec
    big = create_model("resnet20_cifar", "cifar10", input_spec=InputSpec(
        (3, 64, 64), 64, 64, spec.mean, spec.std))
    assert layer_costs(big)[0].input_shape == (3, 64, 64)
    assert count_macs(big) - big.fc.weight.numel() == 4 * (
        count_macs(small) - small.fc.weight.numel())


def test_resnet20_compute_table():
    model = create_model("resnet20_cifar", "cifar10")
    table = print_summary(model, "compute")
    assert "layer2.0.downsample.0" in table and "16x32x32" in table
    assert f"{count_macs(model):,}" in table
    assert 40e6 < count_macs(model) < 41e6  # Distiller reports 40.8M for resnet20_cifar


def test_model_summary_and_bad_kind():
    model = create_model("simplenet_digits", "digits")
    text = print_summary(model, "model")
    assert "SimpleNetDigits" in text and "MACs" in text and "1x8x8" in text
    with pytest.raises(UsageError, match="sparsity, compute, model, modules"):
        print_summary(model, "png")


@pytest.mark.parametrize("kind,key", [("qat", "sparsity"),
                                      ("post_train", "quantized_zero_weights")])
def test_only_integer_weights_report_zeros_as_rounded(kind: str, key: str) -> None:
    """A quantization-aware-trained model's weights are float: their zeros are a sparsity; a
    post-training quantized model's are integers, whose zeros rounding made too."""
    from compressor.models.description import describe

    model = create_model("simplenet_digits", "digits")
    describe(model, description_of(model).with_transform("quantization", {"kind": kind}))
    metrics = model_metrics(model)
    assert key in metrics and ({"sparsity", "quantized_zero_weights"} - {key}).isdisjoint(metrics)
