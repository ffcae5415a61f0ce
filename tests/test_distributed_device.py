"""--gpus / --cpu / torchrun: one process drives one GPU; a --gpus list that would silently go
unused is refused with one line that says how to launch (no GPU needed: CUDA is faked)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from compressor.utils import distributed
from compressor.utils.distributed import init_distributed, pick_device
from compressor.utils.errors import UsageError
from tests.conftest import assert_user_error, run_cli


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend four CUDA devices exist (set_device becomes a no-op)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)


@pytest.fixture
def alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """No torchrun environment."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def _one_line(error: pytest.ExceptionInfo[UsageError], *fragments: str) -> str:
    message = str(error.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_cpu_and_single_gpu_picks(cuda: None) -> None:
    assert pick_device(True, None) == torch.device("cpu")
    assert pick_device(True, [0]) == torch.device("cpu")  # --cpu wins over one listed GPU
    assert pick_device(False, None) == torch.device("cuda", 0)
    assert pick_device(False, None, local_rank=1, local_world_size=2) == torch.device("cuda", 1)
    assert pick_device(False, [2]) == torch.device("cuda", 2)


def test_torchrun_rank_uses_its_listed_gpu(cuda: None) -> None:
    picked = [pick_device(False, [3, 1], local_rank=r, local_world_size=2) for r in (0, 1)]
    assert picked == [torch.device("cuda", 3), torch.device("cuda", 1)]


def test_several_gpus_in_one_process_need_torchrun(cuda: None, alone: None) -> None:
    with pytest.raises(UsageError) as info:
        init_distributed(False, [0, 1])
    _one_line(info, "--gpus 0,1", "torchrun --nproc_per_node=2")


def test_gpu_list_shorter_than_nproc_is_refused(cuda: None) -> None:
    with pytest.raises(UsageError) as info:
        pick_device(False, [0], local_rank=1, local_world_size=2)
    _one_line(info, "2 processes", "one GPU per process", "--nproc_per_node=1")


def test_gpu_list_longer_than_nproc_is_refused(cuda: None) -> None:
    with pytest.raises(UsageError) as info:
        pick_device(False, [0, 1, 2], local_rank=0, local_world_size=2)
    _one_line(info, "--nproc_per_node=3")


def test_missing_gpu_index_is_refused(cuda: None) -> None:
    with pytest.raises(UsageError) as info:
        pick_device(False, [7])
    _one_line(info, "GPU 7", "4 visible")


@pytest.mark.parametrize("cpu, available, why", [
    (True, True, "--cpu was given"),
    (False, False, "CUDA is not available"),
    (True, False, "--cpu was given"),
])
def test_several_gpus_without_cuda_are_refused(monkeypatch: pytest.MonkeyPatch, alone: None,
                                               cpu: bool, available: bool, why: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    with pytest.raises(UsageError) as info:
        init_distributed(cpu, [0, 1])
    _one_line(info, "--gpus 0,1 needs CUDA", why, "drop --gpus", "torchrun")


def test_one_gpu_without_cuda_falls_back_to_the_cpu(monkeypatch: pytest.MonkeyPatch,
                                                    alone: None) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ctx = init_distributed(False, [0])  # Distiller's habit of passing --gpus 0 everywhere
    assert ctx.device == torch.device("cpu") and not ctx.enabled


def test_torchrun_environment_is_read(monkeypatch: pytest.MonkeyPatch, cuda: None) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    joined = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group",
                        lambda backend, device_id=None: joined.append((backend, device_id)))
    ctx = init_distributed(False, [2, 3])
    assert (ctx.rank, ctx.world_size, ctx.local_rank) == (1, 2, 1)
    assert ctx.device == torch.device("cuda", 3)
    assert joined == [("nccl", torch.device("cuda", 3))]


def test_cli_refuses_two_gpus_in_one_process(tmp_path: Path) -> None:
    result = run_cli("-a", "simplenet_digits", "--gpus", "0,1", "--epochs", "1", "-j", "0",
                     "-o", str(tmp_path), "-n", "gpus")
    line = assert_user_error(result, "--gpus 0,1")
    assert "torchrun" in line or "--cpu" in line
    assert not (tmp_path / "gpus").exists()
