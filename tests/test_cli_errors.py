"""Bad input: exit status 2, one stderr line naming problem and fix, no traceback, nothing lost."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from PIL import Image

from tests.conftest import assert_user_error, run_cli, run_main

DIGITS = ("-a", "simplenet_digits", "-b", "64", "-j", "0", "--etrs", "0.1", "--etes", "0.2",
          "-p", "0", "--deterministic")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory holding a 1-epoch digits checkpoint."""
    out = tmp_path_factory.mktemp("trained")
    result = run_cli(*DIGITS, "--epochs", "1", "-o", str(out), "-n", "run")
    assert result.returncode == 0, result.stderr
    return out / "run"


def test_unknown_arch_suggests_close_names(tmp_path: Path) -> None:
    result = run_cli("-a", "resnet20_cifr", "--epochs", "1", "-o", str(tmp_path))
    assert_user_error(result, "unknown architecture 'resnet20_cifr'", "resnet20_cifar")
    assert not any(tmp_path.iterdir())


def test_bad_flag_is_one_line(tmp_path: Path) -> None:
    assert_user_error(run_cli("-a", "simplenet_digits", "--epochs", "x"), "--epochs")


def test_an_input_size_the_arch_cannot_take_is_one_line(tmp_path: Path) -> None:
    result = run_cli("-a", "simplenet_mnist", "--dataset", "synthetic", "--input-size",
                     "3,64,64", "--epochs", "1", "-o", str(tmp_path), "-n", "refused")
    assert_user_error(result, "simplenet_mnist cannot take a 3x64x64 input",
                      "--input-size 1,28,28")
    assert not (tmp_path / "refused").exists()


def test_missing_dataset_dir(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    result = run_cli(str(missing), "-a", "resnet20_cifar", "--epochs", "1", "-o", str(tmp_path))
    assert_user_error(result, str(missing))


def test_wrongly_laid_out_dataset_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    result = run_cli(str(data), "-a", "squeezenet1_1", "--epochs", "1", "-o", str(tmp_path / "o"))
    assert_user_error(result, "train")
    assert not (tmp_path / "o").exists()


def test_truncated_and_corrupted_checkpoints(trained: Path, tmp_path: Path) -> None:
    blob = (trained / "checkpoint.pth.tar").read_bytes()
    truncated = tmp_path / "truncated.pth.tar"
    truncated.write_bytes(blob[: len(blob) // 2])
    corrupted = tmp_path / "corrupted.pth.tar"
    corrupted.write_bytes(blob[:100] + bytes(reversed(blob[100:400])) + blob[400:])
    garbage = tmp_path / "garbage.pth.tar"
    garbage.write_bytes(b"not a checkpoint at all")
    # one through a real subprocess; the others in-process (refused before any work is done)
    for path, runner in ((truncated, run_cli), (corrupted, run_main), (garbage, run_main)):
        result = runner("--resume-from", str(path), "-e", "-o", str(tmp_path / "out"))
        assert_user_error(result, str(path))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content,fragment", [
    (b"", "is empty"),
    (b"pruners:\n  p1:\n    class: AutomatedGradualPruner\n", "is not a PyTorch file"),
    (b"\x89PNG\r\n\x1a\n" + bytes(64), "is not a PyTorch file")])
def test_a_file_of_another_kind_is_named_as_such(tmp_path: Path, content: bytes,
                                                 fragment: str) -> None:
    given = tmp_path / "given.pth.tar"
    given.write_bytes(content)
    result = run_main("--resume-from", str(given), "-e", "-o", str(tmp_path / "out"))
    assert_user_error(result, str(given), fragment)
    assert given.read_bytes() == content and not (tmp_path / "out").exists()


def test_checkpoint_of_another_arch(trained: Path, tmp_path: Path) -> None:
    result = run_main("-a", "resnet20_cifar", "--resume-from",
                      str(trained / "checkpoint.pth.tar"), "-e", "-o", str(tmp_path))
    assert_user_error(result, "simplenet_digits", "resnet20_cifar")


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def test_checkpoint_carrying_code_is_refused_unexecuted(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pth.tar"
    torch.save({"state_dict": {}, "payload": _RunsCode(marker)}, evil, pickle_protocol=2)
    plain_pickle = tmp_path / "evil.pkl"
    plain_pickle.write_bytes(pickle.dumps(_RunsCode(marker)))
    for path in (evil, plain_pickle):
        result = run_cli("--resume-from", str(path), "-e", "-o", str(tmp_path / "out"))
        assert_user_error(result, str(path))
        assert not marker.exists(), "the checkpoint's code ran"


def test_run_directory_with_a_checkpoint_is_not_overwritten(trained: Path) -> None:
    before = (trained / "checkpoint.pth.tar").read_bytes()
    result = run_cli(*DIGITS, "--epochs", "1", "-o", str(trained.parent), "-n", trained.name)
    assert_user_error(result, str(trained), "-n")
    assert (trained / "checkpoint.pth.tar").read_bytes() == before


def test_epochs_below_checkpoint(trained: Path, tmp_path: Path) -> None:
    result = run_cli("--resume-from", str(trained / "checkpoint.pth.tar"), "--epochs", "1",
                     "-j", "0", "-o", str(tmp_path))
    assert_user_error(result, "--epochs 1", "--epochs 2")


def test_corrupt_image_is_named(tmp_path: Path) -> None:
    data = tmp_path / "imagenet"
    for split in ("train", "val"):
        for label in ("a", "b"):
            folder = data / split / label
            folder.mkdir(parents=True)
            for index in range(2):
                Image.new("RGB", (40, 30), (index * 90, 20, 200)).save(folder / f"{index}.jpg")
    bad = data / "val" / "b" / "1.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not really a jpeg")
    result = run_cli(str(data), "-a", "squeezenet1_1", "-e", "-b", "2", "-j", "1", "--vs", "0",
                     "-o", str(tmp_path / "out"))
    assert_user_error(result, str(bad))


def test_a_failed_runs_frames_are_freed_before_main_returns(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A DataLoader worker's error is re-raised from a frame that holds it (a reference cycle),
    and the frames of the failed run hold the iterator: main frees them before it returns, so the
    iterator stops its workers at once, not at exit (where it waited 5 s for them)."""
    import gc
    import importlib
    import weakref

    from compressor.utils.errors import DataError

    cli_main = importlib.import_module("compressor.cli.main")  # the module, not its main()

    class Iterator:
        """Stands for the DataLoader iterator a failed epoch's frame holds."""

    held: list[weakref.ref[Iterator]] = []

    def reraise(exception: DataError) -> None:
        raise exception  # as torch's ExceptionWrapper.reraise: its frame holds the error

    def failing_run(_: object) -> int:
        iterator = Iterator()
        held.append(weakref.ref(iterator))
        reraise(DataError("corrupt image file x.jpg: truncated; remove or replace it"))
        return 0

    monkeypatch.setattr(cli_main, "parse_args", lambda argv: argv)
    monkeypatch.setattr(cli_main, "run", failing_run)
    gc.disable()  # only reference counting frees it: no collection may hide a cycle
    try:
        assert cli_main.main([]) == 2
        assert held and held[0]() is None
    finally:
        gc.enable()
