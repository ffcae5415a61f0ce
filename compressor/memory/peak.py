"""The allocator's own record of a block of code: the peak of the bytes it held live.

Chosen over tracking tensors through saved-tensor hooks or a dispatch mode because the
allocator sees everything a training step really holds: activations saved for backward,
those a recomputed segment brings back to life in backward, gradients of activations,
kernels' scratch buffers, and buffers that torch.compile's generated code allocates without
going through an operator. The records come from torch's profiler with `profile_memory=True`
(every allocation and free on the CPU with its address and size); the profiler's per-operator
bookkeeping costs a few percent of the step, and nothing is sampled, so the peak is exact.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.profiler import ProfilerActivity, profile

__all__ = ["AllocationTrace", "record_allocations", "profiler_busy"]


@dataclass
class AllocationTrace:
    """Allocations (positive sizes) and frees (negative) on one device, in time order."""

    device: torch.device
    events: list[tuple[int, int, int]] = field(default_factory=list)  # (time ns, address, bytes)

    def peak_bytes(self, exclude: Iterable[Tensor] = ()) -> int:
        """Highest total of bytes allocated within the block and live at one time.

        What was live before the block does not count (a free of it lowers the total, as for
        CUDA's max_memory_allocated minus the start). The storages of `exclude` (e.g. the
        parameters' gradients, which the step leaves behind) are taken out from the moment
        they were allocated: their last allocation at their address within the block.
        """
        addresses = {_address(tensor) for tensor in exclude}
        skipped = {}
        for index, (_, address, size) in enumerate(self.events):
            if size > 0 and address in addresses:
                skipped[address] = index  # the last allocation at that address is the one alive
        skipped_indices = set(skipped.values())
        live = peak = 0
        for index, (_, _, size) in enumerate(self.events):
            if index in skipped_indices:
                continue
            live += size
            peak = max(peak, live)
        return peak


def _address(tensor: Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # sparse or storage-less tensors
        return 0


def profiler_busy() -> bool:
    """Whether a profiler already runs in this thread (a second one cannot start)."""
    return bool(torch._C._autograd._profiler_enabled())


@contextmanager
def record_allocations(device: torch.device | str = "cpu") -> Iterator[AllocationTrace]:
    """Record every allocation and free on `device` made inside the block (CPU tested).

    The trace fills when the block ends. Raises RuntimeError if a profiler already runs.
    """
    trace = AllocationTrace(torch.device(device))
    # The profiler's library (kineto) writes its start and stop messages straight to stderr,
    # which would break a refused run's one-line error and litter a benchmark's tables; it
    # reads this when first used (a level the user set stays)
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield trace
    # The event tree is the profiler's raw record (torch.profiler's memory timeline reads it
    # too); the public event list merges allocations into per-operator totals.
    from torch._C._profiler import _EventType

    pending = list(reversed(prof.profiler.kineto_results.experimental_event_tree()))
    while pending:  # depth first, in record order
        event = pending.pop()
        pending.extend(reversed(event.children))
        kind, fields = event.typed
        if kind == _EventType.Allocation and fields.device.type == trace.device.type:
            trace.events.append((event.start_time_ns, fields.ptr, fields.alloc_size))
    trace.events.sort(key=lambda item: item[0])  # stable: ties keep the record's order
