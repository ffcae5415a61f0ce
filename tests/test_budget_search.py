"""The budget search in-process: groups thinning can remove on every family, an allocation that
meets MACs and parameter budgets on residual, concatenating and depthwise networks, an unmet
budget reported as such, a search resumed from its state, and the schedule it writes."""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from compressor.budget import Budget, BudgetSearch, figures, prunable_groups
from compressor.budget.groups import ChannelGroup, batchnorms_of, group_masked, leader_ranking
from compressor.budget.schedule import (
    budget_schedule,
    exact_fraction,
    pruning_epochs,
    schedule_text,
)
from compressor.budget.search import LATENCY_SEARCH_MARGIN, build_candidate
from compressor.models import create_model, description_of, get_arch_spec
from compressor.pruning.groups import count_to_prune
from compressor.schedule import load_schedule
from compressor.schedule.policies import PruningPolicy
from compressor.thinning.plan import find_thinning
from compressor.thinning.renormalize import renormalized
from compressor.thinning.support import channel_shuffles
from compressor.utils.config import OptimizerConfig, make_optimizer
from compressor.utils.errors import UsageError
from tests.conftest import trained_like_batchnorms
from tests.test_thinning_support import FAMILIES

# One architecture per family (as thinning's tests), at small inputs; densenet_bc_40 stands for
# the DenseNet-BC family (same blocks as _100, a third of the layers).
BUDGET_FAMILIES = {**{a: s for a, s in FAMILIES.items() if a != "densenet_bc_100_cifar"},
                   "densenet_bc_40_cifar": None}


def _model(arch: str, side: int | None) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = trained_like_batchnorms(create_model(arch, get_arch_spec(arch).default_dataset))
    channels, height, width = description_of(model).input_spec.input_size
    return model, torch.randn(4, channels, side or height, side or width)


def _scorer(inputs: torch.Tensor, calls: list[int] | None = None
            ) -> Callable[[nn.Module], Mapping[str, float]]:
    labels = torch.arange(inputs.shape[0]) % 10

    def evaluate(model: nn.Module) -> Mapping[str, float]:
        if calls is not None:
            calls.append(1)
        with torch.no_grad():
            logits = model(inputs)
        return {"top1": float((logits.argmax(1) == labels).float().mean() * 100),
                "loss": float(F.cross_entropy(logits, labels))}
    return evaluate


def _measure(model: nn.Module, quantities: tuple[str, ...],
             dense: Mapping[str, float] | None = None) -> dict[str, float]:
    return figures(model, quantities, None)


def _on_clock(clock: Callable[[nn.Module, Mapping[str, float] | None], float]
              ) -> Callable[..., dict[str, float]]:
    """A measure function: figures counted, latency read off a deterministic stand-in `clock`
    (given the candidate and the dense model's figures once they are measured)."""
    def measure(candidate: nn.Module, quantities: tuple[str, ...],
                dense: Mapping[str, float] | None = None) -> dict[str, float]:
        measured = figures(candidate, tuple(q for q in quantities if q != "latency"), None)
        if "latency" in quantities:
            measured["latency"] = clock(candidate, dense)
        return measured
    return measure


@pytest.mark.parametrize("arch", sorted(BUDGET_FAMILIES))
def test_every_family_gives_groups_thinning_removes_exactly_or_refuses_in_one_line(
        arch: str) -> None:
    model, inputs = _model(arch, BUDGET_FAMILIES[arch])
    try:
        groups = prunable_groups(model, inputs[:2])
    except UsageError as exc:
        assert "\n" not in str(exc) and "channel shuffle" in str(exc), str(exc)
        assert channel_shuffles(model, inputs[:2])
        return
    assert groups, arch
    removed = tuple(g.channels // 2 for g in groups)
    rankings = [leader_ranking(model, g) for g in groups]
    batchnorms = batchnorms_of(model, groups)
    thinned = build_candidate(model, tuple(groups), removed, rankings, batchnorms, inputs[:2])
    with contextlib.ExitStack() as masks, torch.no_grad():
        for group, count, ranking in zip(groups, removed, rankings, strict=True):
            masks.enter_context(group_masked(model, group, ranking[:count], batchnorms))
        # the thinned candidate computes what the masked model computes (a LayerNorm that
        # loses channels normalizing the ones it keeps: thinning's definition)
        with torch.enable_grad():  # Torch-Pruning traces with autograd
            recipe, _ = find_thinning(copy.deepcopy(model), inputs[:2], exact=True)
        with renormalized(model, recipe):
            torch.testing.assert_close(thinned(inputs[:2]), model(inputs[:2]), atol=1e-4,
                                       rtol=1e-4)
    for group, count in zip(groups, removed, strict=True):
        layer = thinned.get_submodule(group.layer)
        kept = getattr(layer, "out_channels", getattr(layer, "out_features", None))
        # a group a grouped convolution shares counts units of one channel per block
        assert kept == (group.channels - count) * group.blocks, (arch, group.layer)


@pytest.mark.parametrize(("arch", "side"), [
    ("resnet20_cifar", None),  # residual additions: coupled groups
    ("squeezenet1_1", 64),  # concatenations (fire modules)
    ("mobilenet_025", 64),  # depthwise convolutions
    ("simplenet_digits", None),
])
def test_the_allocation_meets_macs_and_params_budgets(arch: str, side: int | None) -> None:
    model, inputs = _model(arch, side)
    targets = {"macs": 0.5, "params": 0.6}
    search = BudgetSearch(model, inputs[:2], Budget(targets), _scorer(inputs), _measure)
    result = search.run()
    assert result.met, result.ratios
    chosen = build_candidate(model, result.groups, result.removed, search.rankings,
                             search.batchnorms, inputs[:2])
    measured = _measure(chosen, ("macs", "params"))
    dense = _measure(model, ("macs", "params"))
    for quantity, target in targets.items():
        assert measured[quantity] / dense[quantity] <= target
        assert measured[quantity] / dense[quantity] == pytest.approx(result.ratios[quantity])
    assert len(set(result.removed)) > 1, "the ratios differ by group, not one uniform ratio"
    assert any(e["phase"] == "probe" for e in search.evaluations.values())


def test_a_budget_out_of_reach_is_reported_unmet_with_the_most_pruned_model() -> None:
    model, inputs = _model("simplenet_digits", None)
    search = BudgetSearch(model, inputs[:2], Budget({"macs": 0.001}), _scorer(inputs), _measure)
    result = search.run()
    assert not result.met and result.ratios["macs"] > 0.001
    assert all(kept >= 1 for kept in (g.channels - n for g, n in
                                      zip(result.groups, result.removed, strict=True)))


class _Killed(Exception):
    pass


def test_a_search_resumed_from_its_state_ends_alike_and_reuses_its_cache() -> None:
    model, inputs = _model("resnet20_cifar", None)
    budget = Budget({"macs": 0.4})
    full_calls: list[int] = []
    full = BudgetSearch(model, inputs[:2], budget, _scorer(inputs, full_calls), _measure).run()
    saved: list[dict] = []

    def kill_after_five(state: dict) -> None:
        if len(state["evaluations"]) == 5:
            saved.append(state)
            raise _Killed

    with pytest.raises(_Killed):
        BudgetSearch(model, inputs[:2], budget, _scorer(inputs), _measure,
                     on_evaluation=kill_after_five).run()
    resumed_calls: list[int] = []
    resumed = BudgetSearch(model, inputs[:2], budget, _scorer(inputs, resumed_calls), _measure,
                           state=saved[0]).run()
    assert resumed.removed == full.removed and resumed.ratios == full.ratios
    assert len(resumed_calls) == len(full_calls) - 5


def test_exact_fractions_remove_exactly_the_chosen_count() -> None:
    for total in (1, 3, 10, 16, 64, 96, 100, 512, 2048):
        for removed in range(total):
            assert count_to_prune(exact_fraction(removed, total), total) == removed


def test_the_schedule_prunes_the_chosen_counts_progressively_then_thins(tmp_path: Path) -> None:
    model, inputs = _model("resnet20_cifar", None)
    search = BudgetSearch(model, inputs[:2], Budget({"macs": 0.5}), _scorer(inputs), _measure)
    result = search.run()
    epochs = 6  # three pruning epochs: two with masks only, the third thins after its masks
    path = tmp_path / "budget_schedule.yaml"
    path.write_text(schedule_text(budget_schedule(result.groups, result.removed, epochs), ["t"]))
    optimizer = make_optimizer(model.parameters(), OptimizerConfig())
    scheduler = load_schedule(path, model, optimizer)
    pruners = [p.pruner for p in scheduler.policies if isinstance(p, PruningPolicy)]
    assert len(pruners) == sum(1 for n in result.removed if n)
    zeroed = []
    for epoch in range(pruning_epochs(epochs) - 1):
        scheduler.on_epoch_begin(epoch)
        zeroed.append(sum(int((model.get_parameter(g.leader).detach().flatten(1).abs().sum(1)
                                == 0).sum()) for g in result.groups))
    assert 0 < zeroed[0] < zeroed[1] < sum(result.removed), zeroed  # progressive
    scheduler.on_epoch_begin(pruning_epochs(epochs) - 1)
    for group, removed in zip(result.groups, result.removed, strict=True):
        layer = model.get_submodule(group.layer)
        assert layer.out_channels == group.channels - removed, group.layer  # thinned
    assert yaml.safe_load(path.read_text())["extensions"]["budget_thinning"]["class"] == \
        "FilterRemover"


def test_a_one_step_schedule_never_starts_above_its_final_sparsity() -> None:
    """With one pruning epoch, fraction / 1 rounded to 6 digits may round up: 21 of 23
    filters is 0.9130435, which rounded to 0.913044 and the written schedule was refused."""
    assert exact_fraction(21, 23) == 0.9130435
    group = ChannelGroup(weights=("conv.weight",), channels=23)
    for epochs in (1, 2, 6):
        doc = budget_schedule([group], [21], epochs)
        pruner = next(iter(doc["pruners"].values()))
        assert pruner["initial_sparsity"] <= pruner["final_sparsity"] == 0.9130435


def test_a_latency_budget_prices_channels_by_the_time_they_save() -> None:
    """Latency is not MACs: with a (deterministic, stand-in) clock on which only resnet20's last
    stage takes time, the search times each group's thinned probe and removes only channels
    whose removal saves time, where MACs pricing would take the cheap early stages too."""
    from compressor.reports.metrics import layer_costs

    model, inputs = _model("resnet20_cifar", None)

    measure = _on_clock(lambda candidate, dense: 1e-6 * sum(
        cost.macs for cost in layer_costs(candidate) if cost.name.startswith("layer3")))

    search = BudgetSearch(model, inputs[:2], Budget({"latency": 0.6}), _scorer(inputs), measure)
    result = search.run()
    assert result.met and result.ratios["latency"] <= 0.6 * LATENCY_SEARCH_MARGIN, result.ratios
    probes = [e for e in search.evaluations.values() if e["phase"] == "probe"]
    assert probes and all("latency" in e["figures"] for e in probes)
    for group, removed in zip(result.groups, result.removed, strict=True):
        if not any(name.startswith("layer3") for name, _ in group.members):
            assert removed == 0, group.layer  # saves no time on this clock


def test_kept_channels_are_rounded_to_multiples_of_8_where_the_budget_still_holds(
        caplog: pytest.LogCaptureFixture) -> None:
    """On a (stand-in) clock where a convolution with a multiple of 8 output channels runs at
    half the cost per channel, rounding the kept counts up meets the latency budget with
    fewer channels removed; with MACs, where rounding up cannot hold, the choice stays."""
    model, inputs = _model("resnet20_cifar", None)

    measure = _on_clock(lambda candidate, dense: sum(
        m.out_channels * (0.5 if m.out_channels % 8 == 0 else 1.0)
        for m in candidate.modules() if isinstance(m, nn.Conv2d)))

    search = BudgetSearch(model, inputs[:2], Budget({"latency": 0.5}), _scorer(inputs), measure)
    result = search.run()
    rounded = [e for e in search.evaluations.values() if e["phase"] == "rounded"]
    assert result.met and rounded and list(result.removed) == rounded[0]["removed"]
    for group, removed in zip(result.groups, result.removed, strict=True):
        assert (group.channels - removed) % 8 == 0, group.layer
    bisected = [e for e in search.evaluations.values() if e["phase"] == "search"]
    assert sum(result.removed) < min(sum(e["removed"]) for e in bisected if search._met(e))
    caplog.clear()
    macs = BudgetSearch(model, inputs[:2], Budget({"macs": 0.5}), _scorer(inputs), _measure)
    with caplog.at_level(logging.INFO, logger="compressor"):
        chosen = macs.run()
    assert chosen.met and chosen.ratios["macs"] <= 0.5
    # a rounded candidate over the target says it was rejected, and why the choice stands
    lines = [r.getMessage() for r in caplog.records if "(rounded)" in r.getMessage()]
    assert any(line.endswith("(misses the budget)") for line in lines), lines
    assert any("the unrounded choice is kept" in line for line in lines), lines


def test_a_latency_choice_timed_low_by_chance_is_confirmed_or_pruned_further() -> None:
    """On a (stand-in) clock whose first timing of every candidate reads 8% low, bisection
    keeps a candidate that only chance put under the aim; timed twice more (the median of
    three), it misses, and the search removes more channels until the median holds."""
    model, inputs = _model("resnet20_cifar", None)
    timed: dict[tuple[int, ...], int] = {}

    def true_latency(candidate: nn.Module) -> float:
        return float(sum(m.out_channels for m in candidate.modules()
                         if isinstance(m, nn.Conv2d)))

    def lucky_clock(candidate: nn.Module, dense: Mapping[str, float] | None) -> float:
        shape = tuple(m.out_channels for m in candidate.modules() if isinstance(m, nn.Conv2d))
        timed[shape] = timed.get(shape, 0) + 1
        lucky = 0.92 if timed[shape] == 1 and dense is not None else 1.0
        return lucky * true_latency(candidate)

    measure = _on_clock(lucky_clock)

    search = BudgetSearch(model, inputs[:2], Budget({"latency": 0.5}), _scorer(inputs), measure)
    result = search.run()
    chosen = next(e for e in search.evaluations.values()
                  if list(e["removed"]) == list(result.removed))
    assert result.met and len(chosen["latency_timings"]) == 3
    candidate = build_candidate(model, result.groups, result.removed, search.rankings,
                                search.batchnorms, inputs[:2])
    assert true_latency(candidate) <= 0.5 * LATENCY_SEARCH_MARGIN * true_latency(model)
    confirmed = [e for e in search.evaluations.values() if "latency_timings" in e]
    assert len(confirmed) >= 2  # the first choice was not confirmed
    assert any(e["phase"] == "confirm" for e in search.evaluations.values())


def test_latency_probes_are_timed_together_in_shared_sessions() -> None:
    """With a function that times several models in one session, the probes are timed in
    chunks of PROBES_TIMED_TOGETHER (one dense timing per chunk), not one session each; the
    prices, and so the choice, are those of the same clock timed one by one."""
    from compressor.budget.search import PROBES_TIMED_TOGETHER

    model, inputs = _model("resnet20_cifar", None)

    def clock(candidate: nn.Module) -> float:
        return float(sum(m.out_channels ** 1.5 for m in candidate.modules()
                         if isinstance(m, nn.Conv2d)))

    measure = _on_clock(lambda candidate, dense: clock(candidate))

    sessions: list[int] = []

    def measure_latencies(models: list[nn.Module], dense: Mapping[str, float]) -> list[float]:
        sessions.append(len(models))
        return [clock(m) for m in models]

    together = BudgetSearch(model, inputs[:2], Budget({"latency": 0.5}), _scorer(inputs),
                            measure, measure_latencies=measure_latencies)
    chosen = together.run()
    groups = len(together.groups)
    assert sum(sessions) == groups and max(sessions) <= PROBES_TIMED_TOGETHER
    assert len(sessions) == -(-groups // PROBES_TIMED_TOGETHER)
    alone = BudgetSearch(model, inputs[:2], Budget({"latency": 0.5}), _scorer(inputs), measure)
    assert alone.run().removed == chosen.removed and chosen.met


def test_latencies_measured_together_come_one_per_model_with_the_reference() -> None:
    from compressor.budget.measure import LatencySetting, measure_latencies

    models = [create_model("simplenet_mnist", "mnist").train() for _ in range(3)]
    reference = create_model("simplenet_mnist", "mnist")
    setting = LatencySetting(repeats=2, min_seconds=0.0)
    seconds, reference_seconds = measure_latencies(models, setting, reference)
    assert len(seconds) == 3 and all(s > 0 for s in seconds) and reference_seconds > 0
    assert all(m.training for m in models) and reference.training  # modes restored
    alone, none = measure_latencies(models[:1], setting)
    assert len(alone) == 1 and none is None


def test_a_group_whose_loss_steepens_past_its_half_keeps_the_channels_beyond_it() -> None:
    """A second probe, at the most a group may lose, measures how the loss rises past the half:
    a group nearly free to halve but steep beyond keeps more than half of its channels, where a
    straight line through the half probe alone would empty it to the floor first."""
    model, inputs = _model("resnet20_cifar", None)
    groups = prunable_groups(model, inputs[:2])
    steep = "layer3.2.conv1"
    leaders = {g.layer: g.channels for g in groups}
    assert steep in leaders

    def removed_fraction(candidate: nn.Module, layer: str) -> float:
        weight = candidate.get_submodule(layer).weight.detach()
        alive = int((weight.flatten(1).abs().sum(1) > 0).sum())
        return 1.0 - alive / leaders[layer]

    def evaluate(candidate: nn.Module) -> Mapping[str, float]:
        loss = 1.0
        for layer in leaders:
            fraction = removed_fraction(candidate, layer)
            if layer == steep:  # 0.01 at the half, then 10 per unit fraction beyond it
                loss += 0.02 * min(fraction, 0.5) + 10.0 * max(fraction - 0.5, 0.0)
            else:
                loss += 0.2 * fraction
        return {"top1": 50.0, "loss": loss}

    search = BudgetSearch(model, inputs[:2], Budget({"macs": 0.6}), evaluate, _measure)
    result = search.run()
    assert result.met, result.ratios
    removed = dict(zip((g.layer for g in result.groups), result.removed, strict=True))
    assert 0 < removed[steep] <= leaders[steep] // 2, removed
    deep = [e for e in search.evaluations.values() if e["phase"] == "deep probe"]
    assert len(deep) == len(groups)


def test_a_channel_multiple_keeps_every_pruned_layer_at_a_multiple_of_it() -> None:
    """With a multiple of 8 (the CUDA default), every candidate keeps multiples of 8 in every
    layer it prunes (rounding the kept count down), and still meets the budget."""
    model, inputs = _model("resnet20_cifar", None)
    search = BudgetSearch(model, inputs[:2], Budget({"macs": 0.5}, channel_multiple=8),
                          _scorer(inputs), _measure)
    result = search.run()
    assert result.met and result.ratios["macs"] <= 0.5
    candidates = [e for e in search.evaluations.values() if e["phase"] in ("search", "rounded")]
    assert candidates
    for entry in candidates:
        for group, removed in zip(search.groups, entry["removed"], strict=True):
            kept = group.channels - removed
            assert removed == 0 or (kept * group.blocks) % 8 == 0, (group.layer, kept)
    assert any(result.removed), "it pruned"
    unconstrained = BudgetSearch(model, inputs[:2], Budget({"macs": 0.5}), _scorer(inputs),
                                 _measure).run()
    assert any((g.channels - n) % 8 for g, n in zip(unconstrained.groups,
                                                     unconstrained.removed, strict=True)), \
        "without the multiple some layer keeps another count (the test would prove nothing)"
