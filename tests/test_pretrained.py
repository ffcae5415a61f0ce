"""--pretrained goes through torchvision's weights API and their own preprocessing metadata."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from torchvision.datasets import ImageFolder
from torchvision.models import get_model, get_model_weights

from compressor.models import get_arch_spec
from compressor.models.pretrained import pretrained_weights_path
from tests.conftest import assert_user_error, run_cli

ARCH = "squeezenet1_1"


def _image_folder(root: Path) -> Path:
    generator = torch.Generator().manual_seed(0)
    for split in ("train", "val"):
        for label in ("n01440764", "n01443537"):
            folder = root / split / label
            folder.mkdir(parents=True)
            for index in range(3):
                pixels = torch.randint(0, 256, (60, 80, 3), generator=generator,
                                       dtype=torch.uint8).numpy()
                Image.fromarray(pixels).save(folder / f"{index}.JPEG", quality=95)
    return root


def test_input_spec_comes_from_the_weights_metadata() -> None:
    weights = get_model_weights(ARCH).DEFAULT
    preprocess = weights.transforms()
    spec = get_arch_spec(ARCH).input_spec("imagenet")
    assert spec.crop_size == preprocess.crop_size[0]
    assert spec.resize_size == preprocess.resize_size[0]
    assert list(spec.mean) == list(preprocess.mean) and list(spec.std) == list(preprocess.std)
    inception = get_arch_spec("inception_v3").input_spec("imagenet")
    assert (inception.resize_size, inception.crop_size) == (342, 299)
    assert inception.input_size == (3, 299, 299)
    googlenet = get_arch_spec("googlenet").input_spec("imagenet")
    assert googlenet.mean == (0.5, 0.5, 0.5) and googlenet.std == (0.5, 0.5, 0.5)


def test_planted_weights_are_evaluated_with_their_preprocessing(torch_home: Path,
                                                                 tmp_path: Path) -> None:
    weights = get_model_weights(ARCH).DEFAULT
    torch.manual_seed(3)
    reference = get_model(ARCH, weights=None).eval()
    torch.save(reference.state_dict(), pretrained_weights_path(weights.url))
    data = _image_folder(tmp_path / "imagenet")
    result = run_cli(str(data), "-a", ARCH, "--pretrained", "-e", "-b", "4", "-j", "0",
                     "--vs", "0", "-o", str(tmp_path), "-n", "eval")
    assert result.returncode == 0, result.stderr
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    # The same evaluation by hand, with torchvision's own transforms for these weights.
    val = ImageFolder(str(data / "val"), transform=weights.transforms())
    with torch.no_grad():
        inputs = torch.stack([val[i][0] for i in range(len(val))])
        targets = torch.tensor([val[i][1] for i in range(len(val))])
        logits = reference(inputs)
    loss = torch.nn.functional.cross_entropy(logits, targets).item()
    top1 = 100.0 * (logits.argmax(1) == targets).float().mean().item()
    assert results["loss"] == pytest.approx(loss, rel=1e-4)
    assert results["top1"] == pytest.approx(top1)


def test_missing_weights_name_path_and_url(torch_home: Path, tmp_path: Path) -> None:
    weights = get_model_weights(ARCH).DEFAULT
    data = _image_folder(tmp_path / "imagenet")
    result = run_cli(str(data), "-a", ARCH, "--pretrained", "-e", "-j", "0", "--vs", "0",
                     "-o", str(tmp_path / "out"), env={"no_proxy": "", "https_proxy":
                                                       "http://127.0.0.1:9"})
    assert_user_error(result, str(pretrained_weights_path(weights.url)), weights.url)
