"""Pruning sensitivity analysis (`--sense`): accuracy as each layer alone is pruned harder.

For every convolution/linear weight and every sparsity level, the layer is pruned (element
magnitude, or L1-ranked filters/channels), the model is evaluated, and the weight restored.
The pruning is the pruners' own (compressor.pruning.groups): a level of 0.5 zeroes exactly what
SparsityLevelParameterPruner / L1RankedStructureParameterPruner zero at 0.5, as in Distiller.
Results go to `sensitivity.csv` and a `sensitivity.png` plot, as Distiller's did.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from compressor.models.names import canonical_name
from compressor.pruning.groups import (
    element_mask,
    expand_group_mask,
    group_mask_from_scores,
    group_norms,
)
from compressor.reports.metrics import weight_tensors
from compressor.utils.atomic_io import atomic_write, atomic_write_text
from compressor.utils.errors import UsageError

__all__ = ["SENSITIVITY_KINDS", "prune_tensor", "sensitivity_levels", "run_sensitivity",
           "write_sensitivity_csv", "plot_sensitivity"]

SENSITIVITY_KINDS = ("element", "filter", "channel")
_GROUP_TYPES = {"filter": "Filters", "channel": "Channels"}
EvaluateFn = Callable[[nn.Module], dict[str, float]]


def sensitivity_levels(start: float = 0.0, end: float = 0.95, step: float = 0.1) -> list[float]:
    """Distiller's `--sense-range START END STEP` (end excluded), as rounded floats."""
    if step <= 0 or not 0.0 <= start < 1.0 or end > 1.0:
        raise UsageError("--sense-range needs 0 <= START < END <= 1 and STEP > 0, "
                         "e.g. --sense-range 0 0.9 0.1")
    count = max(1, math.ceil((end - start) / step - 1e-9))
    return [round(start + i * step, 6) for i in range(count)]


def prune_tensor(weight: Tensor, kind: str, level: float) -> Tensor:
    """A copy of `weight` with the smallest `level` fraction of elements/filters/channels zeroed.

    Elements rank by magnitude, filters and channels by their L1 norm, exactly as the pruners
    rank them (same rounding of the count, same ties).
    """
    _check_kind(kind)
    weight = weight.detach()
    if kind == "element":
        return weight * element_mask(weight, level)
    group_type = _GROUP_TYPES[kind]
    keep = group_mask_from_scores(group_norms(weight, group_type, p=1), level)
    return weight * expand_group_mask(keep, weight, group_type)


def _check_kind(kind: str) -> None:
    if kind not in SENSITIVITY_KINDS:
        raise UsageError(f"unknown sensitivity '{kind}'; use one of: "
                         f"{', '.join(SENSITIVITY_KINDS)}")


def _targets(model: nn.Module, kind: str) -> list[tuple[str, nn.Module]]:
    targets = []
    for name, module, weight in weight_tensors(model):
        if kind == "element" or (weight.dim() == 4 and getattr(module, "groups", 1) == 1):
            targets.append((name, module))  # filter/channel ranking only for plain convs
    return targets


def run_sensitivity(model: nn.Module, evaluate_fn: EvaluateFn, kind: str,
                    levels: Sequence[float], out_dir: str | os.PathLike | None,
                    names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Evaluate the model with each weight pruned alone at each level; write CSV and PNG."""
    _check_kind(kind)
    targets = _targets(model, kind)
    if names is not None:  # as written, or without Distiller's `module.` parts anywhere
        wanted = set(names) | {canonical_name(n) for n in names}
        targets = [(n, m) for n, m in targets if n in wanted]
        if not targets:
            raise UsageError("none of the sensitivity parameter names matches the model's "
                             "weights; see --summary modules for the names")
    rows: list[dict[str, Any]] = []
    for name, module in targets:
        original = module.weight.detach().clone()
        try:
            for level in levels:
                with torch.no_grad():
                    module.weight.copy_(prune_tensor(original, kind, float(level)))
                metrics = evaluate_fn(model)
                row = {"parameter": name, "sparsity": float(level),
                       "top1": float(metrics["top1"])}
                if "top5" in metrics:  # only with more than 5 classes
                    row["top5"] = float(metrics["top5"])
                rows.append({**row, "loss": float(metrics["loss"])})
        finally:
            with torch.no_grad():
                module.weight.copy_(original)
    if out_dir is None:  # not the writing rank
        return rows
    os.makedirs(out_dir, exist_ok=True)
    write_sensitivity_csv(rows, os.path.join(out_dir, "sensitivity.csv"))
    plot_sensitivity(rows, os.path.join(out_dir, "sensitivity.png"), kind)
    return rows


def write_sensitivity_csv(rows: list[dict[str, Any]], path: str | os.PathLike) -> None:
    """One row per (parameter, sparsity): top1, top5, loss (Distiller's column order; no top5
    where the evaluation had none: a model of 5 classes or fewer)."""
    text = io.StringIO(newline="")
    columns = ["top1", "top5", "loss"] if not rows or "top5" in rows[0] else ["top1", "loss"]
    writer = csv.DictWriter(text, fieldnames=["parameter", "sparsity", *columns])
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, text.getvalue())


def plot_sensitivity(rows: list[dict[str, Any]], path: str | os.PathLike, kind: str) -> None:
    """Top-1 against sparsity, one line per parameter (matplotlib, Agg backend)."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed

    figure = Figure(figsize=(10, 6))
    axes = figure.add_subplot()
    for name in dict.fromkeys(row["parameter"] for row in rows):
        points = [(r["sparsity"], r["top1"]) for r in rows if r["parameter"] == name]
        axes.plot(*zip(*points, strict=True), marker="o", markersize=3, label=name)
    axes.set_xlabel(f"{kind} sparsity")
    axes.set_ylabel("top-1 (%)")
    axes.set_title(f"Pruning sensitivity ({kind})")
    axes.grid(True, alpha=0.3)
    if rows:
        axes.legend(fontsize=6, ncol=2, loc="lower left")
    atomic_write(path, lambda handle: figure.savefig(handle, format="png", dpi=100,
                                                     bbox_inches="tight"))
