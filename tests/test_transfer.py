"""Transfer learning: --pretrained on other classes loads every weight but the classifier, which
its family's builder initialises for the dataset's classes; the checkpoint records the weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torchvision.models import get_model_weights

from compressor.assembly import build_resolved_model, resolve_model
from compressor.models import get_arch_spec, list_archs
from compressor.models.pretrained import pretrained_weights_path
from compressor.training.checkpoint import load_checkpoint
from compressor.utils.config import ModelRequest
from compressor.utils.errors import CheckpointError
from tests.conftest import assert_user_error, run_cli

ARCH = "resnet18"
# RegNet's builders compute widths with tensors, which the meta device cannot: built for real
# (regnet_y_128gf alone takes 20 s). Both checks run in the registry tier (12 s and 30 s); the
# suite loads resnet18's and mobilenet_v2's weights around their named heads.
_NOT_ON_META = ("regnet_",)


def _plant(arch: str, seed: int = 3) -> dict[str, torch.Tensor]:
    """Write a 1000-class `arch` state dict where torchvision's file would be; return it."""
    spec = get_arch_spec(arch)
    torch.manual_seed(seed)
    model = spec.builder(num_classes=1000, input_spec=spec.input_spec("imagenet"),
                         **spec.resolve_attrs(None, pretrained=True))
    state = model.state_dict()
    path = pretrained_weights_path(get_model_weights(arch).DEFAULT.url)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return state


def _state_dicts(arch: str, device: str) -> tuple[dict, dict]:
    spec = get_arch_spec(arch)
    attrs = spec.resolve_attrs(None)
    with torch.device(device):
        return tuple(spec.builder(num_classes=classes, input_spec=spec.input_spec("imagenet"),
                                  **attrs).state_dict() for classes in (1000, 3))


def _classifier_table_matches(arch: str, device: str) -> None:
    weights, fine_tuned = _state_dicts(arch, device)
    changed = {key for key in weights if weights[key].shape != fine_tuned[key].shape}
    classifier = get_arch_spec(arch).classifier
    named = {key for key in weights if any(key.startswith(f"{layer}.") for layer in classifier)}
    assert changed == named, f"{arch}: classifier layers {classifier} vs changed {changed}"


@pytest.mark.registry
def test_every_torchvision_classifier_is_named() -> None:
    """Of each torchvision arch, exactly the parameters the class count shapes are named as its
    classifier: what --pretrained leaves out on other classes is the head and nothing else."""
    archs = [name for name in list_archs() if get_arch_spec(name).family == "torchvision"
             and not name.startswith(_NOT_ON_META)]
    assert len(archs) > 50
    for arch in archs:
        _classifier_table_matches(arch, "meta")


@pytest.mark.registry
@pytest.mark.parametrize("arch", [name for name in list_archs() if name.startswith(_NOT_ON_META)])
def test_regnet_classifiers_are_named(arch: str) -> None:
    _classifier_table_matches(arch, "cpu")


def test_new_head_for_other_classes_rest_loaded(torch_home: Path) -> None:
    state = _plant(ARCH)
    resolved = resolve_model(ModelRequest(arch=ARCH, dataset="folder", num_classes=3,
                                          pretrained=True))
    assert resolved.new_layers == ("fc",)
    source = resolved.pretrained_source
    assert source is not None and source.weights == str(get_model_weights(ARCH).DEFAULT)
    assert len(source.sha256) == 64
    torch.manual_seed(0)
    model = build_resolved_model(resolved)
    loaded = model.state_dict()
    assert loaded["fc.weight"].shape == (3, 512)
    for key, value in state.items():
        if not key.startswith("fc."):
            assert torch.equal(loaded[key], value), key
    # the new head is initialised as torchvision's ResNet initialises its fc (nn.Linear's own)
    bound = 1 / 512 ** 0.5
    assert loaded["fc.weight"].abs().max() <= bound and loaded["fc.weight"].std() > bound / 4


def test_same_classes_load_everything(torch_home: Path) -> None:
    state = _plant(ARCH)
    resolved = resolve_model(ModelRequest(arch=ARCH, dataset="synthetic", pretrained=True))
    assert resolved.new_layers == ()
    model = build_resolved_model(resolved)
    assert all(torch.equal(model.state_dict()[key], value) for key, value in state.items())


def test_weights_of_another_arch_are_refused(torch_home: Path, tmp_path: Path) -> None:
    spec = get_arch_spec("resnet34")
    other = spec.builder(num_classes=1000, input_spec=spec.input_spec("imagenet"))
    file = tmp_path / "resnet34.pth"
    torch.save(other.state_dict(), file)
    resolved = resolve_model(ModelRequest(arch=ARCH, dataset="folder", num_classes=3,
                                          pretrained=True, pretrained_file=file))
    with pytest.raises(CheckpointError, match="does not match resnet18"):
        build_resolved_model(resolved)


def test_pretrained_file_in_safetensors(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    spec = get_arch_spec("mobilenet_v2")
    torch.manual_seed(5)
    weights = spec.builder(num_classes=1000, input_spec=spec.input_spec("imagenet")).state_dict()
    file = tmp_path / "backbone.safetensors"
    save_file({key: value.contiguous() for key, value in weights.items()}, str(file))
    resolved = resolve_model(ModelRequest(arch="mobilenet_v2", dataset="folder", num_classes=4,
                                          pretrained=True, pretrained_file=file))
    assert resolved.new_layers == ("classifier.1",)
    loaded = build_resolved_model(resolved).state_dict()
    assert loaded["classifier.1.weight"].shape == (4, 1280)
    assert torch.equal(loaded["features.0.0.weight"], weights["features.0.0.weight"])


def test_fine_tune_cli_records_weights_and_head_lr(torch_home: Path, tmp_path: Path) -> None:
    """One epoch of fine-tuning: the log names the new layer, the checkpoint records the
    weights and two parameter groups (head at 10x --lr); -e and resume need nothing else."""
    _plant(ARCH)
    common = ("-j", "0", "-p", "0", "-b", "8", "--etrs", "0.05", "--etes", "0.1",
              "-o", str(tmp_path))
    result = run_cli("-a", ARCH, "--dataset", "synthetic", "--num-classes", "3",
                     "--input-size", "3,32,32", "--pretrained", "--lr", "0.01", "--epochs", "1",
                     "-n", "tune", *common)
    assert result.returncode == 0, result.stderr
    assert "newly initialised for the dataset's classes: fc" in result.stdout
    checkpoint = load_checkpoint(tmp_path / "tune" / "checkpoint.pth.tar")
    assert checkpoint["num_classes"] == 3
    recorded = checkpoint["args"]["pretrained_source"]
    assert recorded["new_layers"] == ["fc"] and len(recorded["sha256"]) == 64
    groups = checkpoint["optimizer"]["param_groups"]
    assert [group["lr"] for group in groups] == [0.01, pytest.approx(0.1)]
    assert len(groups[1]["params"]) == 2  # fc.weight, fc.bias
    # resumed, the groups and their rates come back from the checkpoint
    resumed = run_cli("--resume-from", str(tmp_path / "tune" / "checkpoint.pth.tar"),
                      "--epochs", "2", *common)
    assert resumed.returncode == 0, resumed.stderr
    again = load_checkpoint(tmp_path / "tune" / "checkpoint.pth.tar")
    assert [group["lr"] for group in again["optimizer"]["param_groups"]] == [0.01,
                                                                            pytest.approx(0.1)]
    assert again["args"]["pretrained_source"] == recorded
    evaluated = run_cli("-e", "--resume-from", str(tmp_path / "tune" / "checkpoint.pth.tar"),
                        "-n", "eval", *common)
    assert evaluated.returncode == 0, evaluated.stderr
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["num_classes"] == 3


def test_lr_head_without_a_new_head_is_refused(tmp_path: Path) -> None:
    result = run_cli("-a", "simplenet_digits", "--lr-head", "0.5", "--epochs", "1", "-j", "0",
                     "-o", str(tmp_path))
    assert_user_error(result, "--lr-head")
    assert not any(tmp_path.iterdir())


def test_pretrained_file_needs_pretrained(tmp_path: Path) -> None:
    result = run_cli("-a", ARCH, "--pretrained-file", str(tmp_path / "w.pth"), "-e",
                     "--dataset", "synthetic", "-o", str(tmp_path))
    assert_user_error(result, "--pretrained-file")


@pytest.mark.parametrize("content,fragment", [
    (b"", "is empty (0 bytes)"),
    (b"\x00\x01garbage" * 100, "is not a PyTorch file"),
    (b"pruners:\n  p1: {}\n", "is not a PyTorch file"),
    (b"PK\x03\x04" + bytes(60), "is truncated or corrupted")])
def test_unreadable_pretrained_file_is_one_line(tmp_path: Path, content: bytes,
                                                fragment: str) -> None:
    file = tmp_path / "weights.pth"
    file.write_bytes(content)
    result = run_cli("-a", ARCH, "--pretrained", "--pretrained-file", str(file), "-e",
                     "--dataset", "synthetic", "--num-classes", "3", "-o", str(tmp_path / "out"))
    assert_user_error(result, f"weights file {file} {fragment}",
                      "give a torch.save(state_dict) or safetensors file")
    assert not (tmp_path / "out").exists()


def test_budget_from_a_new_head_is_refused(torch_home: Path, tmp_path: Path) -> None:
    """The dense model teaches a budget run's fine-tune: with a head built for other classes
    it cannot, and the run says so before writing anything."""
    _plant(ARCH)
    result = run_cli("-a", ARCH, "--pretrained", "--dataset", "synthetic", "--num-classes", "3",
                     "--input-size", "3,32,32", "--target-macs", "0.5", "--epochs", "1",
                     "-j", "0", "-o", str(tmp_path / "out"))
    assert_user_error(result, "cannot teach", "--resume-from", "--no-kd")
    assert not (tmp_path / "out").exists()


def test_bn_momentum_is_set_for_training_and_refused_without_it(tmp_path: Path) -> None:
    from compressor.commands.train import set_bn_momentum

    spec = get_arch_spec("mobilenet_v2")
    model = spec.builder(num_classes=3, input_spec=spec.input_spec("imagenet"))
    set_bn_momentum(model, 0.3)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and all(norm.momentum == 0.3 for norm in norms)
    result = run_cli("-a", "simplenet_digits", "-e", "--bn-momentum", "0.1", "-j", "0",
                     "-o", str(tmp_path))
    assert_user_error(result, "--bn-momentum", "-e trains none")
    result = run_cli("-a", "simplenet_digits", "--bn-momentum", "0", "-j", "0",
                     "-o", str(tmp_path))
    assert_user_error(result, "--bn-momentum")
