"""The peers' pruning in the budget benchmark (benchmarks/budget_fashion_mnist.py): one uniform
L1 filter fraction for every group, and Torch-Pruning's global pruning stepped to a MACs target or
bisected to a latency one. The script fine-tunes and measures what these choose."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from compressor.budget.groups import (
    ChannelGroup,
    batchnorms_of,
    leader_ranking,
    prunable_groups,
)
from compressor.budget.measure import LatencySetting, figures
from compressor.budget.search import build_candidate
from compressor.pruning.groups import count_to_prune
from compressor.thinning.transform import probe_batch

MIN_KEEP = 0.1  # uniform and tp keep at least this fraction of a group (ours: Budget.min_keep)
TP_STEPS = 200  # Torch-Pruning's iterative steps, to TP_RATIO of all channels
TP_RATIO = 0.95
LATENCY = LatencySetting(batch=32, threads=1)
GALLOP = 0.8  # tp latency: MACs target shrinks by this factor until the latency holds


def measure_one(model: nn.Module, quantity: str) -> float:
    """The budgeted figure of `model`, as the budget search measures it."""
    return figures(model, (quantity,), LATENCY if quantity == "latency" else None)[quantity]


def uniform_counts(groups: Sequence[ChannelGroup], fraction: float) -> tuple[int, ...]:
    """Channels each group loses at one uniform fraction (keeping MIN_KEEP of each)."""
    return tuple(min(count_to_prune(fraction, g.channels),
                     g.channels - math.ceil(MIN_KEEP * g.channels)) for g in groups)


def uniform_fractions(groups: Sequence[ChannelGroup]) -> list[float]:
    """Every fraction at which some group's count changes, ascending (0 first)."""
    found = {k / g.channels for g in groups
             for k in range(g.channels - math.ceil(MIN_KEEP * g.channels) + 1)}
    return sorted(found)


def bisect_first(count: int, passes: Callable[[int], bool]) -> tuple[int, bool]:
    """The lowest index in 1..count-1 that passes (index 0 is known to fail), assuming
    monotony; (count - 1, False) when even the last fails."""
    low, high = 0, count - 1
    if not passes(high):
        return high, False
    while high - low > 1:
        middle = (low + high) // 2
        if passes(middle):
            high = middle
        else:
            low = middle
    return high, True


def uniform_fraction(dense: nn.Module, quantity: str, target: float
                     ) -> tuple[list[ChannelGroup], tuple[int, ...], dict[str, Any]]:
    """The smallest uniform filter fraction whose thinned model meets the budget."""
    inputs = probe_batch(dense)
    groups = prunable_groups(dense, inputs)
    rankings = [leader_ranking(dense, g) for g in groups]
    batchnorms = batchnorms_of(dense, groups)
    fractions = uniform_fractions(groups)
    base = measure_one(dense, quantity)
    ratios: dict[int, float] = {}

    def passes(index: int) -> bool:
        model = build_candidate(dense, tuple(groups), uniform_counts(groups, fractions[index]),
                                rankings, batchnorms, inputs)
        ratios[index] = measure_one(model, quantity) / base
        return ratios[index] <= target

    index, met = bisect_first(len(fractions), passes)
    return groups, uniform_counts(groups, fractions[index]), {
        "fraction": fractions[index], "ratio": ratios[index], "met": met,
        "evaluations": len(ratios)}


def classifier_of(model: nn.Module) -> nn.Module:
    """The model's last linear layer: its classifier, whose outputs Torch-Pruning must keep."""
    linear = [module for module in model.modules() if isinstance(module, nn.Linear)]
    if not linear:
        raise ValueError(f"{type(model).__name__} has no linear classifier")
    return linear[-1]


class TorchPruningWalk:
    """Torch-Pruning's global L1 pruning of a copy of the dense model, stepped on demand; the
    model after every step is kept, so a bisection over steps re-prunes nothing."""

    def __init__(self, dense: nn.Module) -> None:
        import torch_pruning as tp

        model = copy.deepcopy(dense).eval()
        self.inputs = probe_batch(model)[:1]
        self.pruner = tp.pruner.MetaPruner(
            model, self.inputs, importance=tp.importance.MagnitudeImportance(p=1),
            global_pruning=True, pruning_ratio=TP_RATIO, max_pruning_ratio=1.0 - MIN_KEEP,
            iterative_steps=TP_STEPS, ignored_layers=[classifier_of(model)])
        self.model = model
        self.dense_macs = measure_one(dense, "macs")
        self.snapshots = [copy.deepcopy(model)]
        self.macs = [self.dense_macs]

    def first_at_most(self, ratio: float) -> int:
        """The first step whose MACs are within `ratio` of dense (the last step if none)."""
        while self.macs[-1] > ratio * self.dense_macs and len(self.snapshots) <= TP_STEPS:
            self._step()
        return next((k for k, m in enumerate(self.macs) if m <= ratio * self.dense_macs),
                    len(self.macs) - 1)

    def model_at(self, step: int) -> nn.Module:
        """The model after `step` steps (taking the steps not yet taken)."""
        while len(self.snapshots) <= step:
            self._step()
        return self.snapshots[step]

    def _step(self) -> None:
        self.pruner.step()
        self.snapshots.append(copy.deepcopy(self.model))
        self.macs.append(measure_one(self.model, "macs"))

    def exhausted(self) -> bool:
        """Whether every step has been taken."""
        return len(self.snapshots) > TP_STEPS


def tp_prune(dense: nn.Module, quantity: str, target: float) -> tuple[nn.Module, dict[str, Any]]:
    """Torch-Pruning global pruning to the budget: MACs stepped, latency bisected over steps."""
    import torch_pruning as tp

    walk = TorchPruningWalk(dense)
    if quantity == "macs":
        step = walk.first_at_most(target)
        ratio = walk.macs[step] / walk.dense_macs
        met, timed = ratio <= target, 0
    else:
        base = measure_one(dense, "latency")
        latency: dict[int, float] = {}

        def ratio_at(step: int) -> float:
            if step not in latency:
                latency[step] = measure_one(walk.snapshots[step], "latency") / base
            return latency[step]

        goal, failing = target, 0
        step = walk.first_at_most(goal)
        while ratio_at(step) > target and not (walk.exhausted() and step == len(walk.macs) - 1):
            failing, goal = step, goal * GALLOP
            step = walk.first_at_most(goal)
        passing = step
        if ratio_at(passing) <= target:  # bisect between the last failing and first passing
            found, _ = bisect_first(passing - failing + 1,
                                    lambda i: ratio_at(failing + i) <= target)
            passing = failing + found
        step, ratio = passing, ratio_at(passing)
        met, timed = ratio <= target, len(latency)
    model = walk.snapshots[step]
    tp_macs, _ = tp.utils.count_ops_and_params(model, walk.inputs)
    tp_dense, _ = tp.utils.count_ops_and_params(walk.snapshots[0], walk.inputs)
    return model, {"step": step, "steps_taken": len(walk.macs) - 1, "ratio": ratio, "met": met,
                   "latency_evaluations": timed, "macs_ratio": walk.macs[step] / walk.dense_macs,
                   "tp_counted_macs_ratio": float(tp_macs / tp_dense)}
