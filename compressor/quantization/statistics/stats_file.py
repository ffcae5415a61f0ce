"""Activation statistics files in Distiller's YAML format: parse, validate, load and save.

A stats file maps each module's qualified name to the statistics of its inputs and output:

    layer1.0.conv1:
      inputs:
        0: {min: .., max: .., avg_min: .., avg_max: .., mean: .., std: .., b: .., shape: (..)}
      output: {min: .., max: .., ...}

`load_stats` reads the files that Distiller's `--qe-calibration` wrote unchanged (`module.`
prefixes are dropped from names); `histogram` (ours, optional) counts the values in
HISTOGRAM_BINS equal bins over [min, max], for clip mode MSE; Distiller's files have none.
stats.py collects the statistics these files hold.
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from compressor.quantization.core.errors import QuantizationError, shown
from compressor.utils.atomic_io import atomic_write_text

__all__ = ["STATS_FILE_NAME", "STAT_KEYS", "ActivationStats", "load_stats", "parse_stats",
           "dump_stats", "save_stats"]

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
