"""Clip mode MSE: the activation range of least squared error on the calibration histogram (the
criterion of torch.ao's HistogramObserver), carried in our statistics and checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from compressor.models.layers.eltwise import Concat
from compressor.quantization import (
    ALPHA_LAPLACE,
    HISTOGRAM_BINS,
    QuantizationError,
    collect_stats,
    fake_quantize,
    quant_params,
    settings_from_args,
    stats_range,
    tensor_range,
    tensor_stats,
)
from compressor.quantization.simulated.graph import explicit_graph
from compressor.quantization.simulated.post_train import PostTrainLinearQuantizer
from tests.conftest import assert_user_error, run_cli

QUANTIZE = ("-a", "simplenet_digits", "-e", "--qe", "-b", "64", "-j", "0")


def squared_error(x: torch.Tensor, low: float, high: float, mode: str, bits: int = 8) -> float:
    """The mean squared error of quantizing `x` to the grid of [low, high]."""
    scale, zero_point = quant_params(low, high, bits, mode)
    return float(((fake_quantize(x, scale, zero_point, bits, mode) - x) ** 2).mean())


@pytest.mark.parametrize("mode", ["sym", "asym_u"])
@pytest.mark.parametrize("bits", [4, 8])
def test_mse_finds_aciqs_optimal_clip_of_a_laplace(mode: str, bits: int) -> None:
    """ACIQ worked out the clip of least squared error of a Laplace analytically (its table);
    the histogram search lands on it, well inside the sample's max at 4 bits."""
    torch.manual_seed(0)
    x = torch.distributions.Laplace(0.0, 1.0).sample((40, 5000))
    low, high = (float(v) for v in tensor_range(x, "mse", mode, bits))
    assert high == pytest.approx(ALPHA_LAPLACE[bits], rel=0.05)
    assert low == pytest.approx(-ALPHA_LAPLACE[bits], rel=0.05)


@pytest.mark.parametrize("mode", ["sym", "asym_u"])
@pytest.mark.parametrize("bits", [4, 8])
def test_mse_finds_the_clip_a_scan_of_real_quantizations_finds(mode: str, bits: int) -> None:
    """On a Laplace sample the chosen range quantizes as well as the best of 200 symmetric
    clips tried by quantizing the sample itself."""
    torch.manual_seed(0)
    x = torch.distributions.Laplace(0.0, 1.0).sample((40, 500))
    low, high = (float(v) for v in tensor_range(x, "mse", mode, bits))
    best = min(squared_error(x, -t, t, mode, bits) for t in torch.linspace(0.5, 14, 200).tolist())
    assert squared_error(x, low, high, mode, bits) <= 1.03 * best
    assert squared_error(x, low, high, mode, bits) < squared_error(
        x, float(x.min()), float(x.max()), mode, bits)


def test_statistics_carry_the_histogram_mse_reads() -> None:
    torch.manual_seed(0)
    x = torch.relu(torch.distributions.Laplace(0.0, 1.0).sample((40, 500)))
    record = tensor_stats(x)
    assert len(record["histogram"]) == HISTOGRAM_BINS and sum(record["histogram"]) == x.numel()
    from_stats = stats_range(record, "mse", "asym_u", 4)
    from_tensor = tensor_range(x, "mse", "asym_u", 4)
    assert from_stats == pytest.approx([float(v) for v in from_tensor], rel=1e-5)
    assert from_stats[0] == 0.0 and from_stats[1] < record["max"] * 0.9
    distiller_record = {k: v for k, v in record.items() if k != "histogram"}
    with pytest.raises(QuantizationError, match="lack a 'histogram'.*--qe-calibration") as info:
        stats_range(distiller_record, "mse", "asym_u", 8)
    assert "\n" not in str(info.value)


def _recipe_stats(run: Path) -> dict:
    checkpoint = torch.load(run / "quantized_checkpoint.pth.tar", weights_only=True)
    return checkpoint["model_attrs"]["transforms"][-1]["recipe"]["stats"]


@pytest.mark.slow
def test_cli_mse_quantizes_rebuilds_and_refuses_statistics_without_histograms(
        tmp_path: Path) -> None:
    out = ("-o", str(tmp_path))
    mse = run_cli(*QUANTIZE, "--qeca", "mse", *out, "-n", "mse")
    assert mse.returncode == 0, mse.stderr[-2000:]
    plain = run_cli(*QUANTIZE, *out, "-n", "plain")
    assert plain.returncode == 0, plain.stderr[-2000:]
    results = json.loads((tmp_path / "mse" / "results.json").read_text())
    assert results["clip_acts"] == "MSE"
    # the checkpoint keeps the histograms its ranges came from, and only then
    assert "histogram" in _recipe_stats(tmp_path / "mse")["conv1"]["output"]
    assert "histogram" not in _recipe_stats(tmp_path / "plain")["conv1"]["output"]
    again = run_cli("--resume-from", str(tmp_path / "mse" / "quantized_checkpoint.pth.tar"),
                    "-e", "-b", "64", "-j", "0", *out, "-n", "again")
    assert again.returncode == 0, again.stderr[-2000:]
    rebuilt = json.loads((tmp_path / "again" / "results.json").read_text())
    assert rebuilt["top1"] == results["quantized_top1"]
    # the statistics --qe-calibration writes carry histograms; a file without them is refused
    collected = run_cli("-a", "simplenet_digits", "-e", "--qe-calibration", "0.05", "-b", "64",
                        "-j", "0", *out, "-n", "stats")
    assert collected.returncode == 0, collected.stderr[-2000:]
    saved = yaml.safe_load((tmp_path / "stats" / "acts_quantization_stats.yaml").read_text())
    assert len(saved["conv1"]["output"]["histogram"]) == HISTOGRAM_BINS
    for entry in saved.values():
        for record in [entry["output"], *entry.get("inputs", {}).values()]:
            record.pop("histogram")
    distiller = tmp_path / "distiller_stats.yaml"
    distiller.write_text(yaml.safe_dump(saved))
    refused = run_cli(*QUANTIZE, "--qeca", "mse", "--qe-stats-file", str(distiller), *out,
                      "-n", "refused")
    assert_user_error(refused, "histogram", "--qe-calibration")


def test_histograms_are_counted_where_a_layer_clips_by_them() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    batches = [torch.randn(8, 4)]
    assert "histogram" in collect_stats(model, batches)["0"]["output"]
    assert "histogram" not in collect_stats(model, batches, histograms=False)["0"]["output"]
    assert not settings_from_args({"clip_acts": "AVG"}, "q").clips_by_histogram()
    assert settings_from_args({"clip_acts": "MSE"}, "q").clips_by_histogram()
    one_layer = {"overrides": {"fc": {"clip_acts": "MSE"}}}
    assert settings_from_args(one_layer, "q").clips_by_histogram()
    one_input = {"overrides": {"fc": {"input_overrides": {0: {"clip_acts": "MSE"}}}}}
    assert settings_from_args(one_input, "q").clips_by_histogram()


class _TwoBranches(torch.nn.Module):
    """Many channels of small values and one of large concatenated (a DenseNet block in
    small)."""

    def __init__(self) -> None:
        super().__init__()
        self.narrow = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.wide = torch.nn.Conv2d(3, 1, 3, padding=1)
        self.head = torch.nn.Conv2d(17, 2, 1)
        with torch.no_grad():
            self.wide.weight.mul_(10.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.narrow(x), self.wide(x)], dim=1))


def test_a_concatenation_clips_by_mse_on_the_data_of_all_its_inputs() -> None:
    """One grid for a concatenation and the layers feeding it: the range of least error on
    their values together (as torch.ao's one shared observer), not the widest member's."""
    torch.manual_seed(0)
    model, x = _TwoBranches().eval(), torch.randn(16, 3, 12, 12)
    graph = explicit_graph(model, x[:1])
    settings = settings_from_args({"clip_acts": "MSE",
                                   "mode": {"activations": "asym_u", "weights": "sym"}}, "q")
    quantized = PostTrainLinearQuantizer(settings, collect_stats(graph, [x])).quantize(graph)
    cat = next(m for m in quantized.modules() if isinstance(getattr(m, "wrapped", None), Concat))
    scale, zero_point = (float(t) for t in cat.qparams("output"))
    low, width = zero_point / scale, 255 / scale
    with torch.no_grad():
        values = torch.cat([model.narrow(x), model.wide(x)], dim=1)
    expected_low, expected_high = (float(v) for v in tensor_range(values, "mse", "asym_u", 8))
    assert width == pytest.approx(expected_high - expected_low, rel=0.03)
    assert low == pytest.approx(expected_low, abs=0.03 * width)
    wide_alone = tensor_range(model.wide(x).detach(), "mse", "asym_u", 8)
    assert width < float(wide_alone[1] - wide_alone[0])  # a union of ranges gave at least this
