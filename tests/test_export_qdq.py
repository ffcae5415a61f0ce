"""--export-onnx of a post-training quantized checkpoint: a QDQ graph on the same integers,
scales and zero points, checked in ONNX Runtime against our int8 kernels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from compressor.export.qdq import qdq_form
from compressor.models import create_model
from compressor.quantization.core.errors import QuantizationError
from compressor.quantization.core.settings import settings_from_args
from compressor.quantization.simulated.graph import explicit_graph
from compressor.quantization.simulated.post_train import PostTrainLinearQuantizer
from compressor.quantization.statistics.collect import collect_stats
from tests.conftest import assert_user_error, run_cli, trained_like_batchnorms

onnx = pytest.importorskip("onnx", reason="install the onnx extra: pip install -e '.[onnx]'")
pytest.importorskip("onnxruntime", reason="install the onnx extra: pip install -e '.[onnx]'")

COMMON = ("-a", "simplenet_digits", "-b", "32", "-j", "0", "--etes", "0.2")


def _quantized(args: dict, dynamic: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    model = trained_like_batchnorms(create_model("resnet20_cifar", "cifar10"))
    graph = explicit_graph(model)
    x = torch.randn(8, 3, 32, 32)
    stats = None if dynamic else collect_stats(graph, [x[:4], x[4:]])
    return PostTrainLinearQuantizer(settings_from_args(args, "q"), stats, dynamic).quantize(graph)


@pytest.mark.parametrize("args", [{}, {"bits_activations": 4, "bits_weights": 4,
                                       "mode": "asym_u", "per_channel_wts": True}])
def test_the_qdq_form_computes_the_simulation(args: dict) -> None:
    simulated = _quantized(args)
    form = qdq_form(simulated)
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        sim, got = simulated(x), form(x)
    step = 1 / float(simulated.fc.output_scale)
    assert (got - sim).abs().max() <= 2 * step
    assert form.conv1.weight_int8.dtype == torch.int8  # integers, not floats, are stored


def test_what_a_qdq_graph_cannot_hold_is_refused() -> None:
    with pytest.raises(QuantizationError, match="dynamic ranges"):
        qdq_form(_quantized({}, dynamic=True))
    with pytest.raises(QuantizationError, match="wider than 8 bits"):
        qdq_form(_quantized({"bits_activations": 12}))


@pytest.mark.slow
def test_cli_exports_the_int8_checkpoint_as_qdq_checked_against_the_kernels(tmp_path: Path
                                                                           ) -> None:
    quantized = run_cli(*COMMON, "-e", "--qe", "--qept", "-o", str(tmp_path), "-n", "q")
    assert quantized.returncode == 0, quantized.stderr[-2000:]
    checkpoint = tmp_path / "q" / "quantized_checkpoint.pth.tar"
    exported = run_cli("--resume-from", str(checkpoint), "--export-onnx", "-b", "32", "-j", "0",
                       "--etes", "0.2", "-o", str(tmp_path), "-n", "x")
    assert exported.returncode == 0, exported.stderr[-2000:]
    record = json.loads((tmp_path / "x" / "export.json").read_text())
    assert record["kind"] == "qdq"
    assert set(record["integer_rewrites"]) == {"requantize_folded", "integer_concat",
                                               "batch_norm_as_int8_conv"}
    assert record["check"]["max_abs_diff"] <= record["check"]["allowed"]
    versus = record["versus_int8"]
    # An untrained model has near-tied logits; one rounding step may flip those and no others.
    assert 1.0 - versus["top1_agreement"] <= versus["near_ties"] + 1e-9
    assert versus["top1_agreement"] >= 0.75
    model = onnx.load(str(tmp_path / "x" / "model.onnx"))
    ops = {node.op_type for node in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    int8 = [i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.INT8]
    assert "conv1.weight_int8" in int8


def test_cli_refuses_a_dynamic_checkpoint_in_one_line(tmp_path: Path) -> None:
    quantized = run_cli(*COMMON, "-e", "--qe", "--qe-dynamic", "-o", str(tmp_path), "-n", "q")
    assert quantized.returncode == 0, quantized.stderr[-2000:]
    result = run_cli("--resume-from", str(tmp_path / "q" / "quantized_checkpoint.pth.tar"),
                     "--export-onnx", "-j", "0", "-o", str(tmp_path), "-n", "x")
    assert_user_error(result, "dynamic ranges")
    assert not (tmp_path / "x").exists()  # refused before any file was written
