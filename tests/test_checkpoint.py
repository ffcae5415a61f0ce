"""Checkpoint writing survives SIGKILL at any moment; loading strips wrappers and refuses junk."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import IO

import pytest
import torch

from compressor.assembly.state import plain_state_dict
from compressor.training.checkpoint import (
    clean_state_dict,
    get_rng_state,
    load_checkpoint,
    require_full_checkpoint,
    save_checkpoint,
    set_rng_state,
)
from compressor.utils.atomic_io import atomic_duplicate, atomic_write
from compressor.utils.errors import CheckpointError
from tests.conftest import ROOT, start_killable

SAVER = """
import pathlib, sys, torch
from compressor.training.checkpoint import save_checkpoint
path, ready, step = sys.argv[1], pathlib.Path(sys.argv[2]), 0
ready.touch()
while True:
    step += 1
    save_checkpoint(path, {"step": step, "blob": torch.full((1_000_000,), float(step))})
"""


def test_sigkill_during_writes_never_leaves_a_broken_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "out" / "checkpoint.pth.tar"
    path.parent.mkdir()
    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    rng = random.Random(0)
    last_step = 0
    for attempt in range(6):
        kill = start_killable([str(script), str(path), str(tmp_path / f"ready{attempt}")],
                               tmp_path / f"ready{attempt}")
        time.sleep(rng.uniform(0.0, 0.3))
        kill()
        if path.exists():
            state = load_checkpoint(path)  # never raises: the file is always whole
            assert torch.equal(state["blob"], torch.full((1_000_000,), float(state["step"])))
            last_step = state["step"]
    assert last_step > 0, "no checkpoint was ever completed"
    leftovers = [p.name for p in path.parent.iterdir() if p.name != path.name]
    assert all(".tmp-" in name for name in leftovers)


@pytest.mark.slow
def test_sigkill_of_a_training_run_leaves_a_loadable_checkpoint(tmp_path: Path) -> None:
    rng = random.Random(1)
    out = tmp_path / "run"
    kill = start_killable([str(ROOT / "compress_classifier.py"), "-a", "simplenet_digits",
                            "--epochs", "50", "-b", "32", "-j", "0", "-p", "0", "-o",
                            str(tmp_path), "-n", out.name], out / "checkpoint.pth.tar")
    time.sleep(rng.uniform(0.0, 1.5))
    kill()
    checkpoint = load_checkpoint(out / "checkpoint.pth.tar")
    require_full_checkpoint(checkpoint, out / "checkpoint.pth.tar")
    assert checkpoint["epoch"] >= 0


def test_save_is_atomic_and_keeps_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "c.pth.tar"
    save_checkpoint(path, {"a": torch.ones(3)})
    save_checkpoint(path, {"a": torch.zeros(3)})
    assert torch.equal(load_checkpoint(path)["a"], torch.zeros(3))
    assert os.listdir(tmp_path) == ["c.pth.tar"]


def test_load_refuses_missing_and_non_dict(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "missing.pth")
    torch.save(torch.ones(2), tmp_path / "tensor.pth")
    with pytest.raises(CheckpointError, match="not a dict"):
        load_checkpoint(tmp_path / "tensor.pth")


def test_clean_state_dict_strips_wrappers() -> None:
    state = {"module.fc.weight": 1, "_orig_mod.module.conv.bias": 2, "bn.weight": 3}
    assert clean_state_dict(state) == {"fc.weight": 1, "conv.bias": 2, "bn.weight": 3}


def test_plain_state_dict_looks_through_wrappers() -> None:
    layer = torch.nn.Linear(3, 2)
    wrapped = torch.nn.parallel.DataParallel(torch.nn.Sequential(layer))
    state = plain_state_dict(wrapped)
    assert set(state) == {"0.weight", "0.bias"}
    assert torch.equal(state["0.weight"], layer.weight.detach())


def test_rng_state_round_trip() -> None:
    import numpy as np

    state = get_rng_state()
    first = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(state)
    second = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(first[0], second[0])
    assert (first[1] == second[1]).all() and first[2] == second[2]


def test_a_failed_write_keeps_the_previous_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "c.pth.tar"
    save_checkpoint(path, {"a": torch.ones(3)})

    def fail(handle: IO[bytes]) -> None:
        handle.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        atomic_write(path, fail)
    assert torch.equal(load_checkpoint(path)["a"], torch.ones(3))
    assert os.listdir(tmp_path) == ["c.pth.tar"]


def test_a_crashed_runs_temporary_does_not_stop_the_next_duplicate(tmp_path: Path) -> None:
    source, best = tmp_path / "checkpoint.pth.tar", tmp_path / "best.pth.tar"
    save_checkpoint(source, {"a": torch.ones(3)})
    (tmp_path / f".best.pth.tar.tmp-{os.getpid()}").write_bytes(b"left by a kill")
    atomic_duplicate(source, best)
    assert best.samefile(source)
    assert sorted(os.listdir(tmp_path)) == ["best.pth.tar", "checkpoint.pth.tar"]
