"""The tiny data, weights and launcher that every docs page's commands run against.

A page's temporary directory gets (tests/test_docs.py): `compress_classifier.py` (a launcher of
the repository's), `configs/` and `examples/` (links to the repository's), `my_images/` (a
folder dataset of 48x48 JPEGs: classes bag, sandal, sneaker), `data/cifar10/` (CIFAR-10 python
batches under cifar-10-batches-py/), `data/fashion-mnist/` (gzipped IDX files) and, under
`.torch_home/hub/checkpoints/`, random-weight torchvision files for resnet18 and mobilenet_v2
under their usual names.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

__all__ = ["FOLDER_CLASSES", "LINKED", "PLANTED_ARCHS", "TORCH_HOME", "UNMET_OK",
           "build_template", "populate_page_dir", "write_jpeg_folders"]

ROOT = Path(__file__).resolve().parents[1]
FOLDER_CLASSES = ("bag", "sandal", "sneaker")
PLANTED_ARCHS = ("resnet18", "mobilenet_v2")
LINKED = ("configs", "examples")  # the repository's folders a page's commands name
TORCH_HOME = ".torch_home"  # hidden, so that a page's `ls` shows what its commands wrote
# the launcher reads it: exit status 1 (a budget not met) passes in a block marked `unmet`
UNMET_OK = "DOCS_HARNESS_UNMET_OK"
# the launcher's text: the repository's driver, run as `python compress_classifier.py ...`
LAUNCHER = ('"""Runs the repository\'s compress_classifier.py (written by tests/test_docs.py)."""\n'
            "import os\nimport runpy\nimport sys\n\n"
            "try:\n"
            f"    runpy.run_path({str(ROOT / 'compress_classifier.py')!r}, run_name='__main__')\n"
            "except SystemExit as ended:\n"
            "    # a budget not met (1) passes in a block marked unmet (tests/test_docs.py)\n"
            f"    if ended.code == 1 and os.environ.get({UNMET_OK!r}) == '1':\n"
            "        print('docs-harness: budget not met on the noise images, accepted',\n"
            "              file=sys.stderr)\n"
            "        sys.exit(0)\n"
            "    raise\n")
# a class's images share a hue, so that a page's one-epoch fine-tune has something to learn
_HUES = {"bag": (150, 90, 40), "sandal": (200, 170, 60), "sneaker": (60, 90, 200)}


def write_jpeg_folders(root: Path, per_split: dict[str, int], size: int = 48) -> Path:
    """`root/<split>/<class>/<i>.jpg`: per class, the given count of noisy `size`-px JPEGs."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in per_split.items():
        for name in FOLDER_CLASSES:
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for index in range(count):
                noise = rng.integers(-40, 41, (size, size, 3))
                pixels = np.clip(np.array(_HUES[name]) + noise, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{index}.jpg", quality=90)
    return root


def build_template(template: Path) -> Path:
    """Write every fixture once into `template` (the weights take a second or two to build)."""
    # the suite's own writers of each format, imported here so that the extractor's unit test
    # does not import the model and data packages
    from tests.test_data_cifar import write_cifar10
    from tests.test_data_idx import write_mnist
    from tests.test_transfer import _plant

    write_jpeg_folders(template / "my_images", {"train": 6, "val": 3})
    write_cifar10(template / "data" / "cifar10" / "cifar-10-batches-py", per_batch=16)
    write_mnist(template / "data" / "fashion-mnist", gz=True, n_train=60, n_test=20)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_HOME", str(template / TORCH_HOME))
        for arch in PLANTED_ARCHS:
            _plant(arch)
    return template


def populate_page_dir(template: Path, page_dir: Path) -> Path:
    """Fill a page's empty directory: the fixtures (weights hard-linked), the launcher, links."""
    shutil.copytree(template, page_dir, dirs_exist_ok=True, copy_function=_link_or_copy)
    (page_dir / "compress_classifier.py").write_text(LAUNCHER)
    for name in LINKED:
        if (ROOT / name).is_dir():
            (page_dir / name).symlink_to(ROOT / name, target_is_directory=True)
    return page_dir


def _link_or_copy(source: str, destination: str) -> None:
    """Hard-link the large weight files (read only by the commands), copy the small data."""
    if Path(source).suffix == ".pth":
        try:
            os.link(source, destination)
            return
        except OSError:
            pass
    shutil.copy2(source, destination)
