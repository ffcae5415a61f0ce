"""Bad input of every kind the CLI reads: exit status 2, one stderr line, never a traceback.

Random bytes (random.Random(0).randbytes) stand for every file a user can name, and
out-of-domain values for every numeric flag. Flags are checked in-process (argparse exits
with status 2); a few real CLI runs check the whole path, one per file kind.
"""

from __future__ import annotations

import gzip
import math
import random
import struct
from pathlib import Path

import pytest
from PIL import Image

from compressor.cli.parser import parse_args
from compressor.data import load_datasets
from compressor.data.idx import IMAGES_MAGIC
from compressor.utils.dataset_table import DATASET_INPUT_SPECS
from compressor.utils.errors import DataError
from compressor.utils.input_spec import InputSpec
from tests.conftest import assert_user_error, run_cli
from tests.test_data_cifar import write_cifar10
from tests.test_data_idx import write_mnist

IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
             "t10k-labels-idx1-ubyte")
CIFAR10_FILES = (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch")
MNIST_SPEC = DATASET_INPUT_SPECS["mnist"]
CIFAR10_SPEC = DATASET_INPUT_SPECS["cifar10"]
IMAGE_SPEC = InputSpec((3, 16, 16), 18, 16, (0.5,) * 3, (0.5,) * 3, "bilinear")
DIGITS_EVAL = ("-a", "simplenet_digits", "-e", "-b", "64", "-j", "0", "--etes", "0.1")


def random_bytes(size: int = 4096, seed: int = 0) -> bytes:
    """Reproducible garbage."""
    return random.Random(seed).randbytes(size)


# --- numeric flags: in-process -------------------------------------------------------------

TOO_BIG_INT = str(2**63)
OUT_OF_DOMAIN = {
    "--lr": ["-1", "0", "nan", "inf", "1e400", "x"],
    "--momentum": ["-0.1", "1", "1.5", "nan", "inf"],
    "--wd": ["-1e-4", "nan", "inf"],
    "-b": ["0", "-1", "nan", "inf", "2.5", TOO_BIG_INT],
    "-j": ["-1", "nan", "100000", TOO_BIG_INT],
    "--epochs": ["-1", "nan", "inf", "1.5", TOO_BIG_INT],
    "-p": ["-1", "nan", TOO_BIG_INT],
    "--seed": ["-1", "nan", "inf", TOO_BIG_INT, "9" * 5000],
    "--vs": ["-0.1", "1", "1.5", "nan", "inf"],
    "--etrs": ["0", "-0.5", "1.01", "nan", "inf"],
    "--evs": ["0", "2", "nan"],
    "--etes": ["0", "-1", "1.5", "nan", "inf"],
    "--gpus": ["-1", "0,0", "a", ",", "nan", "1.5", TOO_BIG_INT],
}
SENSE_RANGES = [("-0.1", "0.5", "0.1"), ("1", "1", "0.1"), ("0.5", "0.5", "0.1"),
                ("0.5", "0.2", "0.1"), ("0", "1.5", "0.1"), ("0", "0.9", "0"),
                ("0", "0.9", "-0.1"), ("nan", "0.9", "0.1"), ("0", "inf", "0.1"),
                ("0", "0.9", "nan")]
IN_DOMAIN = [("--lr", "1e-6", "lr", 1e-6), ("--momentum", "0", "momentum", 0.0),
             ("--wd", "0", "weight_decay", 0.0), ("-b", "1", "batch_size", 1),
             ("-j", "0", "workers", 0), ("--epochs", "0", "epochs", 0),
             ("-p", "0", "print_freq", 0), ("--seed", str(2**63 - 1), "seed", 2**63 - 1),
             ("--vs", "0", "validation_split", 0.0), ("--etrs", "1", "effective_train_size", 1.0),
             ("--etes", "0.001", "effective_test_size", 0.001), ("--gpus", "1,0", "gpus", [1, 0])]


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        parse_args(["-a", "simplenet_digits", *argv])
    assert info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("flag,value", [(flag, value) for flag, values in OUT_OF_DOMAIN.items()
                                        for value in values])
def test_numeric_flag_out_of_domain(flag: str, value: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused([f"{flag}={value}"], capsys)  # '=': argparse reads '-inf' as a value too
    assert f"argument {flag}" in line and "Traceback" not in line
    assert len(line) < 300, line  # a 5000-digit value is not echoed whole


def test_negative_infinity_is_refused_too(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--lr", "--wd", "--momentum"):
        assert f"argument {flag}" in _refused([flag, "-inf"], capsys)


@pytest.mark.parametrize("levels", SENSE_RANGES)
def test_sense_range_out_of_domain(levels: tuple[str, str, str],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert "argument --sense-range" in _refused(["--sense", "element", "--sense-range", *levels],
                                                capsys)


@pytest.mark.parametrize("flag,text,dest,expected", IN_DOMAIN)
def test_domain_boundaries_are_accepted(flag: str, text: str, dest: str, expected: object) -> None:
    value = getattr(parse_args(["-a", "simplenet_digits", flag, text]), dest)
    assert value == expected and (not isinstance(value, float) or math.isfinite(value))


def test_sense_range_boundaries_are_accepted() -> None:
    args = parse_args(["-a", "x", "--sense", "filter", "--sense-range", "0", "1", "0.25"])
    assert args.sense_range == [0.0, 1.0, 0.25]


def test_cli_refuses_numeric_values_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for argv, flag in ((("-a", "simplenet_digits", "--epochs", "1", "--lr", "-1"), "--lr"),
                       ((*DIGITS_EVAL, "--sense", "filter", "--sense-range", "0.5", "0.2",
                         "nan"), "--sense-range")):
        assert_user_error(run_cli(*argv, "-o", str(out)), f"argument {flag}")
    assert not out.exists()


# --- dataset files: in-process, every file of every format ---------------------------------

def _one_line_data_error(load: object, *fragments: str) -> str:
    with pytest.raises(DataError) as info:
        load()  # type: ignore[operator]
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


@pytest.mark.parametrize("name", IDX_FILES)
@pytest.mark.parametrize("gz", [False, True])
def test_random_bytes_in_each_idx_file(tmp_path: Path, name: str, gz: bool) -> None:
    write_mnist(tmp_path, gz=gz)
    path = tmp_path / (f"{name}.gz" if gz else name)
    path.write_bytes(random_bytes())
    _one_line_data_error(lambda: load_datasets("mnist", str(tmp_path), MNIST_SPEC), str(path))
    # The right magic number and a shape the bytes cannot fill.
    body = struct.pack(">IIII", IMAGES_MAGIC, 2**31, 2**31, 2**31) + random_bytes(100)
    if "images" in name:
        path.write_bytes(gzip.compress(body) if gz else body)
        _one_line_data_error(lambda: load_datasets("mnist", str(tmp_path), MNIST_SPEC),
                             str(path), "header")


def test_truncated_gz_and_random_payload_in_gz(tmp_path: Path) -> None:
    write_mnist(tmp_path, gz=True)
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    _one_line_data_error(lambda: load_datasets("mnist", str(tmp_path), MNIST_SPEC),
                         f"cannot read IDX file {path}")
    path.write_bytes(gzip.compress(random_bytes()))
    _one_line_data_error(lambda: load_datasets("mnist", str(tmp_path), MNIST_SPEC), str(path))


def test_idx_images_of_the_wrong_size(tmp_path: Path) -> None:
    write_mnist(tmp_path, gz=False)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(struct.pack(">IIII", IMAGES_MAGIC, 12, 32, 32) + bytes(12 * 32 * 32))
    _one_line_data_error(lambda: load_datasets("mnist", str(tmp_path), MNIST_SPEC),
                         str(path), "32x32 images", "28x28")


def test_a_directory_where_a_file_should_be(tmp_path: Path) -> None:
    write_mnist(tmp_path, gz=False)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    (tmp_path / "t10k-labels-idx1-ubyte").mkdir()
    _one_line_data_error(lambda: load_datasets("mnist", str(tmp_path), MNIST_SPEC),
                         "no mnist IDX files", "t10k-labels-idx1-ubyte")
    cifar = tmp_path / "cifar"
    write_cifar10(cifar)
    (cifar / "test_batch").unlink()
    (cifar / "test_batch").mkdir()
    _one_line_data_error(lambda: load_datasets("cifar10", str(cifar), CIFAR10_SPEC),
                         "no cifar10 batch files", "test_batch")
    not_a_dir = tmp_path / "file"
    not_a_dir.write_bytes(random_bytes(10))
    _one_line_data_error(lambda: load_datasets("cifar10", str(not_a_dir), CIFAR10_SPEC),
                         f"DATASET_DIR {not_a_dir} does not exist or is not a directory")
    # a mistyped image folder is not called missing "cifar10 data": both readings are named
    _one_line_data_error(lambda: load_datasets("cifar10", str(tmp_path / "typo"), CIFAR10_SPEC),
                         "check the path (it holds the cifar10 files, or your images in "
                         "train/<class>/ and val/<class>/)")


@pytest.mark.parametrize("name", CIFAR10_FILES)
def test_random_bytes_in_each_cifar_batch(tmp_path: Path, name: str) -> None:
    write_cifar10(tmp_path)
    path = tmp_path / name
    for seed in range(4):  # several garbages: each trips the unpickler somewhere else
        path.write_bytes(random_bytes(4096, seed))
        _one_line_data_error(lambda: load_datasets("cifar10", str(tmp_path), CIFAR10_SPEC),
                             str(path))
    path.write_bytes(b"\x80\x02" + random_bytes(4096))  # a pickle header, then garbage
    _one_line_data_error(lambda: load_datasets("cifar10", str(tmp_path), CIFAR10_SPEC), str(path))


def test_random_bytes_as_an_image(tmp_path: Path) -> None:
    for split in ("train", "val"):
        (tmp_path / split / "ant").mkdir(parents=True)
        Image.new("RGB", (20, 20), (200, 10, 10)).save(tmp_path / split / "ant" / "0.JPEG")
    bad = tmp_path / "val" / "ant" / "1.JPEG"
    bad.write_bytes(random_bytes())
    test = load_datasets("imagenet", str(tmp_path), IMAGE_SPEC).test
    _one_line_data_error(lambda: [test[i] for i in range(len(test))],
                         f"corrupt image file {bad}")


# --- every file kind through the real CLI: one run each -----------------------------------

@pytest.fixture
def garbage(tmp_path: Path) -> Path:
    path = tmp_path / "garbage.bin"
    path.write_bytes(random_bytes())
    return path


def test_random_checkpoint_to_resume_from(garbage: Path, tmp_path: Path) -> None:
    result = run_cli("--resume-from", str(garbage), "-e", "-o", str(tmp_path / "out"))
    assert_user_error(result, str(garbage))
    assert not (tmp_path / "out").exists()


def test_random_checkpoint_to_load_weights_from(garbage: Path, tmp_path: Path) -> None:
    result = run_cli(*DIGITS_EVAL, "--exp-load-weights-from", str(garbage),
                     "-o", str(tmp_path / "out"))
    assert_user_error(result, str(garbage))
    assert not (tmp_path / "out").exists()


def test_random_schedule(garbage: Path, tmp_path: Path) -> None:
    result = run_cli("-a", "simplenet_digits", "--compress", str(garbage), "--epochs", "1",
                     "-b", "64", "-j", "0", "--etrs", "0.05", "--etes", "0.1", "-p", "0",
                     "-o", str(tmp_path / "out"))
    assert_user_error(result, str(garbage))


def test_random_idx_file(tmp_path: Path) -> None:
    write_mnist(tmp_path / "mnist", gz=False)
    bad = tmp_path / "mnist" / "t10k-images-idx3-ubyte"  # read by -e as well as by training
    bad.write_bytes(random_bytes())
    result = run_cli(str(tmp_path / "mnist"), "-a", "simplenet_mnist", "-e", "-j", "0",
                     "-o", str(tmp_path / "out"))
    assert_user_error(result, str(bad))
    assert not (tmp_path / "out").exists()


def test_random_cifar_batch(tmp_path: Path) -> None:
    write_cifar10(tmp_path / "cifar")
    bad = tmp_path / "cifar" / "test_batch"
    bad.write_bytes(random_bytes())
    result = run_cli(str(tmp_path / "cifar"), "-a", "resnet20_cifar", "-e", "-j", "0",
                     "-o", str(tmp_path / "out"))
    assert_user_error(result, str(bad))
    assert not (tmp_path / "out").exists()


def test_random_image_file(tmp_path: Path) -> None:
    for split in ("train", "val"):
        for label in ("a", "b"):
            (tmp_path / "data" / split / label).mkdir(parents=True)
            Image.new("RGB", (40, 30), (20, 90, 200)).save(
                tmp_path / "data" / split / label / "0.JPEG")
    bad = tmp_path / "data" / "val" / "b" / "0.JPEG"
    bad.write_bytes(random_bytes())
    result = run_cli(str(tmp_path / "data"), "-a", "squeezenet1_1", "-e", "-b", "2", "-j", "0",
                     "--vs", "0", "-o", str(tmp_path / "out"))
    assert_user_error(result, str(bad))
