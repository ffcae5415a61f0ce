"""Real int8 conversion: same integers as the simulation, agreeing predictions, refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from compressor.models.registry import create_model
from compressor.quantization.errors import QuantizationError
from compressor.quantization.int8 import check_convertible, convert_to_int8
from compressor.quantization.post_train import PostTrainLinearQuantizer
from compressor.quantization.range_linear import quantize
from compressor.quantization.settings import settings_from_args
from compressor.quantization.stats import collect_stats
from tests.conftest import trained_like_batchnorms


def _inputs(count: int, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Half noise, half smooth structured images."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(count // 2, *shape, generator=generator)
    coarse = torch.randn(count - count // 2, shape[0], 4, 4, generator=generator)
    smooth = 2 * F.interpolate(coarse, size=shape[1:], mode="bilinear")
    return torch.cat([noise, smooth])


def _quantized(arch: str, dataset: str, shape: tuple[int, ...], args: dict) -> nn.Module:
    torch.manual_seed(0)
    model = trained_like_batchnorms(create_model(arch, dataset))
    calibration = _inputs(128, shape, seed=1)
    stats = collect_stats(model, [calibration[:64], calibration[64:]])
    return PostTrainLinearQuantizer(settings_from_args(args, "q"), stats).quantize(model)


@pytest.mark.parametrize("args", [{}, {"mode": "asym_u", "per_channel_wts": True}])
def test_int8_agrees_with_simulation_simplenet(args: dict) -> None:
    sim = _quantized("simplenet_mnist", "mnist", (1, 28, 28), args)
    int8 = convert_to_int8(sim, "x86")
    assert isinstance(int8.model.conv1.op, torch.ao.nn.intrinsic.quantized.ConvReLU2d)
    # the weights are the simulation's integers
    wrapper = sim.conv1
    ints = quantize(wrapper.wrapped.weight, wrapper.weight_scale, wrapper.weight_zero_point, 8,
                    wrapper.weight_quant.mode)
    shift = 0 if wrapper.weight_quant.mode.signed else 128
    assert torch.equal(int8.model.conv1.op.weight().int_repr().float(), ints - shift)
    x = _inputs(256, (1, 28, 28), seed=2)
    with torch.no_grad():
        expected, got = sim(x), int8(x)
    assert not got.is_quantized
    assert (expected.argmax(1) == got.argmax(1)).float().mean() >= 0.99
    torch.testing.assert_close(got, expected, atol=0.01, rtol=0)


def test_int8_agrees_with_simulation_resnet20_eltwise() -> None:
    sim = _quantized("resnet20_cifar", "cifar10", (3, 32, 32), {})
    int8 = convert_to_int8(sim, "x86")
    x = _inputs(128, (3, 32, 32), seed=2)
    with torch.no_grad():
        expected, got = sim(x), int8(x)
    assert (expected.argmax(1) == got.argmax(1)).float().mean() >= 0.98
    # layer by layer the int8 model stays within an output step or two of the simulation
    first = sim.conv1(x)
    step = 1 / sim.conv1.output_scale
    assert ((int8.model.conv1(x).dequantize() - first).abs() <= step * 1.01).all()


@pytest.mark.parametrize(("args", "dynamic", "words"), [
    ({"bits_activations": 4}, False, "output in 4 bits"),
    ({"bits_weights": 6}, False, "weights in 6 bits"),
    ({"overrides": {"fc2": {"bits_activations": None}}}, False, "output in float"),
    ({}, True, "dynamic"),
])
def test_not_convertible_is_refused(args: dict, dynamic: bool, words: str) -> None:
    torch.manual_seed(0)
    model = create_model("simplenet_mnist", "mnist").eval()
    stats = None if dynamic else collect_stats(model, [torch.randn(4, 1, 28, 28)])
    PostTrainLinearQuantizer(settings_from_args(args, "q"), stats, dynamic).quantize(model)
    with pytest.raises(QuantizationError, match=words) as info:
        check_convertible(model)
    assert "widths 4/8 stay simulated" in str(info.value)


def test_float_model_and_unknown_backend_are_refused() -> None:
    model = create_model("simplenet_mnist", "mnist")
    with pytest.raises(QuantizationError, match="needs a post-training-quantized model"):
        convert_to_int8(model)
    with pytest.raises(QuantizationError, match="unknown int8 backend"):
        convert_to_int8(model, "tensorrt")
