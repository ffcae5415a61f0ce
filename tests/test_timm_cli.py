"""A timm model through the real CLI (timm's ResNet-10-T at 32 px on synthetic data): train,
resume, evaluate from the checkpoint alone, int8 post-training quantization, ONNX export, and
--pretrained offline from a planted Hugging Face cache onto 3 classes. Every family through
every step: tests/test_timm_registry.py (marked registry)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from compressor.training.checkpoint import load_checkpoint
from tests.conftest import run_cli
from tests.test_timm_models import plant_hub_weights

timm = pytest.importorskip("timm", reason="install the timm extra: pip install -e '.[timm]'")

ARCH = "timm/resnet10t"
HUB_ID = "timm/resnet10t.c3_in1k"
COMMON = ("-j", "0", "-p", "0", "-b", "16", "--deterministic", "--etes", "0.1")
DATA = ("--dataset", "synthetic", "--etrs", "0.05", "--vs", "0.3")
TRAIN = ("-a", ARCH, "--input-size", "3,32,32", "--num-classes", "10", "--lr", "0.02", *DATA,
         *COMMON)


def _ok(result) -> None:  # noqa: ANN001 - a CompletedProcess
    assert result.returncode == 0, result.stderr[-3000:]


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One epoch of training, resumed to two, and int8 post-training quantization of it."""
    out = tmp_path_factory.mktemp("timm")
    _ok(run_cli(*TRAIN, "--epochs", "1", "-o", str(out), "-n", "first"))
    _ok(run_cli("--resume-from", str(out / "first" / "checkpoint.pth.tar"), "--epochs", "2",
                "--lr", "0.02", *DATA, *COMMON, "-o", str(out), "-n", "resumed"))
    _ok(run_cli("--resume-from", str(out / "resumed" / "checkpoint.pth.tar"), "-e", "--qe",
                "--qe-calibration", "0.2", "--qept", *DATA, *COMMON, "-o", str(out), "-n",
                "int8"))
    return out


def test_the_run_records_where_the_model_comes_from(runs: Path) -> None:
    source = {"kind": "timm", "weights": HUB_ID}
    assert yaml.safe_load((runs / "first" / "args.yaml").read_text())["arch_source"] == source
    checkpoint = load_checkpoint(runs / "resumed" / "checkpoint.pth.tar")
    assert checkpoint["arch"] == ARCH and checkpoint["args"]["arch_source"] == source
    assert checkpoint["input_spec"]["input_size"] == [3, 32, 32]
    assert checkpoint["input_spec"]["interpolation"] == "bicubic"  # timm's, for this model
    assert checkpoint["epoch"] == 1 and len(checkpoint["history"]) == 2
    first = load_checkpoint(runs / "first" / "checkpoint.pth.tar")
    assert checkpoint["history"][0] == first["history"][0]  # the resumed run kept epoch 0


def test_evaluate_and_quantize_from_the_checkpoint_alone(runs: Path) -> None:
    _ok(run_cli("--resume-from", str(runs / "resumed" / "checkpoint.pth.tar"), "-e", *DATA,
                *COMMON, "-o", str(runs), "-n", "eval"))
    evaluated, trained = _results(runs / "eval"), _results(runs / "resumed")
    assert evaluated["arch"] == ARCH and evaluated["top1"] == pytest.approx(trained["top1"])
    int8 = _results(runs / "int8")
    assert int8["kernels"] == "int8" and int8["arch"] == ARCH
    _ok(run_cli("--resume-from", str(runs / "int8" / "quantized_checkpoint.pth.tar"), "-e",
                *DATA, *COMMON, "-o", str(runs), "-n", "int8_again"))
    assert _results(runs / "int8_again")["top1"] == int8["quantized_top1"]


@pytest.mark.slow
def test_onnx_export_computes_what_the_model_does(runs: Path) -> None:
    pytest.importorskip("onnxruntime", reason="install the onnx extra: pip install -e '.[onnx]'")
    _ok(run_cli("--resume-from", str(runs / "resumed" / "checkpoint.pth.tar"), "-e",
                "--export-onnx", *DATA, *COMMON, "-o", str(runs), "-n", "onnx"))
    record = json.loads((runs / "onnx" / "export.json").read_text())
    assert record["kind"] == "float" and record["input"]["shape"] == ["batch", 3, 32, 32]
    assert record["check"]["max_abs_diff"] <= record["check"]["allowed"]


def test_pretrained_offline_onto_three_classes(tmp_path: Path) -> None:
    """The planted 1000-class file is the backbone; the classifier is new, learns at
    --lr-head's default (10 x --lr) and is named in the log."""
    torch.manual_seed(1)
    state = timm.create_model("resnet10t").state_dict()
    plant_hub_weights(tmp_path / "hf", HUB_ID, state)
    result = run_cli("-a", ARCH, "--pretrained", "--input-size", "3,32,32", "--num-classes",
                     "3", "--epochs", "1", "--lr", "0.001", *DATA, *COMMON, "-o",
                     str(tmp_path), "-n", "transfer", env={"HF_HOME": str(tmp_path / "hf")})
    _ok(result)
    assert "newly initialised for the dataset's classes: fc" in result.stderr + result.stdout
    checkpoint = load_checkpoint(tmp_path / "transfer" / "checkpoint.pth.tar")
    recorded = checkpoint["args"]["pretrained_source"]
    assert recorded["weights"] == HUB_ID and recorded["new_layers"] == ["fc"]
    groups = checkpoint["optimizer"]["param_groups"]
    assert [g["lr"] for g in groups] == pytest.approx([0.001, 0.01])
    assert checkpoint["state_dict"]["fc.weight"].shape == (3, state["fc.weight"].shape[1])
