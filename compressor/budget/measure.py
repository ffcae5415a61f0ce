"""The figures a budget constrains, measured on a (thinned) model: MACs, parameters, latency,
saved size."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from compressor.models.description import description_of
from compressor.reports.metrics import count_macs, model_file_bytes
from compressor.utils.precision import Precision

__all__ = ["QUANTITIES", "LatencySetting", "measure_latencies", "measure_latency",
           "relative_latencies", "figures", "search_measures", "MeasureFn", "LatenciesFn"]

# budgeted quantity -> the figure measured for it
QUANTITIES = ("macs", "params", "latency", "size")
# (model, quantities, the dense model's figures once measured) -> figures
MeasureFn = Callable[[nn.Module, tuple[str, ...], Mapping[str, float] | None],
                     Mapping[str, float]]
# (models, the dense model's figures) -> each model's latency, all timed in the same rounds
LatenciesFn = Callable[[list[nn.Module], Mapping[str, float]], list[float]]


@dataclass(frozen=True)
class LatencySetting:
    """How latency is measured: batch size, CPU threads, device, timed repetitions, and the
    precision (autocast dtype, memory format) the model runs in, as it was trained."""

    batch: int = 1
    threads: int = 1
    device: str = "cpu"
    repeats: int = 11
    min_seconds: float = 0.3
    precision: Precision = field(default_factory=Precision)


@contextmanager
def _threads(count: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _batch(model: nn.Module, setting: LatencySetting) -> torch.Tensor:
    spec = description_of(model).input_spec
    param = next(model.parameters())
    generator = torch.Generator().manual_seed(0)
    return torch.randn(setting.batch, *spec.input_size, generator=generator).to(
        device=setting.device, dtype=param.dtype)


def _call_seconds(model: nn.Module, batch: torch.Tensor, device: torch.device,
                  precision: Precision) -> float:
    """Seconds of one forward pass: on CUDA between two events on the stream (the GPU's own
    time, not the host's launch time), elsewhere by the clock."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with precision.autocast(device):
            model(batch)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0  # milliseconds
    begin = time.perf_counter()
    with precision.autocast(device):
        model(batch)
    return time.perf_counter() - begin


def measure_latencies(models: Sequence[nn.Module], setting: LatencySetting,
                      reference: nn.Module | None = None) -> tuple[list[float], float | None]:
    """Median seconds of one forward pass of a batch at each model's InputSpec (eval mode), all
    timed in the same interleaved rounds, and with `reference`, the reference's, timed in
    those rounds too (so a change in the machine's load cannot bias their ratios). In each
    round a model is called twice and its second call timed (warm caches). Under the setting's
    precision each model runs in its memory format (changed in place) and autocast dtype."""
    device = torch.device(setting.device)
    precision = setting.precision
    timed = [*models] if reference is None else [*models, reference]
    modes = [m.training for m in timed]
    for m in timed:
        precision.prepare(m)
    batches = [precision.inputs(_batch(m, setting)) for m in timed]
    times: list[list[float]] = [[] for _ in timed]
    try:
        for m in timed:
            m.eval()
        with _threads(setting.threads), torch.inference_mode():
            for m, batch in zip(timed, batches, strict=True):
                for _ in range(2):  # warm-up: allocator, kernels' first-call set-up
                    _call_seconds(m, batch, device, precision)
            started = time.perf_counter()
            while len(times[0]) < setting.repeats or (
                    time.perf_counter() - started < setting.min_seconds
                    and len(times[0]) < 10 * setting.repeats):
                for index, (m, batch) in enumerate(zip(timed, batches, strict=True)):
                    # the model's first call after the others runs on caches they filled
                    # (5-10% slower at batch 32 for these sizes, by its place in the round):
                    # untimed, so every model is timed warm, as in a loop serving it
                    _call_seconds(m, batch, device, precision)
                    times[index].append(_call_seconds(m, batch, device, precision))
    finally:
        for m, mode in zip(timed, modes, strict=True):
            m.train(mode)
    medians = [statistics.median(t) for t in times]
    if reference is None:
        return medians, None
    return medians[:-1], medians[-1]


def measure_latency(model: nn.Module, setting: LatencySetting,
                    reference: nn.Module | None = None) -> tuple[float, float | None]:
    """Median seconds of one forward pass of `model` (measure_latencies of one model)."""
    seconds, reference_seconds = measure_latencies([model], setting, reference)
    return seconds[0], reference_seconds


def relative_latencies(models: Sequence[nn.Module], setting: LatencySetting,
                       reference: tuple[nn.Module, float]) -> list[float]:
    """Each model's latency as the reference's recorded seconds times their ratio measured in
    the same interleaved rounds (measure_latencies)."""
    seconds, reference_seconds = measure_latencies(models, setting, reference[0])
    assert reference_seconds is not None
    return [reference[1] * value / reference_seconds for value in seconds]


def figures(model: nn.Module, quantities: tuple[str, ...], latency: LatencySetting | None,
            reference: tuple[nn.Module, float] | None = None) -> dict[str, float]:
    """The requested figures of `model` (MACs of one sample, parameters, seconds, bytes).

    With `reference` (a model and its recorded latency), latency is timed in alternation with
    the reference and given as the recorded latency times their measured ratio.
    """
    measured: dict[str, float] = {}
    for quantity in quantities:
        if quantity == "macs":
            measured["macs"] = float(count_macs(model))
        elif quantity == "params":
            measured["params"] = float(sum(p.numel() for p in model.parameters()))
        elif quantity == "size":
            measured["size"] = float(model_file_bytes(model))
        elif quantity == "latency":
            if latency is None:
                raise ValueError("latency needs a LatencySetting")
            if reference is None:
                measured["latency"] = measure_latency(model, latency)[0]
            else:
                measured["latency"] = relative_latencies([model], latency, reference)[0]
        else:
            raise ValueError(f"unknown budget quantity {quantity!r}")
    return measured


def _run_here(time_it: Callable[[], Any]) -> Any:
    return time_it()


def search_measures(dense: nn.Module, latency: LatencySetting | None, *,
                    size_scale: float = 1.0,
                    timed: Callable[[Callable[[], Any]], Any] = _run_here
                    ) -> tuple[MeasureFn, LatenciesFn | None]:
    """The budget search's two measuring functions for `dense`: one model's figures (latency
    relative to the dense model's recorded figure, timed beside it; a candidate's size scaled
    by `size_scale`), and several candidates' latencies timed together (None without a latency
    setting). `timed` runs each timing (under torchrun: on one rank, shared with the others)."""
    def measure(model: nn.Module, quantities: tuple[str, ...],
                dense_figures: Mapping[str, float] | None) -> dict[str, float]:
        measured = figures(model, tuple(q for q in quantities if q != "latency"), None)
        if "latency" in quantities:
            reference = None
            if dense_figures is not None and "latency" in dense_figures:
                reference = (dense, float(dense_figures["latency"]))
            timing = timed(lambda: figures(model, ("latency",), latency, reference))
            measured["latency"] = float(timing["latency"])
        if "size" in measured and model is not dense:
            measured["size"] *= size_scale
        return {quantity: measured[quantity] for quantity in quantities}  # in the asked order

    def measure_latencies(models: list[nn.Module], dense_figures: Mapping[str, float]
                          ) -> list[float]:
        assert latency is not None
        reference = (dense, float(dense_figures["latency"]))
        timings = timed(lambda: relative_latencies(models, latency, reference))
        return [float(seconds) for seconds in timings]

    return measure, (measure_latencies if latency is not None else None)
