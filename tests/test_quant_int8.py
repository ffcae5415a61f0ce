"""Real int8 conversion: same integers as the simulation, agreeing predictions, refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from compressor.models.factory import create_model
from compressor.quantization.core.errors import QuantizationError
from compressor.quantization.core.range_linear import quantize
from compressor.quantization.core.settings import settings_from_args
from compressor.quantization.int8.convert import (
    check_convertible,
    convert_to_int8,
    kernels_saturate,
)
from compressor.quantization.simulated.post_train import PostTrainLinearQuantizer
from compressor.quantization.statistics.collect import collect_stats
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
    # activations on the 7-bit grid where this CPU's x86 kernels need it (no VNNI)
    settings = settings_from_args({"reduce_range": kernels_saturate("x86"), **args}, "q")
    return PostTrainLinearQuantizer(settings, stats).quantize(model)


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
    assert "other widths stay simulated" in str(info.value)


def test_float_model_and_unknown_backend_are_refused() -> None:
    model = create_model("simplenet_mnist", "mnist")
    with pytest.raises(QuantizationError, match="needs a post-training-quantized model"):
        convert_to_int8(model)
    with pytest.raises(QuantizationError, match="unknown int8 backend"):
        convert_to_int8(model, "tensorrt")


def test_kernels_saturate_is_measured_per_engine() -> None:
    assert kernels_saturate("no-such-engine") is False
    if "qnnpack" in torch.backends.quantized.supported_engines:
        assert kernels_saturate("qnnpack") is False  # QNNPACK accumulates in int32
    engine = torch.backends.quantized.engine
    kernels_saturate("x86" if engine != "x86" else "fbgemm")
    assert torch.backends.quantized.engine == engine  # the probe leaves the engine as it was


def test_reduce_range_puts_activations_on_a_7_bit_grid() -> None:
    from compressor.quantization.core.settings import QuantSettings, resolve_layers

    model = create_model("simplenet_mnist", "mnist")
    settings = settings_from_args({"reduce_range": True, "overrides": {
        "fc2": {"bits_activations": 4}}}, "q")
    layers = resolve_layers(model, settings)
    assert layers["conv1"].bits_activations == 7 and layers["conv1"].bits_weights == 8
    assert layers["fc2"].bits_activations == 4  # other widths are left alone
    assert QuantSettings.from_recipe(settings.to_recipe()).reduce_range is True
    sim = _quantized("simplenet_mnist", "mnist", (1, 28, 28), {"reduce_range": True})
    with torch.no_grad():
        out = sim.conv1(_inputs(8, (1, 28, 28), seed=3))
    levels = torch.unique(torch.round(out * sim.conv1.output_scale))
    assert levels.numel() <= 128 and levels.min() >= -64 and levels.max() <= 127


def test_full_range_activations_are_refused_where_kernels_saturate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from compressor.quantization.int8 import convert as int8

    full = _quantized("simplenet_mnist", "mnist", (1, 28, 28), {"reduce_range": False})
    reduced = _quantized("simplenet_mnist", "mnist", (1, 28, 28), {"reduce_range": True})
    monkeypatch.setattr(int8, "kernels_saturate", lambda backend: True)
    with pytest.raises(QuantizationError, match="saturate 8-bit activations.*reduce_range"):
        convert_to_int8(full, "x86")
    converted = convert_to_int8(reduced, "x86")  # 7-bit activations fit every CPU's kernels
    x = _inputs(64, (1, 28, 28), seed=4)
    with torch.no_grad():
        assert (converted(x).argmax(1) == reduced(x).argmax(1)).float().mean() >= 0.99
