"""The API's examples run as a user runs them, on a tiny image folder of JPEGs, and what they
save is evaluated by the real command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from tests.conftest import ROOT, cli_env, run_cli

CLASSES = {"bag": (200, 40, 40), "sandal": (40, 200, 40), "sneaker": (40, 40, 200)}


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DATA/train/<class>/*.jpg (6 each) and DATA/val/<class>/*.jpg (3 each), 48x48, one
    colour per class with noise."""
    root = tmp_path_factory.mktemp("my_images")
    generator = torch.Generator().manual_seed(0)
    for split, count in (("train", 6), ("val", 3)):
        for name, colour in CLASSES.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for index in range(count):
                noise = torch.randint(-40, 40, (48, 48, 3), generator=generator)
                pixels = (torch.tensor(colour) + noise).clamp(0, 255).to(torch.uint8)
                Image.fromarray(pixels.numpy()).save(folder / f"{index}.jpg", quality=90)
    return root


def run_example(script: str, *args: str, cwd: Path, env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], cwd=cwd,
                            env=cli_env(env), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_train_your_own_then_the_cli_evaluates_its_checkpoint(images: Path,
                                                              tmp_path: Path) -> None:
    result = run_example("train_your_own.py", str(images), "--epochs", "2", "--out", "out",
                         cwd=tmp_path)
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["epoch 0", "epoch 1"]
    assert any(line.startswith("thinned: ") for line in lines)
    int8_line = next(line for line in lines if line.startswith("int8: val top-1 "))
    exported = (tmp_path / "out" / "model_int8.onnx").is_file()
    assert exported or any(line.startswith("not exported: ") for line in lines)
    command = lines[lines.index(next(line for line in lines if line.startswith("saved "))) + 1]
    arch = command.split(" -a ")[1].split()[0]
    assert Path(tmp_path, arch.rsplit(":", 1)[0]).resolve() == ROOT / "examples" / \
        "train_your_own.py"
    cli = run_cli("-a", arch, "--resume-from", "out/int8.pth.tar", "-e", str(images),
                  "-o", "logs", "-n", "eval", cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr[-3000:]
    results = json.loads((tmp_path / "logs" / "eval" / "results.json").read_text())
    assert results["class_names"] == list(CLASSES)
    assert results["transforms"] == ["thinning", "quantization"]
    assert f"{results['top1']:.2f}" == int8_line.rsplit(" ", 1)[1]


@pytest.mark.slow
def test_ptq_int8_quantizes_a_trained_torchvision_model(images: Path, tmp_path: Path,
                                                        torch_home: Path) -> None:
    torchvision = pytest.importorskip("torchvision")
    weights = torchvision.models.ResNet18_Weights.DEFAULT
    torch.manual_seed(0)  # planted random weights under the file name torchvision looks for
    torch.save(torchvision.models.resnet18().state_dict(),
               torch_home / "hub" / "checkpoints" / Path(weights.url).name)
    result = run_example("ptq_int8.py", str(images), cwd=tmp_path)
    assert "int8 agrees with float on" in result.stdout
    saved = torch.load(tmp_path / "resnet18_int8.pth.tar", weights_only=True)
    assert saved["arch"] == "torchvision.models:resnet18" and saved["dataset"] == "imagenet"
    recipe = saved["model_attrs"]["transforms"][-1]
    assert recipe["name"] == "quantization" and recipe["recipe"]["kernels"] == "int8"
