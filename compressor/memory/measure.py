"""Activation memory of one training step: the bytes saved for backward, and the step's peak."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from compressor.memory.peak import AllocationTrace, profiler_busy, record_allocations

__all__ = ["MemoryReport", "measure_saved_bytes", "default_loss"]


@dataclass(frozen=True)
class MemoryReport:
    """Saved-for-backward bytes of one step, and the peak of live bytes during it."""

    saved_bytes: int  # unique storages saved for backward: params, buffers and inputs excluded
    saved_tensors: int  # number of distinct storages counted
    batch_size: int
    # Peak over forward and backward above the start. CPU: from the allocator's records,
    # the gradients left in the parameters' (and inputs') .grad apart. CUDA:
    # max_memory_allocated minus the start, those gradients included. None when another
    # profiler was running (CPU).
    peak_bytes: int | None = None

    @property
    def bytes_per_sample(self) -> float:
        """Saved bytes divided by the batch size."""
        return self.saved_bytes / max(self.batch_size, 1)


def default_loss(output: Any) -> Tensor:
    """Sum of every floating-point output tensor (main and auxiliary heads alike)."""
    if isinstance(output, Tensor):
        return output.float().sum()
    if isinstance(output, dict):
        output = list(output.values())
    return sum(default_loss(item) for item in output if item is not None)


def _storage_key(tensor: Tensor) -> tuple[str, int, int] | None:
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse or storage-less tensors
        return None
    if storage.data_ptr() == 0:
        return None
    return str(tensor.device), storage.data_ptr(), storage.nbytes()


def _keys(tensors: Iterable[Tensor]) -> set[tuple[str, int]]:
    keys = set()
    for tensor in tensors:
        key = _storage_key(tensor)
        if key is not None:
            keys.add(key[:2])
    return keys


@contextmanager
def _cuda_peak(found: list[int]) -> Iterator[None]:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    yield
    torch.cuda.synchronize()
    found.append(torch.cuda.max_memory_allocated() - start)


def measure_saved_bytes(model: nn.Module, *inputs: Tensor,
                        loss_fn: Callable[[Any], Tensor] | None = None,
                        backward: bool = True) -> MemoryReport:
    """Run one forward (and backward) step and count the bytes autograd keeps for backward.

    Every tensor saved for backward passes through a saved_tensors_hooks pack hook; tensors
    are deduplicated by storage (a view costs its whole storage, two views of one storage
    count once); parameters, buffers and the inputs are not activations and are excluded.
    Tensors that activation checkpointing keeps as its inputs are counted (they go through
    the same hooks); tensors it recomputes are not. That is what forward leaves behind, not
    the step's high-water mark: peak_bytes is that (see MemoryReport and
    compressor.memory.peak), and it shows recomputed activations living again in backward and
    the gradients of activations. Gradients accumulate into the parameters' .grad and
    training-mode batch norms update their statistics, as in a step.
    """
    loss_fn = loss_fn or default_loss
    excluded = _keys(list(model.parameters()) + list(model.buffers()) + list(inputs))
    seen: dict[tuple[str, int], int] = {}

    def pack(tensor: Tensor) -> Tensor:
        key = _storage_key(tensor)
        if key is not None and key[:2] not in excluded:
            seen[key[:2]] = max(seen.get(key[:2], 0), key[2])
        return tensor

    cuda_peak: list[int] = []
    cpu = not any(t.is_cuda for t in inputs)
    if not cpu:
        watch = _cuda_peak(cuda_peak)
    elif profiler_busy():
        watch = nullcontext()
    else:
        watch = record_allocations("cpu")
    with watch as trace:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = loss_fn(model(*inputs))
        if backward:
            loss.backward()
        del loss
    peak = cuda_peak[0] if cuda_peak else None
    if isinstance(trace, AllocationTrace):
        leaves = list(model.parameters()) + list(inputs)
        peak = trace.peak_bytes(exclude=[t.grad for t in leaves if t.grad is not None])
    batch = int(inputs[0].shape[0]) if inputs and inputs[0].dim() else 1
    return MemoryReport(sum(seen.values()), len(seen), batch, peak)
