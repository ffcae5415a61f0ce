"""The API's post-training tools on one's own model and on torchvision's: thin, quantize_int8,
compress_to_budget, DistillationLoss, export_onnx, evaluate, and their one-line refusals."""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

import compressor as cz
from compressor.data import load_datasets
from compressor.models.description import description_of
from compressor.quantization import QuantizationError
from compressor.quantization.int8.convert import Int8Model
from compressor.utils.dataset_table import DATASET_SPECS
from compressor.utils.errors import CompressorError, UsageError


class Net(nn.Module):
    """A user's own small CNN for the 8x8 digits."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def train(model: nn.Module, loader: DataLoader, epochs: int, lr: float = 0.1) -> None:
    """A plain PyTorch training loop."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for _ in range(epochs):
        model.train()
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


@pytest.fixture(scope="module")
def digits(one_thread: None) -> dict:
    """Loaders of the digits, and a Net trained on them for a few epochs."""
    data = load_datasets("digits", None, DATASET_SPECS["digits"].input_spec, seed=0)
    generator = torch.Generator().manual_seed(0)
    loaders = {"train": DataLoader(data.train, batch_size=64, shuffle=True, generator=generator),
               "test": DataLoader(data.test, batch_size=128)}
    torch.manual_seed(0)
    model = Net()
    train(model, loaders["train"], epochs=4)
    return {**loaders, "model": model.eval(), "x": next(iter(loaders["test"]))[0][:8]}


def test_evaluate_reports_the_clis_metrics(digits: dict) -> None:
    scores = cz.evaluate(digits["model"], digits["test"])
    assert scores["samples"] == 360 and scores["top1"] > 60 and "top5" in scores
    assert scores["loss"] > 0


@pytest.mark.parametrize("loader,fragment", [
    (5, "the loader is of type int, not an iterable of batches"),
    ([], "the loader is empty"),
    ([1, 2], "batch 0 of the loader is of type int, not an (inputs, targets) pair"),
    ([(torch.zeros(2, 1, 8, 8),)], "batch 0 of the loader is a tuple of 1 items"),
    ([{"image": torch.zeros(2, 1, 8, 8)}], "batch 0 of the loader is of type dict")])
def test_evaluate_refuses_a_loader_of_other_things_in_one_line(digits: dict, loader: object,
                                                               fragment: str) -> None:
    with pytest.raises(UsageError, match=re.escape(fragment)) as info:
        cz.evaluate(digits["model"], loader)
    assert "\n" not in str(info.value)


def test_thin_removes_zeroed_filters_exactly(digits: dict) -> None:
    model = copy.deepcopy(digits["model"])
    with torch.no_grad():
        for param in (model.conv1.weight, model.conv1.bias, model.bn1.weight, model.bn1.bias):
            param[4:10] = 0.0
    x = digits["x"]
    with torch.no_grad():
        before = model(x)
    assert cz.thin(model, x) is model
    assert model.conv1.out_channels == 10 and model.conv2.in_channels == 10
    with torch.no_grad():
        assert torch.allclose(model(x), before, atol=1e-5)
    recipe = description_of(model).recipe("thinning")
    assert recipe["modules"]["conv1"]["out"] == list(range(4, 10))


def test_thin_a_torchvision_model(one_thread: None) -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=5).eval()
    with torch.no_grad():
        model.layer1[0].conv1.weight[:16] = 0.0
        model.layer1[0].bn1.weight[:16] = 0.0
        model.layer1[0].bn1.bias[:16] = 0.0
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        before = model(x)
    cz.thin(model, x)
    assert model.layer1[0].conv1.out_channels == 48
    with torch.no_grad():
        assert torch.allclose(model(x), before, atol=1e-4)


@pytest.fixture(scope="module")
def int8(digits: dict) -> nn.Module:
    calibration = [batch for _, batch in zip(range(4), digits["train"], strict=False)]
    return cz.quantize_int8(digits["model"], calibration, per_channel=True)


def test_quantize_int8_runs_int8_kernels_close_to_float(digits: dict, int8: nn.Module) -> None:
    assert isinstance(int8, Int8Model)
    assert any(t.dtype in (torch.qint8, torch.quint8, torch.int8, torch.uint8)
               for t in int8.state_dict().values() if isinstance(t, torch.Tensor))
    assert description_of(int8).recipe("quantization")["kernels"] == "int8"
    float_top1 = cz.evaluate(digits["model"], digits["test"])["top1"]
    int8_top1 = cz.evaluate(int8, digits["test"])["top1"]
    assert abs(int8_top1 - float_top1) <= 3.0, (float_top1, int8_top1)
    assert not any(isinstance(m, Int8Model) for m in digits["model"].modules())  # unchanged


def test_quantize_int8_a_torchvision_model(one_thread: None) -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=5).eval()
    batches = [torch.randn(4, 3, 32, 32) for _ in range(2)]
    int8_model = cz.quantize_int8(model, batches, backend="x86", mode="sym")
    with torch.no_grad():
        assert int8_model(batches[0]).shape == (4, 5)


def test_quantize_int8_refusals(digits: dict, int8: nn.Module) -> None:
    with pytest.raises(QuantizationError, match="did you mean 'asym_u'"):
        cz.quantize_int8(digits["model"], [digits["x"]], mode="asym_un")
    with pytest.raises(UsageError, match="already quantized"):
        cz.quantize_int8(int8, [digits["x"]])
    with pytest.raises(UsageError, match="calibration loader is empty"):
        cz.quantize_int8(Net(), [])
    with pytest.raises(UsageError, match="symmetric weights"):
        cz.quantize_int8(digits["model"], [digits["x"]], mode="asym_u", backend="onednn")
    first_batch = "the calibration loader's first batch"
    with pytest.raises(UsageError, match=f"{first_batch} is of type str, not a batch of images"):
        cz.quantize_int8(Net(), ["a", "b"])
    with pytest.raises(UsageError, match=rf"{first_batch} is a tensor of shape \[2, 64\]"):
        cz.quantize_int8(Net(), [torch.zeros(2, 64)])
    size = list(digits["x"].shape[1:])
    with pytest.raises(UsageError, match=re.escape(f"the calibration images are [1, 4, 4] and "
                                                   f"the model takes {size}")):
        cz.quantize_int8(digits["model"], [torch.zeros(2, 1, 4, 4)])


def test_compress_to_budget_meets_the_macs_budget(digits: dict) -> None:
    tuned: list[nn.Module] = []

    def train_fn(model: nn.Module) -> None:
        tuned.append(model)
        train(model, digits["train"], epochs=1, lr=0.02)

    def evaluate_fn(model: nn.Module) -> dict[str, float]:
        return cz.evaluate(model, digits["test"])

    dense = digits["model"]
    before = {name: p.clone() for name, p in dense.state_dict().items()}
    result = cz.compress_to_budget(dense, train_fn, evaluate_fn, macs=0.5)
    assert result.met and result.achieved["macs"] <= 0.5
    assert result.figures["macs"] <= 0.5 * result.dense["macs"]
    assert tuned == [result.model] and result.removed_channels > 0
    assert sum(p.numel() for p in result.model.parameters()) < sum(
        p.numel() for p in dense.parameters())
    assert result.scores["top1"] > 50
    assert description_of(result.model).recipe("thinning") is not None
    assert all(torch.equal(before[name], t) for name, t in dense.state_dict().items())


def test_a_torchvision_model_to_a_budget(one_thread: None) -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    dense = torchvision.models.mobilenet_v2(width_mult=0.25, num_classes=3).eval()
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 3, (8,))
    result = cz.compress_to_budget(dense, None, lambda m: cz.evaluate(m, [(x, y)]),
                                   params=0.6, example_inputs=x)
    assert result.achieved["params"] <= 0.6
    # an untrained model scores at chance: the parameter budget holds, the result is not "met"
    assert result.scores["top1"] <= 50.0 and result.collapsed and not result.met
    assert sum(p.numel() for p in result.model.parameters()) <= 0.6 * sum(
        p.numel() for p in dense.parameters())
    assert description_of(result.model).recipe("thinning") is not None


def test_compress_to_budget_refusals(digits: dict) -> None:
    with pytest.raises(UsageError, match="needs a budget"):
        cz.compress_to_budget(digits["model"], None, lambda m: {})
    with pytest.raises(UsageError, match="macs=1.5"):
        cz.compress_to_budget(digits["model"], None, lambda m: {}, macs=1.5)
    with pytest.raises(UsageError, match="with 'top1' and 'loss'"):
        cz.compress_to_budget(digits["model"], None, lambda m: 0.5, params=0.5)


def test_distillation_loss_is_hintons(digits: dict) -> None:
    teacher = digits["model"]
    teacher.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    student = Net()
    kd = cz.DistillationLoss(teacher, temperature=4.0, distill_weight=0.7, student_weight=0.3)
    x, y = next(iter(digits["train"]))
    output = student(x)
    loss = kd(output, y, x)
    with torch.no_grad():
        soft_teacher = F.softmax(teacher(x) / 4.0, dim=1)
    kl = F.kl_div(F.log_softmax(output / 4.0, dim=1), soft_teacher, reduction="batchmean")
    expected = 0.3 * F.cross_entropy(output, y) + 0.7 * 16.0 * kl
    assert torch.allclose(loss, expected, atol=1e-5)
    loss.backward()
    assert student.conv1.weight.grad is not None
    assert all(p.grad is None for p in teacher.parameters())
    with pytest.raises(UsageError, match="temperature=0"):
        cz.DistillationLoss(teacher, temperature=0)


def test_distillation_between_torchvision_models(one_thread: None) -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    teacher = torchvision.models.resnet18(num_classes=4)
    student = torchvision.models.mobilenet_v2(width_mult=0.25, num_classes=4)
    kd = cz.DistillationLoss(teacher, temperature=2.0)
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([1, 3])
    loss = kd(student(x), y, x)
    loss.backward()
    assert torch.isfinite(loss) and not teacher.training
    assert all(p.grad is None for p in teacher.parameters())
    assert student.classifier[1].weight.grad is not None


@pytest.mark.slow
def test_export_onnx_writes_the_int8_model_as_qdq(int8: nn.Module, digits: dict,
                                                  tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime", reason="export_onnx needs the [onnx] extra")
    record = cz.export_onnx(int8, tmp_path / "model.onnx", digits["x"])
    assert (tmp_path / "model.onnx").stat().st_size == record["bytes"]
    assert record["kind"] == "qdq" and record["input"]["shape"] == ["batch", 1, 8, 8]
    assert record["versus_int8"]["top1_agreement"] >= 0.75
    assert not (tmp_path / "export.json").exists()


def test_export_onnx_without_the_extra_says_how_to_install_it(
        digits: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if not installed
    with pytest.raises(UsageError, match=r"needs the 'onnx' extra .*pip install -e '\.\[onnx\]'"):
        cz.export_onnx(digits["model"], tmp_path / "model.onnx", digits["x"])
    assert not (tmp_path / "model.onnx").exists()


@pytest.mark.parametrize("call", [
    lambda: cz.thin(Net()),
    lambda: cz.thin(Net(), torch.randn(8, 8)),
    lambda: cz.thin("resnet18"),  # type: ignore[arg-type]
    lambda: cz.save_checkpoint(Net(), "x.pth", example_inputs=torch.randn(2, 1, 8, 8)),
])
def test_bad_input_is_one_typed_line(call: object) -> None:
    with pytest.raises(CompressorError) as raised:
        call()  # type: ignore[operator]
    assert "\n" not in str(raised.value)
