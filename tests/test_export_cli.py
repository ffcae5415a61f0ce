"""End-to-end --export-onnx: the file runs in ONNX Runtime as the PyTorch model does.

Covers a CIFAR ResNet, its memory-efficient variants, a thinned model, Inception v3 at 299 px,
and the one-line refusal without the onnx extra.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from compressor.assembly.setup import load_model
from compressor.assembly.state import assemble_checkpoint
from compressor.models import create_model, description_of
from compressor.thinning.transform import thin
from compressor.training.checkpoint import save_checkpoint
from tests.conftest import (
    assert_user_error,
    run_cli,
    run_main,
    trained_like_batchnorms,
)

onnx = pytest.importorskip("onnx", reason="install the onnx extra: pip install -e '.[onnx]'")
ort = pytest.importorskip("onnxruntime", reason="install the onnx extra: pip install -e '.[onnx]'")

pytestmark = pytest.mark.usefixtures("one_thread")


def _save(model: nn.Module, path: Path) -> Path:
    save_checkpoint(path, assemble_checkpoint(model, args={}, epoch=0))
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """resnet20_cifar as after training, and the same with half of some filters thinned away."""
    root = tmp_path_factory.mktemp("export")
    torch.manual_seed(0)
    model = trained_like_batchnorms(create_model("resnet20_cifar", "cifar10"))
    dense = _save(model, root / "dense.pth.tar")
    with torch.no_grad():  # zero filters and their batch norm, as a filter pruner does
        for block in (*model.layer1, *model.layer2, *model.layer3):
            block.conv1.weight[::2] = 0
            block.bn1.weight[::2] = 0
            block.bn1.bias[::2] = 0
    thin(model)
    assert model.layer1[0].conv1.out_channels == 8
    return {"dense": dense, "thin": _save(model, root / "thin.pth.tar")}


def _run_ort(path: Path, x: Tensor) -> Tensor:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {"input": x.numpy()})[0])


def _export(tmp_path: Path, *args: str, runner: Callable[..., Any] = run_cli
            ) -> tuple[Path, dict]:
    result = runner(*args, "-o", str(tmp_path), "-n", "run")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "run"
    record = json.loads((run_dir / "export.json").read_text())
    assert json.loads((run_dir / "results.json").read_text())["export"] == record
    return run_dir, record


def _assert_round_trip(onnx_file: Path, model: nn.Module) -> None:
    """ORT equals PyTorch on a batch neither the export nor its check saw."""
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = model.eval()(x)
    torch.testing.assert_close(_run_ort(onnx_file, x), expected, rtol=0, atol=1e-4)


def _op_types(onnx_file: Path) -> set[tuple[str, str]]:
    return {(node.domain, node.op_type) for node in onnx.load(str(onnx_file)).graph.node}


@pytest.mark.slow
def test_resnet_export_round_trips_with_what_a_deployer_needs(checkpoints, tmp_path: Path):
    run_dir, record = _export(tmp_path, "--resume-from", str(checkpoints["dense"]),
                              "--export-onnx")
    onnx_file = run_dir / "model.onnx"  # a bare file name lands in the run directory
    _assert_round_trip(onnx_file, load_model(checkpoints["dense"]))
    data = onnx_file.read_bytes()
    assert record["file"] == str(onnx_file) and record["bytes"] == len(data)
    assert record["sha256"] == hashlib.sha256(data).hexdigest()
    assert record["opset"] == 20 and record["kind"] == "float"
    assert record["input"] == {"name": "input", "shape": ["batch", 3, 32, 32], "dtype": "float32"}
    assert record["output"] == {"name": "logits", "shape": ["batch", 10], "dtype": "float32"}
    spec = description_of(load_model(checkpoints["dense"])).input_spec
    assert record["preprocessing"] == {
        "input_size": [3, 32, 32], "channels": 3, "resize_size": spec.resize_size,
        "crop_size": spec.crop_size, "interpolation": spec.interpolation,
        "mean": list(spec.mean), "std": list(spec.std)}
    assert record["check"]["sample_batch"] == 8  # no data at hand: a seeded random batch
    assert 0 <= record["check"]["max_abs_diff"] <= 1e-4 <= record["check"]["allowed"]
    assert record["versions"]["onnxruntime"] == ort.__version__
    assert all(domain == "" for domain, _ in _op_types(onnx_file))  # standard ops only
    checker_input = onnx.load(str(onnx_file))
    onnx.checker.check_model(checker_input, full_check=True)
    assert {p.key: p.value for p in checker_input.metadata_props}["arch"] == "resnet20_cifar"


@pytest.mark.parametrize("variant", ["recompute", "inplace-abn"])
def test_memory_efficient_variants_export_as_the_plain_network(checkpoints, tmp_path: Path,
                                                               variant: str):
    onnx_file = tmp_path / "deploy" / f"{variant}.onnx"
    # in-process: the CLI's own subprocess path is covered by the round-trip test
    _, record = _export(tmp_path, "--resume-from", str(checkpoints["dense"]),
                        "--memory-efficient", variant, "--export-onnx", str(onnx_file),
                        runner=run_main)
    assert record["transforms"] == ["memory_efficient"] and onnx_file.is_file()
    _assert_round_trip(onnx_file, load_model(checkpoints["dense"], memory_efficient=variant))
    ops = _op_types(onnx_file)
    assert all(domain == "" for domain, _ in ops)  # no PythonOp, no custom domain
    assert ("", "LeakyRelu" if variant == "inplace-abn" else "Relu") in ops


def test_a_thinned_model_exports_at_its_thinned_shapes(checkpoints, tmp_path: Path):
    run_dir, record = _export(tmp_path, "--resume-from", str(checkpoints["thin"]),
                              "--export-onnx", "thin.onnx", runner=run_main)
    assert record["transforms"] == ["thinning"]
    _assert_round_trip(run_dir / "thin.onnx", load_model(checkpoints["thin"]))
    weights = {init.name: list(init.dims)
               for init in onnx.load(str(run_dir / "thin.onnx")).graph.initializer}
    assert weights["layer1.0.conv1.weight"] == [8, 16, 3, 3]  # 8 of 16 filters left
    assert weights["layer1.0.conv2.weight"] == [16, 8, 3, 3]
    assert weights["layer3.2.conv1.weight"] == [32, 64, 3, 3]


@pytest.mark.slow
def test_inception_v3_exports_at_299_without_aux_heads(tmp_path: Path):
    run_dir, record = _export(tmp_path, "-a", "inception_v3", "--dataset", "synthetic",
                              "-b", "1", "--export-onnx")
    assert record["input"]["shape"] == ["batch", 3, 299, 299]
    assert record["output"]["shape"] == ["batch", 1000]
    assert record["preprocessing"]["resize_size"] == 342
    assert record["preprocessing"]["crop_size"] == 299
    assert record["check"]["max_abs_diff"] <= record["check"]["allowed"]
    names = [init.name for init in onnx.load(str(run_dir / "model.onnx")).graph.initializer]
    assert names and not [name for name in names if "AuxLogits" in name]


def test_without_the_onnx_extra_it_says_which_to_install(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` fails as if not installed
    result = run_main("-a", "simplenet_digits", "--export-onnx", "-o", str(tmp_path), "-n", "run")
    assert_user_error(result, "--export-onnx needs the 'onnx' extra", "pip install -e '.[onnx]'")
    assert not (tmp_path / "run").exists()
