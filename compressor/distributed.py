"""torch.distributed set-up for torchrun (DDP; gloo on CPU, nccl on GPU) and rank-0 helpers."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["DistContext", "init_distributed", "all_reduce_sum", "barrier", "shutdown"]


@dataclass(frozen=True)
class DistContext:
    """Where this process runs: rank, world size and device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def enabled(self) -> bool:
        """True when more than one process trains together."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes files and prints results."""
        return self.rank == 0


def _pick_device(cpu: bool, gpus: list[int] | None, local_rank: int) -> torch.device:
    if cpu or not torch.cuda.is_available():
        return torch.device("cpu")
    index = gpus[local_rank % len(gpus)] if gpus else local_rank
    return torch.device("cuda", index)


def init_distributed(cpu: bool, gpus: list[int] | None = None) -> DistContext:
    """Join the process group torchrun describes in the environment, or run alone."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = _pick_device(cpu, gpus, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None)
    return DistContext(rank, world_size, local_rank, device)


def all_reduce_sum(tensor: Tensor) -> Tensor:
    """Sum a tensor over all processes (identity when running alone)."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def barrier() -> None:
    """Wait for every process (no-op when running alone)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    """Leave the process group."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
