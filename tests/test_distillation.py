"""Knowledge distillation at the library level: the loss, the frozen teacher, its own
preprocessing, and what a resume may change."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models import InceptionOutputs, get_model, get_model_weights

from compressor.assembly.state import assemble_checkpoint
from compressor.distillation import (
    Distillation,
    DistillationLoss,
    DistillationOutput,
    check_resume_without_distillation,
    distillation_loss,
)
from compressor.models import create_model
from compressor.models.description import ModelDescription, describe, description_of
from compressor.models.pretrained import pretrained_weights_path
from compressor.training.checkpoint import save_checkpoint
from compressor.training.loop import train_one_epoch
from compressor.training.losses import cross_entropy, get_loss, main_logits
from compressor.utils.config import DistillationConfig, ModelRequest
from compressor.utils.errors import CheckpointError, UsageError
from compressor.utils.input_spec import IMAGENET_MEAN, IMAGENET_STD, InputSpec

CPU = torch.device("cpu")
DIGITS = InputSpec((1, 8, 8), 8, 8, (0.3054,), (0.3761,), "nearest")


def _save_teacher(path: Path, model: nn.Module, input_spec: InputSpec | None = None) -> Path:
    """A compressor checkpoint of `model`, optionally recorded with another input spec."""
    checkpoint = assemble_checkpoint(model, args={})
    if input_spec is not None:
        checkpoint["input_spec"] = input_spec.to_dict()
    save_checkpoint(path, checkpoint)
    return path


def _digits_student(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return create_model("simplenet_digits", "digits", model_attrs={"width": 8})


def _start(teacher_path: Path, student: nn.Module, **settings: float) -> Distillation:
    config = DistillationConfig(teacher=ModelRequest(checkpoint=teacher_path), **settings)
    return Distillation.start(config, student, cross_entropy, CPU)


@pytest.fixture(scope="module")
def teacher_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(1)
    teacher = create_model("simplenet_digits", "digits", model_attrs={"width": 16})
    return _save_teacher(tmp_path_factory.mktemp("teacher") / "teacher.pth.tar", teacher)


def test_kd_loss_matches_a_hand_computed_value() -> None:
    student = [[1.0, 2.0, 0.5], [0.0, -1.0, 1.0]]
    teacher = [[0.5, 1.5, 3.0], [2.0, 0.0, 0.0]]
    target = [1, 2]
    temperature, dw, sw = 2.0, 0.7, 0.3

    def softmax(row: list[float], t: float) -> list[float]:
        exps = [math.exp(v / t) for v in row]
        return [e / sum(exps) for e in exps]

    kl = sum(sum(p * math.log(p / q) for p, q in zip(softmax(t, temperature),
                                                      softmax(s, temperature), strict=True))
             for s, t in zip(student, teacher, strict=True)) / len(student)
    ce = sum(-math.log(softmax(s, 1.0)[y]) for s, y in zip(student, target, strict=True)) / 2
    expected = sw * ce + dw * temperature ** 2 * kl

    s, t, y = torch.tensor(student), torch.tensor(teacher), torch.tensor(target)
    assert distillation_loss(s, t, temperature).item() == pytest.approx(temperature ** 2 * kl,
                                                                        rel=1e-6)
    loss = DistillationLoss(cross_entropy, temperature, dw, sw)(DistillationOutput(s, lambda: t), y)
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_the_arch_task_loss_keeps_its_aux_heads_and_kd_uses_main_logits() -> None:
    generator = torch.Generator().manual_seed(0)
    main, aux, teacher = (torch.randn(4, 10, generator=generator) for _ in range(3))
    target = torch.tensor([0, 1, 2, 3])
    output = DistillationOutput(InceptionOutputs(main, aux), lambda: teacher)
    loss = DistillationLoss(get_loss("inception_aux"), 3.0, 0.6, 0.4)(output, target)
    task = F.cross_entropy(main, target) + 0.4 * F.cross_entropy(aux, target)
    assert torch.allclose(loss, 0.4 * task + 0.6 * distillation_loss(main, teacher, 3.0))
    assert main_logits(output) is main  # the training metrics see the student's main head


def test_teacher_is_frozen_outside_the_student_and_gets_no_gradients(teacher_path: Path) -> None:
    student = _digits_student()
    keys_before = list(student.state_dict())
    distillation = _start(teacher_path, student, temperature=4.0)
    teacher = distillation.teacher.inference
    weights_before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student_before = {k: v.clone() for k, v in student.state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 1, 8, 8, generator=generator), torch.arange(16) % 10)
               for _ in range(3)]
    trained = distillation.wrap(student)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1, momentum=0.9)
    train_one_epoch(trained, batches, distillation.loss_for_epoch(0), optimizer, CPU, 0)
    assert not teacher.training and all(not p.requires_grad for p in teacher.parameters())
    assert all(p.grad is None for p in teacher.parameters())
    for key, value in teacher.state_dict().items():  # every weight and buffer that runs
        assert torch.equal(value, weights_before[key]), key
    assert any(not torch.equal(v, student_before[k]) for k, v in student.state_dict().items())
    # the teacher is in no state_dict: not the student's, not the wrapper's
    assert list(student.state_dict()) == keys_before
    assert all(key.startswith("student.") for key in trained.state_dict())
    assert all(not any(m is teacher for m in module.modules()) for module in (student, trained))


def test_before_the_start_epoch_the_teacher_does_not_run(teacher_path: Path) -> None:
    student = _digits_student()
    distillation = _start(teacher_path, student, start_epoch=2)
    calls: list[int] = []
    distillation.teacher.inference.register_forward_pre_hook(lambda m, args: calls.append(1))
    inputs, target = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])
    output = distillation.wrap(student)(inputs)
    loss = distillation.loss_for_epoch(1)(output, target)
    assert calls == [] and torch.allclose(loss, F.cross_entropy(student(inputs), target))
    distillation.loss_for_epoch(2)(output, target)
    assert calls == [1]


def _capture_teacher_input(distillation: Distillation, inputs: torch.Tensor) -> torch.Tensor:
    seen: list[torch.Tensor] = []
    handle = distillation.teacher.inference.register_forward_pre_hook(
        lambda module, args: seen.append(args[0].detach().clone()))
    distillation.wrap(nn.Identity())(inputs).teacher_logits()
    handle.remove()
    return seen[0]


def _normalize(raw: torch.Tensor, spec: InputSpec) -> torch.Tensor:
    view = (1, -1, 1, 1)
    return (raw - torch.tensor(spec.mean).view(view)) / torch.tensor(spec.std).view(view)


def test_a_teacher_with_another_normalization_sees_its_own(tmp_path: Path) -> None:
    torch.manual_seed(2)
    other = dataclasses.replace(DIGITS, mean=(0.5,), std=(0.25,))
    path = _save_teacher(tmp_path / "t.pth.tar", create_model("simplenet_digits", "digits"),
                         other)
    distillation = _start(path, _digits_student())
    raw = torch.rand(5, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    seen = _capture_teacher_input(distillation, _normalize(raw, DIGITS))
    assert torch.allclose(seen, _normalize(raw, other), atol=1e-5)
    assert not torch.allclose(seen, _normalize(raw, DIGITS), atol=1e-2)


def test_a_teacher_with_the_same_spec_gets_the_student_batch_unchanged(teacher_path: Path) -> None:
    distillation = _start(teacher_path, _digits_student())
    inputs = torch.randn(3, 1, 8, 8)
    assert distillation.teacher.adapter.is_identity
    assert torch.equal(_capture_teacher_input(distillation, inputs), inputs)


def test_a_cifar_teacher_gets_rgb_at_its_size_and_normalization(tmp_path: Path) -> None:
    torch.manual_seed(3)
    teacher = create_model("resnet20_cifar", "cifar10")
    spec = description_of(teacher).input_spec
    path = _save_teacher(tmp_path / "cifar.pth.tar", teacher)
    distillation = _start(path, _digits_student())
    raw = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    seen = _capture_teacher_input(distillation, _normalize(raw, DIGITS))
    resized = F.interpolate(raw.expand(-1, 3, -1, -1), size=(32, 32), mode="bilinear",
                            antialias=True, align_corners=False)
    assert seen.shape == (2, 3, 32, 32)
    assert torch.allclose(seen, _normalize(resized, spec), atol=1e-5)


def test_an_rgb_student_feeds_a_grayscale_teacher_luminance(tmp_path: Path) -> None:
    torch.manual_seed(4)
    path = _save_teacher(tmp_path / "gray.pth.tar", create_model("resnet20_cifar", "mnist"))
    student = create_model("resnet20_cifar", "cifar10")
    distillation = _start(path, student)
    raw = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    cifar = description_of(student).input_spec
    seen = _capture_teacher_input(distillation, _normalize(raw, cifar))
    gray = (0.2989 * raw[:, 0:1] + 0.587 * raw[:, 1:2] + 0.114 * raw[:, 2:3])
    gray = F.interpolate(gray, size=(28, 28), mode="bilinear", antialias=True)
    mnist = distillation.teacher.description.input_spec
    assert seen.shape == (2, 1, 28, 28)
    assert torch.allclose(seen, _normalize(gray, mnist), atol=1e-5)


def test_a_pretrained_googlenet_teacher_sees_its_05_normalization(torch_home: Path) -> None:
    """Distiller fed the teacher the student's tensor: ImageNet-normalized for GoogLeNet."""
    weights = get_model_weights("googlenet").DEFAULT
    torch.manual_seed(5)
    planted = get_model("googlenet", weights=None, aux_logits=False, init_weights=False)
    torch.save(planted.state_dict(), pretrained_weights_path(weights.url))
    student = create_model("squeezenet1_1", "imagenet")
    config = DistillationConfig(teacher=ModelRequest(arch="googlenet", pretrained=True))
    distillation = Distillation.start(config, student, cross_entropy, CPU)
    assert torch.equal(distillation.teacher.inference.model.fc.weight, planted.fc.weight)
    student_spec = description_of(student).input_spec
    assert student_spec.mean == IMAGENET_MEAN and student_spec.std == IMAGENET_STD
    raw = torch.rand(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    seen = _capture_teacher_input(distillation, _normalize(raw, student_spec))
    assert torch.allclose(seen, (raw - 0.5) / 0.5, atol=1e-5)
    record = distillation.record()
    assert record["teacher_weights"] == "pretrained"
    assert record["teacher_path"] == pretrained_weights_path(weights.url).name


def test_a_teacher_must_predict_the_student_classes(tmp_path: Path) -> None:
    path = _save_teacher(tmp_path / "five.pth.tar",
                         create_model("simplenet_digits", "digits", num_classes=5))
    with pytest.raises(UsageError, match="predicts 5 classes but the student"):
        _start(path, _digits_student())


def test_record_is_plain_and_names_file_hash_and_settings(teacher_path: Path) -> None:
    record = _start(teacher_path, _digits_student(), temperature=3.0, distill_weight=0.8,
                    student_weight=0.2, start_epoch=1).record()
    assert record == {"teacher_arch": "simplenet_digits", "teacher_weights": "checkpoint",
                      "teacher_path": str(teacher_path),
                      "teacher_sha256": record["teacher_sha256"], "temperature": 3.0,
                      "distill_weight": 0.8, "student_weight": 0.2, "start_epoch": 1}
    assert len(record["teacher_sha256"]) == 64


def test_resume_refuses_another_teacher_file_or_other_settings(teacher_path: Path,
                                                               tmp_path: Path) -> None:
    student = _digits_student()
    recorded = _start(teacher_path, student, temperature=4.0).record()
    _start(teacher_path, student, temperature=4.0).check_resume(recorded, next_epoch=3)
    torch.manual_seed(9)
    other = _save_teacher(tmp_path / "other.pth.tar",
                          create_model("simplenet_digits", "digits", model_attrs={"width": 16}))
    with pytest.raises(CheckpointError, match="not simplenet_digits"):
        _start(other, student, temperature=4.0).check_resume(recorded, next_epoch=3)
    with pytest.raises(UsageError, match="--kd-temperature 4 \\(not 2\\)"):
        _start(teacher_path, student, temperature=2.0).check_resume(recorded, next_epoch=3)
    with pytest.raises(UsageError, match="distilled from epoch 0, not 1"):
        _start(teacher_path, student, temperature=4.0, start_epoch=1).check_resume(recorded, 3)
    with pytest.raises(CheckpointError, match="record is damaged"):
        _start(teacher_path, student).check_resume({"teacher_arch": "x"}, next_epoch=3)


def test_settings_may_change_until_distillation_has_begun(teacher_path: Path,
                                                         tmp_path: Path) -> None:
    student = _digits_student()
    recorded = _start(teacher_path, student, start_epoch=5).record()
    _start(teacher_path, student, temperature=8.0, start_epoch=4).check_resume(recorded, 3)
    with pytest.raises(UsageError, match="trained without distillation, so it cannot start"):
        _start(teacher_path, student, start_epoch=2).check_resume(recorded, next_epoch=3)
    check_resume_without_distillation(recorded, next_epoch=3)
    with pytest.raises(UsageError, match="pass --kd-resume"):
        check_resume_without_distillation(recorded, next_epoch=6)
    # a plain run's checkpoint: distillation can start at its next epoch, not before
    _start(teacher_path, student, start_epoch=3).check_resume(None, next_epoch=3)
    with pytest.raises(UsageError, match="cannot start at epoch 2; pass --kd-start-epoch 3"):
        _start(teacher_path, student, start_epoch=2).check_resume(None, next_epoch=3)


def test_a_bare_state_dict_teacher_needs_its_arch(tmp_path: Path) -> None:
    torch.manual_seed(6)
    teacher = create_model("simplenet_mnist", "mnist")
    path = tmp_path / "lean.pth.tar"
    torch.save({"state_dict": {f"module.{k}": v for k, v in teacher.state_dict().items()}}, path)
    student = describe(create_model("simplenet_mnist", "mnist"),
                       ModelDescription("simplenet_mnist", "fashion-mnist", 10,
                                        description_of(teacher).input_spec))
    with pytest.raises(CheckpointError, match="name the teacher's architecture with --kd-teacher"):
        _start(path, student)
    config = DistillationConfig(teacher=ModelRequest(arch="simplenet_mnist", checkpoint=path))
    distillation = Distillation.start(config, student, cross_entropy, CPU)
    assert torch.equal(distillation.teacher.inference.model.fc2.weight, teacher.fc2.weight)
    assert distillation.teacher.description.dataset == "fashion-mnist"
    assert distillation.record()["teacher_weights"] == "weights"


def test_teachers_without_weights_or_of_another_arch_are_refused(teacher_path: Path) -> None:
    student = _digits_student()
    no_weights = DistillationConfig(teacher=ModelRequest(arch="resnet20_cifar", pretrained=True))
    with pytest.raises(UsageError, match="'resnet20_cifar' has no pretrained weights; train one "
                                         "and pass --kd-resume CKPT"):
        Distillation.start(no_weights, student, cross_entropy, CPU)
    other_arch = DistillationConfig(teacher=ModelRequest(arch="resnet20_cifar",
                                                         checkpoint=teacher_path))
    with pytest.raises(UsageError, match="holds a 'simplenet_digits', not the --kd-teacher "
                                         "'resnet20_cifar'; drop --kd-teacher"):
        Distillation.start(other_arch, student, cross_entropy, CPU)


@pytest.mark.parametrize("argv,fragment", [
    (["--resume-from", "run.pth.tar", "-e"], "-e trains none"),
    (["-a", "simplenet_digits", "--summary", "compute"], "--summary trains none"),
    (["-a", "simplenet_digits", "--epochs", "3", "--kd-start-epoch", "3"],
     "--kd-start-epoch 3 is not below --epochs 3"),
    (["-a", "simplenet_digits", "--kd-pretrained"], "--kd-pretrained needs --kd-teacher ARCH"),
])
def test_kd_flags_that_would_do_nothing_are_refused(argv: list[str], fragment: str) -> None:
    from compressor.cli.parser import parse_args

    teacher = [] if "--kd-pretrained" in argv else ["--kd-resume", "teacher.pth.tar"]
    with pytest.raises(UsageError, match=fragment):
        parse_args([*argv, *teacher])
