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
           "budget_report", "unmet_line", "collapsed", "CHANCE_FACTOR", "LABEL_FREE_DATASETS"]

# A top-1 at or below this multiple of chance (100 / classes) is a collapsed model, never "met"
CHANCE_FACTOR = 1.5
# datasets whose labels carry no signal (for timing and smoke runs): no accuracy to guard
LABEL_FREE_DATASETS = ("synthetic",)
# a budget's name in tables and plots; its target and achieved columns are fractions of dense
_UNITS = {"macs": "MACs", "params": "parameters", "latency": "latency", "size": "size"}


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
    """A dense or final figure with its unit: counts (MACs, parameters) with separators, bytes
    and seconds named, never in scientific notation."""
    if quantity == "latency":
        return f"{significant(value * 1000)} ms"
    return f"{integer(value)} B" if quantity == "size" else integer(value)


def budget_table(report: Mapping[str, Any]) -> str:
    """The budgets and accuracies of a budget.json report as a GitHub-style table."""
    rows = [[_UNITS.get(r["quantity"], r["quantity"]),
             "minimized" if r["target"] is None else f"{r['target']:.3f}",
             f"{r['achieved']:.3f}", _figure(r["quantity"], r["dense"]),
             _figure(r["quantity"], r["final"]), "yes" if r["met"] else "NO"]
            for r in report["budgets"]]
    accuracy = report["accuracy"]
    floor = accuracy.get("max_drop")
    drops = accuracy.get("drops") or {"float": accuracy["drop"]}
    epoch = accuracy.get("model_epoch")
    shown_epoch = f", epoch {epoch}" if epoch is not None else ""
    for kind, drop in drops.items():
        final = accuracy.get(f"{kind}_val_top1", accuracy["final_val_top1"])
        met = "-" if floor is None else "yes" if drop <= floor else "NO"
        rows.append([f"val top-1 drop, {kind} (pts)", "-" if floor is None else f"{floor:.2f}",
                     f"{drop:.2f}", f"{accuracy['dense_val_top1']:.2f}", f"{final:.2f}", met])
    speed = report.get("speed")
    if speed:  # measured on the run's device whatever the budget: faster there, or not
        verdict = (f"{1 / speed['ratio']:.2f}x faster" if speed["faster"]
                   else "NOT faster here")
        rows.append([f"latency on {speed['device']}, batch {speed['batch']} (measured)",
                     "", f"{speed['ratio']:.3f}", _figure("latency", speed["dense_seconds"]),
                     _figure("latency", speed["final_seconds"]), verdict])
    model = accuracy.get("model", "float")
    rows.append([f"test top-1, {model}{shown_epoch} (%)", "", "",
                 f"{report['dense_test_top1']:.2f}", f"{report['final_test_top1']:.2f}",
                 "NO (chance)" if accuracy.get("collapsed") else ""])
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
        blocks = int(group.get("blocks", 1))  # a group's units are one channel per block
        rows.append({"layer": layer, "weights": group["weights"],
                     "channels_before": group["channels"] * blocks,
                     "removed_chosen": removed * blocks,
                     "channels_after": output_channels(model, layer)})
    return rows


def collapsed(top1: float, num_classes: int) -> bool:
    """Whether a top-1 (%) is at or below CHANCE_FACTOR times chance: a model that predicts
    (nearly) one class, never a budget "met"."""
    return num_classes > 1 and top1 <= CHANCE_FACTOR * 100.0 / num_classes


def _drop_met(drop: float, floor: float | None) -> bool | None:
    return None if floor is None else drop <= floor


def budget_report(state: Mapping[str, Any], model: nn.Module, final_figures: Mapping[str, float],
                  scores: Mapping[str, Any], arch: str, dataset: str,
                  fine_tune: Mapping[str, Any],
                  speed: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """budget.json of a budget run: its search state, final model and figures as plain data.

    `scores`: `val_top1` and `test_top1` of the float model after the fine-tune (its best
    epoch, `model_epoch`), `int8_val_top1` and `int8_test_top1` with --qe, and `num_classes`.
    The accuracy floor (max_drop) holds for the float model and again for the int8 one; the
    model handed over (int8 if there is one) must score above CHANCE_FACTOR x chance (not
    checked on LABEL_FREE_DATASETS, where every model is at chance)."""
    dense = state["dense_figures"]
    rows = budget_rows(state["targets"], dense, final_figures)
    if state.get("accuracy_drop") is not None:  # --target-accuracy-drop: minimized, no target
        rows = [{**row, "target": None, "met": True} for row in rows]
    dense_val = float(state["dense_val_top1"])
    floor = state.get("max_drop")
    quantized = scores.get("int8_val_top1") is not None
    final_val = float(scores["int8_val_top1"] if quantized else scores["val_top1"])
    final_test = float(scores["int8_test_top1"] if quantized else scores["test_top1"])
    drops = {"float": dense_val - float(scores["val_top1"])}
    if quantized:
        drops["int8"] = dense_val - float(scores["int8_val_top1"])
    floor_met = [_drop_met(drop, floor) for drop in drops.values()]
    accuracy = {"dense_val_top1": dense_val, "final_val_top1": final_val,
                "float_val_top1": float(scores["val_top1"]),
                "int8_val_top1": float(scores["int8_val_top1"]) if quantized else None,
                "drop": dense_val - final_val, "drops": drops, "max_drop": floor,
                "met": None if floor is None else all(floor_met),
                "model": "int8" if quantized else "float",
                "model_epoch": scores.get("model_epoch"),
                "chance_top1": 100.0 / max(int(scores["num_classes"]), 1),
                # random inputs and labels (--dataset synthetic) score at chance by design
                "collapsed": None if dataset in LABEL_FREE_DATASETS else collapsed(
                    min(final_val, final_test), int(scores["num_classes"]))}
    return {"arch": arch, "dataset": dataset, "budgets": rows, "accuracy": accuracy,
            "met": all(r["met"] for r in rows) and accuracy["met"] is not False
            and not accuracy["collapsed"],
            "dense_test_top1": float(state["dense_test_top1"]), "final_test_top1": final_test,
            "float_test_top1": float(scores["test_top1"]),
            "layers": _layers(state, model), "latency": state.get("latency"),
            "search": {"groups": len(state["groups"]), "evaluations": len(state["evaluations"]),
                       "seconds": float(state.get("search_seconds", 0.0)),
                       "met_before_fine_tune": bool(state.get("search_met")),
                       "channel_multiple": int(state.get("channel_multiple", 1)),
                       # the autocast and memory format candidates were scored and timed in
                       "precision": state.get("precision"),
                       "batch_norm_recalibration": state.get("recalibration")},
            "fine_tune": dict(fine_tune), "speed": dict(speed) if speed else None}


def unmet_line(report: Mapping[str, Any], run_dir: Path) -> str:
    """One line: which budgets were missed and by how much, and where the model is; for a
    model at chance, the likely cause and the fix."""
    accuracy = report["accuracy"]
    where = run_dir / "best.pth.tar"
    if accuracy.get("collapsed"):
        return (f"budget not met: the {accuracy['model']} model scores "
                f"{min(accuracy['final_val_top1'], report['final_test_top1']):.2f}% top-1, "
                f"at chance ({accuracy['chance_top1']:.2f}% for "
                f"{round(100 / accuracy['chance_top1'])} classes), likely because the targets "
                "remove more than the fine-tune recovers or the fine-tune diverged; raise the "
                "--target-* fractions, add --epochs or lower --lr, or bound the loss with "
                f"--target-accuracy-drop (the model is in {where})")
    missed = [f"{r['quantity']} at {r['achieved']:.3f} of dense, target {r['target']:.3f} "
              f"({r['achieved'] - r['target']:.3f} over)" for r in report["budgets"]
              if not r["met"] and r["target"] is not None]
    if accuracy["met"] is False:
        for kind, drop in accuracy.get("drops", {"float": accuracy["drop"]}).items():
            if drop > accuracy["max_drop"]:
                missed.append(f"{kind} validation top-1 dropped {drop:.2f} points, floor "
                              f"{accuracy['max_drop']:.2f}")
    return (f"budget not met: {'; '.join(missed)}; the best model found is saved in "
            f"{where}")
