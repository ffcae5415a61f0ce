"""Int8 kernels run on the CPU: the int8 steps move a model there themselves, saying so, and
tracing for quantization runs on the model's own device (a model on CUDA no longer fails)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from compressor.models import create_model
from compressor.quantization.int8.placement import int8_placement
from compressor.quantization.simulated.graph import explicit_graph
from tests.conftest import run_cli

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_placement_moves_a_model_from_another_device_and_says_so(
        caplog: pytest.LogCaptureFixture) -> None:
    model = create_model("simplenet_digits", "digits")
    with caplog.at_level(logging.INFO, logger="compressor"):
        line = int8_placement(model, torch.device("cuda", 0))
    assert line is not None and "int8 kernels run on the CPU" in line and "cuda:0" in line
    assert [record.getMessage() for record in caplog.records] == [line]
    assert all(param.device.type == "cpu" for param in model.parameters())
    assert int8_placement(model) is None  # already there: nothing to say


def test_tracing_for_quantization_runs_on_the_models_device() -> None:
    """The graph quantization follows is traced with a sample on the model's device (it was
    made on the CPU: 'the traced graph of ResNetCifar does not run' for a model elsewhere)."""
    model = create_model("resnet20_cifar", "cifar10").to("meta")
    graph = explicit_graph(model)
    assert dict(graph.named_modules()).keys() >= {"layer1.0.conv1", "fc"}
    assert next(graph.parameters()).device.type == "meta"


@pytest.mark.cuda
@CUDA
@pytest.mark.slow
def test_int8_commands_run_on_a_cuda_machine_without_cpu_flag(tmp_path: Path) -> None:
    """Post-training int8, QAT to int8, -e of the int8 checkpoint and its ONNX export, all
    without --cpu: each moves the model to the CPU itself and says so in one log line."""
    common = ("-b", "64", "-j", "0", "-p", "0", "--det", "-o", str(tmp_path))
    dense = run_cli("-a", "simplenet_digits", *common, "--epochs", "1", "-n", "dense")
    assert dense.returncode == 0, dense.stderr
    checkpoint = tmp_path / "dense" / "checkpoint.pth.tar"
    assert torch.load(checkpoint, weights_only=True)["args"]["cpu"] is False
    ptq = run_cli("--resume-from", str(checkpoint), "-e", "--qe", "--qept", *common, "-n", "ptq")
    assert ptq.returncode == 0, ptq.stderr
    assert "int8 kernels run on the CPU: the model moves there from cuda" in ptq.stdout
    int8 = tmp_path / "ptq" / "quantized_checkpoint.pth.tar"
    again = run_cli("--resume-from", str(int8), "-e", *common, "-n", "again")
    assert again.returncode == 0, again.stderr
    assert "int8 kernels run on the CPU" in again.stdout
    schedule = tmp_path / "qat.yaml"
    schedule.write_text("quantizers:\n  q:\n    class: QuantAwareTrainRangeLinearQuantizer\n"
                        "    bits_activations: 8\n    bits_weights: 8\n    reduce_range: True\n"
                        "policies:\n  - quantizer: {instance_name: q}\n    starting_epoch: 0\n"
                        "    ending_epoch: 10\n    frequency: 1\n")
    qat = run_cli("--exp-load-weights-from", str(checkpoint), "-a", "simplenet_digits",
                  "--compress", str(schedule), "--epochs", "1", *common, "-n", "qat")
    assert qat.returncode == 0, qat.stderr
    qat_int8 = run_cli("--resume-from", str(tmp_path / "qat" / "checkpoint.pth.tar"), "-e",
                       "--qept", *common, "-n", "qat_int8")
    assert qat_int8.returncode == 0, qat_int8.stderr
    assert "int8 kernels run on the CPU" in qat_int8.stdout
    pytest.importorskip("onnxruntime")
    onnx = run_cli("--resume-from", str(int8), "--export-onnx", "model.onnx", *common,
                   "-n", "onnx")
    assert onnx.returncode == 0, onnx.stderr
    assert (tmp_path / "onnx" / "model.onnx").is_file()
