"""Activation statistics for post-training quantization, in Distiller's YAML format.

A stats file maps each module's qualified name to the statistics of its inputs and output:

    layer1.0.conv1:
      inputs:
        0: {min: .., max: .., avg_min: .., avg_max: .., mean: .., std: .., b: .., shape: (..)}
      output: {min: .., max: .., ...}

`avg_min` / `avg_max` average each sample's min / max, `std` is the population standard deviation
and `b` the mean absolute deviation (the Laplace scale ACIQ uses), both around the final mean, as
Distiller's QuantCalibrationStatsCollector computes them: so `collect_stats` makes two passes over
the batches (min, max, averages and mean; then std, b and the histogram), and `load_stats` reads
the files that Distiller's `--qe-calibration` wrote unchanged (`module.` prefixes are dropped from
names). `histogram` (ours, optional) counts the values in HISTOGRAM_BINS equal bins over
[min, max], for clip mode MSE; Distiller's files have none.

Names are the model's own qualified module names. Distiller's files also hold entries such as
`layer1.0.add` because its models make residual additions and concatenations explicit modules;
giving our models such modules (so their statistics are collected too) is future work on the
model side: this module records whatever leaf modules the model has.
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.fx
import yaml
from torch import Tensor, nn

from compressor.models.description import unwrap_model
from compressor.quantization.clipping import HISTOGRAM_BINS
from compressor.quantization.errors import QuantizationError, shown
from compressor.utils.atomic_io import atomic_write_text

__all__ = [
    "STATS_FILE_NAME", "STAT_KEYS", "ActivationStats", "load_stats", "parse_stats",
    "dump_stats", "save_stats", "tensor_stats", "collect_stats",
]

STATS_FILE_NAME = "acts_quantization_stats.yaml"  # Distiller's name, in the run directory
STAT_KEYS = ("min", "max", "avg_min", "avg_max", "mean", "std", "b")
# total_numel: written by later Distiller versions; histogram: ours, for clip mode MSE
_OPTIONAL_KEYS = ("shape", "total_numel", "histogram")
_LAYER_KEYS = ("inputs", "output")
_PREFIXES = ("module.", "_orig_mod.")

# {layer: {"inputs": {index: record}, "output": record}}, record: STAT_KEYS -> float (+ "shape")
ActivationStats = dict[str, dict[str, Any]]


class _Where:
    """Where an entry sits in a stats source, to name it in a one-line error."""

    def __init__(self, source: str, layer: str | None = None, tensor: str | None = None) -> None:
        self.source, self.layer, self.tensor = source, layer, tensor

    def fail(self, problem: str, fix: str = "fix the entry or collect the statistics again "
                                                "(--qe-calibration)") -> QuantizationError:
        """The error of this entry."""
        where = self.source
        if self.layer is not None:
            where += f": layer '{self.layer}'"
        if self.tensor is not None:
            where += f" {self.tensor}"
        return QuantizationError(f"{where}: {problem}; {fix}")


def _number(value: Any, key: str, where: _Where) -> float:
    """A finite real number of a stats record."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise where.fail(f"'{key}' is not a number ({shown(value)})")
    if not math.isfinite(value):
        raise where.fail(f"'{key}' is not finite ({shown(value)})")
    return float(value)


def _record(raw: Any, where: _Where) -> dict[str, Any]:
    """One validated record: the seven numbers in order, then `shape` when given."""
    if not isinstance(raw, Mapping):
        raise where.fail(f"expected a mapping of statistics, got {shown(raw)}")
    for key in raw:
        if key not in STAT_KEYS and key not in _OPTIONAL_KEYS:
            close = difflib.get_close_matches(str(key), [*STAT_KEYS, *_OPTIONAL_KEYS], n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise where.fail(f"unknown key {shown(key)}{hint}",
                             f"use only {', '.join(STAT_KEYS)} and shape")
    record: dict[str, Any] = {}
    for key in STAT_KEYS:
        if key not in raw:
            raise where.fail(f"missing '{key}'")
        record[key] = _number(raw[key], key, where)
    if record["min"] > record["max"]:
        raise where.fail(f"min {record['min']} is greater than max {record['max']}")
    for key in ("std", "b"):
        if record[key] < 0:
            raise where.fail(f"'{key}' is negative ({record[key]})")
    if "total_numel" in raw:
        _number(raw["total_numel"], "total_numel", where)
    if "histogram" in raw:
        record["histogram"] = _counts(raw["histogram"], where)
    if "shape" in raw:
        if not isinstance(raw["shape"], str):
            raise where.fail(f"'shape' is not a string like '(256, 64, 56, 56)' "
                             f"({shown(raw['shape'])})")
        record["shape"] = raw["shape"]
    return record


def _counts(raw: Any, where: _Where) -> list[int | float]:
    """A histogram: a non-empty list of non-negative counts."""
    if not isinstance(raw, (list, tuple)) or not raw:
        raise where.fail(f"'histogram' is not a list of counts ({shown(raw)})")
    counts = [_number(count, "histogram", where) for count in raw]
    if min(counts) < 0:
        raise where.fail("'histogram' has a negative count")
    return [int(c) if c.is_integer() else c for c in counts]


def _input_index(key: Any, where: _Where) -> int:
    """An input's position: an int, or a string of digits."""
    if isinstance(key, str) and key.isdigit():
        return int(key)
    if isinstance(key, int) and not isinstance(key, bool) and key >= 0:
        return key
    raise where.fail(f"input index {shown(key)} is not a non-negative integer")


def _layer_name(key: Any, where: _Where) -> str:
    """A layer's qualified name without DataParallel / torch.compile prefixes."""
    if not isinstance(key, str) or not key:
        raise where.fail(f"layer name {shown(key)} is not a module name")
    name = key
    while name.startswith(_PREFIXES):
        name = name.split(".", 1)[1]
    if not name:
        raise where.fail(f"layer name {shown(key)} names no module")
    return name


def parse_stats(data: Any, source: str = "activation statistics") -> ActivationStats:
    """Validate Distiller's statistics mapping and return a normalised copy."""
    top = _Where(source)
    if data is None:
        raise top.fail("holds no statistics")
    if not isinstance(data, Mapping):
        raise top.fail(f"expected a mapping of layer names to statistics, got {shown(data)}")
    stats: ActivationStats = {}
    for key, entry in data.items():
        name = _layer_name(key, top)
        where = _Where(source, name)
        if name in stats:
            raise where.fail("appears twice (with and without a 'module.' prefix)",
                             "keep one of the two entries")
        if not isinstance(entry, Mapping):
            raise where.fail(f"expected 'inputs' and 'output', got {shown(entry)}")
        for part in entry:
            if part not in _LAYER_KEYS:
                raise where.fail(f"unknown key {shown(part)}", "use only 'inputs' and 'output'")
        if "output" not in entry:
            raise where.fail("missing 'output'")
        inputs = entry.get("inputs") or {}
        if not isinstance(inputs, Mapping):
            raise where.fail(f"'inputs' is not a mapping of input index to statistics "
                             f"({shown(inputs)})")
        layer: dict[str, Any] = {"inputs": {}}
        for index, raw in inputs.items():
            position = _input_index(index, where)
            layer["inputs"][position] = _record(raw, _Where(source, name, f"inputs[{position}]"))
        layer["inputs"] = dict(sorted(layer["inputs"].items()))
        layer["output"] = _record(entry["output"], _Where(source, name, "output"))
        stats[name] = layer
    return stats


def load_stats(path: str | os.PathLike[str]) -> ActivationStats:
    """Read and validate a stats YAML file (Distiller's format, e.g. `--qe-stats-file`)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QuantizationError(f"activation statistics file {path} not found; give the path of a "
                                f"YAML file written by --qe-calibration ({STATS_FILE_NAME})"
                                ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise QuantizationError(f"cannot read activation statistics file {path} ({exc}); "
                                "check the path and its permissions") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise QuantizationError(f"{path}: not valid YAML ({problem}{at}); fix the file or "
                                "collect the statistics again (--qe-calibration)") from None
    return parse_stats(data, str(path))


def dump_stats(stats: Mapping[str, Any]) -> str:
    """The YAML text of `stats` in Distiller's layout (validated first)."""
    clean = parse_stats(stats)
    for layer in clean.values():
        if not layer["inputs"]:
            del layer["inputs"]  # Distiller leaves out the inputs of a module that has none
    return yaml.dump(clean, Dumper=_StatsDumper, sort_keys=False, default_flow_style=False)


class _StatsDumper(yaml.SafeDumper):
    """YAML's safe dumper writing lists (histograms) on one line."""


_StatsDumper.add_representer(list, lambda dumper, value: dumper.represent_sequence(
    "tag:yaml.org,2002:seq", value, flow_style=True))


def save_stats(stats: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write `stats` as Distiller's YAML, atomically."""
    atomic_write_text(path, dump_stats(stats))


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
                    for batch in batches:
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
