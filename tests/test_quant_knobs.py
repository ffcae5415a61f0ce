"""Distiller's quantization knobs mean one thing each: bits_accum clamps the accumulator
(refused for int8 kernels, which accumulate in 32 bits), bits_bias is the bias's own width, and
masked weights stay exactly zero through every quantization-aware training method."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from compressor.models.factory import create_model
from compressor.quantization.core.errors import QuantizationError
from compressor.quantization.core.range_linear import fake_quantize, weight_quant_params
from compressor.quantization.core.settings import settings_from_args
from compressor.quantization.int8.convert import check_convertible
from compressor.quantization.qat.build import QAT_CLASSES, build_qat_quantizer
from compressor.quantization.qat.quantizer import QATWrapper
from compressor.quantization.simulated.post_train import PostTrainLinearQuantizer
from compressor.quantization.statistics.collect import collect_stats
from tests.conftest import assert_user_error, run_main


def _linear(args: dict) -> tuple[nn.Module, torch.Tensor]:
    """A quantized 16 -> 4 Linear whose sums run far past 8 accumulator bits."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 4))
    with torch.no_grad():
        model[0].weight.uniform_(0.5, 1.0)
        model[0].bias.copy_(torch.tensor([0.013, -0.71, 0.35, 1.9]))
    x = torch.rand(8, 16) * 4
    stats = collect_stats(model, [x])
    quantized = PostTrainLinearQuantizer(settings_from_args(args, "q"), stats).quantize(model)
    return quantized, x


def test_bits_accum_clamps_the_accumulator() -> None:
    wide, x = _linear({})
    narrow, _ = _linear({"bits_accum": 12})
    wrapper = narrow[0]
    with torch.no_grad():
        x_q, input_scale = wrapper.quantize_input(0, x)
        scale = input_scale * wrapper.weight_scale  # the accumulator's grid
        accum = nn.functional.linear(x_q, wrapper.wrapped.weight, wrapper.grid_bias(input_scale))
        expected = wrapper.quantize_output(torch.clamp(accum * scale, -2048, 2047) / scale)
        assert float((accum * scale).abs().max()) > 2047  # the test reaches the clamp
        assert torch.equal(narrow(x), expected)
        assert not torch.equal(narrow(x), wide(x))
    with pytest.raises(QuantizationError, match="32-bit accumulators.*bits_accum 12"):
        check_convertible(narrow)


def test_bits_bias_is_the_bias_width_and_leaves_the_outputs_close() -> None:
    wide, x = _linear({})
    eight, _ = _linear({"bits_bias": 8})
    bias = eight[0].wrapped.bias.detach()
    scale, zero_point = weight_quant_params(bias, 8, "SYMMETRIC", False)
    on_grid = fake_quantize(bias, scale, zero_point, 8, "SYMMETRIC")
    with torch.no_grad():
        _, input_scale = eight[0].quantize_input(0, x)
        used = eight[0].grid_bias(input_scale)
        accum_step = 1 / float(input_scale * eight[0].weight_scale)
        assert (used - on_grid).abs().max() <= accum_step / 2 + 1e-7  # own grid, then accum's
        assert (on_grid - bias).abs().max() > 0  # 8 bits moved it
        output_step = 1 / float(eight[0].output_scale)
        assert (eight(x) - wide(x)).abs().max() <= 2 * output_step  # not wrecked


def test_qept_with_a_narrow_accumulator_is_refused_before_work(tmp_path) -> None:
    result = run_main("-a", "simplenet_digits", "-e", "--qe", "--qept", "--qe-bits-accum", "16",
                      "-j", "0", "-o", str(tmp_path))
    assert_user_error(result, "bits_accum 16", "--qe-convert-pytorch")
    assert not any(tmp_path.iterdir())


ARGS = {
    "QuantAwareTrainRangeLinearQuantizer": {"bits_activations": 8, "bits_weights": 4,
                                            "mode": "ASYMMETRIC_UNSIGNED"},
    "DorefaQuantizer": {"bits_activations": 4, "bits_weights": 4},
    "PACTQuantizer": {"bits_activations": 4, "bits_weights": 4},
    "WRPNQuantizer": {"bits_activations": 4, "bits_weights": 4},
}


@pytest.mark.parametrize("class_name", sorted(QAT_CLASSES))
def test_masked_weights_stay_exactly_zero_through_qat(class_name: str) -> None:
    torch.manual_seed(0)
    model = create_model("simplenet_mnist", "mnist")
    masked = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1:
                param.mul_(20)  # WRPN's grid is 1/7 apart at 4 bits: init weights fit under it
                mask = torch.rand_like(param) < 0.5
                param[mask] = 0.0
                masked[name] = mask
    build_qat_quantizer(class_name, ARGS[class_name], "test").prepare(model)
    wrappers = [(name, m) for name, m in model.named_modules() if isinstance(m, QATWrapper)]
    assert wrappers
    checked = 0
    for name, wrapper in wrappers:
        weight = wrapper.effective_params().get("weight")
        mask = masked.get(f"{name}.weight")
        if weight is None or mask is None:
            continue
        assert bool((weight[mask] == 0).all()), (class_name, name)
        assert bool((weight[~mask] != 0).any())  # the others are quantized, not zeroed
        checked += 1
    assert checked >= 2
