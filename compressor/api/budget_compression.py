"""`compress_to_budget`: the command line's budget search (compressor.budget) on one's own model,
scored by one's own evaluation, then the chosen channels removed and one's own fine-tune run.

The command line prunes the chosen channels progressively while it fine-tunes (with the dense
model as teacher); here they are removed at once, and `train_fn` fine-tunes the thin model.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from compressor.api.identity import ensure_described, model_device
from compressor.budget import Budget, BudgetSearch, LatencySetting
from compressor.budget.groups import mask_group_filters
from compressor.budget.measure import search_measures
from compressor.quantization.recipe import quantization_kind
from compressor.reports.budget_report import collapsed
from compressor.thinning.transform import probe_batch
from compressor.thinning.transform import thin as thin_in_place
from compressor.training.batchnorm import recalibrate_batch_norm
from compressor.utils.errors import UsageError
from compressor.utils.precision import AMP_DTYPES, Precision

__all__ = ["compress_to_budget", "BudgetResult"]

EvaluateFn = Callable[[nn.Module], Mapping[str, float]]
TrainFn = Callable[[nn.Module], Any]


@dataclass(frozen=True)
class BudgetResult:
    """What compress_to_budget made: the smaller model and how it meets each budget."""

    model: nn.Module  # pruned, thinned, fine-tuned by train_fn
    targets: Mapping[str, float]  # quantity -> the fraction of the dense figure allowed
    achieved: Mapping[str, float]  # quantity -> the final figure / the dense model's
    met: bool  # every achieved fraction is at most its target
    dense: Mapping[str, float]  # the dense model's figures (MACs of one sample, parameters ...)
    figures: Mapping[str, float]  # the final model's
    scores: Mapping[str, float]  # evaluate_fn on the final model
    removed_channels: int  # channels removed over all groups
    accuracy_drop: float = 0.0  # evaluate_fn's top-1 points lost against the dense model
    max_accuracy_drop: float | None = None  # the floor asked for (part of `met`)
    collapsed: bool = False  # the final model scores at chance: never met


def _targets(**given: float | None) -> dict[str, float]:
    targets: dict[str, float] = {}
    for quantity, value in given.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            raise UsageError(f"compress_to_budget: {quantity}={value!r}; give the fraction of "
                             "the dense model's figure to reach, between 0 and 1 (0.5: half)")
        targets[quantity] = float(value)
    if not targets:
        raise UsageError("compress_to_budget needs a budget: macs=, params=, latency= or size=, "
                         "a fraction of the dense model's figure (e.g. macs=0.5)")
    return targets


def _scored(evaluate_fn: EvaluateFn) -> EvaluateFn:
    """evaluate_fn, its results checked: the search ranks by 'loss' and reports 'top1'."""
    if not callable(evaluate_fn):
        raise UsageError("compress_to_budget: evaluate_fn is not callable; give a function "
                         "model -> {'top1': ..., 'loss': ...} (compressor.evaluate is one)")

    def score(model: nn.Module) -> Mapping[str, float]:
        scores = evaluate_fn(model)
        if not isinstance(scores, Mapping) or not {"top1", "loss"} <= set(scores):
            shown = sorted(scores) if isinstance(scores, Mapping) else type(scores).__name__
            raise UsageError(f"compress_to_budget: evaluate_fn returned {shown}, not a dict "
                             "with 'top1' and 'loss'; return compressor.evaluate(model, loader)")
        return scores

    return score


def compress_to_budget(model: nn.Module, train_fn: TrainFn | None, evaluate_fn: EvaluateFn, *,
                       macs: float | None = None, params: float | None = None,
                       latency: float | None = None, size: float | None = None,
                       example_inputs: Any = None, min_keep: float = 0.25,
                       max_accuracy_drop: float | None = None,
                       recalibration_loader: Iterable[Any] | None = None,
                       recalibration_batches: int = 20,
                       channel_multiple: int = 1, amp: str | None = None) -> BudgetResult:
    """Remove the channels that cost the least accuracy per unit of budget until every budget
    holds, thin the model, then fine-tune it with `train_fn`.

    The search (compressor.budget.search, as `--target-*` runs it) probes each channel group's
    sensitivity with `evaluate_fn`, ranks every channel by sensitivity per unit of cost, and
    bisects along that ranking to the fewest channels removed that meet every budget. The
    given model is not changed.

    Args:
        model: a trained float classifier.
        train_fn: `train_fn(model)` fine-tunes the thin model in place (make its optimizer
            inside: the parameters are new); None to skip fine-tuning.
        evaluate_fn: `evaluate_fn(model)` -> a dict with 'top1' and 'loss' on held-out data
            (e.g. `lambda m: compressor.evaluate(m, val_loader)`), called for every candidate.
        macs, params, latency, size: budgets as fractions of the dense model's figure (MACs
            of one sample, parameters, latency of a batch of one on the model's device, saved
            bytes); give one or more.
        example_inputs: a batch of inputs, needed for a model compressor did not build.
        min_keep: the smallest fraction of each group's channels that is kept.
        max_accuracy_drop: top-1 points (evaluate_fn's) the final model may lose against the
            dense one; the result is met only within it. A final model at chance (at most
            1.5x 100/classes) is never met.
        recalibration_loader: training batches: each candidate's batch-norm statistics are
            re-estimated on them before it is scored (on a copy), and the final model's after
            train_fn (strongly advised for models with batch norms: a pruned model scored with
            the dense model's statistics scores near chance).
        recalibration_batches: how many of its batches each re-estimation reads.
        channel_multiple: every pruned layer keeps a multiple of this many channels (8 suits
            GPU tensor cores; 1, any count).
        amp: "bf16" or "fp16": latency is timed under autocast in that dtype, as the model
            will run (evaluate_fn and train_fn are yours: give them the same autocast); None,
            fp32.

    Returns:
        A BudgetResult: the model, the achieved fractions, whether every budget (accuracy
        included) is met, the dense and final figures and evaluate_fn's scores of the final
        model.
    """
    targets = _targets(macs=macs, params=params, latency=latency, size=size)
    if max_accuracy_drop is not None and (isinstance(max_accuracy_drop, bool) or not isinstance(
            max_accuracy_drop, (int, float)) or not 0 <= max_accuracy_drop <= 100):
        raise UsageError(f"compress_to_budget: max_accuracy_drop={max_accuracy_drop!r}; give "
                         "the top-1 points the budget may cost, between 0 and 100")
    if isinstance(channel_multiple, bool) or not isinstance(channel_multiple, int) or not (
            1 <= channel_multiple <= 1024):
        raise UsageError(f"compress_to_budget: channel_multiple={channel_multiple!r}; give an "
                         "integer from 1 to 1024 (8 for GPU tensor cores, 1 for any count)")
    if amp is not None and amp not in AMP_DTYPES:
        raise UsageError(f"compress_to_budget: amp={amp!r}; use one of "
                         f"{', '.join(map(repr, AMP_DTYPES))} or None (fp32)")
    score = _recalibrated(_scored(evaluate_fn), recalibration_loader, recalibration_batches)
    if train_fn is not None and not callable(train_fn):
        raise UsageError("compress_to_budget: train_fn is not callable; give a function that "
                         "fine-tunes the model it is given, or None")
    description = ensure_described(model, example_inputs, "compress_to_budget")
    if quantization_kind(description) is not None:
        raise UsageError("compress_to_budget searches a float model, and this one is quantized; "
                         "search first, then quantize")
    dense = copy.deepcopy(model)
    setting = (LatencySetting(device=str(model_device(dense)), precision=Precision(amp=amp))
               if "latency" in targets else None)
    measure, measure_latencies = search_measures(dense, setting)
    search = BudgetSearch(dense, probe_batch(dense, 1),
                          Budget(targets, min_keep=min_keep, channel_multiple=channel_multiple),
                          score, measure, measure_latencies=measure_latencies)
    result = search.run()
    final = copy.deepcopy(dense).train(model.training)
    for group, count, ranking in zip(search.groups, result.removed, search.rankings,
                                     strict=True):
        if count:
            mask_group_filters(final, group, ranking[:count], dict(search.batchnorms))
    thin_in_place(final)
    if train_fn is not None:
        train_fn(final)
    if recalibration_loader is not None:
        recalibrate_batch_norm(final, recalibration_loader, recalibration_batches)
    dense_figures = search.dense_entry()["figures"]
    quantities = tuple(sorted(targets))
    final_figures = measure(final, quantities, dense_figures)
    achieved = {q: final_figures[q] / dense_figures[q] for q in quantities}
    scores = dict(_scored(evaluate_fn)(final))
    drop = float(search.dense_entry()["top1"]) - float(scores["top1"])
    at_chance = collapsed(float(scores["top1"]), description.num_classes)
    met = (all(achieved[q] <= targets[q] for q in targets) and not at_chance
           and (max_accuracy_drop is None or drop <= max_accuracy_drop))
    return BudgetResult(final, targets, achieved, met, {q: dense_figures[q] for q in quantities},
                        final_figures, scores, sum(result.removed), drop, max_accuracy_drop,
                        at_chance)


def _recalibrated(score: EvaluateFn, loader: Iterable[Any] | None, batches: int) -> EvaluateFn:
    """`score`, each model's batch-norm statistics re-estimated on `loader` first (a copy)."""
    if loader is None:
        return score
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
        raise UsageError(f"compress_to_budget: recalibration_batches={batches!r}; give a "
                         "positive number of batches")

    def recalibrated(model: nn.Module) -> Mapping[str, float]:
        work = copy.deepcopy(model)
        recalibrate_batch_norm(work, loader, batches)
        return score(work)

    return recalibrated
