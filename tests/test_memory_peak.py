"""The peak of live bytes during a training step, from the allocator's records."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from compressor.memory import RecomputedSequential, block_segments, measure_saved_bytes
from compressor.memory.peak import AllocationTrace, record_allocations

FLOAT = 4


def test_a_chain_of_linear_relu_peaks_at_its_activations_plus_two_gradients() -> None:
    # Each ReLU keeps its output (the next Linear saves the same storage); at the peak, in the
    # backward of a ReLU, they are all alive with the incoming gradient and the outgoing one:
    # (layers + 1) x batch x width floats. Beyond that only the loss and its gradient live,
    # two scalars; the weights' gradients stay in .grad and are not counted.
    layers, batch, width = 3, 4, 32
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width),
                                                                nn.ReLU())])
    report = measure_saved_bytes(model, torch.randn(batch, width))
    expected = (layers + 1) * batch * width * FLOAT
    assert report.saved_bytes == layers * batch * width * FLOAT
    assert report.peak_bytes is not None
    assert expected <= report.peak_bytes <= expected + 2 * FLOAT
    assert all(p.grad is not None for p in model.parameters())  # the backward pass ran


def test_the_peak_of_a_small_cnn_is_at_least_what_forward_saves() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)).train()
    report = measure_saved_bytes(model, torch.randn(4, 3, 12, 12))
    assert report.saved_bytes > 0
    assert report.peak_bytes is not None and report.peak_bytes >= report.saved_bytes


class Block(nn.Module):
    """Two Linear+Tanh pairs: four activations of its own that recomputation drops."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(width, width), nn.Tanh(),
                                  nn.Linear(width, width), nn.Tanh())

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x)


def test_recomputation_shows_in_the_peak_not_in_the_saved_bytes() -> None:
    torch.manual_seed(0)
    # Each recomputed segment also keeps the CPU RNG state (about 5 KB, whatever the batch),
    # which the peak sees too: a batch large enough that activations dominate.
    batch, width = 256, 32
    plain = nn.Sequential(nn.Linear(width, width), *[Block(width) for _ in range(4)])
    recomputed = RecomputedSequential(plain, block_segments(plain, ["Block"]))
    x = torch.randn(batch, width)
    plain_report = measure_saved_bytes(plain, x)
    recomputed_report = measure_saved_bytes(recomputed, x)
    activation = batch * width * FLOAT
    assert recomputed_report.saved_bytes == 4 * activation  # the blocks' inputs only
    assert recomputed_report.saved_bytes < plain_report.saved_bytes
    assert recomputed_report.peak_bytes is not None and plain_report.peak_bytes is not None
    # In backward, one block's insides live again: the peak exceeds what forward kept ...
    assert recomputed_report.peak_bytes >= recomputed_report.saved_bytes + 2 * activation
    # ... and stays below the plain step's, which holds every block's insides at once.
    assert recomputed_report.peak_bytes < plain_report.peak_bytes


def test_the_trace_drops_excluded_storages_and_what_lived_before() -> None:
    trace = AllocationTrace(torch.device("cpu"))
    grad = torch.zeros(4)
    address = grad.untyped_storage().data_ptr()
    trace.events = [
        (1, 100, 64),  # an activation
        (2, address, 32),  # a storage at the gradient's address, freed: counts
        (3, address, -32),
        (4, address, 16),  # the gradient itself (last allocation there): excluded
        (5, 200, -48),  # something allocated before the block, freed
        (6, 300, 40),  # below the earlier high-water mark, after that free
    ]
    assert trace.peak_bytes() == 64 + 32  # everything counted
    assert trace.peak_bytes(exclude=[grad]) == 64 + 32
    trace.events.append((7, 400, 100))
    assert trace.peak_bytes() == 64 + 16 - 48 + 40 + 100
    assert trace.peak_bytes(exclude=[grad]) == 64 - 48 + 40 + 100


def test_record_allocations_sees_a_temporary_freed_inside_the_block() -> None:
    with record_allocations() as trace:
        kept = torch.ones(1000)
        (kept * 2).sum()  # the product lives only for a moment
    sizes = [size for _, _, size in trace.events]
    assert sizes.count(1000 * FLOAT) == 2 and -1000 * FLOAT in sizes
    assert trace.peak_bytes() >= 2 * 1000 * FLOAT
    assert trace.peak_bytes(exclude=[kept]) >= 1000 * FLOAT


def test_inside_another_profiler_the_peak_is_unknown_not_an_error() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        report = measure_saved_bytes(model, torch.randn(2, 4))
    assert report.peak_bytes is None
    assert report.saved_bytes == 2 * 4 * FLOAT


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_peak_is_the_allocator_high_water_mark() -> None:
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)).cuda()
    report = measure_saved_bytes(model, torch.randn(32, 64, device="cuda"))
    assert report.peak_bytes is not None and report.peak_bytes >= report.saved_bytes
