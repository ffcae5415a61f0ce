"""Simulated post-training quantization: wrappers, folding, recipes, packing, Distiller's stats."""

from __future__ import annotations

import io
from collections import OrderedDict

import pytest
import torch
from torch import nn

from compressor.models.factory import create_model
from compressor.quantization.core.clipping import stats_range
from compressor.quantization.core.errors import QuantizationError
from compressor.quantization.core.range_linear import quant_params
from compressor.quantization.core.settings import settings_from_args
from compressor.quantization.simulated.fusion import Fusion, apply_fusions, find_fusions
from compressor.quantization.simulated.packing import pack_state_dict, unpack_state_dict
from compressor.quantization.simulated.post_train import (
    PostTrainLinearQuantizer,
    calibration_batches,
    is_quantized,
    quantization_summary,
    quantize_from_recipe,
)
from compressor.quantization.statistics.collect import collect_stats
from compressor.quantization.statistics.stats_file import load_stats
from tests.conftest import CORPUS, trained_like_batchnorms

STATS_DIR = CORPUS / "quantization" / "post_train_quant" / "stats"


def _record(low: float, high: float) -> dict[str, float]:
    return {"min": low, "max": high, "avg_min": low, "avg_max": high, "mean": 0.0, "std": 1.0,
            "b": 1.0}


def _resnet20() -> tuple[nn.Module, torch.Tensor, dict]:
    torch.manual_seed(0)
    model = trained_like_batchnorms(create_model("resnet20_cifar", "cifar10"))
    x = torch.randn(16, 3, 16, 16)
    return model, x, collect_stats(model, [x[:8], x[8:]])


def test_wrapped_linear_hand_worked() -> None:
    fc = nn.Linear(2, 1)
    with torch.no_grad():
        fc.weight.copy_(torch.tensor([[0.5, -1.0]]))
        fc.bias.fill_(0.25)
    model = nn.Sequential(OrderedDict(fc=fc))
    stats = {"fc": {"inputs": {0: _record(-1.0, 1.0)}, "output": _record(-2.0, 2.0)}}
    PostTrainLinearQuantizer(settings_from_args({}, "q"), stats).quantize(model)
    # input scale 127.5: 0.3 -> 38, -0.6 -> -76 (half to even); weight scale 127.5: 64, -128;
    # bias on the accumulator's grid 127.5^2: 4064; output scale 63.75: 16224/16256.25 -> 64
    out = model(torch.tensor([[0.3, -0.6]]))
    assert out.item() == pytest.approx(64 / 63.75, abs=1e-6)
    assert model.fc.wrapped.weight[0].tolist() == pytest.approx([64 / 127.5, -128 / 127.5])
    assert model.fc.input0_scale.item() == 127.5 and model.fc.output_scale.item() == 63.75


def test_batchnorm_folding_is_exact_in_float() -> None:
    model, x, _ = _resnet20()
    expected = model(x)
    found = find_fusions(model)
    fusions = [Fusion(f.layer, f.batchnorm, None) for f in found if f.batchnorm]
    assert len(fusions) == 21 and fusions[0] == Fusion("conv1", "bn1", None)
    # each residual add -> ReLU is a pair too (int8's add_relu); nothing to fold in it
    adds = [f for f in found if not f.batchnorm]
    assert len(adds) == 9 and Fusion("layer1.0.residual_eltwiseadd", None, "layer1.0.relu2") in adds
    apply_fusions(model, fusions)
    assert isinstance(model.bn1, nn.Identity) and model.conv1.bias is not None
    torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-5)


def test_quantize_uses_folded_and_fused_statistics() -> None:
    model, x, stats = _resnet20()
    settings = settings_from_args({"mode": "asym_u", "clip_acts": "AVG"}, "q")
    PostTrainLinearQuantizer(settings, stats).quantize(model)
    assert isinstance(model.relu, nn.Identity) and isinstance(model.layer1[0].bn2, nn.Identity)
    low, high = stats_range(stats["relu"]["output"], "AVG", "ASYMMETRIC_UNSIGNED", 8)
    assert torch.equal(model.conv1.output_scale, quant_params(low, high, 8, "asym_u")[0])
    # conv2's output (bn2 folded, no ReLU) uses bn2's statistics
    low, high = stats_range(stats["layer1.0.bn2"]["output"], "AVG", "ASYMMETRIC_UNSIGNED", 8)
    assert torch.equal(model.layer1[0].conv2.output_scale,
                       quant_params(low, high, 8, "asym_u")[0])
    # the residual add quantizes once, after its fused ReLU, on the ReLU's (half) range
    add = model.layer1[0].residual_eltwiseadd
    assert isinstance(model.layer1[0].relu2, nn.Identity) and isinstance(add.activation, nn.ReLU)
    low, high = stats_range(stats["layer1.0.relu2"]["output"], "AVG", "ASYMMETRIC_UNSIGNED", 8,
                            half_range=True)
    assert torch.equal(add.output_scale, quant_params(low, high, 8, "asym_u")[0])
    # an input fed by a quantized layer is quantized with that layer's output parameters
    assert torch.equal(model.layer1[0].conv1.input0_scale, model.conv1.output_scale)
    add = model.layer1[0].residual_eltwiseadd
    assert torch.equal(add.input1_scale, model.layer1[0].conv2.output_scale)
    rows = {row["name"]: row for row in quantization_summary(model)}
    assert rows["conv1"]["fused"] == "ReLU" and "layer1.0.relu2" not in rows
    assert rows["layer1.0.residual_eltwiseadd"]["fused"] == "ReLU"
    assert is_quantized(model)
    assert (model(x).argmax(1) == _resnet20()[0](x).argmax(1)).float().mean() >= 0.9


def test_recipe_and_packed_checkpoint_reproduce_outputs_bitwise() -> None:
    model, x, stats = _resnet20()
    settings = settings_from_args({"mode": "asym_u", "per_channel_wts": True,
                                   "overrides": {"fc": {"bits_weights": 4}}}, "q")
    quantizer = PostTrainLinearQuantizer(settings, stats)
    quantizer.quantize(model)
    expected = model(x)
    packed = pack_state_dict(model)
    assert packed["conv1.wrapped.weight_int"].dtype == torch.int8
    assert "conv1.wrapped.weight" not in packed
    # one-element scales and zero points travel as one vector (fewer tensors, smaller file)
    assert not [key for key, value in packed.items()
                if key.endswith(("_scale", "_zero_point")) and value.numel() == 1]
    assert packed["quantization_scalars"].dtype == torch.float64
    buffer = io.BytesIO()
    torch.save(packed, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    fresh = quantize_from_recipe(create_model("resnet20_cifar", "cifar10"), quantizer.recipe())
    fresh.load_state_dict(unpack_state_dict(fresh, loaded))
    assert torch.equal(fresh(x), expected)
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    # the first format, scales and zero points one tensor each, still loads
    one_by_one = {key: value for key, value in loaded.items() if key != "quantization_scalars"}
    one_by_one.update({key: value for key, value in model.state_dict().items()
                       if key.endswith(("_scale", "_zero_point")) and value.numel() == 1})
    again = quantize_from_recipe(create_model("resnet20_cifar", "cifar10"), quantizer.recipe())
    again.load_state_dict(unpack_state_dict(again, one_by_one))
    assert torch.equal(again(x), expected)


def test_packed_weights_are_int8_and_four_times_smaller() -> None:
    torch.manual_seed(0)
    model = create_model("simplenet_mnist", "mnist").eval()
    x = torch.randn(8, 1, 28, 28)
    PostTrainLinearQuantizer(settings_from_args({}, "q"), collect_stats(model, [x])
                             ).quantize(model)
    packed = pack_state_dict(model)
    float_bytes = packed_bytes = 0
    for name in ("conv1", "conv2", "fc1", "fc2"):
        weight = model.get_submodule(name).wrapped.weight
        ints = packed[f"{name}.wrapped.weight_int"]
        assert ints.dtype == torch.int8 and ints.shape == weight.shape
        float_bytes += weight.numel() * weight.element_size()
        packed_bytes += ints.numel() * ints.element_size()
    assert float_bytes == 4 * packed_bytes


def test_missing_statistics_name_the_layer() -> None:
    model, _, stats = _resnet20()
    del stats["fc"]
    with pytest.raises(QuantizationError, match=r"lack layer 'fc' \(output\).*--qe-calibration"):
        PostTrainLinearQuantizer(settings_from_args({}, "q"), stats).quantize(model)
    with pytest.raises(QuantizationError, match="needs activation statistics"):
        PostTrainLinearQuantizer(settings_from_args({}, "q"), None)


def test_float_layers_and_dynamic_ranges() -> None:
    torch.manual_seed(0)
    model = create_model("simplenet_mnist", "mnist").eval()
    reference = create_model("simplenet_mnist", "mnist").eval()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(8, 1, 28, 28)
    settings = settings_from_args({"overrides": {"fc2": {"bits_activations": None,
                                                         "bits_weights": None}}}, "q")
    PostTrainLinearQuantizer(settings, None, dynamic=True).quantize(model)
    assert type(model.fc2) is nn.Linear and model.conv1.dynamic
    assert "conv1.output_scale" not in model.state_dict()
    torch.testing.assert_close(model(x), reference(x), atol=0.02, rtol=0.05)


def test_calibration_batches_are_a_seeded_subset() -> None:
    data = [(torch.full((2,), float(i)), i) for i in range(100)]
    batches = calibration_batches(data, 0.05, 2, seed=3)
    assert [b[0].shape for b in batches] == [(2, 2), (2, 2), (1, 2)]
    again = calibration_batches(data, 0.05, 2, seed=3)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(batches, again, strict=True))
    with pytest.raises(QuantizationError, match="fraction"):
        calibration_batches(data, 0.0, 2, seed=3)


@pytest.mark.skipif(not STATS_DIR.is_dir(), reason=f"Distiller's stats not found at {STATS_DIR}")
@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_distiller_stats_files_quantize_torchvision_resnets(arch: str) -> None:
    stats = load_stats(STATS_DIR / f"{arch}_quant_stats.yaml")
    settings = settings_from_args({
        "bits_activations": 8, "bits_parameters": 8, "mode": "ASYMMETRIC_UNSIGNED",
        "per_channel_wts": True, "clip_acts": "AVG", "inputs_quant_auto_fallback": False,
        "overrides": {"conv1": {"input_overrides": {0: {"from_output": True}}},
                      "fc": {"clip_acts": "NONE", "input_overrides": {0: {"clip_acts": "AVG"}}}},
    }, "post_train_quantizer")
    torch.manual_seed(0)
    model = create_model(arch, "imagenet").eval()
    PostTrainLinearQuantizer(settings, stats).quantize(model)
    low, high = stats_range(stats["fc"]["output"], "NONE", "ASYMMETRIC_UNSIGNED", 8)
    assert torch.equal(model.fc.output_scale, quant_params(low, high, 8, "asym_u")[0])
    assert len(quantization_summary(model)) > 20
    with torch.no_grad():
        assert torch.isfinite(model(torch.randn(1, 3, 64, 64))).all()
