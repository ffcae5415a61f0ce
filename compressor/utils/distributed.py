"""torchrun/DDP set-up (gloo on CPU, nccl on GPU), collectives, rank-identical randomness."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from compressor.utils.errors import UsageError

__all__ = ["DistContext", "ReplicaMismatchError", "init_distributed", "pick_device",
           "is_distributed", "rank", "world_size", "all_reduce_sum", "broadcast_object", "barrier",
           "shutdown", "shared_generator", "checksum", "verify_identical"]

LOG = logging.getLogger("compressor")

# Row width used by checksum(): per-row sums of 0/1 values weighted 1..1024 stay exact in float32.
_CHECKSUM_ROW = 1024


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


class ReplicaMismatchError(RuntimeError):
    """State that must be identical on every rank (masks) differs: a framework bug."""


def _listed(gpus: list[int]) -> str:
    return ",".join(str(gpu) for gpu in gpus)


def pick_device(cpu: bool, gpus: list[int] | None, local_rank: int = 0,
                local_world_size: int = 1) -> torch.device:
    """The device of one process, refusing --gpus lists that would silently go unused.

    Without CUDA (or with --cpu) a single listed GPU falls back to the CPU, as in Distiller,
    but several listed GPUs are refused: they promise parallelism that would not happen. With
    CUDA, one process drives one GPU: the list must name exactly one GPU per process on this
    node (process i uses gpus[local_rank]); more GPUs than processes means torchrun is needed.

    Raises:
        UsageError: for a --gpus list that cannot be honoured as given.
    """
    if not gpus:
        if cpu or not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda", local_rank)
    if cpu or not torch.cuda.is_available():
        if len(gpus) > 1:
            why = "--cpu was given" if cpu else "CUDA is not available here"
            raise UsageError(
                f"--gpus {_listed(gpus)} needs CUDA but {why}; drop --gpus to run on the CPU, "
                f"or drop --cpu and launch torchrun --nproc_per_node={len(gpus)} "
                f"compress_classifier.py ... on a machine with these GPUs")
        return torch.device("cpu")
    if len(gpus) > local_world_size:
        raise UsageError(
            f"--gpus {_listed(gpus)} lists {len(gpus)} GPUs but {local_world_size} process(es) "
            f"run here, and each process uses one GPU; launch torchrun "
            f"--nproc_per_node={len(gpus)} compress_classifier.py ... --gpus {_listed(gpus)}")
    if len(gpus) < local_world_size:
        raise UsageError(
            f"--gpus {_listed(gpus)} lists {len(gpus)} GPU(s) for {local_world_size} processes "
            f"per node; list one GPU per process or launch torchrun "
            f"--nproc_per_node={len(gpus)}")
    index = gpus[local_rank]
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise UsageError(f"--gpus {_listed(gpus)}: GPU {index} does not exist ({count} visible,"
                         f" indices 0..{count - 1}); list visible GPU indices")
    return torch.device("cuda", index)


def init_distributed(cpu: bool, gpus: list[int] | None = None) -> DistContext:
    """Join the process group torchrun describes in the environment, or run alone.

    The device comes from pick_device (see there for the --cpu / --gpus rules); under torchrun
    LOCAL_WORLD_SIZE (processes on this node) is what a --gpus list must match.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    global_rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    device = pick_device(cpu, gpus, local_rank, local_world)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None)
    return DistContext(global_rank, world, local_rank, device)


def is_distributed() -> bool:
    """True inside an initialised process group of more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank (0 when running alone)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    """The number of processes (1 when running alone)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_reduce_sum(tensor: Tensor) -> Tensor:
    """Sum a tensor over all processes (identity when running alone)."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def broadcast_object(value: Any) -> Any:
    """Rank 0's `value` on every process (the value itself when running alone)."""
    if not is_distributed():
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def barrier() -> None:
    """Wait for every process (no-op when running alone)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    """Leave the process group."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def shared_generator(seed: int, *keys: int | str) -> torch.Generator:
    """A CPU generator seeded by the run seed and `keys` (never the rank): identical on all ranks.

    Derived, not stateful: the same (seed, keys) give the same numbers in every process and
    after a resume, so it needs no checkpoint state. Keys are hashed with blake2b (Python's
    hash() differs between processes).
    """
    text = "\x1f".join([str(seed), *(str(key) for key in keys)])
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


def checksum(tensor: Tensor) -> Tensor:
    """A position-sensitive float64 checksum (0-d, on the tensor's device); exact for 0/1 masks.

    Elements are weighted by their position (1..1024 within rows of 1024, rows by 1..65521), so
    two masks with the same count but different zeros differ; no host sync, O(n / 1024) extra.
    """
    flat = tensor.detach().flatten().float()
    rows = -(-flat.numel() // _CHECKSUM_ROW)
    flat = torch.nn.functional.pad(flat, (0, rows * _CHECKSUM_ROW - flat.numel()))
    column = torch.arange(1, _CHECKSUM_ROW + 1, device=flat.device, dtype=torch.float32)
    per_row = (flat.view(rows, _CHECKSUM_ROW) * column).sum(dim=1).double()
    row = torch.arange(rows, device=flat.device, dtype=torch.int64) % 65521 + 1
    return (per_row * row.double()).sum()


def verify_identical(named: Mapping[str, Tensor], what: str, device: torch.device,
                     context: str = "") -> None:
    """Check that `named` tensors are identical on every rank (one all-reduce; no-op alone).

    Every rank compares the all-reduced maxima and minima of the checksums, so all ranks raise
    together; rank 0 logs the agreement at INFO.

    Raises:
        ReplicaMismatchError: naming the first tensor that differs.
    """
    if not is_distributed():
        return
    names = sorted(named)
    sums = [checksum(named[name]).to(device) for name in names]
    values = torch.stack([torch.tensor(float(len(names)), dtype=torch.float64, device=device),
                          *sums])
    both = torch.cat([values, -values])  # MAX of (v, -v) gives max(v) and -min(v) at once
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    high, low = both[:values.numel()], -both[values.numel():]
    differs = (high != low).nonzero().flatten().tolist()
    where = f" {context}" if context else ""
    if differs:
        first = "their number" if differs[0] == 0 else f"'{names[differs[0] - 1]}'"
        raise ReplicaMismatchError(
            f"{what} differ across the {world_size()} ranks{where} ({len(differs)} differ, "
            f"first: {first}); they were computed from rank-dependent random numbers or "
            f"statistics: draw from compressor.utils.distributed.shared_generator, all-reduce "
            f"statistics")
    if rank() == 0:
        LOG.info("%s identical on %d ranks%s (checksum %.17g)", what, world_size(), where,
                 float(values[1:].sum()) if names else 0.0)
