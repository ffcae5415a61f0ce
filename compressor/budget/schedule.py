"""The search's choice as a Distiller-format schedule: progressive filter pruning, then thinning.

Each group is one `L1RankedStructureParameterPruner_AGP` over its layers (`group_dependency:
Leader`, so coupled layers lose the same filters), rising on AGP's cubic schedule over the
first half of the fine-tune epochs to exactly the removed count; a `FilterRemover` thins the
model after the last pruning step's masks, so the remaining epochs train the thin model. The
same file reruns with `--compress` to the same per-layer channel counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import yaml

from compressor.budget.groups import ChannelGroup
from compressor.pruning.groups import count_to_prune

__all__ = ["pruning_epochs", "exact_fraction", "budget_schedule", "schedule_text"]


def pruning_epochs(epochs: int) -> int:
    """How many epochs prune progressively (the first half, at least one)."""
    return max(1, math.ceil(epochs / 2))


def exact_fraction(removed: int, total: int) -> float:
    """The shortest decimal fraction from which the pruners remove exactly `removed` of `total`."""
    for digits in range(2, 12):
        fraction = round(removed / total, digits)
        if fraction < 1.0 and count_to_prune(fraction, total) == removed:
            return fraction
    raise ValueError(f"no fraction removes {removed} of {total}")


def _pruner(group: ChannelGroup, fraction: float, steps: int) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "class": "L1RankedStructureParameterPruner_AGP",
        "initial_sparsity": min(fraction, round(fraction / steps, 6)),  # 6 digits may round up
        "final_sparsity": fraction,
        "group_type": "Filters",
        "weights": list(group.weights),
    }
    if len(group.weights) > 1:
        entry["group_dependency"] = "Leader"
    if group.blocks > 1:
        entry["channel_groups"] = group.blocks  # whole units, as the search chose them
    if group.norms:
        entry["norms"] = list(group.norms)  # batch norms the pruned channels pass through
    return entry


def budget_schedule(groups: Sequence[ChannelGroup], removed: Sequence[int], epochs: int
                    ) -> dict[str, Any]:
    """The schedule (a plain mapping) that prunes `removed[i]` filters of group i and thins."""
    steps = pruning_epochs(epochs)
    pruners: dict[str, Any] = {}
    policies: list[dict[str, Any]] = []
    for index, (group, count) in enumerate(zip(groups, removed, strict=True)):
        if count == 0:
            continue
        name = f"budget_{index}_{group.layer.replace('.', '_')}"
        pruners[name] = _pruner(group, exact_fraction(count, group.channels), steps)
        policies.append({"pruner": {"instance_name": name}, "starting_epoch": 0,
                         "ending_epoch": steps, "frequency": 1})
    schedule: dict[str, Any] = {"version": 1, "pruners": pruners}
    if pruners:
        schedule["extensions"] = {"budget_thinning": {
            "class": "FilterRemover", "thinning_func_str": "remove_filters"}}
        policies.append({"extension": {"instance_name": "budget_thinning"},
                         "epochs": [steps - 1]})
    schedule["policies"] = policies
    return schedule


def schedule_text(schedule: dict[str, Any], header: Sequence[str] = ()) -> str:
    """The schedule as YAML, after `header` comment lines."""
    comments = "".join(f"# {line}\n" for line in header)
    return comments + yaml.safe_dump(schedule, sort_keys=False, default_flow_style=False)
