"""Dispatch: summary | dry-run | evaluate | sensitivity | thinnify | train.

The only module that sees argparse: it turns the parsed command line into the small typed
configs of compressor.config and hands them to library code.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tabulate import tabulate
from torch import nn

from compressor.cli import parse_args, quantization_requested
from compressor.config import (
    DataConfig,
    DistillationConfig,
    LoaderConfig,
    ModelRequest,
    OptimizerConfig,
    QuantizeConfig,
    ReportConfig,
    TrainConfig,
    make_optimizer,
)
from compressor.data import DatasetSplits, EvaluationData, load_datasets, load_test_dataset
from compressor.distributed import DistContext, all_reduce_sum, barrier, init_distributed, shutdown
from compressor.engine import evaluate
from compressor.errors import CompressorError, UsageError
from compressor.loaders import eval_loader, seed_everything
from compressor.models.description import description_of
from compressor.run_dir import choose_run_dir, logging_to, write_args_yaml, write_results_json
from compressor.run_setup import RunSetup, build_resolved_model, resolve_run
from compressor.training import check_resume_epochs, run_training, start_distillation

__all__ = ["main", "run"]

EvaluateFn = Callable[[nn.Module], dict[str, float]]


def _one_line(exc: BaseException) -> str:
    # DataLoader workers re-raise errors with the worker's traceback in the message: keep the
    # last line, which is our own message.
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    line = lines[-1] if lines else type(exc).__name__
    for prefix in (f"{type(exc).__module__}.{type(exc).__name__}: ", f"{type(exc).__name__}: "):
        if line.startswith(prefix):
            return line[len(prefix):]
    return line


def main(argv: list[str] | None = None) -> int:
    """Run the command line; user errors become one stderr line and exit status 2."""
    try:
        return run(parse_args(argv))
    except CompressorError as exc:
        sys.stderr.write(f"compress_classifier.py: error: {_one_line(exc)}\n")
        return 2
    finally:
        shutdown()


def _configure_determinism(deterministic: bool) -> None:
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    else:
        torch.backends.cudnn.benchmark = True


def _path(text: str | None) -> Path | None:
    return Path(text) if text else None


def _model_request(args: argparse.Namespace) -> ModelRequest:
    return ModelRequest(arch=args.arch, checkpoint=_path(args.resume_from), dataset=args.dataset,
                        pretrained=args.pretrained, memory_efficient=args.memory_efficient,
                        load_weights_from=_path(args.load_weights_from))


def _optimizer_config(args: argparse.Namespace) -> OptimizerConfig:
    return OptimizerConfig(lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)


def _loader_config(args: argparse.Namespace) -> LoaderConfig:
    return LoaderConfig(batch_size=args.batch_size, workers=args.workers)


def _distillation_config(args: argparse.Namespace) -> DistillationConfig | None:
    if args.kd_teacher is None and args.kd_resume is None:
        return None
    teacher = ModelRequest(arch=args.kd_teacher, checkpoint=_path(args.kd_resume),
                           pretrained=args.kd_pretrained)
    return DistillationConfig(teacher=teacher, temperature=args.kd_temperature,
                              distill_weight=args.kd_distill_wt,
                              student_weight=args.kd_student_wt,
                              start_epoch=args.kd_start_epoch)


def _train_config(args: argparse.Namespace) -> TrainConfig:
    reports = ReportConfig(tensorboard=args.tensorboard, confusion=args.confusion,
                           masks_sparsity=args.masks_sparsity)
    return TrainConfig(epochs=args.epochs, optimizer=_optimizer_config(args),
                       loader=_loader_config(args), print_freq=args.print_freq,
                       compress=_path(args.compress), reset_optimizer=args.reset_optimizer,
                       distillation=_distillation_config(args), reports=reports)


def _quantize_config(args: argparse.Namespace) -> QuantizeConfig:
    return QuantizeConfig(
        quantize=args.quantize_eval, convert=args.qe_convert_pytorch,
        backend=args.qe_pytorch_backend, mode_acts=args.qe_mode_acts or args.qe_mode,
        mode_wts=args.qe_mode_wts or args.qe_mode, bits_acts=args.qe_bits_acts,
        bits_wts=args.qe_bits_wts, bits_accum=args.qe_bits_accum, clip_acts=args.qe_clip_acts,
        clip_n_stds=args.qe_clip_n_stds, per_channel=args.qe_per_channel,
        no_clip_layers=tuple(args.qe_no_clip_layers),
        no_quant_layers=tuple(args.qe_no_quant_layers),
        calibration=args.qe_calibration, stats_file=_path(args.qe_stats_file),
        dynamic=args.qe_dynamic, config_file=_path(args.qe_config_file))


def _refuse_quantized(args: argparse.Namespace, setup: RunSetup, training: bool) -> None:
    """A post-training quantized checkpoint is evaluated or converted, never trained or thinned."""
    from compressor.transforms import quantization_kind

    if quantization_kind(setup.description) != "post_train":
        return
    mode = "training" if training else next(
        (flag for flag, on in (("--thinnify", args.thinnify), ("--sense", args.sense),
                               ("--export-onnx", args.export_onnx is not None)) if on), None)
    if mode is not None:
        raise UsageError(f"{setup.checkpoint_path} is post-training quantized, and {mode} needs "
                         "a float model; use the float checkpoint it came from (quantize last)")


def _data_config(args: argparse.Namespace, training: bool) -> DataConfig:
    return DataConfig(root=args.data, validation_split=args.validation_split if training else 0.0,
                      effective_train_size=args.effective_train_size,
                      effective_valid_size=args.effective_valid_size,
                      effective_test_size=args.effective_test_size)


def _args_record(args: argparse.Namespace, setup: RunSetup,
                 class_names: tuple[str, ...]) -> dict[str, Any]:
    """The resolved arguments: args.yaml, and the checkpoint's `args`."""
    return {**vars(args), **setup.description.to_dict(), "seed": setup.seed,
            "class_names": list(class_names)}


def _is_training(args: argparse.Namespace) -> bool:
    return not (args.evaluate or args.sense or args.thinnify or args.export_onnx is not None)


def _print_results(results: dict[str, Any]) -> None:
    shown = (("top-1 (%)", "top1", "{:.2f}"), ("top-5 (%)", "top5", "{:.2f}"),
             ("loss", "loss", "{:.4f}"), ("kernels", "kernels", "{}"),
             ("bits (acts/wts)", "bits", "{}"), ("stats", "stats_file", "{}"),
             ("params", "params", "{:,}"), ("time (s)", "time", "{:.1f}"))
    if "kernels" in results:
        results = {**results, "bits": f"{results.get('bits_activations')}/"
                                      f"{results.get('bits_weights')}"}
    rows = [[label, fmt.format(results[key])] for label, key, fmt in shown if key in results]
    print(tabulate(rows, headers=[f"{results['arch']} on {results['dataset']}", ""],
                   tablefmt="github"))


def _model_facts(model: nn.Module, run_dir: Path) -> dict[str, Any]:
    from compressor.metrics import model_metrics  # sparsity, params, MACs, file sizes

    description = description_of(model)
    return {"arch": description.arch, "dataset": description.dataset,
            "num_classes": description.num_classes,
            "transforms": [step.name for step in description.transforms],
            **model_metrics(model, run_dir / "checkpoint.pth.tar")}


def _dry_run(args: argparse.Namespace, model: nn.Module) -> int:
    from compressor.schedule import format_dry_run, load_schedule

    optimizer = make_optimizer(model.parameters(), _optimizer_config(args))
    print(format_dry_run(load_schedule(args.compress, model, optimizer), args.epochs))
    return 0


def _summaries(args: argparse.Namespace, model: nn.Module) -> int:
    from compressor.summary import print_summary

    for kind in args.summary:
        print(print_summary(model, kind))
    return 0


def _load_data(setup: RunSetup, config: DataConfig, training: bool
               ) -> DatasetSplits | EvaluationData:
    """Training: train/validation/test splits; otherwise the test split alone (no train files)."""
    description = setup.description
    checkpoint = setup.checkpoint or {}
    recorded = checkpoint.get("args")
    pretrained = setup.model.pretrained or bool(
        isinstance(recorded, dict) and recorded.get("pretrained"))
    names = recorded.get("class_names") if isinstance(recorded, dict) else None
    labels = {"seed": setup.seed, "num_classes": description.num_classes,
              "pretrained": pretrained,
              "class_names": [str(n) for n in names] if isinstance(names, list) and names
              else None}
    if not training:
        return load_test_dataset(description.dataset, config.root, description.input_spec,
                                 effective_test_size=config.effective_test_size, **labels)
    return load_datasets(description.dataset, config.root, description.input_spec,
                         validation_split=config.validation_split,
                         effective_train_size=config.effective_train_size,
                         effective_valid_size=config.effective_valid_size,
                         effective_test_size=config.effective_test_size, **labels)


def run(args: argparse.Namespace) -> int:
    """Execute one parsed command line."""
    started = time.perf_counter()
    setup = resolve_run(_model_request(args), seed=args.seed, deterministic=args.deterministic)
    _configure_determinism(args.deterministic)
    ctx = init_distributed(args.cpu, args.gpus)
    seed_everything(setup.seed)  # the same initial weights on every rank and in every rerun
    model = build_resolved_model(setup.model).to(ctx.device)
    if args.summary:
        return _summaries(args, model)
    if args.dry_run:
        return _dry_run(args, model)
    training = _is_training(args)
    _refuse_quantized(args, setup, training)
    config = _train_config(args)
    distillation = None
    if training:  # everything that can refuse the run does so before any file is written
        check_resume_epochs(config, setup)
        if config.reports.tensorboard:
            from compressor.reports import require_tensorboard

            require_tensorboard()
        distillation = start_distillation(config, setup, model, ctx)
    if quantization_requested(args):  # refused before any file is written
        from compressor.quantize_run import check_quantization

        check_quantization(model, _quantize_config(args),
                           str(setup.checkpoint_path or setup.arch))
    if args.export_onnx is not None:
        return _export(args, setup, ctx, model, started)
    data = _load_data(setup, _data_config(args, training), training)
    resume_dir = setup.checkpoint_path.parent if setup.checkpoint_path and training else None
    run_dir = choose_run_dir(args.output_dir, args.name, setup.arch, resume_dir)
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    barrier()
    record = _args_record(args, setup, data.class_names)
    with logging_to(run_dir if ctx.is_main else None, ctx.is_main) as log:
        log.info("run directory %s", run_dir)
        if ctx.is_main:
            write_args_yaml(run_dir, record)
        writer_dir = run_dir if ctx.is_main else None
        if training:
            results = run_training(setup, ctx, model, data, writer_dir, config, record,
                                   distillation)
        else:
            results, model = _post_training(args, setup, ctx, model, data, writer_dir, config,
                                            record)
        if config.reports.confusion:
            results.update(_confusion(setup, ctx, model, data, writer_dir, config))
        results = {**_model_facts(model, run_dir), **results,
                   "time": time.perf_counter() - started}
        if ctx.is_main:
            write_results_json(run_dir, results)
            _print_results(results)
    return 0


def _device_of(model: nn.Module, ctx: DistContext) -> torch.device:
    """The run's device, or the CPU for a model that only runs there (int8 kernels)."""
    device = next((t.device for t in model.state_dict().values()
                   if isinstance(t, torch.Tensor)), ctx.device)
    return device if device.type == "cpu" else ctx.device


def _post_training(args: argparse.Namespace, setup: RunSetup, ctx: DistContext,
                   model: nn.Module, data: EvaluationData, run_dir: Path | None,
                   config: TrainConfig, record: dict[str, Any]
                   ) -> tuple[dict[str, Any], nn.Module]:
    """Evaluate (quantized or not), analyse sensitivity or thin a model on the test split;
    returns the results and the model they describe."""
    loader = eval_loader(data.test, config.loader.batch_size, config.loader.workers, ctx)
    reduce = all_reduce_sum if ctx.enabled else None

    def evaluate_fn(net: nn.Module) -> dict[str, float]:
        return evaluate(net, loader, _device_of(net, ctx), reduce=reduce, desc="test")

    if quantization_requested(args):
        from compressor.quantize_run import run_quantization

        return run_quantization(model, _quantize_config(args), data.test, config.loader,
                                setup, run_dir, record, evaluate_fn)
    if args.thinnify:
        from compressor.thinning.run import thinnify

        return thinnify(model, evaluate_fn, setup.checkpoint, run_dir, config.optimizer,
                        record), model
    if args.sense:
        from compressor.sensitivity import run_sensitivity, sensitivity_levels

        run_sensitivity(model, evaluate_fn, args.sense, sensitivity_levels(*args.sense_range),
                        run_dir)
    test = evaluate_fn(model)
    return {**test, **setup.progress(test)}, model


def _confusion(setup: RunSetup, ctx: DistContext, model: nn.Module,
               data: DatasetSplits | EvaluationData, run_dir: Path | None,
               config: TrainConfig) -> dict[str, Any]:
    """--confusion: the confusion matrix of the test split (confusion.csv, confusion.png)."""
    from compressor.reports import confusion_report

    loader = eval_loader(data.test, config.loader.batch_size, config.loader.workers, ctx)
    return confusion_report(model, loader, _device_of(model, ctx), num_classes=data.num_classes,
                            class_names=data.class_names, run_dir=run_dir,
                            reduce=all_reduce_sum if ctx.enabled else None)


def _export_sample(args: argparse.Namespace, setup: RunSetup) -> torch.Tensor:
    """A real test batch when the data is at hand, else a seeded random batch at the spec."""
    from compressor.data import needs_data_dir

    description = setup.description
    if args.data is not None or not needs_data_dir(description.dataset):
        data = _load_data(setup, _data_config(args, training=False), training=False)
        count = min(len(data.test), max(1, min(args.batch_size, 32)))
        return torch.stack([data.test[i][0] for i in range(count)])
    generator = torch.Generator().manual_seed(setup.seed)
    return torch.randn(8, *description.input_spec.input_size, generator=generator)


def _export(args: argparse.Namespace, setup: RunSetup, ctx: DistContext, model: nn.Module,
            started: float) -> int:
    """--export-onnx [FILE]: export, check in ONNX Runtime, write export.json; then exit."""
    from compressor.export import export_onnx, require_onnx

    require_onnx()  # without the extra, say so before any data is read
    sample = _export_sample(args, setup)
    run_dir = choose_run_dir(args.output_dir, args.name, setup.arch, None)
    if not ctx.is_main:
        return 0
    run_dir.mkdir(parents=True, exist_ok=True)
    destination = Path(args.export_onnx)
    if not destination.is_absolute() and destination.parent == Path("."):
        destination = run_dir / destination  # a bare file name lands in the run directory
    with logging_to(run_dir, True) as log:
        log.info("run directory %s", run_dir)
        write_args_yaml(run_dir, _args_record(args, setup, ()))
        facts = export_onnx(model.cpu().eval(), destination, sample, run_dir)
        results = {**_model_facts(model, run_dir), "export": facts,
                   "time": time.perf_counter() - started}
        write_results_json(run_dir, results)
        log.info("exported %s (%s)", destination, run_dir / "export.json")
    return 0
