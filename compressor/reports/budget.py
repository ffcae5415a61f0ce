"""A budget run's evidence: budget.json, the table on stdout, and pareto.png."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate
from torch import nn

from compressor.reports.numbers import integer, significant
from compressor.utils.atomic_io import atomic_write, atomic_write_text

__all__ = ["budget_rows", "budget_table", "write_budget_json", "plot_pareto", "output_channels",
           "budget_report", "unmet_line"]

_UNITS = {"macs": "MACs", "params": "parameters", "latency": "latency (s)", "size": "bytes"}


def budget_rows(targets: Mapping[str, float], dense: Mapping[str, float],
                final: Mapping[str, float]) -> list[dict[str, Any]]:
    """One row per budget: target and achieved fractions, dense and final figures, met."""
    rows = []
    for quantity in sorted(targets):
        achieved = final[quantity] / dense[quantity]
        rows.append({"quantity": quantity, "target": targets[quantity], "achieved": achieved,
                     "dense": dense[quantity], "final": final[quantity],
                     "met": achieved <= targets[quantity]})
    return rows


def _figure(quantity: str, value: float) -> str:
    """A dense or final figure: counts (MACs, parameters, bytes) with separators, seconds with
    4 significant digits, never in scientific notation."""
    return significant(value) if quantity == "latency" else integer(value)


def budget_table(report: Mapping[str, Any]) -> str:
    """The budgets and accuracies of a budget.json report as a GitHub-style table."""
    rows = [[_UNITS.get(r["quantity"], r["quantity"]), f"{r['target']:.3f}",
             f"{r['achieved']:.3f}", _figure(r["quantity"], r["dense"]),
             _figure(r["quantity"], r["final"]), "yes" if r["met"] else "NO"]
            for r in report["budgets"]]
    accuracy = report["accuracy"]
    floor = accuracy.get("max_drop")
    rows.append(["val top-1 drop (pts)", "-" if floor is None else f"{floor:.2f}",
                 f"{accuracy['drop']:.2f}", f"{accuracy['dense_val_top1']:.2f}",
                 f"{accuracy['final_val_top1']:.2f}",
                 "-" if accuracy["met"] is None else "yes" if accuracy["met"] else "NO"])
    rows.append(["test top-1 (%)", "", "", f"{report['dense_test_top1']:.2f}",
                 f"{report['final_test_top1']:.2f}", ""])
    return tabulate(rows, headers=["budget", "target", "achieved", "dense", "final", "met"],
                    tablefmt="github", disable_numparse=True,
                    colalign=("left", "right", "right", "right", "right", "left"))


def write_budget_json(path: str | os.PathLike[str], report: Mapping[str, Any]) -> None:
    """Write the report as indented JSON (atomically)."""
    atomic_write_text(path, json.dumps(report, indent=2, sort_keys=False) + "\n")


def plot_pareto(evaluations: Sequence[Mapping[str, Any]], targets: Mapping[str, float],
                chosen: Sequence[int], path: str | os.PathLike[str]) -> None:
    """Validation top-1 against each budgeted fraction, for every candidate the search
    evaluated (the chosen one marked, the target as a vertical line)."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed

    quantities = sorted(targets)
    figure = Figure(figsize=(5 * len(quantities), 4))
    for column, quantity in enumerate(quantities):
        axes = figure.add_subplot(1, len(quantities), column + 1)
        points = [(e["ratios"][quantity], e["top1"], e["phase"]) for e in evaluations
                  if quantity in e.get("ratios", {})]
        for phase, marker in (("dense", "s"), ("probe", "x"), ("search", "o"),
                              ("rounded", "^"), ("confirm", "d")):
            shown = [(x, y) for x, y, p in points if p == phase]
            if shown:
                axes.scatter(*zip(*shown, strict=True), marker=marker, label=phase, s=18)
        picked = [(e["ratios"][quantity], e["top1"]) for e in evaluations
                  if list(e["removed"]) == list(chosen) and quantity in e.get("ratios", {})]
        if picked:
            axes.scatter(*zip(*picked, strict=True), marker="*", s=160, color="red",
                         label="chosen")
        axes.axvline(targets[quantity], color="gray", linestyle="--", label="target")
        axes.set_xlabel(f"{_UNITS.get(quantity, quantity)} / dense")
        axes.set_ylabel("validation top-1 (%), before fine-tuning")
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=7)
    figure.suptitle("Budget search: every candidate evaluated")
    atomic_write(path, lambda handle: figure.savefig(handle, format="png", dpi=100,
                                                     bbox_inches="tight"))


def output_channels(model: nn.Module, layer: str) -> int:
    """The number of filters (output features) of `layer` in `model`."""
    module = model.get_submodule(layer)
    return int(getattr(module, "out_channels", getattr(module, "out_features", 0)))


def _layers(state: Mapping[str, Any], model: nn.Module) -> list[dict[str, Any]]:
    """Per group: its layers, channels before, chosen to remove, and after (on the model)."""
    rows = []
    for group, removed in zip(state["groups"], state["chosen"], strict=True):
        layer = group["weights"][0].rsplit(".", 1)[0]
        rows.append({"layer": layer, "weights": group["weights"],
                     "channels_before": group["channels"], "removed_chosen": removed,
                     "channels_after": output_channels(model, layer)})
    return rows


def budget_report(state: Mapping[str, Any], model: nn.Module, final_figures: Mapping[str, float],
                  final_val_top1: float, test_top1: float, arch: str, dataset: str,
                  fine_tune: Mapping[str, Any]) -> dict[str, Any]:
    """budget.json of a budget run: its search state, final model and figures as plain data."""
    dense = state["dense_figures"]
    rows = budget_rows(state["targets"], dense, final_figures)
    drop = float(state["dense_val_top1"]) - final_val_top1
    floor = state.get("max_drop")
    accuracy = {"dense_val_top1": float(state["dense_val_top1"]),
                "final_val_top1": final_val_top1, "drop": drop, "max_drop": floor,
                "met": None if floor is None else drop <= floor}
    return {"arch": arch, "dataset": dataset, "budgets": rows, "accuracy": accuracy,
            "met": all(r["met"] for r in rows) and accuracy["met"] is not False,
            "dense_test_top1": float(state["dense_test_top1"]), "final_test_top1": test_top1,
            "layers": _layers(state, model), "latency": state.get("latency"),
            "search": {"groups": len(state["groups"]), "evaluations": len(state["evaluations"]),
                       "seconds": float(state.get("search_seconds", 0.0)),
                       "met_before_fine_tune": bool(state.get("search_met"))},
            "fine_tune": dict(fine_tune)}


def unmet_line(report: Mapping[str, Any], run_dir: Path) -> str:
    """One line: which budgets were missed and by how much, and where the model is."""
    missed = [f"{r['quantity']} at {r['achieved']:.3f} of dense, target {r['target']:.3f} "
              f"({r['achieved'] - r['target']:.3f} over)" for r in report["budgets"]
              if not r["met"]]
    accuracy = report["accuracy"]
    if accuracy["met"] is False:
        missed.append(f"validation top-1 dropped {accuracy['drop']:.2f} points, floor "
                      f"{accuracy['max_drop']:.2f}")
    return (f"budget not met: {'; '.join(missed)}; the best model found is saved in "
            f"{run_dir / 'checkpoint.pth.tar'}")
