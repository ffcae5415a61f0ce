"""Distiller's quantizer arguments: parsing, refusals, overrides and per-layer resolution."""

from __future__ import annotations

import pytest
from torch import nn

from compressor.models.layers.eltwise import EltwiseAdd
from compressor.quantization.core.clipping import ClipMode
from compressor.quantization.core.errors import QuantizationError
from compressor.quantization.core.range_linear import LinearQuantMode, ModuleQuantMode
from compressor.quantization.core.settings import (
    QuantSettings,
    quantizable_modules,
    resolve_layers,
    settings_from_args,
    with_layer_overrides,
)

ASYM_U = LinearQuantMode.ASYMMETRIC_UNSIGNED
SYM = LinearQuantMode.SYMMETRIC


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3)
        self.bn1 = nn.BatchNorm2d(4)
        self.relu1 = nn.ReLU()
        self.block = nn.Sequential(nn.Conv2d(4, 4, 1), nn.ReLU())
        self.add = EltwiseAdd()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.add(x, self.block(x))
        return self.fc(self.pool(x).flatten(1))


def test_defaults_and_distiller_example() -> None:
    assert settings_from_args({}, "q") == QuantSettings()
    s = settings_from_args({"bits_activations": 6, "bits_parameters": 6, "bits_accum": 32,
                            "mode": "ASYMMETRIC_UNSIGNED", "per_channel_wts": True,
                            "clip_acts": "AVG", "inputs_quant_auto_fallback": False,
                            "overrides": {"fc": {"clip_acts": "NONE",
                                                 "input_overrides": {0: {"clip_acts": "avg"}}},
                                          "conv1": {"input_overrides": {"0": {
                                              "from_output": True}}}}}, "q")
    assert (s.bits_activations, s.bits_weights, s.bits_bias) == (6, 6, 32)
    assert s.mode == ModuleQuantMode(ASYM_U, ASYM_U) and s.clip_acts is ClipMode.AVG
    assert s.per_channel_wts and not s.inputs_quant_auto_fallback
    assert [p for p, _ in s.overrides] == ["fc", "conv1"]
    assert s.overrides[0][1]["input_overrides"] == {0: {"clip_acts": ClipMode.AVG}}
    assert s.overrides[1][1]["input_overrides"] == {0: {"from_output": True}}
    assert QuantSettings.from_recipe(s.to_recipe()) == s


def test_mixed_mode_null_and_zero_bits() -> None:
    s = settings_from_args({"mode": {"activations": "asym_u", "weights": "sym"},
                            "bits_activations": None, "bits_weights": 0, "clip_acts": "n_std",
                            "clip_n_stds": 3}, "q")
    assert s.mode == ModuleQuantMode(ASYM_U, SYM)
    assert s.bits_activations is None and s.bits_weights is None and s.clip_n_stds == 3.0
    assert QuantSettings.from_recipe(s.to_recipe()) == s


@pytest.mark.parametrize(("args", "words"), [
    ({"bits_actvations": 8}, ["unknown key 'bits_actvations'", "bits_activations"]),
    ({"bits_activations": 1}, ["bits_activations=1", "2..16"]),
    ({"bits_weights": 17}, ["bits_weights=17"]),
    ({"bits_activations": 7.5}, ["whole number"]),
    ({"bits_activations": True}, ["whole number"]),
    ({"bits_bias": 33}, ["bits_bias=33"]),
    ({"bits_accum": 64}, ["bits_accum=64"]),
    ({"bits_weights": 8, "bits_parameters": 8}, ["keep one"]),
    ({"mode": "SYMETRIC"}, ["unknown quantization mode", "SYMMETRIC"]),
    ({"mode": {"activations": "sym"}}, ["lacks 'weights'"]),
    ({"clip_acts": "mean"}, ["unknown clip mode"]),
    ({"clip_acts": "N_STD"}, ["clip_n_stds"]),
    ({"clip_n_stds": -1}, ["positive"]),
    ({"per_channel_wts": "yes"}, ["true or false"]),
    ({"overrides": ["fc"]}, ["overrides must map"]),
    ({"overrides": {"fc(": {}}}, ["not a valid regex"]),
    ({"overrides": {"fc": {"bits_activation": 8}}}, ["override 'fc'", "bits_activation"]),
    ({"overrides": {"fc": {"bits_weights": 1}}}, ["override 'fc'", "bits_weights=1"]),
    ({"overrides": {"fc": 8}}, ["expected a mapping"]),
    ({"overrides": {"fc": {"input_overrides": {"x": {}}}}}, ["index 'x'"]),
    ({"overrides": {"fc": {"input_overrides": {0: {"from_out": True}}}}}, ["from_output"]),
    ({"overrides": {"fc": {"input_overrides": {0: {"mode": "bad"}}}}}, ["activations mode"]),
])
def test_bad_values_are_one_line_errors(args, words) -> None:
    with pytest.raises(QuantizationError) as info:
        settings_from_args(args, "quantizers.q")
    text = str(info.value)
    assert text.startswith("quantizers.q") and "\n" not in text and ";" in text
    for word in words:
        assert word in text


def test_extra_keys_are_left_to_the_caller() -> None:
    assert settings_from_args({"ema_decay": 0.99}, "q", extra_keys=("ema_decay",)) == \
        QuantSettings()


def test_quantizable_modules_in_model_order() -> None:
    assert list(quantizable_modules(_Net())) == ["conv1", "relu1", "block.0", "block.1", "add",
                                                 "fc"]


def test_overrides_first_match_wins_and_fullmatch() -> None:
    s = settings_from_args({"bits_activations": 8, "overrides": {
        "conv1": {"bits_activations": 4},  # full match: not block.0
        "block\\..*": {"bits_weights": None, "clip_acts": "AVG"},
        ".*": {"bits_activations": 6},
    }}, "q")
    layers = resolve_layers(_Net(), s)
    assert layers["conv1"].bits_activations == 4 and layers["conv1"].bits_weights == 8
    assert layers["block.0"].bits_weights is None and layers["block.0"].clip_acts is ClipMode.AVG
    assert layers["block.0"].bits_activations == 8  # first match only, no merging
    assert layers["fc"].bits_activations == 6 and layers["add"].bits_activations == 6


def test_override_matching_nothing_is_an_error() -> None:
    s = settings_from_args({"overrides": {"layer9.conv": {"bits_weights": 4}}}, "q")
    with pytest.raises(QuantizationError, match="'layer9.conv' matches no module.*--summary"):
        resolve_layers(_Net(), s)


def test_module_prefix_is_accepted() -> None:
    s = settings_from_args({"overrides": {"module.fc": {"bits_weights": 4}}}, "q")
    assert resolve_layers(_Net(), s)["fc"].bits_weights == 4


def test_no_quant_and_no_clip_layers_come_first() -> None:
    base = settings_from_args({"clip_acts": "AVG", "overrides": {"fc": {"bits_weights": 4}}},
                              "q")
    s = with_layer_overrides(base, no_quant=["fc"], no_clip=["module.conv1"])
    layers = resolve_layers(_Net(), s)
    assert layers["fc"].bits_weights is None and layers["fc"].bits_activations is None
    assert layers["fc"].bits_bias is None
    assert layers["conv1"].clip_acts is ClipMode.NONE and layers["add"].clip_acts is ClipMode.AVG
    assert QuantSettings.from_recipe(s.to_recipe()) == s


def test_n_std_needs_its_count_per_layer() -> None:
    s = settings_from_args({"overrides": {"fc": {"clip_acts": "N_STD"}}}, "q")
    with pytest.raises(QuantizationError, match="layer 'fc'.*clip_n_stds"):
        resolve_layers(_Net(), s)


def test_one_settings_type_for_flags_yaml_and_api() -> None:
    """The --qe-* flags, a YAML quantizer and quantize_int8 give the same QuantSettings."""
    from dataclasses import fields, replace

    import torch

    from compressor.api.quantize import quantize_int8
    from compressor.cli.configs import quantize_request
    from compressor.cli.parser import parse_args
    from compressor.models.description import description_of
    from compressor.quantization.recipe import QUANTIZATION
    from compressor.quantization.request import QuantizeRequest

    # the request adds the step; it repeats none of the settings
    assert not {f.name for f in fields(QuantizeRequest)} & {f.name for f in fields(QuantSettings)}
    args = parse_args(["-a", "simplenet_digits", "--dataset", "digits", "-e", "--qe",
                       "--qe-mode-acts", "ASYMMETRIC_UNSIGNED", "--qe-mode-wts", "sym",
                       "--qe-clip-acts", "AVG", "--qe-per-channel", "--qe-bits-accum", "32",
                       "--qenql", "module.fc"])
    request = quantize_request(args)
    yaml_quantizer = settings_from_args({
        "bits_activations": 8, "bits_parameters": 8, "bits_accum": 32,
        "mode": {"activations": "asym_u", "weights": "SYMMETRIC"}, "clip_acts": "avg",
        "per_channel_wts": True,
        "overrides": {"fc": {"bits_activations": None, "bits_weights": None, "bits_bias": None}}},
        "a schedule's quantizer")
    assert isinstance(request.settings, QuantSettings) and request.quantize
    assert request.settings == yaml_quantizer

    model = _Net().eval()
    images = [torch.randn(4, 3, 8, 8) for _ in range(2)]
    int8 = quantize_int8(model, images, mode="ASYMMETRIC_UNSIGNED", clip="AVG", per_channel=True,
                         backend="x86")
    saved = QuantSettings.from_recipe(description_of(int8).recipe(QUANTIZATION)["settings"])
    api_flags = quantize_request(parse_args(
        ["-a", "simplenet_digits", "--dataset", "digits", "-e", "--qe", "--qe-mode", "asym_u",
         "--qe-clip-acts", "avg", "--qe-per-channel"])).settings
    # reduce_range is this CPU's kernels' need (7-bit activations without VNNI), not a choice
    assert saved == replace(api_flags, reduce_range=saved.reduce_range)
