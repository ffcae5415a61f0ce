"""Activation statistics: collection with hooks, Distiller's YAML format, validation."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from compressor.quantization import (
    HISTOGRAM_BINS,
    STAT_KEYS,
    QuantizationError,
    collect_stats,
    dump_stats,
    load_stats,
    parse_stats,
    save_stats,
    stats_range,
    tensor_stats,
)
from tests.conftest import CORPUS, requires_corpus

STATS_DIR = CORPUS / "quantization" / "post_train_quant" / "stats"


def test_tensor_stats_hand_worked():
    t = torch.tensor([[-1.0, 2.0], [-3.0, 0.5]])
    record = tensor_stats(t)
    # per-sample mins -1, -3 and maxes 2, 0.5; mean -0.375; deviations 0.625, 2.375, 2.625, 0.875
    assert without_histogram(record) == pytest.approx({
        "min": -3.0, "max": 2.0, "avg_min": -2.0, "avg_max": 1.25, "mean": -0.375,
        "std": (13.6875 / 4) ** 0.5,  # population std (squared deviations sum to 13.6875)
        "b": 6.5 / 4, "shape": "(2, 2)"})
    assert list(record) == [*STAT_KEYS, "shape", "histogram"]  # Distiller's key order, then ours
    # -3 in the first bin, 2 in the last, -1 and 0.5 at 2/5 and 7/10 of the way
    assert [i for i, n in enumerate(record["histogram"]) if n] == [0, 204, 358, 511]
    # one value per sample: min / max over the batch instead (as Distiller)
    record = tensor_stats(torch.tensor([[1.0], [-2.0], [5.0]]))
    assert (record["avg_min"], record["avg_max"]) == (-2.0, 5.0)


class Tiny(nn.Module):
    """y = relu(2 x) with an in-place ReLU and an Identity (which is not recorded)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2, bias=False)
        with torch.no_grad():
            self.fc.weight.copy_(2 * torch.eye(2))
        self.relu = nn.ReLU(inplace=True)
        self.skip = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.skip(self.relu(self.fc(x)))


BATCHES = [torch.tensor([[-1.0, 2.0], [-3.0, 0.5]]), torch.tensor([[4.0, -2.0]])]
VALUES = [-1.0, 2.0, -3.0, 0.5, 4.0, -2.0]


def histogram(values: list[float]) -> list[int]:
    """The counts of `values` in HISTOGRAM_BINS equal bins over [min, max] (the last bin holds
    the max)."""
    low, high = min(values), max(values)
    counts = [0] * HISTOGRAM_BINS
    for v in values:
        counts[min(int((v - low) * HISTOGRAM_BINS / (high - low)), HISTOGRAM_BINS - 1)] += 1
    return counts


def expected(values: list[float], mins: list[float], maxes: list[float], shape: str) -> dict:
    """A record worked from the plain list of values of every batch."""
    mean = statistics.fmean(values)
    return {"min": min(values), "max": max(values), "avg_min": statistics.fmean(mins),
            "avg_max": statistics.fmean(maxes), "mean": mean, "std": statistics.pstdev(values),
            "b": statistics.fmean(abs(v - mean) for v in values), "shape": shape}


def without_histogram(record: dict) -> dict:
    """The record's numbers (pytest.approx compares no lists inside a dict)."""
    return {k: v for k, v in record.items() if k != "histogram"}


def same(record: dict, values: list[float], mins: list[float], maxes: list[float],
         shape: str) -> bool:
    """Whether `record` holds the statistics worked from the plain list of values."""
    return (without_histogram(record) == pytest.approx(expected(values, mins, maxes, shape))
            and record["histogram"] == histogram(values))


def test_collect_stats_over_batches_with_hooks():
    model = Tiny().train()
    stats = collect_stats(model, BATCHES)
    assert list(stats) == ["fc", "relu"]  # leaf modules by qualified name, no Identity
    fc_in = (VALUES, [-1.0, -3.0, -2.0], [2.0, 0.5, 4.0], "(2, 2)")
    fc_out = ([2 * v for v in VALUES], [-2.0, -6.0, -4.0], [4.0, 1.0, 8.0], "(2, 2)")
    relu_out = ([max(0.0, 2 * v) for v in VALUES], [0.0, 0.0, 0.0], [4.0, 1.0, 8.0], "(2, 2)")
    assert same(stats["fc"]["inputs"][0], *fc_in)
    assert same(stats["fc"]["output"], *fc_out)
    # the in-place ReLU's input is measured before it overwrites it
    assert same(stats["relu"]["inputs"][0], *fc_out)
    assert same(stats["relu"]["output"], *relu_out)
    # the model is back in training mode and carries no hooks
    assert model.training and model.fc.training
    assert not model.fc._forward_hooks and not model.fc._forward_pre_hooks


class Branches(nn.Module):
    """conv -> in-place ReLU, a residual add and a concatenation: the tensors a module measures
    as its input are sometimes the previous module's output unchanged, sometimes not."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu1(self.conv1(x))
        z = self.relu2(self.conv2(y) + y)
        return self.conv3(torch.cat([y, z], dim=1))


def test_a_tensor_measured_twice_gives_what_measuring_it_anew_gives(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A module's input is mostly the tensor the module before it measured as its output: its
    figures are reused for that very tensor unchanged only, so the statistics equal a fresh
    measurement of every tensor."""
    from compressor.quantization.statistics import collect as stats_module

    torch.manual_seed(0)
    model = Branches().eval()
    batches = [torch.randn(3, 3, 6, 6), torch.randn(2, 3, 6, 6)]
    counts = {"asked": 0, "measured": 0}
    reuse = stats_module._Memo.get

    def counted(memo: object, tensor: torch.Tensor, key: object,
                compute: Callable[[torch.Tensor], object]) -> object:
        counts["asked"] += 1

        def measure(t: torch.Tensor) -> object:
            counts["measured"] += 1
            return compute(t)
        return reuse(memo, tensor, key, measure)

    monkeypatch.setattr(stats_module._Memo, "get", counted)
    reused = collect_stats(model, batches)
    assert 0 < counts["measured"] < counts["asked"]  # some measurements were reused
    monkeypatch.setattr(stats_module._Memo, "get", lambda memo, tensor, key, compute:
                        compute(tensor))
    assert reused == collect_stats(model, batches)


def test_collect_stats_loader_batches_and_module_types():
    pairs = [(x, torch.zeros(len(x))) for x in BATCHES]  # (inputs, targets) as a loader gives
    stats = collect_stats(Tiny(), pairs, module_types=(nn.ReLU,))
    assert list(stats) == ["relu"]
    assert stats["relu"]["output"]["max"] == 8.0


def test_collect_stats_refuses_one_shot_iterators_and_no_batches():
    with pytest.raises(QuantizationError, match="twice"):
        collect_stats(Tiny(), iter(BATCHES))
    with pytest.raises(QuantizationError, match="no batches"):
        collect_stats(Tiny(), [])


def test_yaml_round_trip(tmp_path: Path):
    stats = collect_stats(Tiny(), BATCHES)
    path = tmp_path / "acts_quantization_stats.yaml"
    save_stats(stats, path)
    assert load_stats(path) == stats
    text = path.read_text()
    # Distiller's layout: input indices as integers, shape as '(N, C)' text
    assert "fc:\n  inputs:\n    0:\n      min: -3.0\n" in text
    assert "shape: (2, 2)" in text
    assert yaml.safe_load(text)["relu"]["output"]["max"] == 8.0


def test_module_prefixes_are_dropped():
    record = tensor_stats(torch.tensor([[1.0, 2.0]]))
    stats = parse_stats({"module.fc": {"inputs": {"0": record}, "output": record}})
    assert list(stats) == ["fc"] and list(stats["fc"]["inputs"]) == [0]
    with pytest.raises(QuantizationError, match="appears twice"):
        parse_stats({"module.fc": {"output": record}, "fc": {"output": record}})


@requires_corpus
@pytest.mark.parametrize(("name", "layers"), [("resnet18_quant_stats.yaml", 68),
                                              ("resnet50_quant_stats.yaml", 174)])
def test_corpus_stats_files_load_unchanged(name: str, layers: int):
    stats = load_stats(STATS_DIR / name)
    assert len(stats) == layers
    conv1 = stats["conv1"]
    assert conv1["inputs"][0]["min"] == -2.1179039478302
    assert conv1["inputs"][0]["shape"] == "(256, 3, 224, 224)"
    assert set(stats["layer1.0.add"]["inputs"]) == {0, 1}  # a residual add: two inputs
    assert stats["fc"]["output"]["mean"] > 0  # 2.8e-05 / 8.3e-06 read as numbers


@requires_corpus
def test_corpus_stats_are_read_as_written_and_written_back_whole():
    path = STATS_DIR / "resnet18_quant_stats.yaml"
    raw = yaml.safe_load(path.read_text())
    stats = parse_stats(raw, str(path))
    assert stats == {name: {"inputs": layer.get("inputs", {}), "output": layer["output"]}
                     for name, layer in raw.items()}
    assert parse_stats(yaml.safe_load(dump_stats(stats))) == stats


@requires_corpus
def test_corpus_stats_feed_the_range_math():
    stats = load_stats(STATS_DIR / "resnet18_quant_stats.yaml")
    output = stats["conv1"]["output"]
    # AVG clipping of conv1's output: [avg_min, avg_max] as written in the file
    assert stats_range(output, "avg", "asym_u", 8) == (-22.434925651550294, 22.787699317932127)


RECORD = {"min": -1.0, "max": 2.0, "avg_min": -0.5, "avg_max": 1.5, "mean": 0.1, "std": 0.7,
          "b": 0.5, "shape": "(4, 2)"}


def write(tmp_path: Path, data) -> Path:
    path = tmp_path / "stats.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("data", "match"), [
    ({"conv1": {"output": {k: v for k, v in RECORD.items() if k != "b"}}},
     "layer 'conv1' output: missing 'b'"),
    ({"conv1": {"inputs": {0: {**RECORD, "std": "wide"}}, "output": RECORD}},
     r"layer 'conv1' inputs\[0\]: 'std' is not a number"),
    ({"conv1": {"output": {**RECORD, "max": True}}}, "'max' is not a number"),
    ({"conv1": {"output": {**RECORD, "mean": float("nan")}}}, "'mean' is not finite"),
    ({"conv1": {"output": {**RECORD, "avg_mn": 0.0}}}, "did you mean 'avg_min'"),
    ({"conv1": {"output": {**RECORD, "min": 3.0}}}, "greater than max"),
    ({"conv1": {"output": {**RECORD, "std": -1.0}}}, "'std' is negative"),
    ({"conv1": {"inputs": {0: RECORD}}}, "layer 'conv1': missing 'output'"),
    ({"conv1": {"inputs": {"first": RECORD}, "output": RECORD}}, "input index 'first'"),
    ({"conv1": {"outputs": RECORD, "output": RECORD}}, "unknown key 'outputs'"),
    ({"conv1": [1, 2]}, "layer 'conv1': expected 'inputs' and 'output'"),
    ([RECORD], "expected a mapping of layer names"),
    ("", "holds no statistics"),
    ("conv1:\n  output: {min: [\n", "not valid YAML"),
])
def test_malformed_stats_are_one_line_errors(tmp_path: Path, data, match: str):
    path = write(tmp_path, data)
    with pytest.raises(QuantizationError, match=match) as info:
        load_stats(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message


def test_missing_file_is_one_line_error(tmp_path: Path):
    with pytest.raises(QuantizationError, match="not found") as info:
        load_stats(tmp_path / "nope.yaml")
    assert "\n" not in str(info.value)


def test_total_numel_of_later_distiller_files_is_accepted(tmp_path: Path):
    stats = load_stats(write(tmp_path, {"fc": {"output": {**RECORD, "total_numel": 8}}}))
    assert "total_numel" not in stats["fc"]["output"]
