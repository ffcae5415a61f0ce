"""RandomRankedFilterPruner_AGP: the README's worked example of adding a pruner."""

from __future__ import annotations

import torch

from compressor.pruning import RandomRankedFilterPruner
from compressor.pruning.base import PruneStep, agp_sparsity
from compressor.schedule.registry import SCHEDULE_CLASSES
from tests.test_pruning_pruners import run_schedule, tiny

SCHEDULE = {
    "version": 1,
    "pruners": {"random": {"class": "RandomRankedFilterPruner_AGP", "initial_sparsity": 0.25,
                           "final_sparsity": 0.5, "group_type": "Filters",
                           "weights": ["conv1.weight", "conv2.weight"]}},
    "policies": [{"pruner": {"instance_name": "random"}, "starting_epoch": 0,
                  "ending_epoch": 3, "frequency": 1}],
}


def _zero_filters(weight: torch.Tensor) -> set[int]:
    return {i for i in range(weight.shape[0]) if not weight[i].any()}


def test_a_schedule_prunes_exactly_the_agp_fraction_of_random_filters() -> None:
    assert SCHEDULE_CLASSES["RandomRankedFilterPruner_AGP"][0] == "pruners"
    model = tiny()
    scheduler, _ = run_schedule(model, SCHEDULE, epochs=3)
    pruner = scheduler.instances["random"]
    assert isinstance(pruner, RandomRankedFilterPruner)
    for name in ("conv1.weight", "conv2.weight"):
        weight = model.get_parameter(name).detach()
        assert len(_zero_filters(weight)) == int(0.5 * weight.shape[0])


def test_the_ranking_is_random_reproducible_and_moves_with_the_epoch() -> None:
    model = tiny()
    pruner = RandomRankedFilterPruner("r", ["conv2.weight"], group_type="Filters",
                                      initial_sparsity=0.25, final_sparsity=0.5)
    params = dict(model.named_parameters())

    def pruned(epoch: int, seed: int = 3) -> set[int]:
        step = PruneStep(epoch, 0, 4, 1, model, seed=seed)
        mask = pruner.compute_masks(params, step)["conv2.weight"]
        return _zero_filters(mask), agp_sparsity(0.25, 0.5, step)

    first, level = pruned(1)
    assert len(first) == int(level * params["conv2.weight"].shape[0])
    assert pruned(1) == (first, level)  # the same on every rank and in every rerun
    assert {frozenset(pruned(1, seed)[0]) for seed in range(6)} != {frozenset(first)}
    fixed = RandomRankedFilterPruner("f", ["conv2.weight"], group_type="Filters", level=0.5)
    drawn = {frozenset(_zero_filters(fixed.compute_masks(
        params, PruneStep(epoch, 0, 4, 1, model, seed=3))["conv2.weight"])) for epoch in range(4)}
    assert len(drawn) > 1  # re-ranked at every step, as Distiller's
    # random, not ranked by magnitude: the smallest filters are not always the ones chosen
    norms = params["conv2.weight"].detach().abs().flatten(1).sum(1)
    smallest = set(norms.argsort()[:len(first)].tolist())
    assert any(pruned(1, seed)[0] != smallest for seed in range(6))
