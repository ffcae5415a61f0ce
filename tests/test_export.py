"""ONNX export in-process: the dynamic batch axis, the export form, refusals leaving no file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from compressor.assembly.recipes import apply_transform
from compressor.export.onnx import EXPORT_JSON, export_form, export_onnx
from compressor.memory import InPlaceABN
from compressor.models import InputSpec, ModelDescription, create_model, describe
from compressor.utils.errors import CompressorError, ExportError, UsageError

ort = pytest.importorskip("onnxruntime", reason="install the onnx extra: pip install -e '.[onnx]'")

pytestmark = pytest.mark.usefixtures("one_thread")


def _run_ort(path: Path, x: Tensor) -> Tensor:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {"input": x.numpy()})[0])


def test_a_batch_of_one_still_exports_a_dynamic_batch_axis(tmp_path: Path):
    torch.manual_seed(0)
    model = create_model("simplenet_digits", "digits").eval()
    record = export_onnx(model, tmp_path / "digits.onnx", torch.randn(1, 1, 8, 8), tmp_path)
    assert record["input"] == {"name": "input", "shape": ["batch", 1, 8, 8], "dtype": "float32"}
    assert record["output"]["shape"] == ["batch", 10]
    assert record["check"]["max_abs_diff"] <= 1e-4
    assert json.loads((tmp_path / EXPORT_JSON).read_text()) == record
    x = torch.randn(5, 1, 8, 8)
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(_run_ort(tmp_path / "digits.onnx", x), expected, rtol=0, atol=1e-4)


def test_export_form_is_a_plain_copy_and_leaves_the_model_alone():
    model = apply_transform(create_model("resnet20_cifar", "cifar10"), "memory_efficient",
                            "inplace-abn").train()
    form = export_form(model)
    assert model.training and not form.training
    fused = [m.fused for m in model.modules() if isinstance(m, InPlaceABN)]
    plain = [m.fused for m in form.modules() if isinstance(m, InPlaceABN)]
    assert fused and all(fused) and not any(plain) and len(plain) == len(fused)


class _Drifting(nn.Module):
    """A classifier whose output depends on how often it ran: its traced graph cannot match."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 10)
        self.calls = 0

    def forward(self, x: Tensor) -> Tensor:
        self.calls += 1
        return self.fc(x.flatten(1)) + float(self.calls)


def _drifting() -> nn.Module:
    spec = InputSpec((1, 8, 8), 8, 8, (0.5,), (0.25,))
    return describe(_Drifting(), ModelDescription("drifting", "digits", 10, spec))


def test_a_mismatch_is_an_error_and_leaves_the_destination_as_it_was(tmp_path: Path):
    destination = tmp_path / "model.onnx"
    destination.write_bytes(b"the previous export")
    with pytest.raises(ExportError) as error:
        export_onnx(_drifting(), destination, torch.randn(4, 1, 8, 8), tmp_path)
    message = str(error.value)
    assert "\n" not in message and "differ from PyTorch's" in message and "allowed" in message
    assert destination.read_bytes() == b"the previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]  # no temp, no record


def test_refusals_name_the_problem(tmp_path: Path):
    model = create_model("simplenet_digits", "digits")
    with pytest.raises(UsageError, match="is a directory"):
        export_onnx(model, tmp_path, torch.randn(2, 1, 8, 8), tmp_path)
    with pytest.raises(UsageError, match=r"input spec is \[1, 8, 8\]"):
        export_onnx(model, tmp_path / "m.onnx", torch.randn(2, 3, 8, 8), tmp_path)
    with pytest.raises(UsageError, match="unknown export kind 'int4'"):
        export_onnx(model, tmp_path / "m.onnx", torch.randn(2, 1, 8, 8), tmp_path, kind="int4")
    assert list(tmp_path.iterdir()) == []
    assert issubclass(ExportError, CompressorError)
