"""Activation statistics for post-training quantization, collected as Distiller collects them
(stats_file.py reads and writes them in its YAML format).

`avg_min` / `avg_max` average each sample's min / max, `std` is the population standard deviation
and `b` the mean absolute deviation (the Laplace scale ACIQ uses), both around the final mean, as
Distiller's QuantCalibrationStatsCollector computes them: so `collect_stats` makes two passes over
the batches (min, max, averages and mean; then std, b and, where asked, the histogram over
[min, max] that clip mode MSE reads). Names are the model's own qualified module names; a traced
graph's functional adds, multiplies and concatenations are named modules too (graph.py).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.fx
from torch import Tensor, nn

from compressor.models.description import unwrap_model
from compressor.quantization.core.clipping import HISTOGRAM_BINS
from compressor.quantization.core.errors import QuantizationError
from compressor.quantization.statistics.stats_file import ActivationStats
from compressor.utils.progress import heartbeat

__all__ = ["tensor_stats", "collect_stats"]


def _shape_text(tensor: Tensor) -> str:
    """Distiller's size2str: '(256, 64, 56, 56)'."""
    return "(" + ", ".join(str(size) for size in tensor.shape) + ")"


class _Running:
    """Running statistics of one tensor slot (an input or the output of one module)."""

    def __init__(self, histogram: bool = True) -> None:
        self.histogram = histogram  # count values in bins over [min, max] in pass two
        self.low: Tensor | None = None
        self.high: Tensor | None = None
        self.sums = [torch.zeros((), dtype=torch.float64) for _ in range(5)]
        # sum of per-sample mins, of maxes, of values, of squared and of absolute deviations
        self.units = 0  # samples seen (per-sample min/max)
        self.numel = 0
        self.numel_second = 0
        self.mean: Tensor | None = None  # after the first pass
        self.bounds: tuple[float, float] | None = None  # (min, max) after the first pass
        self.counts: Tensor | None = None  # the histogram over bounds, in float64
        self.shape = ""

    def first(self, tensor: Tensor, memo: _Memo | None = None) -> None:
        """Pass one: min, max, per-sample min/max sums, value sum."""
        part = memo.get(tensor, None, _first_part) if memo is not None else _first_part(tensor)
        if part is None:
            return
        low, high, mins_sum, maxes_sum, value_sum, units, numel = part
        self.low = low if self.low is None else torch.minimum(self.low, low)
        self.high = high if self.high is None else torch.maximum(self.high, high)
        self._add(0, mins_sum)
        self._add(1, maxes_sum)
        self._add(2, value_sum)
        self.units += units
        self.numel += numel
        self.shape = self.shape or _shape_text(tensor)

    def end_first(self) -> None:
        """Fix the mean that the second pass measures deviations from."""
        if self.numel:
            self.mean = self.sums[2] / self.numel
        if self.low is not None and self.high is not None:
            self.bounds = (float(self.low), float(self.high))

    def second(self, tensor: Tensor, memo: _Memo | None = None) -> None:
        """Pass two: squared and absolute deviations from the mean."""
        mean, bounds = self.mean, self.bounds
        if mean is None or bounds is None:
            return
        if memo is not None and tensor.device.type == "cpu":  # keyed by the mean: no host sync
            part = memo.get(tensor, (float(mean), bounds, self.histogram),
                            lambda x: _second_part(x, mean, bounds, self.histogram))
        else:
            part = _second_part(tensor, mean, bounds, self.histogram)
        if part is None:
            return
        absolute, squared, counts, numel = part
        self._add(4, absolute)
        self._add(3, squared)
        if counts is not None:
            self.counts = counts if self.counts is None else self.counts + counts.to(self.counts)
        self.numel_second += numel

    def _add(self, slot: int, value: Tensor) -> None:
        """Accumulate on the tensor's device (no host sync per batch)."""
        self.sums[slot] = self.sums[slot].to(value.device) + value

    def result(self) -> dict[str, Any] | None:
        """The record in Distiller's key order, or None if nothing was seen."""
        if self.low is None or self.high is None or not self.numel:
            return None
        second = max(self.numel_second, 1)
        return {
            "min": float(self.low), "max": float(self.high),
            "avg_min": float(self.sums[0]) / self.units,
            "avg_max": float(self.sums[1]) / self.units,
            "mean": float(self.sums[2]) / self.numel,
            "std": math.sqrt(float(self.sums[3]) / second), "b": float(self.sums[4]) / second,
            "shape": self.shape,
            **({} if self.counts is None else
               {"histogram": [int(c) for c in self.counts.round().tolist()]}),
        }


def _first_part(tensor: Tensor) -> tuple[Any, ...] | None:
    """Pass one's figures of one tensor: min, max, sums of per-sample mins and maxes, sum of
    values, samples, values (None if empty)."""
    act = _rows(tensor)
    if act.numel() == 0:
        return None
    # one value per sample: per-batch min / max instead (as Distiller)
    dim = 0 if act.shape[1] == 1 else 1
    mins, maxes = torch.aminmax(act, dim=dim)
    return (mins.min(), maxes.max(), mins.sum(dtype=torch.float64),
            maxes.sum(dtype=torch.float64), _row_sums(act), mins.numel(), act.numel())


def _second_part(tensor: Tensor, mean: Tensor, bounds: tuple[float, float], histogram: bool
                 ) -> tuple[Tensor, Tensor, Tensor | None, int] | None:
    """Pass two's figures of one tensor: sums of absolute and squared deviations from `mean`,
    its histogram over `bounds` (when asked), values (None if empty)."""
    act = _rows(tensor)
    if act.numel() == 0:
        return None
    deviation = act - mean.to(device=act.device, dtype=act.dtype)
    # per row without temporaries (at least float32), then the rows in float64
    dtype = _row_dtype(deviation)
    absolute = torch.linalg.vector_norm(deviation, 1, dim=1, dtype=dtype).sum(dtype=torch.float64)
    squared = torch.linalg.vector_norm(deviation, 2, dim=1, dtype=dtype).square().sum(
        dtype=torch.float64)
    return absolute, squared, _histogram(act, bounds) if histogram else None, act.numel()


def _histogram(rows: Tensor, bounds: tuple[float, float]) -> Tensor:
    """The counts of `rows` in HISTOGRAM_BINS equal bins over `bounds`, in float64 (histc counts
    in the input's float dtype: a few rows at a time, so every count stays exact in float32)."""
    counts = torch.zeros(HISTOGRAM_BINS, dtype=torch.float64, device=rows.device)
    chunk = max(1, 2 ** 24 // max(rows.shape[1], 1))
    for start in range(0, rows.shape[0], chunk):
        part = rows[start:start + chunk]
        part = part if part.dtype in (torch.float32, torch.float64) else part.float()
        counts += torch.histc(part, HISTOGRAM_BINS, *bounds).to(torch.float64)
    return counts


class _Memo:
    """The figures last computed from a few tensors, by tensor (identity and version: an in-place
    module makes a new version) and key. A module's input is mostly the output the module before
    it just measured: measured once, not twice. Holds weak references only, so no activation
    lives longer than the forward pass keeps it."""

    SIZE = 8

    def __init__(self) -> None:
        self._entries: dict[tuple[int, int, Any], tuple[weakref.ref[Tensor], Any]] = {}

    def get(self, tensor: Tensor, key: Any, compute: Callable[[Tensor], Any]) -> Any:
        """compute(tensor), or what it gave for this very tensor and key."""
        entry_key = (id(tensor), tensor._version, key)
        entry = self._entries.get(entry_key)
        if entry is not None and entry[0]() is tensor:
            return entry[1]
        value = compute(tensor)
        if len(self._entries) >= self.SIZE:
            self._entries.pop(next(iter(self._entries)))
        self._entries[entry_key] = (weakref.ref(tensor), value)
        return value


def _row_dtype(rows: Tensor) -> torch.dtype:
    """The dtype a row is summed in: its own, at least float32 (a float64 model stays float64)."""
    return torch.promote_types(rows.dtype, torch.float32)


def _row_sums(rows: Tensor) -> Tensor:
    """The sum of a (samples, values) tensor: each row summed vectorized in `_row_dtype`
    (torch's cascade summation keeps float32 accurate), the rows' sums added in float64."""
    return rows.sum(dim=1, dtype=_row_dtype(rows)).sum(dtype=torch.float64)


def _rows(tensor: Tensor) -> Tensor:
    """The tensor as (samples, values per sample), in a floating dtype."""
    x = tensor.detach()
    if not x.is_floating_point():
        x = x.to(torch.float32)
    return x.reshape(x.shape[0], -1) if x.dim() > 0 else x.reshape(1, 1)


def tensor_stats(tensor: Tensor, histogram: bool = True) -> dict[str, Any]:
    """The statistics record of one tensor (a batch whose dim 0 indexes samples)."""
    running = _Running(histogram)
    running.first(tensor)
    running.end_first()
    running.second(tensor)
    record = running.result()
    if record is None:
        raise QuantizationError("cannot compute statistics of an empty tensor; give a non-empty "
                                "batch")
    return record


class _Slots:
    """The running statistics of one module's inputs (by position) and output."""

    def __init__(self, histogram: bool) -> None:
        self.histogram = histogram
        self.inputs: dict[int, _Running] = {}
        self.output = _Running(histogram)

    def all(self) -> list[_Running]:
        """Every slot."""
        return [*self.inputs.values(), self.output]

    def result(self) -> dict[str, Any] | None:
        """{'inputs': ..., 'output': ...}, or None if the module never produced a tensor."""
        output = self.output.result()
        if output is None:
            return None
        inputs = {i: r for i, r in ((i, s.result()) for i, s in sorted(self.inputs.items()))
                  if r is not None}
        return {"inputs": inputs, "output": output}


def _default_forward(model: nn.Module, batch: Any) -> None:
    """Run `model` on a batch: a tensor, or the first item of an (inputs, targets) pair."""
    inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
    device = next((p.device for p in model.parameters()), None)
    if device is not None and isinstance(inputs, Tensor):
        inputs = inputs.to(device)
    model(inputs)


def collect_stats(model: nn.Module, batches: Iterable[Any],
                  module_types: tuple[type[nn.Module], ...] | None = None,
                  forward: Callable[[nn.Module, Any], Any] | None = None,
                  histograms: bool = True) -> ActivationStats:
    """Collect Distiller's activation statistics of every leaf module (of a traced model: every
    module its graph calls) over `batches`, in eval mode.

    `batches` is iterated twice (a list or a DataLoader, not a one-shot iterator): pass one
    measures min, max, avg_min, avg_max and mean, pass two std and b around that mean. Inputs are
    measured before the module runs, so in-place modules (ReLU(inplace=True)) do not overwrite
    them; a module called several times per forward (a shared ReLU) gathers all its calls in one
    entry, as in Distiller. `module_types` restricts the modules (Distiller's `classes`);
    `forward(model, batch)` runs one batch (default: `model(batch)` or `model(batch[0])`, moved to
    the model's device). Modules whose output is not a tensor are left out. `histograms`: count
    each tensor's values in HISTOGRAM_BINS bins in pass two (clip mode MSE reads them; false
    saves that pass's largest cost where no layer clips by histogram).
    """
    if iter(batches) is batches:
        raise QuantizationError("statistics collection reads the batches twice (as Distiller); "
                                "pass a list or a DataLoader, not a one-shot iterator")
    target = unwrap_model(model)
    # a traced model's: the modules its graph calls (a padding conv with a child among them)
    called = ({str(node.target) for node in target.graph.nodes if node.op == "call_module"}
              if isinstance(target, torch.fx.GraphModule) else None)
    modules = [(name, module) for name, module in target.named_modules()
               if name and (name in called if called is not None
                            else not any(True for _ in module.children()))
               and not isinstance(module, nn.Identity)
               and (module_types is None or isinstance(module, module_types))]
    if not modules:
        raise QuantizationError("the model has no leaf modules to collect statistics on; "
                                "check module_types")
    slots = {name: _Slots(histograms) for name, _ in modules}
    run = forward or _default_forward
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        for second in (False, True):
            handles, memo = [], _Memo()
            for name, module in modules:
                handles += _hooks(module, slots[name], second, memo)
            try:
                with torch.no_grad():
                    count = 0
                    for batch in heartbeat(batches, "quantization statistics, pass "
                                           f"{2 if second else 1} of 2"):
                        run(model, batch)
                        count += 1
            finally:
                for handle in handles:
                    handle.remove()
            if not count:
                raise QuantizationError("no batches to collect statistics on; give a non-empty "
                                        "calibration set")
            if not second:
                for slot in slots.values():
                    for running in slot.all():
                        running.end_first()
    finally:
        for module, training in modes:
            module.train(training)
    results = ((name, slots[name].result()) for name, _ in modules)
    return {name: result for name, result in results if result is not None}


def _hooks(module: nn.Module, slots: _Slots, second: bool, memo: _Memo) -> list[Any]:
    """A pre-hook measuring the inputs and a hook measuring the output of `module`."""
    def measure(running: _Running, tensor: Tensor) -> None:
        if second:
            running.second(tensor, memo)
        else:
            running.first(tensor, memo)

    def before(_: nn.Module, args: tuple[Any, ...]) -> None:
        for index, value in enumerate(args):
            if isinstance(value, Tensor):
                measure(slots.inputs.setdefault(index, _Running(slots.histogram)), value)

    def after(_: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if isinstance(output, Tensor):
            measure(slots.output, output)

    return [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
