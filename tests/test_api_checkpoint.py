"""save_checkpoint writes what the real command line evaluates (`-a my_model.py:Net
--resume-from CKPT -e`), thinning and int8 recipes included; load_model reads it back."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import compressor as cz
from compressor.data import load_datasets
from compressor.models.description import description_of
from compressor.quantization.int8.convert import Int8Model
from compressor.utils.dataset_table import DATASET_SPECS
from compressor.utils.errors import CheckpointError, UsageError
from tests.conftest import run_cli

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MODEL_CODE = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


class Other(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))
'''


@pytest.fixture
def own_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """my_model.py in the working directory, a trained, pruned Net and the digits' test split."""
    (tmp_path / "my_model.py").write_text(MODEL_CODE)
    monkeypatch.chdir(tmp_path)
    data = load_datasets("digits", None, DATASET_SPECS["digits"].input_spec, seed=0)
    test = DataLoader(data.test, batch_size=128)
    torch.manual_seed(0)
    model = runpy.run_path("my_model.py")["Net"]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in DataLoader(data.train, batch_size=64, shuffle=True):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():  # prune four filters of conv2: thinning removes them
        model.conv2.weight[:4] = 0.0
        model.conv2.bias[:4] = 0.0
    return {"model": model.eval(), "test": test, "train": data.train, "dir": tmp_path}


def cli_top1(directory: Path, checkpoint: str, name: str) -> float:
    result = run_cli("-a", "my_model.py:Net", "--resume-from", checkpoint, "-e", "-o", "logs",
                     "-n", name, cwd=directory)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((directory / "logs" / name / "results.json").read_text())["top1"]


def test_the_cli_evaluates_a_thinned_then_int8_model_saved_by_the_api(own_code: dict,
                                                                       one_thread: None) -> None:
    model, test = own_code["model"], own_code["test"]
    x = next(iter(test))[0][:4]
    cz.thin(model, x)
    assert model.conv2.out_channels == 12 and model.fc.in_features == 12 * 16
    float_path = cz.save_checkpoint(model, "thin.pth.tar", arch="my_model.py:Net",
                                    dataset="digits")
    saved = torch.load(float_path, weights_only=True)
    assert saved["arch"] == "my_model.py:Net" and saved["dataset"] == "digits"
    assert saved["input_spec"]["mean"] == [0.3054]  # the dataset's preprocessing
    assert [step["name"] for step in saved["model_attrs"]["transforms"]] == ["thinning"]
    assert saved["args"]["arch_source"]["sha256"]

    calibration = [batch for _, batch in zip(range(3), DataLoader(own_code["train"],
                                                                  batch_size=64), strict=False)]
    int8 = cz.quantize_int8(model, calibration)
    int8_path = cz.save_checkpoint(int8, "int8.pth.tar", arch="my_model.py:Net",
                                   dataset="digits")
    assert cli_top1(own_code["dir"], str(float_path), "float") == pytest.approx(
        cz.evaluate(model, test)["top1"])
    assert cli_top1(own_code["dir"], str(int8_path), "int8") == pytest.approx(
        cz.evaluate(int8, test)["top1"])

    loaded = cz.load_model(int8_path, arch="my_model.py:Net")
    assert isinstance(loaded, Int8Model)
    with torch.no_grad():
        assert torch.equal(loaded(x), int8(x))


DIGIT_NAMES = [f"digit {k}" for k in range(10)]


def test_class_names_travel_with_the_model_through_every_api_step(own_code: dict,
                                                                  one_thread: None) -> None:
    """Named once, at the first save: load_model, thin, quantize_int8 and the next
    save_checkpoint keep them; the command line's evaluation and an ONNX export carry them."""
    model, test = own_code["model"], own_code["test"]
    x = next(iter(test))[0][:4]
    cz.save_checkpoint(model, "dense.pth.tar", arch="my_model.py:Net", dataset="digits",
                       class_names=DIGIT_NAMES, example_inputs=x)
    loaded = cz.load_model("dense.pth.tar", arch="my_model.py:Net")
    assert description_of(loaded).class_names == tuple(DIGIT_NAMES)
    cz.thin(loaded, x)
    calibration = [batch for _, batch in zip(range(2), DataLoader(own_code["train"],
                                                                  batch_size=64), strict=False)]
    int8 = cz.quantize_int8(loaded, calibration)
    path = cz.save_checkpoint(int8, "int8.pth.tar", arch="my_model.py:Net")
    saved = torch.load(path, weights_only=True)
    assert saved["class_names"] == DIGIT_NAMES and saved["args"]["class_names"] == DIGIT_NAMES
    assert description_of(cz.load_model(path, arch="my_model.py:Net")).class_names == tuple(
        DIGIT_NAMES)
    pytest.importorskip("onnxruntime", reason="the ONNX export needs the [onnx] extra")
    import onnx

    record = cz.export_onnx(loaded, "model.onnx", x)
    assert record["class_names"] == DIGIT_NAMES
    props = {p.key: p.value for p in onnx.load("model.onnx").metadata_props}
    assert json.loads(props["class_names"]) == DIGIT_NAMES
    assert json.loads(props["input_spec"])["mean"] == [0.3054]
    # the command line's export reads them from the checkpoint alone
    result = run_cli("-a", "my_model.py:Net", "--resume-from", str(path), "--export-onnx",
                     "cli.onnx", "-o", "logs", "-n", "named", cwd=own_code["dir"])
    assert result.returncode == 0, result.stderr[-3000:]
    exported = json.loads((own_code["dir"] / "logs" / "named" / "export.json").read_text())
    assert exported["class_names"] == DIGIT_NAMES
    _predict_onnx_agrees(own_code["dir"], loaded)


def _predict_onnx_agrees(directory: Path, model: nn.Module) -> None:
    """examples/predict_onnx.py, ONNX Runtime alone, names the class the model predicts for
    PNG files preprocessed as the command line does (folder images at the model's size)."""
    from PIL import Image

    from compressor.data.image_transforms import build_transforms

    spec = description_of(model).input_spec
    model.eval()
    transform = build_transforms(spec, "folder", train=False)
    generator = torch.Generator().manual_seed(0)
    expected, paths = [], []
    for k in range(4):
        pixels = torch.randint(0, 256, (8, 8), generator=generator, dtype=torch.uint8)
        image = Image.fromarray(pixels.numpy(), mode="L")
        paths.append(directory / f"image{k}.png")
        image.save(paths[-1])
        with torch.no_grad():
            logits = model(transform(Image.open(paths[-1]))[None])
        expected.append(DIGIT_NAMES[int(logits.argmax())])
    result = subprocess.run([sys.executable, str(EXAMPLES / "predict_onnx.py"),
                             str(directory / "model.onnx"), *map(str, paths)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    predicted = [line.split(": ", 1)[1].rsplit(" ", 1)[0] for line in result.stdout.splitlines()]
    assert predicted == expected


def test_a_torchvision_model_round_trips_with_its_registered_arch(tmp_path: Path,
                                                                  one_thread: None) -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=3).eval()
    with torch.no_grad():
        model.layer2[0].conv1.weight[:32] = 0.0
        model.layer2[0].bn1.weight[:32] = 0.0
        model.layer2[0].bn1.bias[:32] = 0.0
    x = torch.randn(2, 3, 64, 64)
    cz.thin(model, x)
    path = cz.save_checkpoint(model, tmp_path / "r18.pth.tar", arch="resnet18",
                              class_names=["bag", "sandal", "sneaker"],
                              input_spec={"resize_size": 73})
    description = description_of(model)
    assert (description.arch, description.dataset) == ("resnet18", "folder")
    assert description.input_spec.input_size == (3, 64, 64)
    assert description.input_spec.resize_size == 73
    loaded = cz.load_model(path)
    assert loaded.layer2[0].conv1.out_channels == 96
    with torch.no_grad():
        assert torch.allclose(loaded.eval()(x), model(x), atol=1e-5)


def test_save_checkpoint_refuses_what_the_cli_could_not_read(own_code: dict) -> None:
    model = own_code["model"]
    x = next(iter(own_code["test"]))[0][:2]
    with pytest.raises(UsageError, match="needs arch="):
        cz.save_checkpoint(model, "a.pth.tar", example_inputs=x)
    with pytest.raises(CheckpointError, match="do not fit my_model.py:Other"):
        cz.save_checkpoint(model, "b.pth.tar", arch="my_model.py:Other", dataset="digits")
    with pytest.raises(UsageError, match="unknown dataset 'digit'"):
        cz.save_checkpoint(model, "c.pth.tar", arch="my_model.py:Net", dataset="digit")
    with pytest.raises(UsageError, match="did you mean 'input_size'"):
        cz.save_checkpoint(model, "d.pth.tar", arch="my_model.py:Net",
                           input_spec={"input_sizes": 8})
    with pytest.raises(UsageError, match="3 class_names for a model of 10 classes"):
        cz.save_checkpoint(model, "e.pth.tar", arch="my_model.py:Net",
                           class_names=["a", "b", "c"])
    with pytest.raises(UsageError, match="is a directory; give the file to write"):
        cz.save_checkpoint(model, own_code["dir"], arch="my_model.py:Net")
    assert not list(own_code["dir"].glob("*.pth.tar"))
