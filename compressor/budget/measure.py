"""The figures a budget constrains, measured on a (thinned) model: MACs, parameters, latency,
saved size."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from compressor.models.description import description_of
from compressor.reports.metrics import count_macs, model_file_size

__all__ = ["QUANTITIES", "LatencySetting", "measure_latency", "figures"]

# budgeted quantity -> the figure measured for it
QUANTITIES = ("macs", "params", "latency", "size")


@dataclass(frozen=True)
class LatencySetting:
    """How latency is measured: batch size, CPU threads, device, timed repetitions."""

    batch: int = 1
    threads: int = 1
    device: str = "cpu"
    repeats: int = 15
    min_seconds: float = 0.3


@contextmanager
def _threads(count: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_latency(model: nn.Module, setting: LatencySetting) -> float:
    """Median seconds of one forward pass of a batch at the model's InputSpec (eval mode)."""
    device = torch.device(setting.device)
    spec = description_of(model).input_spec
    was_training = model.training
    model.eval()
    param = next(model.parameters())
    batch = torch.randn(setting.batch, *spec.input_size, generator=torch.Generator().manual_seed(0)
                        ).to(device=device, dtype=param.dtype)
    times: list[float] = []
    try:
        with _threads(setting.threads), torch.inference_mode():
            for _ in range(2):  # warm-up: allocator, kernels' first-call set-up
                model(batch)
            _sync(device)
            started = time.perf_counter()
            while len(times) < setting.repeats or time.perf_counter() - started < \
                    setting.min_seconds:
                begin = time.perf_counter()
                model(batch)
                _sync(device)
                times.append(time.perf_counter() - begin)
                if len(times) >= 10 * setting.repeats:
                    break
    finally:
        model.train(was_training)
    return statistics.median(times)


def figures(model: nn.Module, quantities: tuple[str, ...], latency: LatencySetting | None
            ) -> dict[str, float]:
    """The requested figures of `model` (MACs of one sample, parameters, seconds, bytes)."""
    measured: dict[str, float] = {}
    for quantity in quantities:
        if quantity == "macs":
            measured["macs"] = float(count_macs(model))
        elif quantity == "params":
            measured["params"] = float(sum(p.numel() for p in model.parameters()))
        elif quantity == "size":
            measured["size"] = float(model_file_size(model)[0])
        elif quantity == "latency":
            if latency is None:
                raise ValueError("latency needs a LatencySetting")
            measured["latency"] = measure_latency(model, latency)
        else:
            raise ValueError(f"unknown budget quantity {quantity!r}")
    return measured
