"""A parsed command line, run: summary | dry-run | export | budget | train | evaluate,
quantize, sensitivity, thinnify.

argparse ends in this package: the parsed command line becomes the small typed configs of
compressor.utils.config (compressor.cli.configs), and one command module runs on them. This
module imports torch and the commands; compressor.cli.main imports it only once the command
line has parsed (so --help, --version and a refused flag cost no torch import).
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from compressor.assembly.recipes import apply_transform
from compressor.assembly.setup import RunSetup, build_resolved_model, resolve_run
from compressor.cli.budget_args import budget_config, budget_only_flags
from compressor.cli.checks import quantization_requested
from compressor.cli.configs import (
    args_record,
    data_config,
    distillation_config,
    is_training,
    model_request,
    optimizer_config,
    quantize_config,
    train_config,
)
from compressor.cli.results_table import dataset_label, results_table
from compressor.commands.budget import BudgetRun, is_budget_run, run_budget
from compressor.commands.common import (
    calibration_source,
    evaluation_fn,
    images_note,
    load_run_data,
    model_facts,
    name_classes,
    run_record,
)
from compressor.commands.evaluate import confusion_results, evaluate_model
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
from compressor.training.run_dir import (
    choose_run_dir,
    logging_to,
    write_args_yaml,
    write_results_json,
)
from compressor.utils.config import TrainConfig
from compressor.utils.distributed import DistContext, barrier, init_distributed
from compressor.utils.errors import UsageError

__all__ = ["run"]


def _configure_determinism(deterministic: bool) -> None:
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    else:
        torch.backends.cudnn.benchmark = True


def _refuse_quantized(args: argparse.Namespace, setup: RunSetup, training: bool) -> None:
    """A post-training quantized checkpoint is evaluated or converted, never trained or thinned."""
    if quantization_kind(setup.description) != "post_train":
        return
    mode = "training" if training else next(
        (flag for flag, on in (("--thinnify", args.thinnify), ("--sense", args.sense)) if on),
        None)
    if mode is not None:
        raise UsageError(f"{setup.checkpoint_path} is post-training quantized, and {mode} needs "
                         "a float model; use the float checkpoint it came from (quantize last)")


def _check_before_writing(args: argparse.Namespace, setup: RunSetup, model: nn.Module,
                          ctx: DistContext, config: TrainConfig, training: bool) -> Any:
    """Everything that can refuse the run does so before any file is written; returns the
    distillation of a training run (None without --kd-*)."""
    _refuse_quantized(args, setup, training)
    distillation = None
    if training:
        check_resume_epochs(config, setup)
        check_resume_precision(config, setup)
        check_head_lr(config, setup)
        if config.reports.tensorboard:
            from compressor.reports import require_tensorboard

            require_tensorboard()
        distillation = start_distillation(config, setup, model, ctx)
    if quantization_requested(args):
        from compressor.commands.quantize import check_quantization

        check_quantization(model, quantize_config(args), str(setup.checkpoint_path or setup.arch))
    return distillation


def run(args: argparse.Namespace) -> int:
    """Execute one parsed command line."""
    started = time.perf_counter()
    request = model_request(args)
    if args.memory_efficient == AUTO:  # chosen by measuring, once the model is built
        request = replace(request, memory_efficient=None)
    setup = resolve_run(request, seed=args.seed, deterministic=args.deterministic)
    _configure_determinism(args.deterministic)
    ctx = init_distributed(args.cpu, args.gpus)
    seed_everything(setup.seed)  # the same initial weights on every rank and in every rerun
    model, placement_note = _placed(build_resolved_model(setup.model), ctx)
    if args.summary:
        from compressor.commands.summary import run_summary

        return run_summary(model, args.summary)
    if args.dry_run:
        from compressor.commands.dry_run import run_dry_run

        return run_dry_run(model, Path(args.compress), optimizer_config(args), args.epochs)
    training = is_training(args)
    config = train_config(args)
    budget = budget_config(args)
    if is_budget_run(setup, budget, training, args.reset_optimizer):
        if args.memory_efficient == AUTO:
            raise UsageError("--memory-efficient auto measures one model, and a budget run "
                             "changes it as it searches; name a variant (--memory-efficient "
                             "recompute) or drop the flag")
        _refuse_quantized(args, setup, training)
        return run_budget(BudgetRun(
            budget, config, data_config(args, training),
            quantize_config(args) if quantization_requested(args) else None, args.output_dir,
            args.name, args_record(args), distillation_config(args)), setup, ctx, model, started)
    extra = budget_only_flags(args)
    if extra:  # resuming a checkpoint that is not a budget run's: the flag would do nothing
        raise UsageError(f"{extra[0]} belongs to a budget run, and {setup.checkpoint_path} is "
                         f"not one; add a --target-* budget or drop {extra[0]}")
    distillation = _check_before_writing(args, setup, model, ctx, config, training)
    memory_note = None
    if args.memory_efficient == AUTO:
        setup, model, memory_note = _fit_memory_budget(args, setup, model)
    if args.export_onnx is not None:
        from compressor.commands.export import run_export

        return run_export(setup, ctx, model, target=args.export_onnx,
                          data=data_config(args, training=False), batch_size=args.batch_size,
                          output_dir=args.output_dir, name=args.name,
                          arguments=args_record(args), started=started)
    data = load_run_data(setup, data_config(args, training), training)
    name_classes(model, data.class_names)
    size_note = images_note(setup, args.data)
    calibration = None if training else _calibration(args, setup, model, data)
    recalibration = None if training else _recalibration(args, setup, ctx, data)
    resume_dir = setup.checkpoint_path.parent if setup.checkpoint_path and training else None
    run_dir = choose_run_dir(args.output_dir, args.name, setup.arch, resume_dir)
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    barrier()
    record = run_record(args_record(args), setup, data.class_names)
    with logging_to(run_dir if ctx.is_main else None, ctx.is_main) as log:
        log.info("run directory %s", run_dir)
        if setup.model.pretrained_source is not None:
            log.info("%s", setup.model.pretrained_source.describe())
        for note in (memory_note, placement_note, size_note):
            if note is not None:
                log.info("%s", note)
        if ctx.is_main:
            write_args_yaml(run_dir, record)
        writer_dir = run_dir if ctx.is_main else None
        if training:
            results = run_training(setup, ctx, model, data, writer_dir, config, record,
                                   distillation)
        else:
            assert isinstance(data, EvaluationData)
            if recalibration is not None:
                recalibration(model, "--bn-recalibrate, before evaluating")
            results, model = _post_training(args, setup, ctx, model, data, writer_dir, config,
                                            record, calibration)
        if config.reports.confusion:
            results.update(confusion_results(ctx, model, data, writer_dir, config.loader))
        if ctx.is_main:  # the other ranks write nothing: no model figures (seconds) for them
            named = {"class_names": list(data.class_names)} if data.class_names else {}
            results = {**model_facts(model, run_dir), **named, **results,
                       "time": time.perf_counter() - started}
            write_results_json(run_dir, results)
            print(results_table(results, dataset_label(results["dataset"], args.data)))
    return 0


def _placed(model: nn.Module, ctx: DistContext) -> tuple[nn.Module, str | None]:
    """The built model on the run's device; one running int8 kernels stays on the CPU (with
    the line that says so, logged once the run's log is open)."""
    if not isinstance(unwrap_model(model), Int8Model):
        return model.to(ctx.device), None
    return model, int8_placement(model, ctx.device, log=False)


def _fit_memory_budget(args: argparse.Namespace, setup: RunSetup, model: nn.Module
                       ) -> tuple[RunSetup, nn.Module, str]:
    """--memory-efficient auto: measure, choose and record the variant like a named one (a
    checkpoint's recorded variant is kept, not measured again); returns the log line too."""
    recorded = setup.description.recipe(MEMORY_EFFICIENT)
    if recorded is not None:
        return setup, model, (f"memory-efficient auto: {variant_label(recorded)}, as "
                              f"{setup.checkpoint_path} records (not measured again)")
    weights_from = next((flag for flag, on in (
        ("--pretrained", setup.model.pretrained), ("--resume-from", setup.checkpoint is not None),
        ("--exp-load-weights-from", setup.model.load_weights_from is not None)) if on), None)
    choice = fit_memory_budget(model, setup.model.arch_spec, args.batch_size,
                               round(args.memory_budget * 2**30),
                               optimizer_config=optimizer_config(args), weights_from=weights_from)
    if choice.recipe is not None:
        model = apply_transform(model, MEMORY_EFFICIENT, choice.recipe)
        setup = replace(setup, model=replace(setup.model, description=description_of(model)))
    return setup, model, choice.describe()


def _recalibration(args: argparse.Namespace, setup: RunSetup, ctx: DistContext,
                   data: EvaluationData) -> Recalibrator | None:
    """-e with --bn-recalibrate N: the re-estimation on the training split (with evaluation
    transforms), read now, before any file is written."""
    if not args.bn_recalibrate:
        return None
    source = calibration_source(
        setup, data_config(args, training=False), data.test, "train",
        fix="--bn-recalibrate reads training images: give the dataset with its training split, "
            "or drop --bn-recalibrate")
    return recalibrator(source(), train_config(args), setup.seed, ctx)


def _calibration(args: argparse.Namespace, setup: RunSetup, model: nn.Module,
                 data: EvaluationData) -> Any:
    """What quantization calibrates on (None without --qe*): the training split is read now,
    before any file is written, where statistics will be collected."""
    if not quantization_requested(args):
        return None
    from compressor.commands.quantize import needs_calibration

    quantize = quantize_config(args)
    source = calibration_source(setup, data_config(args, training=False), data.test,
                                quantize.calibration_split)
    if not needs_calibration(model, quantize):
        return source  # never called
    dataset = source()
    return lambda: dataset


def _post_training(args: argparse.Namespace, setup: RunSetup, ctx: DistContext,
                   model: nn.Module, data: EvaluationData, run_dir: Path | None,
                   config: TrainConfig, record: dict[str, Any], calibration: Any
                   ) -> tuple[dict[str, Any], nn.Module]:
    """Evaluate (quantized or not), analyse sensitivity or thin a model on the test split;
    returns the results and the model they describe."""
    evaluate_fn = evaluation_fn(data.test, config.loader, ctx)
    if quantization_requested(args):
        from compressor.commands.quantize import run_quantization

        assert calibration is not None
        return run_quantization(model, quantize_config(args), calibration, config.loader, setup,
                                run_dir, record, evaluate_fn)
    if args.thinnify:
        from compressor.commands.thinnify import thinnify

        return thinnify(model, evaluate_fn, setup.checkpoint, run_dir, config.optimizer,
                        record), model
    if args.sense:
        from compressor.commands.sensitivity import run_sensitivity_analysis

        run_sensitivity_analysis(model, evaluate_fn, args.sense, tuple(args.sense_range),
                                 run_dir)
    return evaluate_model(setup, model, evaluate_fn), model
