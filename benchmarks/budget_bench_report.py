"""The budget benchmark's results: what one arm's run leaves, the per-budget summary over
seeds, its tables, and the targets checked (benchmarks/budget_fashion_mnist.py runs it)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tabulate import tabulate

__all__ = ["BUDGETS", "ARMS", "ArmResult", "budget_target", "mismatches", "summarize",
           "budget_table", "check_targets", "targets_table"]

# name -> (budgeted quantity, target fraction of the dense model's figure)
BUDGETS = (("macs-0.5", "macs", 0.5), ("macs-0.3", "macs", 0.3), ("latency-0.5", "latency", 0.5))
# "-kd" arms fine-tune with the same distillation as ours: the allocation is judged alone
ARMS = (("uniform", "uniform L1 filters"), ("tp", "Torch-Pruning global"),
        ("uniform-kd", "uniform L1 filters + KD"), ("tp-kd", "Torch-Pruning global + KD"),
        ("ours-nokd", "ours, no KD"), ("ours", "ours"))


@dataclass(frozen=True)
class ArmResult:
    """One arm's final model and how it got there (before the side-by-side measurement)."""

    seed: int
    budget: str
    arm: str
    model_path: str
    pickled: bool  # Torch-Pruning's weights (tp), rebuilt by replaying its steps, rather than
    # a compressor checkpoint
    search_s: float
    fine_tune_s: float
    own_ratio: float  # the budgeted figure over dense, as the arm measured it when choosing
    own_met: bool
    cli_test_top1: float | None  # the run's own test top-1 (results.json / in-process)
    detail: dict[str, Any]


def budget_target(name: str) -> tuple[str, float]:
    """(quantity, target) of a budget name."""
    return next((quantity, target) for key, quantity, target in BUDGETS if key == name)


def mismatches(results: Sequence[ArmResult], measured: Mapping[str, Mapping[str, float]]
               ) -> list[str]:
    """Runs whose rebuilt final model scores other than the run itself reported."""
    found = []
    for r in results:
        again = measured[f"seed{r.seed}/{r.budget}/{r.arm}"]["test_top1"]
        if r.cli_test_top1 is not None and abs(again - r.cli_test_top1) > 0.01:
            found.append(f"seed {r.seed} {r.budget} {r.arm}: the run reported test top-1 "
                         f"{r.cli_test_top1:.2f}, its saved model scores {again:.2f}")
    return found


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(results: Sequence[ArmResult], measured: Mapping[str, Mapping[str, float]]
              ) -> dict[str, dict[str, dict[str, Any]]]:
    """Budget -> arm -> per-seed figures and their means (ratios against the seed's dense)."""
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for r in results:
        quantity, target = budget_target(r.budget)
        final, base = measured[f"seed{r.seed}/{r.budget}/{r.arm}"], measured[f"seed{r.seed}/dense"]
        ratios = {"macs": final["macs"] / base["macs"],
                  "latency": final["latency_ms"] / base["latency_ms"]}
        seed_row = {"seed": r.seed, "top1": final["test_top1"],
                    "dense_top1": base["test_top1"], "macs_ratio": ratios["macs"],
                    "latency_ratio": ratios["latency"], "met": ratios[quantity] <= target,
                    "own_ratio": r.own_ratio, "own_met": r.own_met, "search_s": r.search_s,
                    "fine_tune_s": r.fine_tune_s, "total_s": r.search_s + r.fine_tune_s,
                    "run_test_top1": r.cli_test_top1}
        entry = summary.setdefault(r.budget, {}).setdefault(r.arm, {"seeds": []})
        entry["seeds"].append(seed_row)
    for arms in summary.values():
        for entry in arms.values():
            rows = entry["seeds"]
            top1, std = _mean_std([row["top1"] for row in rows])
            entry.update({
                "top1_mean": top1, "top1_std": std,
                "vs_dense": statistics.fmean(row["top1"] - row["dense_top1"] for row in rows),
                "macs_ratio": statistics.fmean(row["macs_ratio"] for row in rows),
                "latency_ratio": statistics.fmean(row["latency_ratio"] for row in rows),
                "met": sum(row["met"] for row in rows), "own_met": sum(row["own_met"]
                                                                      for row in rows),
                "runs": len(rows),
                **{key: statistics.fmean(row[key] for row in rows)
                   for key in ("search_s", "fine_tune_s", "total_s")}})
    return summary


def budget_table(budget: str, arms: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per arm of one budget: top-1, achieved ratios, budget met, wall time."""
    labels = dict(ARMS)
    rows = []
    for arm, _ in ARMS:
        if arm not in arms:
            continue
        e = arms[arm]
        rows.append([labels[arm], f"{e['top1_mean']:.2f} +- {e['top1_std']:.2f}",
                     "/".join(f"{row['top1']:.2f}" for row in e["seeds"]),
                     f"{e['vs_dense']:+.2f}", f"{e['macs_ratio']:.3f}",
                     f"{e['latency_ratio']:.3f}", f"{e['met']}/{e['runs']}",
                     f"{e['own_met']}/{e['runs']}", f"{e['search_s']:.1f}",
                     f"{e['fine_tune_s']:.1f}", f"{e['total_s']:.1f}"])
    quantity, target = budget_target(budget)
    headers = ["arm", "test top-1 %", "per seed", "vs dense", "MACs x", "latency x",
               "met", "met (own)", "search s", "fine-tune s", "total s"]
    title = f"budget {budget}: {quantity} <= {target} of dense"
    return title + "\n" + tabulate(rows, headers=headers, tablefmt="github",
                                   disable_numparse=True)


def check_targets(summary: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The targets, each with whether it holds (None where its runs are missing)."""
    ours = [row for arms in summary.values() for arm in ("ours", "ours-nokd")
            for row in arms.get(arm, {}).get("seeds", [])]
    targets = [{"target": "budget met in 100% of our runs (side-by-side figures)",
                "value": f"{sum(r['met'] for r in ours)}/{len(ours)}",
                "met": all(r["met"] for r in ours) if ours else None}]

    def pair(budget: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        arms = summary.get(budget, {})
        if "ours" not in arms or "tp" not in arms:
            return None
        return arms["ours"]["seeds"], arms["tp"]["seeds"]

    low = pair("macs-0.3")
    gains = [o["top1"] - t["top1"] for o, t in zip(*low, strict=True)] if low else []
    targets.append({"target": "macs 0.3: ours >= Torch-Pruning global + 0.3 pt on every seed",
                    "value": ", ".join(f"{g:+.2f}" for g in gains) or "not run",
                    "met": all(g >= 0.3 for g in gains) if low else None})
    high = pair("macs-0.5")
    gains = [o["top1"] - t["top1"] for o, t in zip(*high, strict=True)] if high else []
    targets.append({"target": "macs 0.5: ours no worse than Torch-Pruning global (mean)",
                    "value": (f"{statistics.fmean(gains):+.2f} (per seed "
                              f"{', '.join(f'{g:+.2f}' for g in gains)})") if gains else "not run",
                    "met": statistics.fmean(gains) >= 0.0 if gains else None})
    for budget in summary:  # the allocation alone: every arm distilled alike
        arms = summary[budget]
        peers = [arms[arm]["top1_mean"] for arm in ("uniform-kd", "tp-kd") if arm in arms]
        if "ours" in arms and peers:
            gain = arms["ours"]["top1_mean"] - max(peers)
            targets.append({"target": f"{budget}: ours >= max(uniform L1, Torch-Pruning global),"
                            " all distilled alike (mean top-1)", "value": f"{gain:+.2f}",
                            "met": gain >= 0.0})
    times = {b: summary[b]["ours"]["total_s"] / summary[b]["tp"]["total_s"]
             for b in summary if "ours" in summary[b] and "tp" in summary[b]}
    targets.append({"target": "search + fine-tune wall time of ours <= 2x Torch-Pruning's arm",
                    "value": ", ".join(f"{b} {v:.2f}x" for b, v in times.items()) or "not run",
                    "met": all(v <= 2.0 for v in times.values()) if times else None})
    return targets


def targets_table(targets: Sequence[Mapping[str, Any]]) -> str:
    """The targets: value and whether each is met ("-" where not run)."""
    rows = [[t["target"], t["value"], "-" if t["met"] is None else "yes" if t["met"] else "NO"]
            for t in targets]
    return tabulate(rows, headers=["target", "value", "met"], tablefmt="github",
                    disable_numparse=True)
