"""The budget search: how many channels of each group to remove so every budget holds.

1. Probe: each group alone loses half its channels (its leader's lowest filter norms, masked),
   then as many as it may lose (all but `min_keep`); the rises of the validation loss are the
   group's sensitivity over the first half and beyond it. A channel's price is what its
   removal saves of the budgeted cost: MACs or parameters to first order over every layer
   that produces, reads or passes it (compressor.budget.prices); latency as measured, each
   probe thinned and timed against the dense model (several probes in one session when the
   caller can time models together).
2. Rank every channel of every group by (sensitivity x the channel's norm relative to its
   layer's mean) / price: a global ranking normalised by each group's cost, never a uniform
   ratio. A channel past the group's half weighs the rise of the second probe per channel
   beyond the half (never less than the first half's: a group whose loss steepens keeps its
   channels, where a straight line through the first probe would empty it). Channels of one
   group keep their leader's order; a group keeps at least `min_keep` of its channels.
3. Bisect the number of channels removed along that ranking to the fewest that meet every
   budget, each candidate thinned and measured (latency timed on the thinned model).
4. Round each group's kept channels up to a multiple of CHANNEL_MULTIPLE, kept where every
   budget still holds (hardware-friendly counts, where they pay). With a channel multiple
   (`--channel-multiple`, 8 on CUDA), every candidate keeps multiples of it in the first place.
5. Confirm a latency choice by timing it again (the median of three timings must meet the
   aim), else remove more channels along the ranking until one is confirmed.

Every evaluation is cached under the candidate's per-group counts; the state is plain values,
so it rides in a checkpoint and a resumed search replays the same decisions from the cache.
"""

from __future__ import annotations

import copy
import logging
import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from compressor.budget.groups import (
    ChannelGroup,
    batchnorms_of,
    group_masked,
    leader_norms,
    leader_ranking,
    mask_group_filters,
    prunable_groups,
)
from compressor.budget.measure import LatenciesFn, MeasureFn, figures
from compressor.budget.prices import channel_prices
from compressor.thinning.plan import find_thinning
from compressor.thinning.recipe import apply_thinning_recipe
from compressor.utils.errors import UsageError

__all__ = ["Budget", "SearchResult", "BudgetSearch", "STATE_VERSION", "build_candidate",
           "ranking_quantity", "LatenciesFn", "LATENCY_SEARCH_MARGIN"]

STATE_VERSION = 3  # 2: a second, deeper probe per group; 3: candidates scored with
# their batch-norm statistics re-estimated
LOG = logging.getLogger("compressor")
EvaluateFn = Callable[[nn.Module], Mapping[str, float]]
# Probes timed together in one interleaved session (thinned copies held in memory at once)
PROBES_TIMED_TOGETHER = 8
# Kept channel counts are rounded up to multiples of this where the budgets still hold
# (oneDNN's CPU convolutions block channels by 8 (AVX2) or 16 (AVX-512), tensor cores by 8)
CHANNEL_MULTIPLE = 8
# phases whose log line says whether the candidate meets the budget
VERDICT_PHASES = ("search", "rounded", "confirm")
# Timings vary by a few percent from run to run, and a shared machine's dense-to-thinned ratio
# drifts over an hour: the search aims this much under a latency target, so the fine-tuned
# model, timed again later, still meets it (at 3% under, a benchmark's side-by-side timing an
# hour later found one of six confirmed 0.466-0.489x models at 0.501x)
LATENCY_SEARCH_MARGIN = 0.95
# A latency choice is timed this many times more (its figure becomes the median of all its
# timings) before it is kept: bisection keeps the first candidate whose one timing fell under
# the aim, and a timing that fell there by chance is not confirmed. At most CONFIRM_STEPS
# further candidates along the ranking are tried when it is not.
LATENCY_CONFIRMATIONS = 2
# A latency bisection stops when its bracket is this fraction of the ranking or less (one
# channel moves latency by less than a timing's noise)
LATENCY_BISECTION_PARTS = 64
CONFIRM_STEPS = 8


@dataclass(frozen=True)
class Budget:
    """Targets as fractions of the dense model's figures; all must hold.

    With `accuracy_drop`, the search instead removes as many channels (ranked by the targets'
    quantity, whose fraction is then 1.0: any) as keep the candidate's validation top-1
    within that many points of the dense model's: compress as far as accuracy allows."""

    targets: Mapping[str, float]
    # the smallest fraction of a group's channels that is kept: the ranking is greedy, and
    # with a 10% floor it emptied blocks to a few channels (0.86 pt lower at 0.3x MACs)
    min_keep: float = 0.25
    accuracy_drop: float | None = None
    # every pruned layer keeps a multiple of this many channels (GPU kernels run tensor-core
    # tiles of 8 or more: a width of 61 can be slower than one of 64); 1: any count
    channel_multiple: int = 1

    @property
    def quantities(self) -> tuple[str, ...]:
        """The budgeted quantities, in a fixed order."""
        return tuple(sorted(self.targets))


def ranking_quantity(quantity: str) -> str:
    """What prices a channel for `quantity`: saved size by parameters, the others by
    themselves (latency by the time a group's probe, thinned, saves)."""
    return {"size": "params"}.get(quantity, quantity)


# A group whose thinned probe saved no measurable time is priced at this fraction of the dense
# latency per channel removed (timings vary by a few percent: a zero or negative saving is
# noise, and a zero price would rank its channels last whatever they cost)
LATENCY_PRICE_FLOOR = 1e-4


@dataclass(frozen=True)
class SearchResult:
    """The chosen per-group counts of removed channels, and whether every budget holds."""

    groups: tuple[ChannelGroup, ...]
    removed: tuple[int, ...]
    ratios: Mapping[str, float]  # quantity -> achieved fraction of the dense figure
    met: bool


def _key(removed: tuple[int, ...]) -> str:
    return ",".join(str(n) for n in removed)


def build_candidate(dense: nn.Module, groups: tuple[ChannelGroup, ...], removed: tuple[int, ...],
                    rankings: list[Tensor], batchnorms: Mapping[str, str | None],
                    inputs: Tensor) -> nn.Module:
    """A thinned copy of `dense` without the `removed[i]` least important channels of group i."""
    model = copy.deepcopy(dense).eval()
    for group, count, ranking in zip(groups, removed, rankings, strict=True):
        if count:
            mask_group_filters(model, group, ranking[:count], dict(batchnorms))
    recipe, _ = find_thinning(model, inputs, exact=True)
    apply_thinning_recipe(model, recipe)
    return model


class BudgetSearch:
    """Run (or resume, from `state`) the search on a dense model; see the module docstring."""

    def __init__(self, dense: nn.Module, inputs: Tensor, budget: Budget, evaluate: EvaluateFn,
                 measure: MeasureFn, state: Mapping[str, Any] | None = None,
                 on_evaluation: Callable[[dict[str, Any]], None] | None = None,
                 measure_latencies: LatenciesFn | None = None) -> None:
        self.dense = dense.eval()
        self.measure_latencies = measure_latencies
        self.inputs = inputs
        self.budget = budget
        self.evaluate = evaluate
        self.measure = measure
        self.on_evaluation = on_evaluation
        self.state: dict[str, Any] = copy.deepcopy(dict(state)) if state else {
            "version": STATE_VERSION, "targets": dict(budget.targets), "evaluations": {}}
        if self.state.get("version") != STATE_VERSION:
            raise UsageError("the checkpoint's budget search is of another version; start the "
                             "budget run again from the dense checkpoint")
        if "groups" in self.state:
            self.groups = tuple(ChannelGroup.from_state(g) for g in self.state["groups"])
        else:
            self.groups = tuple(prunable_groups(self.dense, inputs))
            self.state["groups"] = [g.to_state() for g in self.groups]
        if not self.groups:
            raise UsageError("the budget search found no channel group that thinning can "
                             "remove in this model; use a schedule (--compress) instead")
        self.rankings = [leader_ranking(self.dense, g) for g in self.groups]
        self.batchnorms = batchnorms_of(self.dense, list(self.groups))

    # -- evaluations ------------------------------------------------------------------------
    @property
    def evaluations(self) -> dict[str, dict[str, Any]]:
        """Every candidate evaluated so far, keyed by its per-group counts."""
        return self.state["evaluations"]

    def _thinned(self, removed: tuple[int, ...]) -> nn.Module:
        """The dense model thinned by `removed` (build_candidate with the search's groups)."""
        return build_candidate(self.dense, self.groups, removed, self.rankings,
                               self.batchnorms, self.inputs)

    def _saved(self) -> None:
        """Hand the state to `on_evaluation` (the caller checkpoints it), if there is one."""
        if self.on_evaluation is not None:
            self.on_evaluation(self.state)

    def _evaluate(self, removed: tuple[int, ...], phase: str,
                  quantities: tuple[str, ...]) -> dict[str, Any]:
        key = _key(removed)
        cached = self.evaluations.get(key)
        if cached is not None and all(q in cached["figures"] for q in quantities):
            return cached
        model = self.dense if not any(removed) else self._thinned(removed)
        scores = dict(self.evaluate(model)) if cached is None else cached
        dense = self.evaluations.get(_key((0,) * len(self.groups)))
        reference = None if model is self.dense or dense is None else dense["figures"]
        figures = {**(cached or {}).get("figures", {}),
                   **self.measure(model, quantities, reference)}
        entry = {"removed": list(removed), "phase": (cached or {}).get("phase", phase),
                 "top1": float(scores["top1"]), "loss": float(scores["loss"]),
                 "figures": {k: float(v) for k, v in figures.items()}}
        self.evaluations[key] = entry
        dense = self.evaluations.get(_key((0,) * len(self.groups)))
        shown = ", ".join(f"{q} {entry['figures'][q] / dense['figures'][q]:.3f} of dense"
                          for q in quantities if dense and q in dense["figures"])
        verdict = ""
        if phase in VERDICT_PHASES and dense is not None and all(
                q in entry["figures"] for q in self.budget.quantities):
            verdict = " (meets the budget)" if self._met(entry) else " (misses the budget)"
        LOG.info("budget search (%s): %d channels removed, val top1 %.2f loss %.4f%s%s", phase,
                 sum(removed), entry["top1"], entry["loss"], f", {shown}" if shown else "",
                 verdict)
        self._saved()
        return entry

    def dense_entry(self) -> dict[str, Any]:
        """The dense model's evaluation (validation scores, every budgeted figure)."""
        return self._evaluate((0,) * len(self.groups), "dense", self.budget.quantities)

    def ratios(self, entry: Mapping[str, Any]) -> dict[str, float]:
        """Each budgeted figure of `entry` as a fraction of the dense model's."""
        dense = self.dense_entry()["figures"]
        return {q: entry["figures"][q] / dense[q] for q in self.budget.quantities}

    def _within_accuracy(self, entry: Mapping[str, Any]) -> bool:
        """Whether `entry` scores within the budget's accuracy drop of the dense model."""
        drop = self.budget.accuracy_drop
        return drop is None or self.dense_entry()["top1"] - entry["top1"] <= drop

    def _met(self, entry: Mapping[str, Any]) -> bool:
        if not self._within_accuracy(entry):
            return False
        ratios = self.ratios(entry)
        margins = {"latency": LATENCY_SEARCH_MARGIN}
        return all(ratios[q] <= self.budget.targets[q] * margins.get(q, 1.0)
                   for q in self.budget.quantities)

    # -- the search -------------------------------------------------------------------------
    def _price_quantities(self) -> tuple[str, ...]:
        return tuple(sorted({ranking_quantity(q) for q in self.budget.quantities}))

    def _limit(self, group: ChannelGroup) -> int:
        """How many of the group's channels may go (it keeps at least min_keep of them)."""
        return max(0, min(group.channels - 1,
                          group.channels - math.ceil(self.budget.min_keep * group.channels)))

    def _probe(self, index: int, count: int | None = None) -> dict[str, Any]:
        """Validation scores with `count` (half by default) of the group's channels masked in
        the dense model (and restored): no thinning needed, the masked model computes what the
        thinned one would. The half probe's phase is "probe", a deeper one's "deep probe"."""
        removed = [0] * len(self.groups)
        removed[index] = self.groups[index].channels // 2 if count is None else count
        key = _key(tuple(removed))
        cached = self.evaluations.get(key)
        if cached is not None:
            return cached
        with group_masked(self.dense, self.groups[index],
                          self.rankings[index][:removed[index]], dict(self.batchnorms)) as model:
            scores = self.evaluate(model)
        phase = "probe" if count is None else "deep probe"
        entry = {"removed": removed, "phase": phase, "top1": float(scores["top1"]),
                 "loss": float(scores["loss"]), "figures": {}}
        self.evaluations[key] = entry
        LOG.info("budget search (%s): %s loses %d of %d channels, val top1 %.2f loss %.4f",
                 phase, self.groups[index].layer, removed[index], self.groups[index].channels,
                 entry["top1"], entry["loss"])
        self._saved()
        return entry

    def _latency_prices(self) -> list[float]:
        """Per group, the seconds one of its channels saves: its probe (half its channels
        removed) thinned and timed against the dense model, divided by the channels removed.
        MACs are not latency: a layer's time depends on its kernel and shape, not its MACs."""
        dense = self.dense_entry()["figures"]["latency"]
        probes = [tuple(self._probe(index)["removed"]) for index in range(len(self.groups))]
        if self.measure_latencies is not None:
            self._time_together(probes)
        prices = []
        for removed in probes:
            entry = self._evaluate(removed, "probe", ("latency",))
            saved = (dense - entry["figures"]["latency"]) / max(sum(removed), 1)
            prices.append(max(saved, LATENCY_PRICE_FLOOR * dense))
        return prices

    def _time_together(self, candidates: list[tuple[int, ...]]) -> None:
        """Time the scored candidates that have no latency yet in shared interleaved sessions
        (PROBES_TIMED_TOGETHER at a time, with the dense model): one dense timing per session
        instead of one per candidate."""
        assert self.measure_latencies is not None
        dense = self.dense_entry()["figures"]
        missing = [c for c in candidates
                   if "latency" not in self.evaluations[_key(c)]["figures"]]
        for start in range(0, len(missing), PROBES_TIMED_TOGETHER):
            chunk = missing[start:start + PROBES_TIMED_TOGETHER]
            models = [self._thinned(removed) for removed in chunk]
            for removed, seconds in zip(chunk, self.measure_latencies(models, dense),
                                        strict=True):
                entry = self.evaluations[_key(removed)]
                entry["figures"]["latency"] = float(seconds)
                LOG.info("budget search (probe): %d channels removed, latency %.3f",
                         sum(removed), seconds / dense["latency"])
            self._saved()

    def _order(self) -> list[int]:
        """Group indices, one per channel, in the order the channels are removed."""
        dense = self.dense_entry()
        prices: dict[str, list[float]] = dict(channel_prices(self.dense, self.groups))
        if "latency" in self._price_quantities():
            prices["latency"] = self._latency_prices()  # probes scored first, then timed
        dense_totals = {q: dense["figures"].get(q) or float(
            figures(self.dense, (q,), None)[q]) for q in self._price_quantities()}
        keyed: list[tuple[float, int, int]] = []
        floor = 1e-4 * max(dense["loss"], 1e-3)
        for index, group in enumerate(self.groups):
            price = sum(prices[q][index] / dense_totals[q] for q in self._price_quantities())
            half, limit = group.channels // 2, self._limit(group)
            rise_half = max(self._probe(index)["loss"] - dense["loss"], floor)
            # past the half, the second probe's rise scaled to as many channels as the first's
            rise_beyond = rise_half
            if limit > half:
                rise_deep = self._probe(index, limit)["loss"] - dense["loss"]
                rise_beyond = max((rise_deep - rise_half) * half / (limit - half), rise_half)
            norms = leader_norms(self.dense, group)
            relative = norms[self.rankings[index]] / norms.mean().clamp_min(1e-12)
            for position in range(limit):
                marginal = rise_half if position < half else rise_beyond
                score = marginal * float(relative[position]) / max(price, 1e-12)
                keyed.append((score, index, position))
        keyed.sort()
        return [index for _, index, _ in keyed]

    def _rounded(self, chosen: dict[str, Any]) -> dict[str, Any]:
        """The choice with each group's kept channels rounded up to a multiple of
        CHANNEL_MULTIPLE, when that still meets every budget (it removes fewer channels; CPU
        and GPU kernels block channels by 8 or 16, so a rounded layer often runs faster than
        one with a few channels fewer), else `chosen` as it is."""
        rounded = []
        for group, removed in zip(self.groups, chosen["removed"], strict=True):
            kept = group.channels - removed
            multiple = min(CHANNEL_MULTIPLE, group.channels)
            rounded.append(group.channels - min(group.channels,
                                                -(-kept // multiple) * multiple))
        if rounded == list(chosen["removed"]):
            return chosen
        entry = self._evaluate(tuple(rounded), "rounded", self.budget.quantities)
        if self._met(entry):
            return entry
        LOG.info("budget search (rounded): channel counts rounded up to multiples of %d miss "
                 "the budget; the unrounded choice is kept", CHANNEL_MULTIPLE)
        return chosen

    def _retimed(self, entry: dict[str, Any]) -> dict[str, Any]:
        """`entry` with its latency timed LATENCY_CONFIRMATIONS more times (in alternation with
        the dense model), its figure the median of every timing (once: the timings are kept)."""
        if "latency_timings" in entry:
            return entry
        removed = tuple(entry["removed"])
        model = self._thinned(removed)
        reference = self.dense_entry()["figures"]
        timings = [float(entry["figures"]["latency"])] + [
            float(self.measure(model, ("latency",), reference)["latency"])
            for _ in range(LATENCY_CONFIRMATIONS)]
        entry["latency_timings"] = timings
        entry["figures"]["latency"] = statistics.median(timings)
        LOG.info("budget search (confirm): %d channels removed, latency timed %s of dense",
                 sum(removed), " ".join(f"{t / reference['latency']:.3f}" for t in timings))
        self._saved()
        return entry

    def _confirmed(self, order: list[int], taken: int, chosen: dict[str, Any]
                   ) -> dict[str, Any]:
        """The choice once its latency is confirmed by more timings; when the median misses
        the aim, more channels along the ranking (as many as the time per channel removed so
        far says the excess needs), confirmed in turn."""
        if "latency" not in self.budget.quantities or not self._met(chosen):
            return chosen  # out of reach: the most pruned candidate, as it is
        aim = self.budget.targets["latency"] * LATENCY_SEARCH_MARGIN
        for _ in range(CONFIRM_STEPS):
            chosen = self._retimed(chosen)
            ratio = self.ratios(chosen)["latency"]
            if self._met(chosen) or taken >= len(order):
                return chosen
            per_channel = max(1.0 - ratio, 1e-6) / max(taken, 1)
            taken = min(len(order), taken + max(1, math.ceil((ratio - aim) / per_channel)))
            chosen = self._evaluate(self._counts(order, taken), "confirm",
                                    self.budget.quantities)
        return chosen

    def _counts(self, order: list[int], taken: int) -> tuple[int, ...]:
        """Each group's removed channels when the first `taken` of the ranking go, its kept
        count rounded down to the channel multiple."""
        removed = [0] * len(self.groups)
        for index in order[:taken]:
            removed[index] += 1
        return tuple(self._on_multiple(group, count)
                     for group, count in zip(self.groups, removed, strict=True))

    def _on_multiple(self, group: ChannelGroup, removed: int) -> int:
        """`removed` with the group's kept channels (of every layer: units x blocks) a multiple
        of the budget's channel multiple: rounded down (removing more keeps the bisection's
        order), at least one multiple kept; a group narrower than one multiple is left whole."""
        multiple = self.budget.channel_multiple
        # in units of `blocks` channels (of the narrowest layer: the others keep a multiple)
        step = multiple // math.gcd(multiple, group.min_blocks)
        if step <= 1 or removed == 0:
            return removed
        if group.channels < step:
            return 0
        kept = max(step, (group.channels - removed) // step * step)
        return group.channels - kept

    def run(self) -> SearchResult:
        """Bisect along the ranking to the fewest channels removed that meet every budget (with
        an accuracy drop: the most removed whose candidate keeps accuracy within it)."""
        quantities = self.budget.quantities
        self.dense_entry()
        order = self._order()
        # timings vary by a few percent: a latency bisection stops at a few channels
        resolution = (max(1, len(order) // LATENCY_BISECTION_PARTS)
                      if "latency" in quantities else 1)
        if self.budget.accuracy_drop is not None:
            taken = self._bisect(order, resolution, more_is_met=False)
            return self._chosen(self._evaluate(self._counts(order, taken), "search",
                                               quantities))
        taken = self._bisect(order, resolution, more_is_met=True)
        chosen = self._evaluate(self._counts(order, taken), "search", quantities)
        if self._met(chosen):
            chosen = self._rounded(chosen)
        return self._chosen(self._confirmed(order, taken, chosen))

    def _bisect(self, order: list[int], resolution: int, more_is_met: bool) -> int:
        """How many channels along the ranking sit at the boundary of `_met`: with
        `more_is_met` (budgets met by removing more) the fewest that meet them, or all when
        even all do not; else (an accuracy bound, held by removing less) the most that still
        hold, or all when all do."""
        quantities = self.budget.quantities
        low, high = 0, len(order)
        if self._met(self._evaluate(self._counts(order, high), "search", quantities)) \
                != more_is_met:
            return high
        while high - low > resolution:
            middle = (low + high) // 2
            met = self._met(self._evaluate(self._counts(order, middle), "search", quantities))
            if met == more_is_met:
                high = middle
            else:
                low = middle
        return high if more_is_met else low

    def _chosen(self, chosen: dict[str, Any]) -> SearchResult:
        """Record `chosen` in the state (checkpointed) and return it as the result."""
        self.state["chosen"] = chosen["removed"]
        self._saved()
        return SearchResult(self.groups, tuple(chosen["removed"]), self.ratios(chosen),
                            self._met(chosen))
