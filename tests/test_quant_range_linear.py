"""Range-linear quantization math against hand-worked values (Distiller's conventions).

Convention: q = clamp(round(scale * x - zero_point), qmin, qmax), x = (q + zero_point) / scale.
"""

from __future__ import annotations

import pytest
import torch

from compressor.quantization import (
    ClampedLinearQuantizeSTE,
    LinearQuantizeSTE,
    LinearQuantMode,
    ModuleQuantMode,
    QuantizationError,
    accum_range,
    check_bits,
    dequantize,
    fake_quantize,
    fake_quantize_ste,
    float_range,
    parse_module_quant_mode,
    parse_quant_mode,
    quant_params,
    quantize,
    quantize_bias,
    quantized_range,
    torch_qparams,
    weight_quant_params,
)

SYM, RESTR = LinearQuantMode.SYMMETRIC, LinearQuantMode.SYMMETRIC_RESTRICTED
ASYM_U, ASYM_S = LinearQuantMode.ASYMMETRIC_UNSIGNED, LinearQuantMode.ASYMMETRIC_SIGNED


def one_line_error(match: str):
    """pytest.raises for a one-line QuantizationError containing `match`."""
    return pytest.raises(QuantizationError, match=match)


# min -2.5, max 1.5:
#   SYMMETRIC             sat = max(|-2.5|, |1.5|) = 2.5, scale = ((2^b - 1) / 2) / sat, zp = 0
#   SYMMETRIC_RESTRICTED  scale = (2^(b-1) - 1) / sat, zp = 0
#   ASYMMETRIC_UNSIGNED   scale = (2^b - 1) / (1.5 - (-2.5)), zp = round(scale * -2.5)
#   ASYMMETRIC_SIGNED     as unsigned, zp + 2^(b-1)
HAND_WORKED = [
    # bits 8
    (8, SYM, 127.5 / 2.5, 0.0, (-128, 127)),          # 51
    (8, RESTR, 127 / 2.5, 0.0, (-127, 127)),          # 50.8
    (8, ASYM_U, 255 / 4.0, -159.0, (0, 255)),         # 63.75, round(-159.375) = -159
    (8, ASYM_S, 255 / 4.0, -159.0 + 128, (-128, 127)),  # zp -31
    # bits 4
    (4, SYM, 7.5 / 2.5, 0.0, (-8, 7)),                # 3
    (4, RESTR, 7 / 2.5, 0.0, (-7, 7)),                # 2.8
    (4, ASYM_U, 15 / 4.0, -9.0, (0, 15)),             # 3.75, round(-9.375) = -9
    (4, ASYM_S, 15 / 4.0, -9.0 + 8, (-8, 7)),         # zp -1
]


@pytest.mark.parametrize(("bits", "mode", "scale", "zero_point", "qrange"), HAND_WORKED)
def test_quant_params_hand_worked(bits, mode, scale, zero_point, qrange):
    got_scale, got_zp = quant_params(-2.5, 1.5, bits, mode)
    assert got_scale.dtype == torch.float32 and got_scale.dim() == 0  # as Distiller: float32
    assert got_scale.item() == pytest.approx(scale, rel=1e-6)
    assert got_zp.item() == zero_point
    assert quantized_range(bits, mode) == qrange


def test_quantize_hand_worked_values():
    x = torch.tensor([-2.5, 0.0, 1.0, 1.5, 2.5])
    # SYMMETRIC 8 bits, scale 51: 2.5 * 51 = 127.5 -> 128 (half to even) -> clamped to 127
    assert quantize(x, 51.0, 0.0, 8, SYM).tolist() == [-128, 0, 51, 76, 127]
    # RESTRICTED, scale 50.8: -2.5 * 50.8 = -127
    assert quantize(x, 50.8, 0.0, 8, RESTR).tolist() == [-127, 0, 51, 76, 127]
    # ASYMMETRIC_UNSIGNED, scale 63.75, zp -159: 1.5 * 63.75 + 159 = 254.625 -> 255
    assert quantize(x, 63.75, -159.0, 8, ASYM_U).tolist() == [0, 159, 223, 255, 255]
    # ASYMMETRIC_SIGNED: the same integers shifted down by 128
    assert quantize(x, 63.75, -31.0, 8, ASYM_S).tolist() == [-128, 31, 95, 127, 127]
    # zero is exact in asymmetric modes: (159 + -159) / 63.75 = 0
    assert dequantize(torch.tensor(159.0), 63.75, -159.0).item() == 0.0


def test_asymmetric_range_is_widened_to_include_zero_and_zero_range_gives_scale_one():
    # [0.5, 2] -> [0, 2]: scale 255 / 2 = 127.5, zp round(0) = 0
    scale, zp = quant_params(0.5, 2.0, 8, ASYM_U)
    assert (scale.item(), zp.item()) == (127.5, 0.0)
    # [-2, -1] -> [-2, 0]: scale 127.5, zp round(-255) = -255
    scale, zp = quant_params(-2.0, -1.0, 8, ASYM_U)
    assert (scale.item(), zp.item()) == (127.5, -255.0)
    for mode in LinearQuantMode:
        scale, zp = quant_params(0.0, 0.0, 8, mode)
        assert scale.item() == 1.0
        assert quantize(torch.zeros(3), scale, zp, 8, mode).add(zp).tolist() == [0, 0, 0]


def test_per_channel_weights_along_dim_0():
    weight = torch.tensor([[-1.0, 0.5, 0.25], [0.0, 2.0, 4.0]])
    scale, zp = weight_quant_params(weight, 8, SYM, per_channel=True)
    # sat per row: 1 and 4 -> scale 127.5 / 1, 127.5 / 4
    assert scale.shape == (2, 1)
    assert scale.flatten().tolist() == [127.5, 31.875] and zp.abs().sum() == 0
    scale, zp = weight_quant_params(weight, 8, ASYM_U, per_channel=True)
    # row 0: [-1, 0.5] -> 255 / 1.5 = 170, zp round(-170) = -170; row 1: [0, 4] -> 63.75, zp 0
    assert scale.flatten().tolist() == pytest.approx([170.0, 63.75])
    assert zp.flatten().tolist() == [-170.0, 0.0]
    # per tensor: [-1, 4] -> 255 / 5 = 51, zp round(-51) = -51
    scale, zp = weight_quant_params(weight, 8, ASYM_U)
    assert (scale.item(), zp.item()) == (51.0, -51.0)
    conv = torch.randn(6, 3, 3, 3)
    scale, zp = weight_quant_params(conv, 4, ASYM_S, per_channel=True)
    assert scale.shape == zp.shape == (6, 1, 1, 1)
    assert fake_quantize(conv, scale, zp, 4, ASYM_S).shape == conv.shape
    with one_line_error("per-channel"):
        weight_quant_params(torch.randn(5), 8, SYM, per_channel=True)


@pytest.mark.parametrize("mode", list(LinearQuantMode))
@pytest.mark.parametrize("bits", [2, 5, 8, 16])
def test_round_trip_error_is_at_most_half_a_step(mode, bits):
    generator = torch.Generator().manual_seed(bits)
    x = torch.rand(500, generator=generator, dtype=torch.float64) * 4.0 - 2.5  # [-2.5, 1.5)
    scale, zp = quant_params(-2.5, 1.5, bits, mode)
    scale, zp = scale.double(), zp.double()
    low, high = float_range(scale, zp, bits, mode)
    inside = (x >= low) & (x <= high)
    error = (fake_quantize(x, scale, zp, bits, mode) - x).abs()
    # one integer step is 1 / scale (Distiller's scale is torch.ao's 1 / scale)
    assert bool((error[inside] <= 0.5 / scale + 1e-12).all())
    # outside the representable range (symmetric's +2.5 end) values saturate at the range end
    assert bool((error[~inside] <= 1.0 / scale + 1e-12).all())


def test_per_channel_round_trip():
    weight = torch.randn(8, 4, 3, 3, dtype=torch.float64)
    for mode in LinearQuantMode:
        scale, zp = weight_quant_params(weight, 8, mode, per_channel=True)
        error = (fake_quantize(weight, scale, zp, 8, mode) - weight).abs()
        assert bool((error <= 1.0 / scale + 1e-12).all())  # <= a step (sym's top end saturates)
        inside = error <= 0.5 / scale + 1e-12
        assert inside.float().mean() > 0.99


def test_float_range_and_torch_conventions():
    low, high = float_range(51.0, 0.0, 8, SYM)
    assert (low.item(), high.item()) == pytest.approx((-128 / 51, 127 / 51))
    low, high = float_range(63.75, -159.0, 8, ASYM_U)  # (0 - 159) / 63.75, (255 - 159) / 63.75
    assert (low.item(), high.item()) == pytest.approx((-159 / 63.75, 96 / 63.75))
    torch_scale, torch_zp = torch_qparams(63.75, -159.0)
    assert torch_scale.item() == pytest.approx(1 / 63.75) and torch_zp.item() == 159
    # torch.ao's fake quantization with the converted parameters gives the same grid
    # (x * scale and x / (1 / scale) may round differently at exact ties: at most a step apart)
    x = torch.rand(1000, generator=torch.Generator().manual_seed(0)) * 3.8 - 2.4
    theirs = torch.fake_quantize_per_tensor_affine(x, torch_scale.item(), 159, 0, 255)
    ours = fake_quantize(x, 63.75, -159.0, 8, ASYM_U)
    differ = (ours - theirs).abs() > 1e-6
    assert differ.float().mean() <= 0.01
    assert float((ours - theirs).abs().max()) <= 1 / 63.75 + 1e-6


LOW, HIGH = -2.5, 1.5


class _SteAgainstClamp(torch.autograd.Function):
    """Forward: the float clamp the STE stands in for; backward: the STE path's own backward.

    gradcheck then compares the STE's gradient with the numerical derivative of its
    straight-through surrogate (1 inside the clip range, 0 outside).
    """

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.clamp(x, LOW, HIGH)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            leaf = x.detach().requires_grad_(True)
            scale, zp = quant_params(LOW, HIGH, 8, ASYM_U)
            out = fake_quantize_ste(leaf, scale.double(), zp.double(), 8, ASYM_U,
                                    clip_range=(LOW, HIGH))
            (result,) = torch.autograd.grad(out, leaf, grad)
        return result


def test_ste_gradcheck_float64():
    # away from the clamp's kinks at -2.5 and 1.5 (the numerical derivative is undefined there)
    x = torch.tensor([-3.0, -2.2, -1.2, -0.3, 0.0, 0.7, 1.4, 2.9], dtype=torch.float64,
                     requires_grad=True)
    assert torch.autograd.gradcheck(_SteAgainstClamp.apply, (x,), eps=1e-6, atol=1e-7)


def test_ste_gradient_is_one_inside_and_zero_outside_the_clip_range():
    x = torch.tensor([-3.0, -2.5, -1.0, 0.0, 1.5, 2.0], dtype=torch.float64, requires_grad=True)
    scale, zp = quant_params(LOW, HIGH, 8, ASYM_U)
    out = fake_quantize_ste(x, scale.double(), zp.double(), 8, ASYM_U, clip_range=(LOW, HIGH))
    out.backward(torch.full_like(x, 3.0))
    # the gradient passes at the bounds and inside, as Distiller's clamp with Python numbers
    assert x.grad.tolist() == [0.0, 3.0, 3.0, 3.0, 3.0, 0.0]
    # the values are the fake-quantized clamped values
    expected = fake_quantize(x.detach().clamp(LOW, HIGH), scale.double(), zp.double(), 8, ASYM_U)
    assert torch.equal(out.detach(), expected)


def test_ste_per_channel_clip_range_tensors():
    x = torch.tensor([[-2.0, 1.0, 3.0], [-2.0, 1.0, 3.0]], requires_grad=True)
    low, high = torch.tensor([[-1.0], [-2.0]]), torch.tensor([[1.0], [3.0]])
    scale, zp = quant_params(low, high, 8, SYM)
    fake_quantize_ste(x, scale, zp, 8, SYM, clip_range=(low, high)).sum().backward()
    assert x.grad.tolist() == [[0.0, 1.0, 0.0], [1.0, 1.0, 1.0]]


def test_ste_without_clip_range_passes_every_gradient_as_distiller():
    x = torch.tensor([-9.0, 0.3, 9.0], requires_grad=True)
    out = fake_quantize_ste(x, 51.0, 0.0, 8, SYM)
    out.sum().backward()
    assert x.grad.tolist() == [1.0, 1.0, 1.0]
    assert out.detach().tolist() == pytest.approx([-128 / 51, 15 / 51, 127 / 51])
    q = LinearQuantizeSTE.apply(torch.tensor([0.3, 9.0]), 51.0, 0.0, -128, 127, False)
    assert q.tolist() == [15.0, 127.0]


@pytest.mark.parametrize(("text", "mode"), [
    ("sym", SYM), ("SYM", SYM), ("symmetric", SYM), ("SYMMETRIC", SYM),
    ("sym_restr", RESTR), ("Symmetric_Restricted", RESTR),
    ("asym_u", ASYM_U), ("ASYMMETRIC_UNSIGNED", ASYM_U),
    ("asym_s", ASYM_S), ("asymmetric_signed", ASYM_S), (ASYM_S, ASYM_S),
])
def test_parse_quant_mode(text, mode):
    assert parse_quant_mode(text) is mode


def test_parse_module_quant_mode_per_tensor_kind():
    assert parse_module_quant_mode("asym_u") == ModuleQuantMode(ASYM_U, ASYM_U)
    both = parse_module_quant_mode({"activations": "ASYMMETRIC_UNSIGNED", "weights": "SYMMETRIC"})
    assert both == ModuleQuantMode(activations=ASYM_U, weights=SYM)
    with one_line_error("lacks 'weights'"):
        parse_module_quant_mode({"activations": "sym"})
    with one_line_error("did you mean 'weights'"):
        parse_module_quant_mode({"activations": "sym", "weight": "sym"})
    with one_line_error("unknown activations mode 'SYMETRIC'.*did you mean 'SYMMETRIC'"):
        parse_module_quant_mode({"activations": "SYMETRIC", "weights": "sym"})


@pytest.mark.parametrize("bad", ["symm", "asym", "", "LINEAR", 3, None])
def test_unknown_mode_is_one_line_error(bad):
    with pytest.raises(QuantizationError) as info:
        parse_quant_mode(bad)
    message = str(info.value)
    assert "\n" not in message and "unknown quantization mode" in message
    assert "SYMMETRIC" in message and "asym_u" in message


@pytest.mark.parametrize("bits", [1, 17, 0, -8, 8.5, True, "8", None])
def test_bits_outside_2_to_16_are_refused(bits):
    with pytest.raises(QuantizationError) as info:
        quant_params(-1.0, 1.0, bits, SYM)
    assert "\n" not in str(info.value) and "2" in str(info.value) and "16" in str(info.value)
    with pytest.raises(QuantizationError):
        quantized_range(bits, SYM)


def test_bits_2_and_16_are_accepted():
    assert check_bits(2) == 2 and check_bits(16) == 16
    assert quantized_range(2, SYM) == (-2, 1) and quantized_range(2, RESTR) == (-1, 1)
    assert quantized_range(16, ASYM_U) == (0, 65535)


def test_bad_ranges_are_refused():
    with one_line_error("greater than its max"):
        quant_params(1.0, -1.0, 8, ASYM_U)
    with one_line_error("not finite"):
        quant_params(float("nan"), 1.0, 8, SYM)
    with one_line_error("must be a number"):
        quant_params("-1", 1.0, 8, SYM)


def test_bias_on_the_accumulator_grid():
    # input scale 51 (sym, 8 bits), weight scale 2 -> accumulator scale 102; 0.5 * 102 = 51
    q, scale = quantize_bias(torch.tensor([0.5, -0.25]), 51.0, 2.0)
    assert q.dtype == torch.int32 and q.tolist() == [51, -26]  # -25.5 -> -26 (half to even)
    assert scale.item() == 102.0
    # per-channel weight scales (C, 1, 1, 1) -> a scale per bias value
    weight_scale = torch.tensor([2.0, 3.0]).view(2, 1, 1, 1)
    q, scale = quantize_bias(torch.tensor([1.0, 1.0]), 0.5, weight_scale)
    assert scale.tolist() == [1.0, 1.5] and q.tolist() == [1, 2]  # 1.5 -> 2
    # clamped to the signed accumulator range, exactly at 32 bits
    assert accum_range(32) == (-(2 ** 31), 2 ** 31 - 1)
    q, _ = quantize_bias(torch.tensor([1e12, -1e12]), 1.0, 1.0)
    assert q.tolist() == [2 ** 31 - 1, -(2 ** 31)]
    q, _ = quantize_bias(torch.tensor([1e3]), 1.0, 1.0, bits_accum=8)
    assert q.tolist() == [127]
    with one_line_error("channel"):
        quantize_bias(torch.zeros(3), 1.0, torch.ones(2))
    with one_line_error("bits_accum=33"):
        accum_range(33)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ste_host_and_tensor_ranges_agree_at_the_bounds(dtype: torch.dtype) -> None:
    """The CPU path (the range read as numbers, hardtanh's backward) and the accelerator path
    (the range as tensors, a where) give the same values and pass the gradient at the bounds
    but not one step of the dtype outside them."""
    low, high = torch.tensor(-1.3, dtype=dtype), torch.tensor(0.9, dtype=dtype)
    inf = torch.tensor(float("inf"), dtype=dtype)
    points = [torch.nextafter(low, -inf), low, torch.nextafter(low, inf),
              torch.zeros((), dtype=dtype),
              torch.nextafter(high, -inf), high, torch.nextafter(high, inf)]
    scale, zp = quant_params(low, high, 8, ASYM_U)
    results = []
    for bounds in ((low.item(), high.item()), (low, high)):
        x = torch.stack(points).requires_grad_(True)
        out = ClampedLinearQuantizeSTE.apply(x, *bounds, scale, zp, 0, 255)
        out.backward(torch.full_like(x, 2.0))
        results.append((out.detach(), x.grad))
    assert torch.equal(results[0][0], results[1][0])
    assert results[0][1].tolist() == results[1][1].tolist() == [0.0, 2.0, 2.0, 2.0, 2.0, 2.0, 0.0]
