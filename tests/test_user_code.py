"""The user's own model code (-a path/to/file.py:Name, -a package.module:Name), in process:
how it is imported, called and described; the command line's runs are test_user_code_cli.py."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
import torch

from compressor.assembly import load_model
from compressor.assembly.state import assemble_checkpoint
from compressor.models import create_model, get_arch_spec
from compressor.models.user_code import module_name_for
from compressor.training.checkpoint import save_checkpoint
from compressor.utils.dataset_table import DATASET_INPUT_SPECS
from compressor.utils.errors import CheckpointError, UsageError
from tests.conftest import trained_like_batchnorms

# A small hand-written CNN as a user writes one: conv-bn-relu blocks, a residual add written
# as `x + y` in forward, adaptive pooling and a linear head.
MODEL_SOURCE = '''\
import torch
from torch import nn


def conv_bn_relu(cin, cout, stride=1):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True))


class ResidualNet(nn.Module):
    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()
        self.stem = conv_bn_relu(in_channels, 16)
        self.branch = nn.Sequential(conv_bn_relu(16, 16), nn.Conv2d(16, 16, 3, 1, 1, bias=False),
                                    nn.BatchNorm2d(16))
        self.down = conv_bn_relu(16, 32, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        x = self.stem(x)
        y = self.branch(x)
        x = torch.relu(x + y)
        return self.fc(torch.flatten(self.pool(self.down(x)), 1))


def rgb_net(**kwargs):
    return ResidualNet(in_channels=3, **kwargs)


class FixedHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = ResidualNet(num_classes=4)

    def forward(self, x):
        return self.body(x)
'''


def write_model(directory: Path, name: str = "user_net.py") -> Path:
    """The user's model file, written into `directory`; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(MODEL_SOURCE)
    return path


def test_a_file_is_imported_once_under_a_name_of_its_path(tmp_path: Path) -> None:
    path = write_model(tmp_path)
    ref = f"{path}:ResidualNet"
    first = create_model(ref, "digits")
    second = create_model(ref, "digits")
    module = sys.modules[module_name_for(path.resolve())]
    assert type(first) is type(second) is module.ResidualNet  # one class object per process
    other = write_model(tmp_path / "other")  # the same code elsewhere is another module
    assert type(create_model(f"{other}:ResidualNet", "digits")) is not module.ResidualNet


def test_source_records_the_reference_file_and_hash(tmp_path: Path) -> None:
    path = write_model(tmp_path)
    spec = get_arch_spec(f"{path}:ResidualNet")
    assert dict(spec.source) == {
        "kind": "code", "ref": f"{path}:ResidualNet", "file": str(path.resolve()),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    assert spec.name == f"{path}:ResidualNet"


def test_input_spec_follows_the_dataset_and_imagenet_by_default(tmp_path: Path) -> None:
    spec = get_arch_spec(f"{write_model(tmp_path)}:ResidualNet")
    assert spec.default_dataset == "imagenet"
    assert set(spec.datasets) == set(DATASET_INPUT_SPECS)
    for dataset, input_spec in DATASET_INPUT_SPECS.items():
        assert spec.input_spec(dataset) == input_spec
    # data without preprocessing of its own (synthetic, an image folder): ImageNet's
    assert spec.input_spec("synthetic") == spec.input_spec("folder") == \
        DATASET_INPUT_SPECS["imagenet"]
    assert spec.num_classes("digits") == 10 and spec.num_classes("cifar100") == 100


def test_num_classes_is_passed_where_the_signature_takes_it(tmp_path: Path) -> None:
    path = write_model(tmp_path)
    model = create_model(f"{path}:ResidualNet", "cifar100",
                         input_spec=DATASET_INPUT_SPECS["digits"])
    assert model.fc.out_features == 100
    rgb = create_model(f"{path}:rgb_net", "cifar10")  # a factory's **kwargs take it too
    assert rgb.fc.out_features == 10 and rgb.stem[0].in_channels == 3
    fixed = create_model(f"{path}:FixedHead", "digits", num_classes=4)  # called bare
    assert fixed.body.fc.out_features == 4
    with pytest.raises(UsageError, match=r"FixedHead\(\) outputs 4 classes, not the 10"):
        create_model(f"{path}:FixedHead", "digits")


def test_the_check_forward_leaves_modes_weights_and_rng_as_they_were(tmp_path: Path) -> None:
    """Every build runs one forward to check the model fits: it must change nothing."""
    path = write_model(tmp_path)
    torch.manual_seed(0)
    model = create_model(f"{path}:ResidualNet", "digits")
    after_build = torch.random.get_rng_state()
    torch.manual_seed(0)
    bare = sys.modules[module_name_for(path.resolve())].ResidualNet(num_classes=10)
    assert torch.equal(after_build, torch.random.get_rng_state())  # no draw but the init's
    for (name, value), expected in zip(model.state_dict().items(), bare.state_dict().values(),
                                       strict=True):
        assert torch.equal(value, expected), name  # batch-norm statistics untouched too
    assert all(module.training for module in model.modules())


def test_a_file_imports_the_modules_beside_it(tmp_path: Path) -> None:
    (tmp_path / "blocks_for_user_net.py").write_text(
        "from torch import nn\n\ndef head(n):\n    return nn.Linear(1, n)\n")
    (tmp_path / "net.py").write_text(
        "from torch import nn\nfrom blocks_for_user_net import head\n\n"
        "class Net(nn.Module):\n    def __init__(self, num_classes):\n        super().__init__()\n"
        "        self.pool = nn.AdaptiveAvgPool2d(1)\n        self.fc = head(num_classes)\n\n"
        "    def forward(self, x):\n        return self.fc(self.pool(x[:, :1]).flatten(1))\n")
    model = create_model(f"{tmp_path / 'net.py'}:Net", "digits")
    assert model.fc.out_features == 10
    assert str(tmp_path) not in sys.path  # its directory was on the path while it loaded only


def test_relative_file_reference_is_read_from_the_current_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_model(tmp_path / "models")
    monkeypatch.chdir(tmp_path)
    spec = get_arch_spec("models/user_net.py:ResidualNet")
    assert spec.source["file"] == str(path.resolve())


def test_module_reference_comes_from_sys_path_only(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "user_models_pkg"
    write_model(package, "nets.py")
    (package / "__init__.py").write_text("")
    ref = "user_models_pkg.nets:ResidualNet"
    monkeypatch.chdir(tmp_path)  # the current directory is not assumed to be on sys.path
    monkeypatch.delitem(sys.modules, "user_models_pkg", raising=False)
    with pytest.raises(UsageError, match="not found on sys.path .* PYTHONPATH"):
        get_arch_spec(ref)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        spec = get_arch_spec(ref)
        assert spec.source["file"] == str((package / "nets.py").resolve())
        assert create_model(ref, "digits").fc.out_features == 10
        (package / "broken.py").write_text("import torch\nimport a_module_nobody_installed\n")
        with pytest.raises(UsageError, match=rf"{package / 'broken.py'}:2 .*nobody_installed"):
            get_arch_spec("user_models_pkg.broken:Net")
    finally:
        for name in ("user_models_pkg", "user_models_pkg.nets", "user_models_pkg.broken"):
            sys.modules.pop(name, None)


def test_a_failed_import_leaves_nothing_in_sys_modules(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("import torch\nraise RuntimeError('half-written model')\n")
    with pytest.raises(UsageError, match=rf"{path}:2 \(RuntimeError: half-written model\)"):
        get_arch_spec(f"{path}:Net")
    assert module_name_for(path.resolve()) not in sys.modules
    path.write_text("from torch import nn\nNet = nn.Identity\n")  # fixed: imported anew
    assert get_arch_spec(f"{path}:Net").source["sha256"] == hashlib.sha256(
        path.read_bytes()).hexdigest()


def test_load_model_imports_the_code_only_where_named(tmp_path: Path) -> None:
    ref = f"{write_model(tmp_path)}:ResidualNet"
    model = trained_like_batchnorms(create_model(ref, "digits"))
    save_checkpoint(tmp_path / "model.pth.tar", assemble_checkpoint(model, args={}))
    with pytest.raises(CheckpointError, match="your own code"):
        load_model(tmp_path / "model.pth.tar")
    loaded = load_model(tmp_path / "model.pth.tar", arch=ref).eval()
    inputs = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(loaded(inputs), model(inputs), rtol=0, atol=0)
