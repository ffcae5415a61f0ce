"""A budget run: search per-group channel counts, prune progressively, thin, fine-tune with
distillation from the dense model, quantize with --qe, and prove every budget was met.

The run starts from given weights (a dense checkpoint, or --pretrained) as a new run. Its
checkpoints carry the search state under `budget`: the cache of every candidate evaluated,
and once chosen, the allocation and the schedule, so `--resume-from` one of them continues
the search, or the fine-tune, where it stopped.
"""

from __future__ import annotations

import copy
import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Subset

from compressor.assembly.setup import RunSetup
from compressor.assembly.state import assemble_checkpoint
from compressor.budget.groups import ChannelGroup
from compressor.budget.measure import LatencySetting, measure_latencies, search_measures
from compressor.budget.schedule import budget_schedule, pruning_epochs, schedule_text
from compressor.budget.search import STATE_VERSION, Budget, BudgetSearch
from compressor.commands.common import (
    evaluation_fn,
    images_note,
    load_run_data,
    name_classes,
)
from compressor.commands.record import open_run
from compressor.commands.train import check_resume_epochs, run_training, start_distillation
from compressor.data import DatasetSplits
from compressor.models.inference import inference_copy
from compressor.quantization.request import QuantizeRequest
from compressor.reports.budget_report import (
    budget_report,
    budget_table,
    plot_pareto,
    unmet_line,
    write_budget_json,
)
from compressor.reports.metrics import model_file_bytes
from compressor.thinning.transform import probe_batch
from compressor.training.checkpoint import save_run_checkpoint
from compressor.training.recalibration import recalibrator
from compressor.utils.atomic_io import atomic_write_text
from compressor.utils.config import (
    BudgetConfig,
    DataConfig,
    DistillationConfig,
    ModelRequest,
    TrainConfig,
)
from compressor.utils.distributed import DistContext, barrier, broadcast_object, rank
from compressor.utils.errors import UsageError
from compressor.utils.precision import Precision

__all__ = ["BudgetRun", "is_budget_run", "run_budget", "SCHEDULE_NAME", "REPORT_NAME",
           "PARETO_NAME"]

LOG = logging.getLogger("compressor")
SCHEDULE_NAME = "budget_schedule.yaml"
REPORT_NAME = "budget.json"
# channels a pruned layer keeps a multiple of on CUDA, by default (tensor-core tiles)
CUDA_CHANNEL_MULTIPLE = 8
PARETO_NAME = "pareto.png"
SAVE_EVERY_S = 30.0  # the search checkpoints its cache at first, then at most this often, and
# at its end: a kill costs at most this much search time
QE_SIZE_FRACTION = 0.25  # int8 weights over float32: the size estimate while searching
# The search scores its probes and candidates on at most this many validation images (a seeded
# subset): its decisions compare candidates with each other, and a pass over a large
# validation split per candidate would cost more than the fine-tune.
SEARCH_VAL_IMAGES = 2000
# the final model's latency is timed this many times as long as each search candidate's
FINAL_TIMING_FACTOR = 3


@dataclass(frozen=True)
class BudgetRun:
    """Everything a budget run needs from the command line, as typed configs."""

    budget: BudgetConfig
    train: TrainConfig
    data: DataConfig
    quantize: QuantizeRequest | None
    output_dir: str
    name: str | None
    arguments: Mapping[str, Any]
    distillation: DistillationConfig | None  # --kd-* given explicitly


def _recorded(setup: RunSetup) -> dict[str, Any] | None:
    state = (setup.checkpoint or {}).get("budget")
    return dict(state) if isinstance(state, Mapping) else None


def is_budget_run(setup: RunSetup, budget: BudgetConfig, training: bool, reset: bool) -> bool:
    """A training command with a budget, or resuming a budget run's checkpoint."""
    return training and (bool(budget.targets) or (_recorded(setup) is not None and not reset))


def _starting_state(run: BudgetRun, setup: RunSetup) -> dict[str, Any] | None:
    """The recorded search state to continue (None for a new budget run)."""
    recorded = None if run.train.reset_optimizer else _recorded(setup)
    if recorded is None:
        return None
    given = dict(run.budget.targets)
    if given and given != dict(recorded.get("targets", {})):
        shown = ", ".join(f"{q} {v:g}" for q, v in sorted(recorded.get("targets", {}).items()))
        raise UsageError(f"{setup.checkpoint_path} continues a budget run with targets {shown};"
                         " repeat them (or drop the --target-* flags), or start a new budget "
                         "run from its weights with --reset-optimizer")
    return recorded


def _teacher(run: BudgetRun, setup: RunSetup) -> dict[str, Any] | None:
    """The distillation teacher as plain values: the dense checkpoint or pretrained arch."""
    if not run.budget.distill:
        return None
    if run.distillation is not None:
        request = run.distillation.teacher
        return {"arch": request.arch, "checkpoint": str(request.checkpoint)
                if request.checkpoint else None, "pretrained": request.pretrained}
    if setup.model.new_layers and setup.checkpoint_path is None:
        raise UsageError(f"the dense model cannot teach: --pretrained built a new "
                         f"{', '.join(setup.model.new_layers)} for this dataset's classes; "
                         "fine-tune it first and give its checkpoint with --resume-from, or "
                         "add --no-kd")
    if setup.checkpoint_path is not None:
        # the arch repeated: a checkpoint of the user's code is rebuilt only where it is named
        return {"arch": setup.arch, "checkpoint": str(setup.checkpoint_path),
                "pretrained": False}
    return {"arch": setup.arch, "checkpoint": None, "pretrained": True}


def _distillation(run: BudgetRun, teacher: Mapping[str, Any] | None
                  ) -> DistillationConfig | None:
    if teacher is None:
        return None
    request = ModelRequest(arch=teacher["arch"], checkpoint=Path(teacher["checkpoint"])
                           if teacher["checkpoint"] else None, pretrained=teacher["pretrained"])
    base = run.distillation or DistillationConfig(teacher=request)
    return replace(base, teacher=request)


def _fine_tuning(setup: RunSetup, state: Mapping[str, Any] | None) -> bool:
    """Whether the checkpoint is one of the fine-tune's epochs (not the search's)."""
    epoch = (setup.checkpoint or {}).get("epoch", -1)
    return state is not None and "schedule" in state and isinstance(epoch, int) and epoch >= 0


class _SearchSaver:
    """Checkpoint the search's cache (rank 0) at most every SAVE_EVERY_S seconds."""

    def __init__(self, model: nn.Module, run_dir: Path | None, record: Mapping[str, Any]
                 ) -> None:
        self.model, self.run_dir, self.record = model, run_dir, record
        self.last = -SAVE_EVERY_S

    def __call__(self, state: dict[str, Any], force: bool = False) -> None:
        now = time.monotonic()
        if self.run_dir is None or (not force and now - self.last < SAVE_EVERY_S):
            return
        self.last = now
        save_run_checkpoint(self.run_dir, assemble_checkpoint(
            self.model, args=self.record, epoch=-1, best_top1=float("-inf"), best_epoch=-1,
            budget=state), False)


def _timed_by_rank0(time_it: Callable[[], Any]) -> Any:
    """What `time_it` measures on rank 0, broadcast: every rank decides on the same timing
    while the others wait (not competing for the CPU)."""
    return broadcast_object(time_it() if rank() == 0 else None)


def _prepare_search(run: BudgetRun, setup: RunSetup, ctx: DistContext, model: nn.Module,
                    data: DatasetSplits, state: dict[str, Any]) -> BudgetSearch:
    """The search over `model`, its groups found (or refused, in one line) before any file is
    written."""
    latency = _latency_setting(state, ctx.device)
    size_scale = QE_SIZE_FRACTION if state.get("quantize") else 1.0
    score = evaluation_fn(_search_subset(data.val, setup.seed), run.train.loader, ctx,
                          desc="search", precision=run.train.precision)
    recalibrate = recalibrator(data.train, run.train, setup.seed, ctx)
    # what the re-estimations cost, continued from a resumed search's record
    spent = {"seconds": 0.0, "candidates": 0, **dict(state.get("recalibration") or {}),
             "batches": recalibrate.batches, "enabled": recalibrate.enabled}

    def validate(candidate: nn.Module) -> Mapping[str, float]:
        # a pruned candidate's running statistics are the dense model's, stale: re-estimated
        # (on a copy, the same batches for every candidate) it is judged as it will be used
        work = copy.deepcopy(candidate)
        done = recalibrate(work, "search", log=False) if recalibrate.enabled else None
        if done is not None:
            spent["seconds"] += done.seconds
            spent["candidates"] += 1
        return score(inference_copy(work))  # frozen while scored: the faster form

    measure, time_together = search_measures(model, latency, size_scale=size_scale,
                                             timed=_timed_by_rank0)
    search = BudgetSearch(model, probe_batch(model, 1), Budget(
        state["targets"], accuracy_drop=state.get("accuracy_drop"),
        channel_multiple=int(state.get("channel_multiple", 1))), validate, measure,
        state=state, measure_latencies=time_together)
    search.state["recalibration"] = spent  # the search's own state: checkpointed with it
    return search


def _search(search: BudgetSearch, run: BudgetRun, ctx: DistContext, model: nn.Module,
            data: DatasetSplits, saver: _SearchSaver) -> dict[str, Any]:
    """Run (or finish) the search; returns the state with `chosen` and the dense figures."""
    started = time.perf_counter()
    search.on_evaluation = saver
    result = search.run()
    state = search.state
    state["search_seconds"] = float(state.get("search_seconds", 0.0)) + (
        time.perf_counter() - started)
    spent = state.get("recalibration")
    if spent and spent.get("candidates"):
        LOG.info("budget search: batch-norm statistics re-estimated for each of %d candidates "
                 "on %d training batches, %.1fs in all", spent["candidates"], spent["batches"],
                 spent["seconds"])
    if "dense_test_top1" not in state:  # for the report, not the search: timed apart
        precision = run.train.precision
        test = evaluation_fn(data.test, run.train.loader, ctx, precision=precision)(model)
        state["dense_test_top1"] = float(test["top1"])
        validation = evaluation_fn(data.val, run.train.loader, ctx, desc="validate",
                                   precision=precision)(model)
        state["dense_val_top1"] = float(validation["top1"])  # the floor's reference
    state["dense_figures"] = search.dense_entry()["figures"]
    state["search_met"] = result.met
    quantities = set(state["targets"])
    for entry in state["evaluations"].values():
        if quantities <= set(entry["figures"]):  # probes are timed for latency alone
            entry["ratios"] = search.ratios(entry)
    saver(state, force=True)
    return state


def _search_subset(dataset: Any, seed: int) -> Any:
    """At most SEARCH_VAL_IMAGES of the validation split, drawn with the run's seed."""
    if len(dataset) <= SEARCH_VAL_IMAGES:
        return dataset
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(len(dataset), generator=generator)[:SEARCH_VAL_IMAGES]
    return Subset(dataset, sorted(chosen.tolist()))


def _latency_setting(state: Mapping[str, Any], device: Any) -> LatencySetting | None:
    """How the run times latency (its recorded batch, threads and precision) on `device`; None
    without a latency budget."""
    recorded = state.get("latency")
    if recorded is None:
        return None
    return LatencySetting(batch=int(recorded["batch"]), threads=int(recorded["threads"]),
                          device=str(device), precision=_precision(state))


def _precision(state: Mapping[str, Any]) -> Precision:
    """The precision the run trains, scores and times in (fp32 for a search recorded before
    one was)."""
    return Precision.from_record(state.get("precision"))


def _speed(state: Mapping[str, Any], model: nn.Module, final_figures: Mapping[str, float]
           ) -> dict[str, Any]:
    """How fast the final model runs against the dense one on the run's device: the latency
    budget's own timing, or (without one) the two timed in alternation at batch 1."""
    device = next(model.parameters()).device
    if "latency" in final_figures:
        setting = _latency_setting(state, device)
        assert setting is not None
        ratio = float(final_figures["latency"]) / float(state["dense_figures"]["latency"])
        dense_seconds = float(state["dense_figures"]["latency"])
    else:
        setting = LatencySetting(device=str(device), precision=_precision(state))
        dense = _rebuild_dense(state["dense_source"], device)
        seconds, dense_seconds = _timed_by_rank0(
            lambda: measure_latencies([model], setting, dense))
        ratio = float(seconds[0]) / float(dense_seconds)
    return {"device": str(device), "batch": setting.batch, "threads": setting.threads,
            "dense_seconds": float(dense_seconds), "final_seconds": ratio * float(dense_seconds),
            "ratio": ratio, "faster": ratio < 1.0}


def channel_multiple(budget: BudgetConfig, device: Any) -> int:
    """--channel-multiple, else 8 on CUDA (tensor-core tiles) and 1 elsewhere."""
    if budget.channel_multiple is not None:
        return budget.channel_multiple
    return CUDA_CHANNEL_MULTIPLE if str(device).startswith("cuda") else 1


def _new_state(run: BudgetRun, setup: RunSetup, ctx: DistContext) -> dict[str, Any]:
    state: dict[str, Any] = {"version": STATE_VERSION, "targets": dict(run.budget.targets),
                             "evaluations": {}, "quantize": run.quantize is not None,
                             "max_drop": run.budget.max_drop, "epochs": run.train.epochs,
                             "accuracy_drop": run.budget.accuracy_drop,
                             "channel_multiple": channel_multiple(run.budget, ctx.device),
                             "precision": run.train.precision.record(),
                             "teacher": _teacher(run, setup),
                             "dense_source": _dense_source(setup)}
    if "latency" in run.budget.targets:
        state["latency"] = {"batch": run.budget.latency_batch,
                            "threads": run.budget.latency_threads, "device": str(ctx.device)}
    return state


def _write_schedule(state: dict[str, Any], epochs: int, run_dir: Path, write: bool) -> Path:
    """Put the chosen allocation as a schedule in the state and (rank 0) in the run directory."""
    groups = [ChannelGroup.from_state(g) for g in state["groups"]]
    schedule = budget_schedule(groups, state["chosen"], epochs)
    targets = ", ".join(f"{q} {v:g}" for q, v in sorted(state["targets"].items()))
    aim = f"targets: {targets} of the dense model"
    if state.get("accuracy_drop") is not None:
        aim = (f"{', '.join(sorted(state['targets']))} minimized within "
               f"{state['accuracy_drop']:g} validation top-1 points")
    text = schedule_text(schedule, [
        f"Written by a compressor budget run ({aim}).",
        f"Prunes over the first {pruning_epochs(epochs)} of {epochs} epochs, then thins; "
        "rerun with --compress THIS_FILE."])
    state["schedule"] = text
    path = run_dir / SCHEDULE_NAME
    if write:
        atomic_write_text(path, text)
    barrier()
    return path


def run_budget(run: BudgetRun, setup: RunSetup, ctx: DistContext, model: nn.Module,
               started: float) -> int:
    """Run (or continue) a budget run; 0 when every budget holds, 1 when one is missed."""
    state = _starting_state(run, setup)
    fine_tuning = _fine_tuning(setup, state)
    if state is None:
        state = _new_state(run, setup, ctx)
    config = replace(run.train, compress=None, reset_optimizer=not fine_tuning,
                     distillation=_distillation(run, state.get("teacher")))
    check_resume_epochs(config, setup)
    data = load_run_data(setup, run.data, training=True)
    assert isinstance(data, DatasetSplits)
    name_classes(model, data.class_names)
    if data.val is None:
        raise UsageError("a budget run searches on the validation split and there is none; "
                         "pass --vs 0.1 (or another fraction above 0)")
    if run.quantize is not None:
        from compressor.commands.quantize import check_quantization

        check_quantization(model, run.quantize, str(setup.checkpoint_path or setup.arch))
    distillation = start_distillation(config, setup, model, ctx)
    search = None if "chosen" in state else _prepare_search(run, setup, ctx, model, data, state)
    resume_dir = setup.checkpoint_path.parent if setup.checkpoint_path and _recorded(
        setup) is not None else None
    with open_run(setup, ctx, run.arguments, data.class_names, output_dir=run.output_dir,
                  name=run.name, resume_dir=resume_dir, notes=(images_note(setup, run.data.root),),
                  started=started) as opened:
        run_dir, writer_dir, record = opened.run_dir, opened.writer_dir, opened.record
        if search is not None:
            state = _search(search, run, ctx, model, data, _SearchSaver(model, writer_dir, record))
        schedule_path = _write_schedule(state, config.epochs, run_dir, ctx.is_main)
        if ctx.is_main and not fine_tuning:
            plot_pareto(list(state["evaluations"].values()), state["targets"], state["chosen"],
                        run_dir / PARETO_NAME)
        tuned_started = time.perf_counter()
        results = run_training(setup, ctx, model, data, writer_dir,
                               replace(config, compress=schedule_path), record, distillation,
                               extra={"budget": state}, use_best=True)
        validate = evaluation_fn(data.val, run.train.loader, ctx, desc="validate",
                                 precision=run.train.precision)
        scores: dict[str, Any] = {"val_top1": float(validate(model)["top1"]),
                                  "test_top1": float(results["top1"]),
                                  "model_epoch": results["model_epoch"],
                                  "num_classes": setup.description.num_classes}
        results, final_model = _quantize_last(run, setup, ctx, model, data, writer_dir, record,
                                              results)
        if final_model is not model:  # quantized: computed in fp32 (int8 kernels, or simulated)
            validate = evaluation_fn(data.val, run.train.loader, ctx, desc="validate")
            scores["int8_val_top1"] = float(validate(final_model)["top1"])
            scores["int8_test_top1"] = float(results.get("quantized_top1", results["top1"]))
        final_figures = _final_figures(state, model, results)
        fine_tune = {"epochs": config.epochs, "distillation": distillation is not None,
                     "seconds": time.perf_counter() - tuned_started,
                     "quantized": run.quantize is not None,
                     "model_epoch": results["model_epoch"]}
        report = budget_report(state, model, final_figures, scores, setup.arch, setup.dataset,
                               fine_tune, speed=_speed(state, model, final_figures))
        # the other ranks write nothing: no model figures (seconds) for them
        results = opened.finish(model, {**results, "budget_met": report["met"]})
        if ctx.is_main:
            write_budget_json(run_dir / REPORT_NAME, report)
            print(budget_table(report))
    if not report["met"]:
        if ctx.is_main:
            sys.stderr.write(f"compress_classifier.py: {unmet_line(report, run_dir)}\n")
        return 1
    return 0


def _quantize_last(run: BudgetRun, setup: RunSetup, ctx: DistContext, model: nn.Module,
                   data: DatasetSplits, run_dir: Path | None, record: Mapping[str, Any],
                   results: dict[str, Any]) -> tuple[dict[str, Any], nn.Module]:
    """With --qe: post-training quantize the fine-tuned model (calibrating on training data)."""
    if run.quantize is None:
        return results, model
    from compressor.commands.common import calibration_source
    from compressor.commands.quantize import run_quantization

    source = calibration_source(setup, run.data, data.test, run.quantize.calibration_split)
    dataset = source()
    test_fn = evaluation_fn(data.test, run.train.loader, ctx)
    quantized, evaluated = run_quantization(model, run.quantize, lambda: dataset,
                                            run.train.loader, setup, run_dir, record, test_fn)
    return {**results, **{k: v for k, v in quantized.items() if k.startswith("quantiz")}}, \
        evaluated


def _dense_source(setup: RunSetup) -> dict[str, Any]:
    """Where the dense model comes from (to time the final model beside it)."""
    spec = setup.description.input_spec
    return {"checkpoint": str(setup.checkpoint_path) if setup.checkpoint_path else None,
            "arch": setup.arch, "dataset": setup.dataset, "pretrained": setup.model.pretrained,
            "num_classes": setup.description.num_classes,
            "input_spec": {"input_size": list(spec.input_size), "mean": list(spec.mean),
                           "std": list(spec.std)},
            "pretrained_file": str(setup.model.pretrained_file)
            if setup.model.pretrained_file else None}


def _rebuild_dense(source: Mapping[str, Any], device: Any) -> nn.Module:
    from compressor.assembly.setup import build_resolved_model, resolve_model

    if source["checkpoint"]:  # the arch repeated: a checkpoint of the user's code needs it
        request = ModelRequest(arch=source["arch"], checkpoint=Path(source["checkpoint"]),
                               dataset=source["dataset"])
    else:  # budget runs recorded before the classes and input spec were: the arch's own
        spec = source.get("input_spec") or {}
        request = ModelRequest(
            arch=source["arch"], dataset=source["dataset"], pretrained=True,
            num_classes=source.get("num_classes"),
            input_size=tuple(spec["input_size"]) if "input_size" in spec else None,
            mean=tuple(spec["mean"]) if "mean" in spec else None,
            std=tuple(spec["std"]) if "std" in spec else None,
            pretrained_file=Path(source["pretrained_file"])
            if source.get("pretrained_file") else None)
    return build_resolved_model(resolve_model(request)).to(device).eval()


def _final_figures(state: Mapping[str, Any], model: nn.Module, results: Mapping[str, Any]
                   ) -> dict[str, float]:
    """The final model's budgeted figures; latency timed in alternation with the dense model,
    FINAL_TIMING_FACTOR times as long as a search timing (the evidence of budget.json)."""
    device = next(model.parameters()).device
    latency = _latency_setting(state, device)
    dense, dense_figures = model, None  # the dense model is needed only to time beside it
    if latency is not None:
        latency = replace(latency, repeats=FINAL_TIMING_FACTOR * latency.repeats,
                          min_seconds=FINAL_TIMING_FACTOR * latency.min_seconds)
        dense = _rebuild_dense(state["dense_source"], device)
        dense_figures = {"latency": float(state["dense_figures"]["latency"])}
    measure, _ = search_measures(dense, latency, timed=_timed_by_rank0)
    measured = measure(model, tuple(sorted(state["targets"])), dense_figures)
    if "size" in measured:
        quantized_size = results.get("quantized_model_file_size")
        measured["size"] = float(quantized_size if quantized_size is not None
                                 else model_file_bytes(model))
    return measured
