"""Parsed arguments -> the RunRequest and the small typed configs of compressor.utils.config
(argparse ends here: nothing past `run_request` reads the namespace)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from compressor.cli.budget_args import budget_config, budget_only_flags
from compressor.cli.checks import quantization_requested
from compressor.cli.request import ActionRequest, MemoryRequest, RunOptions, RunRequest
from compressor.data.folder import folder_num_classes, infer_dataset
from compressor.quantization.core.settings import (
    QuantSettings,
    settings_from_args,
    with_layer_overrides,
)
from compressor.quantization.request import QuantizeRequest
from compressor.utils.config import (
    DataConfig,
    DistillationConfig,
    LoaderConfig,
    ModelRequest,
    OptimizerConfig,
    ReportConfig,
    TrainConfig,
)
from compressor.utils.dataset_table import FOLDER
from compressor.utils.precision import Precision

__all__ = ["run_request", "model_request", "optimizer_config", "loader_config", "train_config",
           "quantize_request", "quantize_settings", "data_config", "is_training", "args_record",
           "distillation_config"]


def _path(text: str | None) -> Path | None:
    return Path(text) if text else None


def _dataset_and_classes(args: argparse.Namespace) -> tuple[str | None, int | None]:
    """--dataset, else the one DATASET_DIR's class folders hold; a folder's class count.

    Resuming, the checkpoint's dataset and classes win, so nothing is inferred.
    """
    if args.resume_from:
        return args.dataset, args.num_classes
    dataset = args.dataset
    if dataset is None and args.data:
        dataset = infer_dataset(args.data)
    if dataset != FOLDER:
        return dataset, args.num_classes
    return dataset, folder_num_classes(args.data, args.num_classes)


def model_request(args: argparse.Namespace) -> ModelRequest:
    """What model the command line asks for (an arch, or a checkpoint to rebuild)."""
    dataset, num_classes = _dataset_and_classes(args)
    return ModelRequest(arch=args.arch, checkpoint=_path(args.resume_from), dataset=dataset,
                        pretrained=args.pretrained, memory_efficient=args.memory_efficient,
                        load_weights_from=_path(args.load_weights_from),
                        num_classes=num_classes, input_size=args.input_size,
                        mean=args.mean, std=args.std,
                        pretrained_file=_path(args.pretrained_file))


def optimizer_config(args: argparse.Namespace) -> OptimizerConfig:
    """--lr, --momentum, --wd."""
    return OptimizerConfig(lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay,
                           lr_head=args.lr_head)


def loader_config(args: argparse.Namespace) -> LoaderConfig:
    """-b, -j."""
    return LoaderConfig(batch_size=args.batch_size, workers=args.workers)


def distillation_config(args: argparse.Namespace) -> DistillationConfig | None:
    """The --kd-* flags (None without a teacher)."""
    if args.kd_teacher is None and args.kd_resume is None:
        return None
    teacher = ModelRequest(arch=args.kd_teacher, checkpoint=_path(args.kd_resume),
                           pretrained=args.kd_pretrained)
    return DistillationConfig(teacher=teacher, temperature=args.kd_temperature,
                              distill_weight=args.kd_distill_wt,
                              student_weight=args.kd_student_wt,
                              start_epoch=args.kd_start_epoch)


def train_config(args: argparse.Namespace) -> TrainConfig:
    """Epochs, optimizer, loaders, schedule, distillation and per-epoch reports."""
    reports = ReportConfig(tensorboard=args.tensorboard, confusion=args.confusion,
                           masks_sparsity=args.masks_sparsity)
    return TrainConfig(epochs=args.epochs, optimizer=optimizer_config(args),
                       loader=loader_config(args), print_freq=args.print_freq,
                       compress=_path(args.compress), reset_optimizer=args.reset_optimizer,
                       distillation=distillation_config(args), reports=reports,
                       bn_momentum=args.bn_momentum, bn_recalibrate=args.bn_recalibrate,
                       precision=Precision(amp=args.amp, channels_last=args.channels_last,
                                           compile=args.compile))


def quantize_settings(args: argparse.Namespace) -> QuantSettings:
    """The --qe-* flags as Distiller's quantizer arguments, read as the YAML's are (--qencl /
    --qenql as exact-name overrides before any other)."""
    flags: dict[str, Any] = {
        "bits_activations": args.qe_bits_acts, "bits_weights": args.qe_bits_wts,
        "bits_accum": args.qe_bits_accum,
        "mode": {"activations": args.qe_mode_acts or args.qe_mode,
                 "weights": args.qe_mode_wts or args.qe_mode},
        "clip_acts": args.qe_clip_acts, "clip_n_stds": args.qe_clip_n_stds,
        "per_channel_wts": args.qe_per_channel}
    settings = settings_from_args(flags, "the --qe-* flags")
    return with_layer_overrides(settings, no_quant=tuple(args.qe_no_quant_layers),
                                no_clip=tuple(args.qe_no_clip_layers))


def quantize_request(args: argparse.Namespace) -> QuantizeRequest:
    """The --qe* flags: the step and its settings."""
    return QuantizeRequest(
        settings=quantize_settings(args), quantize=args.quantize_eval,
        convert=args.qe_convert_pytorch, backend=args.qe_pytorch_backend,
        calibration=args.qe_calibration, calibration_split=args.qe_calibration_split,
        stats_file=_path(args.qe_stats_file),
        dynamic=args.qe_dynamic, config_file=_path(args.qe_config_file))


def data_config(args: argparse.Namespace, training: bool) -> DataConfig:
    """DATASET_DIR and Distiller's split fractions (--vs only when training)."""
    return DataConfig(root=args.data, validation_split=args.validation_split if training else 0.0,
                      effective_train_size=args.effective_train_size,
                      effective_valid_size=args.effective_valid_size,
                      effective_test_size=args.effective_test_size)


def is_training(args: argparse.Namespace) -> bool:
    """Whether this command trains (no -e, --sense, --thinnify or --export-onnx)."""
    return not (args.evaluate or args.sense or args.thinnify or args.export_onnx is not None)


def args_record(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed arguments as plain values (args.yaml, the checkpoint's `args`)."""
    return dict(vars(args))


def run_request(args: argparse.Namespace) -> RunRequest:
    """The parsed command line as one typed, frozen request."""
    training = is_training(args)
    action = ActionRequest(
        summary=tuple(args.summary or ()),
        dry_run=_path(args.compress) if args.dry_run else None,
        export_onnx=args.export_onnx, evaluate=args.evaluate, thinnify=args.thinnify,
        sense=args.sense, sense_range=tuple(args.sense_range),
        bn_recalibrate=args.bn_recalibrate)
    run = RunOptions(seed=args.seed, deterministic=args.deterministic, cpu=args.cpu,
                     gpus=tuple(args.gpus) if args.gpus is not None else None,
                     output_dir=args.output_dir, name=args.name, data_dir=args.data)
    return RunRequest(
        model=model_request(args), train=train_config(args), data=data_config(args, training),
        eval_data=data_config(args, training=False), optimizer=optimizer_config(args),
        budget=budget_config(args),
        quantize=quantize_request(args) if quantization_requested(args) else None,
        distillation=distillation_config(args), run=run,
        memory=MemoryRequest(args.memory_efficient, args.memory_budget), action=action,
        arguments=args_record(args), budget_only_flags=tuple(budget_only_flags(args)))
