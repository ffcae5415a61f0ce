"""A RunRequest, run: the model resolved and built, its command looked up in one table, the
command's check() (every refusal, before any file is written) and its execute().

The commands: summary | dry-run | budget | export | train | quantize | thinnify | sensitivity
| evaluate. This module imports torch and the commands; compressor.cli.main imports it only
once the command line has parsed (so --help, --version and a refused flag cost no torch).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from compressor.assembly.recipes import apply_transform
from compressor.assembly.setup import RunSetup, build_resolved_model, resolve_run
from compressor.cli.configs import run_request
from compressor.cli.request import RunRequest
from compressor.cli.results_table import dataset_label, results_table
from compressor.commands.budget_run import BudgetRun, is_budget_run, run_budget
from compressor.commands.common import (
    calibration_source,
    evaluation_fn,
    images_note,
    load_run_data,
    name_classes,
)
from compressor.commands.evaluate import confusion_results, evaluate_model
from compressor.commands.record import open_run
from compressor.commands.train import (
    check_head_lr,
    check_resume_epochs,
    check_resume_precision,
    run_training,
    start_distillation,
)
from compressor.data import EvaluationData
from compressor.memory import AUTO, fit_memory_budget, variant_label
from compressor.memory.recipe import MEMORY_EFFICIENT
from compressor.models.description import description_of, unwrap_model
from compressor.quantization.int8.convert import Int8Model
from compressor.quantization.int8.placement import int8_placement
from compressor.quantization.recipe import quantization_kind
from compressor.training.dataloaders import seed_everything
from compressor.training.recalibration import Recalibrator, recalibrator
from compressor.utils.distributed import DistContext, init_distributed
from compressor.utils.errors import UsageError

__all__ = ["run", "execute", "Run", "RunResult", "Command", "COMMANDS", "command_for"]


@dataclass
class Run:
    """A request with its model resolved: what every command's check and execute read."""

    request: RunRequest
    setup: RunSetup
    ctx: DistContext
    model: nn.Module
    started: float
    notes: list[str]  # lines for the run's log, once it is open
    distillation: Any = None  # the teacher and loss of a training run (check() starts it)


@dataclass(frozen=True)
class RunResult:
    """What a command returns: its exit status, and the results it wrote (if any)."""

    status: int
    results: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Command:
    """One thing a command line can do: its refusals, then its work."""

    name: str
    check: Callable[[Run], None]
    execute: Callable[[Run], RunResult]


def _configure_determinism(deterministic: bool) -> None:
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    else:
        torch.backends.cudnn.benchmark = True


def _placed(model: nn.Module, ctx: DistContext) -> tuple[nn.Module, str | None]:
    """The built model on the run's device; one running int8 kernels stays on the CPU (with
    the line that says so, logged once the run's log is open)."""
    if not isinstance(unwrap_model(model), Int8Model):
        return model.to(ctx.device), None
    return model, int8_placement(model, ctx.device, log=False)


# -- checks -----------------------------------------------------------------------------------
def _nothing(run: Run) -> None:
    """A command that refuses nothing of its own."""


def _refuse_quantized(run: Run) -> None:
    """A post-training quantized checkpoint is evaluated or converted, never trained or thinned."""
    if quantization_kind(run.setup.description) != "post_train":
        return
    action = run.request.action
    mode = "training" if run.request.training else next(
        (flag for flag, on in (("--thinnify", action.thinnify), ("--sense", action.sense)) if on),
        None)
    if mode is not None:
        raise UsageError(f"{run.setup.checkpoint_path} is post-training quantized, and {mode} "
                         "needs a float model; use the float checkpoint it came from (quantize "
                         "last)")


def _refuse_budget_flags(run: Run) -> None:
    """A flag only a budget run reads, on a command that is not one: it would do nothing."""
    extra = run.request.budget_only_flags
    if extra:
        raise UsageError(f"{extra[0]} belongs to a budget run, and {run.setup.checkpoint_path} "
                         f"is not one; add a --target-* budget or drop {extra[0]}")


def _check_quantization(run: Run) -> None:
    if run.request.quantize is not None:
        from compressor.commands.quantize import check_quantization

        check_quantization(run.model, run.request.quantize,
                           str(run.setup.checkpoint_path or run.setup.arch))


def _check_budget(run: Run) -> None:
    if run.request.memory.variant == AUTO:
        raise UsageError("--memory-efficient auto measures one model, and a budget run "
                         "changes it as it searches; name a variant (--memory-efficient "
                         "recompute) or drop the flag")
    _refuse_quantized(run)


def _check_training(run: Run) -> None:
    _refuse_budget_flags(run)
    _refuse_quantized(run)
    config, setup = run.request.train, run.setup
    check_resume_epochs(config, setup)
    check_resume_precision(config, setup)
    check_head_lr(config, setup)
    if config.reports.tensorboard:
        from compressor.reports import require_tensorboard

        require_tensorboard()
    run.distillation = start_distillation(config, setup, run.model, run.ctx)
    _check_quantization(run)


def _check_post_training(run: Run) -> None:
    _refuse_budget_flags(run)
    _refuse_quantized(run)
    _check_quantization(run)


# -- the memory variant auto chooses, before data is read ---------------------------------------
def _fit_memory_budget(run: Run) -> None:
    """--memory-efficient auto: measure, choose and record the variant like a named one (a
    checkpoint's recorded variant is kept, not measured again); its line goes to the log."""
    if run.request.memory.variant != AUTO:
        return
    setup, model = run.setup, run.model
    recorded = setup.description.recipe(MEMORY_EFFICIENT)
    if recorded is not None:
        run.notes.append(f"memory-efficient auto: {variant_label(recorded)}, as "
                         f"{setup.checkpoint_path} records (not measured again)")
        return
    weights_from = next((flag for flag, on in (
        ("--pretrained", setup.model.pretrained), ("--resume-from", setup.checkpoint is not None),
        ("--exp-load-weights-from", setup.model.load_weights_from is not None)) if on), None)
    choice = fit_memory_budget(model, setup.model.arch_spec, run.request.train.loader.batch_size,
                               round((run.request.memory.budget_gib or 0.0) * 2**30),
                               optimizer_config=run.request.optimizer, weights_from=weights_from)
    if choice.recipe is not None:
        run.model = apply_transform(model, MEMORY_EFFICIENT, choice.recipe)
        run.setup = replace(setup, model=replace(setup.model,
                                                 description=description_of(run.model)))
    run.notes.append(choice.describe())


# -- executes -----------------------------------------------------------------------------------
def _summary(run: Run) -> RunResult:
    from compressor.commands.summary import run_summary

    return RunResult(run_summary(run.model, run.request.action.summary))


def _dry_run(run: Run) -> RunResult:
    from compressor.commands.dry_run import run_dry_run

    assert run.request.action.dry_run is not None
    return RunResult(run_dry_run(run.model, run.request.action.dry_run, run.request.optimizer,
                                 run.request.train.epochs))


def _budget(run: Run) -> RunResult:
    request = run.request
    budget_run = BudgetRun(request.budget, request.train, request.data, request.quantize,
                           request.run.output_dir, request.run.name, request.arguments,
                           request.distillation)
    return RunResult(run_budget(budget_run, run.setup, run.ctx, run.model, run.started))


def _export(run: Run) -> RunResult:
    from compressor.commands.export import run_export

    _fit_memory_budget(run)
    request = run.request
    assert request.action.export_onnx is not None
    return RunResult(run_export(run.setup, run.ctx, run.model, target=request.action.export_onnx,
                                data=request.eval_data, batch_size=request.train.loader.batch_size,
                                output_dir=request.run.output_dir, name=request.run.name,
                                arguments=request.arguments, started=run.started))


def _recalibration(run: Run, data: EvaluationData) -> Recalibrator | None:
    """-e with --bn-recalibrate N: the re-estimation on the training split (with evaluation
    transforms), read now, before any file is written."""
    if not run.request.action.bn_recalibrate:
        return None
    source = calibration_source(
        run.setup, run.request.eval_data, data.test, "train",
        fix="--bn-recalibrate reads training images: give the dataset with its training split, "
            "or drop --bn-recalibrate")
    return recalibrator(source(), run.request.train, run.setup.seed, run.ctx)


def _calibration(run: Run, data: EvaluationData) -> Any:
    """What quantization calibrates on (None without --qe*): the training split is read now,
    before any file is written, where statistics will be collected."""
    quantize = run.request.quantize
    if quantize is None:
        return None
    from compressor.commands.quantize import needs_calibration

    source = calibration_source(run.setup, run.request.eval_data, data.test,
                                quantize.calibration_split)
    if not needs_calibration(run.model, quantize):
        return source  # never called
    dataset = source()
    return lambda: dataset


def _post_training(run: Run, data: EvaluationData, run_dir: Any, record: dict[str, Any],
                   calibration: Any) -> tuple[dict[str, Any], nn.Module]:
    """Evaluate (quantized or not), analyse sensitivity or thin a model on the test split;
    returns the results and the model they describe."""
    request, setup, model = run.request, run.setup, run.model
    config = request.train
    # a quantized model computes in fp32 (int8 kernels, or fake quantization): no autocast
    evaluate_fn = evaluation_fn(data.test, config.loader, run.ctx, precision=None
                                if request.quantize is not None else config.precision)
    if request.quantize is not None:
        from compressor.commands.quantize import run_quantization

        assert calibration is not None
        return run_quantization(model, request.quantize, calibration, config.loader, setup,
                                run_dir, record, evaluate_fn)
    if request.action.thinnify:
        from compressor.commands.thinnify import thinnify

        return thinnify(model, evaluate_fn, setup.checkpoint, run_dir, config.optimizer,
                        record), model
    if request.action.sense:
        from compressor.commands.sensitivity import run_sensitivity_analysis

        run_sensitivity_analysis(model, evaluate_fn, request.action.sense,
                                 request.action.sense_range, run_dir)
    return evaluate_model(setup, model, evaluate_fn), model


def _recorded_run(run: Run) -> RunResult:
    """A training or evaluating run: its data read and every source it needs opened before
    anything is written; then its run directory, log, args.yaml, results.json and table."""
    _fit_memory_budget(run)
    request, setup, ctx = run.request, run.setup, run.ctx
    training = request.training
    data = load_run_data(setup, request.data, training)
    name_classes(run.model, data.class_names)
    size_note = images_note(setup, request.run.data_dir)
    calibration = None if training else _calibration(run, data)
    recalibration = None if training else _recalibration(run, data)
    resume_dir = setup.checkpoint_path.parent if setup.checkpoint_path and training else None
    config, model = request.train, run.model
    with open_run(setup, ctx, request.arguments, data.class_names,
                  output_dir=request.run.output_dir, name=request.run.name,
                  resume_dir=resume_dir, notes=(*run.notes, size_note),
                  started=run.started) as opened:
        writer_dir, record = opened.writer_dir, opened.record
        if training:
            results = run_training(setup, ctx, model, data, writer_dir, config, record,
                                   run.distillation)
        else:
            assert isinstance(data, EvaluationData)
            if recalibration is not None:
                recalibration(model, "--bn-recalibrate, before evaluating")
            results, model = _post_training(run, data, writer_dir, record, calibration)
        if config.reports.confusion:
            results.update(confusion_results(ctx, model, data, writer_dir, config.loader))
        # the other ranks write nothing: no model figures (seconds) for them
        named = {"class_names": list(data.class_names)} if data.class_names else {}
        results = opened.finish(model, results, first=named)
        if ctx.is_main:
            print(results_table(results, dataset_label(results["dataset"],
                                                        request.run.data_dir)))
    return RunResult(0, results)


# -- the table ------------------------------------------------------------------------------------
COMMANDS: Mapping[str, Command] = {command.name: command for command in (
    Command("summary", _nothing, _summary),
    Command("dry-run", _nothing, _dry_run),
    Command("budget", _check_budget, _budget),
    Command("export", _check_post_training, _export),
    Command("train", _check_training, _recorded_run),
    Command("quantize", _check_post_training, _recorded_run),
    Command("thinnify", _check_post_training, _recorded_run),
    Command("sensitivity", _check_post_training, _recorded_run),
    Command("evaluate", _check_post_training, _recorded_run),
)}


def command_for(request: RunRequest, setup: RunSetup) -> Command:
    """The command a request asks for (a budget run's checkpoint continues its budget run)."""
    action = request.action
    if action.summary:
        name = "summary"
    elif action.dry_run is not None:
        name = "dry-run"
    elif is_budget_run(setup, request.budget, request.training,
                       request.train.reset_optimizer):
        name = "budget"
    elif action.export_onnx is not None:
        name = "export"
    elif request.training:
        name = "train"
    elif request.quantize is not None:
        name = "quantize"
    elif action.thinnify:
        name = "thinnify"
    elif action.sense:
        name = "sensitivity"
    else:
        name = "evaluate"
    return COMMANDS[name]


def execute(request: RunRequest) -> RunResult:
    """Resolve and build the request's model, then check and execute its command."""
    started = time.perf_counter()
    model_request = request.model
    if request.memory.variant == AUTO:  # chosen by measuring, once the model is built
        model_request = replace(model_request, memory_efficient=None)
    setup = resolve_run(model_request, seed=request.run.seed,
                        deterministic=request.run.deterministic)
    _configure_determinism(request.run.deterministic)
    gpus = list(request.run.gpus) if request.run.gpus is not None else None
    ctx = init_distributed(request.run.cpu, gpus)
    seed_everything(setup.seed)  # the same initial weights on every rank and in every rerun
    model, placement_note = _placed(build_resolved_model(setup.model), ctx)
    notes = [placement_note] if placement_note is not None else []
    run = Run(request, setup, ctx, model, started, notes)
    command = command_for(request, setup)
    command.check(run)
    return command.execute(run)


def run(args: argparse.Namespace) -> int:
    """Execute one parsed command line; returns its exit status."""
    return execute(run_request(args)).status
