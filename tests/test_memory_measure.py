"""measure_saved_bytes counts exactly the bytes that autograd keeps, on models known by hand."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from compressor.memory import RecomputedSequential, block_segments, measure_saved_bytes

FLOAT = 4


def test_linear_relu_linear_saves_only_the_relu_output() -> None:
    # Linear 1 saves its input (excluded) and its weight (a parameter); ReLU saves its output,
    # which Linear 2 saves too (same storage, counted once); sum() saves nothing.
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    report = measure_saved_bytes(model, torch.randn(5, 8))
    assert report.saved_bytes == 5 * 16 * FLOAT
    assert report.saved_tensors == 1
    assert report.bytes_per_sample == 16 * FLOAT
    assert report.peak_bytes is not None and report.peak_bytes >= report.saved_bytes


class TwoViews(nn.Module):
    """Saves two views of one tensor (counted once) and a fresh tensor (counted)."""

    def forward(self, x: Tensor) -> Tensor:
        h = x * 2  # mul by a constant saves nothing
        a, b = h[:, :3], h[:, 3:]  # views of h's storage
        return (a * b).sum() + torch.sigmoid(h).sum()  # a*b saves a and b; sigmoid its output


def test_views_are_deduplicated_by_storage_and_inputs_excluded() -> None:
    x = torch.randn(4, 6, requires_grad=True)
    report = measure_saved_bytes(TwoViews(), x)
    assert report.saved_bytes == 2 * 4 * 6 * FLOAT  # h's storage + sigmoid's output
    assert report.saved_tensors == 2
    assert x.grad is not None  # the backward pass ran


def test_float64_and_parameters_excluded() -> None:
    model = nn.Sequential(nn.Linear(3, 7), nn.Tanh()).double()
    report = measure_saved_bytes(model, torch.randn(2, 3, dtype=torch.float64))
    assert report.saved_bytes == 2 * 7 * 8  # tanh's output only


def test_checkpointed_blocks_count_their_inputs_not_their_insides() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.act = nn.Linear(10, 10), nn.Tanh()

        def forward(self, x: Tensor) -> Tensor:
            return self.act(self.fc(x))

    model = nn.Sequential(nn.Linear(10, 10), Block(), Block())
    x = torch.randn(3, 10)
    # plain: each block saves its input (the previous output) and its tanh output
    assert measure_saved_bytes(model, x).saved_bytes == 3 * 3 * 10 * FLOAT
    model = RecomputedSequential(model, block_segments(model, ["Block"]))
    # recomputed: only the blocks' inputs are kept (the first Linear's and Block 1's outputs)
    assert measure_saved_bytes(model, x).saved_bytes == 2 * 3 * 10 * FLOAT
