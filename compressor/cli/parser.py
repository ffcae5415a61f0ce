"""The command line: Distiller's compress_classifier.py flags, with their names and meanings."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from compressor.cli.budget_args import add_budget_args, budget_requested, check_budget
from compressor.cli.domains import INT_MAX, finite, integer, real
from compressor.memory import MEMORY_VARIANTS
from compressor.utils.dataset_table import dataset_names
from compressor.utils.errors import UsageError

__all__ = ["get_args_parser", "parse_args"]

MAX_WORKERS = 1024
DISTILLER_WORKERS = 4  # Distiller's -j default
SEED_MAX = 2**63 - 1  # torch.manual_seed takes a 64-bit seed
SUMMARY_CHOICES = ("sparsity", "compute", "model", "modules")
SENSE_CHOICES = ("element", "filter", "channel")
QE_MODES = ("sym", "sym_restr", "asym_u", "asym_s")
QE_CLIP_MODES = ("none", "avg", "n_std", "gauss", "laplace", "mse")
QE_BACKENDS = ("auto", "onednn", "x86", "fbgemm", "qnnpack")
CALIBRATION_SPLITS = ("train", "test")
MAX_QUANT_BITS = 16


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows: no affinity mask
        return os.cpu_count() or 1


def default_workers() -> int:
    """-j's default: Distiller's 4, never more than the CPUs at hand (torch warns beyond)."""
    return min(DISTILLER_WORKERS, usable_cpus())


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one line on stderr, exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)


def _gpu_list(text: str) -> list[int]:
    """--gpus: distinct non-negative GPU indices separated by commas, e.g. 0,1."""
    index = integer(0, INT_MAX)
    try:
        gpus = [index(part.strip()) for part in text.split(",") if part.strip()]
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (expected comma-separated GPU indices, "
                                         "e.g. 0,1)") from None
    if not gpus:
        raise argparse.ArgumentTypeError("expected comma-separated GPU indices, e.g. 0,1")
    if len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"{text} lists a GPU twice; list each GPU once")
    return gpus


def _floats(text: str) -> tuple[float, ...]:
    """--mean: one or more finite numbers separated by commas."""
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"'{text[:40]}' is not a comma-separated list of "
                                         "numbers, e.g. 0.5,0.5,0.5")
    return tuple(finite(part) for part in parts)


def _positive_floats(text: str) -> tuple[float, ...]:
    """--std: one or more numbers > 0 separated by commas."""
    values = _floats(text)
    if any(value <= 0.0 for value in values):
        raise argparse.ArgumentTypeError(f"must be numbers > 0, got {text[:40]}")
    return values


def _input_size(text: str) -> tuple[int, int, int]:
    """--input-size C,H,W: 1..4 channels, a square side of 1..4096 pixels."""
    parts = text.split(",")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"'{text[:40]}' is not C,H,W (e.g. 3,224,224)")
    channels = integer(1, 4)(parts[0].strip())
    height, width = (integer(1, 4096)(part.strip()) for part in parts[1:])
    if height != width:
        raise argparse.ArgumentTypeError(f"{height}x{width} is not square; give C,S,S")
    return channels, height, width


_validation_split = real(0.0, 1.0, high_open=True)
_effective_size = real(0.0, 1.0, low_open=True)


def _add_data_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data")
    group.add_argument("data", metavar="DATASET_DIR", nargs="?", default=None,
                       help="dataset directory (not needed for digits and synthetic)")
    group.add_argument("--dataset", choices=dataset_names(), default=None,
                       help="dataset (default: the checkpoint's; else DATASET_DIR's class "
                            "folders: ImageNet wnids -> imagenet, other names -> folder; else "
                            "the arch's)")
    group.add_argument("-j", "--workers", type=integer(0, MAX_WORKERS),
                       default=default_workers(),
                       help="data loading workers (default: Distiller's 4, capped at the "
                            f"{usable_cpus()} CPUs this process may use)")
    group.add_argument("-b", "--batch-size", type=integer(1, INT_MAX), default=256,
                       help="mini-batch size")
    group.add_argument("--vs", "--validation-split", dest="validation_split",
                       type=_validation_split, default=0.1,
                       help="fraction of the training set held out for validation, in [0, 1)")
    group.add_argument("--etrs", "--effective-train-size", dest="effective_train_size",
                       type=_effective_size, default=1.0,
                       help="fraction of the training set to use, in (0, 1]")
    group.add_argument("--evs", "--effective-valid-size", dest="effective_valid_size",
                       type=_effective_size, default=1.0,
                       help="fraction of the validation set to use, in (0, 1]")
    group.add_argument("--etes", "--effective-test-size", dest="effective_test_size",
                       type=_effective_size, default=1.0,
                       help="fraction of the test set to use, in (0, 1]")


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("-a", "--arch", default=None,
                       help="architecture: a registered name (see compressor.models.list_archs()), "
                            "timm/NAME (any timm model; the [timm] extra), or your own code as "
                            "path/to/file.py:Name or package.module:Name")
    group.add_argument("--pretrained", action="store_true",
                       help="start from the arch's pretrained weights (torchvision's, timm's from "
                            "the local Hugging Face cache, a package's); on a dataset with other "
                            "classes the classifier is new (transfer learning)")
    group.add_argument("--pretrained-file", dest="pretrained_file", default=None, metavar="PATH",
                       help="with --pretrained: read the weights from this file (a state dict or "
                            "a safetensors file) instead of the arch's own")
    group.add_argument("--num-classes", dest="num_classes", type=integer(1, INT_MAX),
                       default=None, help="classes of the model (default: the dataset's)")
    group.add_argument("--input-size", dest="input_size", type=_input_size, default=None,
                       metavar="C,H,W", help="the model's input size, e.g. 3,64,64 (default: the "
                                              "arch's, for its dataset)")
    group.add_argument("--mean", type=_floats, default=None, metavar="M[,M,M]",
                       help="normalization mean per channel (default: the arch's)")
    group.add_argument("--std", type=_positive_floats, default=None, metavar="S[,S,S]",
                       help="normalization standard deviation per channel, > 0 (default: the "
                            "arch's)")
    group.add_argument("--memory-efficient", dest="memory_efficient", default=None,
                       choices=MEMORY_VARIANTS,
                       help="memory-efficient variant: recompute (activation checkpointing, "
                            "efficient DenseNet) or inplace-abn (fused BN + leaky ReLU)")


def _add_training_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("training")
    group.add_argument("--epochs", type=integer(0, INT_MAX), default=90,
                       help="total number of epochs (also when resuming)")
    group.add_argument("--lr", "--learning-rate", dest="lr", type=real(0.0, None, low_open=True),
                       default=0.1, help="learning rate, > 0")
    group.add_argument("--lr-head", dest="lr_head", type=real(0.0, None, low_open=True),
                       default=None, help="learning rate of a classifier newly initialised for "
                       "the dataset's classes (--pretrained on other classes; default 10 x --lr)")
    group.add_argument("--bn-momentum", dest="bn_momentum",
                       type=real(0.0, 1.0, low_open=True), default=None,
                       help="batch norm momentum while training, in (0, 1] (default: the "
                            "model's; TF-ported weights such as EfficientNet-Lite's use 0.01, "
                            "slow to adapt in a short fine-tune: 0.1 is PyTorch's)")
    group.add_argument("--momentum", type=real(0.0, 1.0, high_open=True), default=0.9,
                       help="SGD momentum, in [0, 1)")
    group.add_argument("--wd", "--weight-decay", dest="weight_decay", type=real(0.0, None),
                       default=1e-4, help="weight decay, >= 0")
    group.add_argument("-p", "--print-freq", type=integer(0, INT_MAX), default=10,
                       help="log every N mini-batches (0: never)")
    group.add_argument("--deterministic", "--det", action="store_true",
                       help="reproducible run (seed 0 unless --seed is given)")
    group.add_argument("--seed", type=integer(0, SEED_MAX), default=None,
                       help="random seed, in 0..2**63-1")
    group.add_argument("--cpu", action="store_true", help="run on the CPU even if CUDA exists")
    group.add_argument("--gpus", type=_gpu_list, default=None,
                       help="comma-separated GPU indices to use, e.g. 0,1")


def _add_checkpoint_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("checkpoints and outputs")
    group.add_argument("--resume-from", dest="resume_from", default=None, metavar="CKPT",
                       help="resume training (or evaluate with -e) from a checkpoint")
    group.add_argument("--exp-load-weights-from", dest="load_weights_from", default=None,
                       metavar="CKPT", help="load model weights only, then train from epoch 0")
    group.add_argument("--reset-optimizer", action="store_true",
                       help="with --resume-from: fresh optimizer, epoch 0 and best top-1")
    group.add_argument("-e", "--evaluate", action="store_true", help="evaluate on the test set")
    group.add_argument("-o", "--out-dir", dest="output_dir", default="logs",
                       help="directory that holds the run directories")
    group.add_argument("-n", "--name", default=None,
                       help="run directory name (default: <arch>___<timestamp>)")


def _add_compression_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("compression and reports")
    group.add_argument("--compress", default=None, metavar="YAML",
                       help="compression schedule (Distiller YAML format)")
    group.add_argument("--dry-run", action="store_true",
                       help="with --compress: print the schedule per epoch and exit")
    group.add_argument("--summary", choices=SUMMARY_CHOICES, action="append", default=None,
                       help="print a summary of the model and exit")
    group.add_argument("--sense", choices=SENSE_CHOICES, default=None,
                       help="sensitivity analysis by pruning granularity")
    group.add_argument("--sense-range", dest="sense_range", type=real(None, None), nargs=3,
                       default=(0.0, 0.95, 0.05), metavar=("START", "STOP", "STEP"),
                       help="sparsity levels for --sense: 0 <= START < STOP <= 1, STEP > 0")
    group.add_argument("--thinnify", action="store_true",
                       help="with --resume-from: remove zeroed filters/channels and save")


def _add_distillation_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "knowledge distillation",
        "loss = sw * task loss + dw * T^2 * KL(softmax(teacher/T) || softmax(student/T))")
    group.add_argument("--kd-teacher", dest="kd_teacher", default=None, metavar="ARCH",
                       help="teacher architecture (with --kd-pretrained or --kd-resume)")
    group.add_argument("--kd-pretrained", dest="kd_pretrained", action="store_true",
                       help="the teacher uses torchvision's pretrained weights")
    group.add_argument("--kd-resume", dest="kd_resume", default=None, metavar="CKPT",
                       help="the teacher: any compressor checkpoint (arch, attributes, "
                            "thinning, memory variant and input spec come from it)")
    group.add_argument("--kd-temperature", "--kd-temp", dest="kd_temperature",
                       type=real(0.0, None, low_open=True), default=1.0,
                       help="softmax temperature T (default 1.0)")
    group.add_argument("--kd-distill-wt", "--kd-dw", dest="kd_distill_wt",
                       type=real(0.0, None), default=0.5,
                       help="weight of the distillation loss (default 0.5)")
    group.add_argument("--kd-student-wt", "--kd-sw", dest="kd_student_wt",
                       type=real(0.0, None), default=0.5,
                       help="weight of the student's task loss (default 0.5)")
    group.add_argument("--kd-teacher-wt", "--kd-tw", dest="kd_teacher_wt",
                       type=real(0.0, None), default=0.0,
                       help="weight of the teacher's own loss (not supported: must be 0)")
    group.add_argument("--kd-start-epoch", dest="kd_start_epoch", type=integer(0, INT_MAX),
                       default=0, help="epoch from which distillation is on (default 0)")


def _add_report_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("export and reports")
    group.add_argument("--export-onnx", dest="export_onnx", nargs="?", const="model.onnx",
                       default=None, metavar="FILE",
                       help="export the model to ONNX (default model.onnx in the run "
                            "directory), checked in ONNX Runtime; needs the [onnx] extra")
    group.add_argument("--tensorboard", action="store_true",
                       help="write TensorBoard scalars under the run directory")
    group.add_argument("--confusion", action="store_true",
                       help="confusion matrix of the evaluated split (confusion.csv/.png)")
    group.add_argument("--masks-sparsity", dest="masks_sparsity", action="store_true",
                       help="log the per-layer mask sparsity table at the end of each epoch")


def _add_quantization_args(parser: argparse.ArgumentParser) -> None:
    """Distiller's post-training quantization flags (range_linear.add_post_train_quant_args)."""
    group = parser.add_argument_group(
        "post-training quantization (with -e)",
        "8-bit models convert to real int8 kernels with --qe-convert-pytorch; other widths are "
        "simulated")
    bits = integer(0, MAX_QUANT_BITS)
    group.add_argument("--quantize-eval", "--qe", dest="quantize_eval", action="store_true",
                       help="quantize the model after loading it, then evaluate it (with -e)")
    group.add_argument("--qe-mode", "--qem", dest="qe_mode", choices=QE_MODES, default="sym",
                       help="linear quantization mode (default sym)")
    group.add_argument("--qe-mode-acts", "--qema", dest="qe_mode_acts", choices=QE_MODES,
                       default=None, help="mode of the activations (overrides --qe-mode)")
    group.add_argument("--qe-mode-wts", "--qemw", dest="qe_mode_wts", choices=QE_MODES,
                       default=None, help="mode of the weights (overrides --qe-mode)")
    group.add_argument("--qe-bits-acts", "--qeba", dest="qe_bits_acts", type=bits, default=8,
                       help="bits of the activations, 2..16 (0: keep float; default 8)")
    group.add_argument("--qe-bits-wts", "--qebw", dest="qe_bits_wts", type=bits, default=8,
                       help="bits of the weights, 2..16 (0: keep float; default 8)")
    group.add_argument("--qe-bits-accum", dest="qe_bits_accum", type=integer(1, 32),
                       default=32, help="bits of the accumulator (default 32)")
    group.add_argument("--qe-clip-acts", "--qeca", dest="qe_clip_acts", choices=QE_CLIP_MODES,
                       default="none", help="activation clipping (default none; mse: the range "
                       "of least squared error on the calibration histogram, as torch.ao's "
                       "HistogramObserver)")
    group.add_argument("--qe-clip-n-stds", dest="qe_clip_n_stds",
                       type=real(0.0, None, low_open=True), default=None,
                       help="with --qe-clip-acts n_std: clip at mean +- N standard deviations")
    group.add_argument("--qe-no-clip-layers", "--qencl", dest="qe_no_clip_layers", nargs="+",
                       default=[], metavar="LAYER", help="layers whose activations are not "
                                                         "clipped")
    group.add_argument("--qe-no-quant-layers", "--qenql", dest="qe_no_quant_layers", nargs="+",
                       default=[], metavar="LAYER", help="layers kept in float")
    group.add_argument("--qe-per-channel", "--qepc", dest="qe_per_channel", action="store_true",
                       help="per-channel weight quantization")
    source = group.add_mutually_exclusive_group()
    source.add_argument("--qe-calibration", dest="qe_calibration", type=_effective_size,
                        default=None, metavar="FRACTION",
                        help="collect activation statistics on this fraction of the calibration "
                             "split (alone: write acts_quantization_stats.yaml and exit)")
    source.add_argument("--qe-stats-file", dest="qe_stats_file", default=None, metavar="PATH",
                        help="activation statistics (Distiller's YAML format)")
    source.add_argument("--qe-dynamic", dest="qe_dynamic", action="store_true",
                        help="activation ranges computed on the fly, per batch (simulated)")
    source.add_argument("--qe-config-file", dest="qe_config_file", default=None,
                        metavar="YAML", help="a Distiller YAML with a PostTrainLinearQuantizer "
                                             "(its settings replace the --qe-* flags)")
    group.add_argument("--qe-calibration-split", dest="qe_calibration_split",
                       choices=CALIBRATION_SPLITS, default="train",
                       help="where calibration reads: a seeded fraction of the training split, "
                            "with evaluation transforms (default), or of the test split, which "
                            "Distiller used and which is then reported on")
    group.add_argument("--qe-convert-pytorch", "--qept", dest="qe_convert_pytorch",
                       action="store_true",
                       help="convert the quantized model to real int8 kernels (8 bits only)")
    group.add_argument("--qe-pytorch-backend", dest="qe_pytorch_backend", choices=QE_BACKENDS,
                       default="auto",
                       help="int8 kernels: onednn (plain uint8 tensors, the kernels torchao's x86 "
                            "lowering calls), x86 / fbgemm / qnnpack (torch.ao's quantized "
                            "engines); auto (default): onednn where it can compute the model "
                            "(symmetric weights), else x86")


def get_args_parser() -> argparse.ArgumentParser:
    """The compress_classifier.py argument parser."""
    parser = _OneLineParser(
        prog="compress_classifier.py",
        description="Train, compress, resume and evaluate PyTorch image classifiers.")
    _add_data_args(parser)
    _add_model_args(parser)
    _add_training_args(parser)
    _add_checkpoint_args(parser)
    _add_compression_args(parser)
    _add_distillation_args(parser)
    _add_report_args(parser)
    _add_quantization_args(parser)
    add_budget_args(parser)
    return parser


def _check_sense_range(parser: argparse.ArgumentParser, levels: tuple[float, ...]) -> None:
    start, stop, step = levels
    if not 0.0 <= start < 1.0:
        parser.error(f"argument --sense-range: START must be in [0, 1), got {start:g}")
    if not start < stop <= 1.0:
        parser.error(f"argument --sense-range: STOP must be in (START, 1], got {stop:g}")
    if step <= 0.0:
        parser.error(f"argument --sense-range: STEP must be > 0, got {step:g}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and cross-check the command line; a value out of its domain exits with status 2."""
    parser = get_args_parser()
    args = parser.parse_args(argv)
    _check_sense_range(parser, tuple(args.sense_range))
    if args.arch is None and args.resume_from is None:
        raise UsageError("no architecture given: pass -a ARCH, or --resume-from CKPT")
    if args.thinnify and args.resume_from is None:
        raise UsageError("--thinnify needs --resume-from CKPT (the pruned model to thin)")
    if args.dry_run and args.compress is None:
        raise UsageError("--dry-run needs --compress YAML")
    if args.reset_optimizer and args.resume_from is None:
        raise UsageError("--reset-optimizer needs --resume-from CKPT")
    if args.pretrained_file is not None and not args.pretrained:
        raise UsageError("--pretrained-file names the weights of --pretrained; add --pretrained")
    if args.resume_from and args.load_weights_from:
        raise UsageError("give either --resume-from or --exp-load-weights-from, not both")
    check_budget(args, _non_training_mode(args))
    _check_distillation(args)
    _check_epoch_reports(args)
    _check_training_settings(args)
    _check_quantization(args)
    return args


def _non_training_mode(args: argparse.Namespace) -> str | None:
    """The flag that makes this command something other than training, if any."""
    modes = (("-e", args.evaluate), ("--thinnify", args.thinnify), ("--sense", args.sense),
             ("--export-onnx", args.export_onnx is not None), ("--summary", args.summary),
             ("--dry-run", args.dry_run))
    return next((flag for flag, on in modes if on), None)


def _check_training_settings(args: argparse.Namespace) -> None:
    """Settings of training epochs: refused where nothing trains, rather than ignored."""
    mode = _non_training_mode(args)
    if mode is None:
        return
    for flag, on in (("--bn-momentum", args.bn_momentum is not None),
                     ("--lr-head", args.lr_head is not None)):
        if on:
            raise UsageError(f"{flag} sets how training runs, and {mode} trains none; drop "
                             f"{flag} (or {mode})")


def _check_epoch_reports(args: argparse.Namespace) -> None:
    """Per-epoch reports need epochs: refuse them where nothing trains, rather than ignore them."""
    mode = _non_training_mode(args)
    if mode is None:
        return
    for flag, on in (("--tensorboard", args.tensorboard),
                     ("--masks-sparsity", args.masks_sparsity)):
        if on:
            raise UsageError(f"{flag} reports training epochs, and {mode} trains none; drop "
                             f"{flag} (or {mode})")


def _check_distillation(args: argparse.Namespace) -> None:
    """Distiller's --kd-* rules: a teacher comes with weights; the teacher loss is not built."""
    if args.kd_teacher_wt != 0.0:
        raise UsageError("--kd-teacher-wt is not supported (Distiller did not implement it "
                         "either); drop it or pass --kd-teacher-wt 0")
    if args.kd_teacher is None and args.kd_resume is None:
        if args.kd_pretrained:
            raise UsageError("--kd-pretrained needs --kd-teacher ARCH")
        return
    if args.kd_resume is None and not args.kd_pretrained:
        raise UsageError("a distillation teacher needs weights: add --kd-pretrained (torchvision "
                         "weights) or --kd-resume CKPT")
    if args.kd_resume is not None and args.kd_pretrained:
        raise UsageError("give either --kd-pretrained or --kd-resume CKPT for the teacher, "
                         "not both")
    mode = _non_training_mode(args)
    if mode is not None:  # refused rather than ignored: the teacher would silently do nothing
        raise UsageError(f"a distillation teacher teaches training epochs, and {mode} trains "
                         f"none; drop the --kd-* flags (or {mode})")
    if args.kd_start_epoch >= args.epochs:
        raise UsageError(f"--kd-start-epoch {args.kd_start_epoch} is not below --epochs "
                         f"{args.epochs} (the total), so no epoch would be distilled; lower it, "
                         "or pass the --kd-* flags when resuming to train further")


def quantization_requested(args: argparse.Namespace) -> bool:
    """Whether this command quantizes (or calibrates, or converts) after loading the model."""
    return bool(args.quantize_eval or args.qe_convert_pytorch or args.qe_calibration is not None)


def _check_quantization(args: argparse.Namespace) -> None:
    """Distiller's rules: post-training quantization runs with -e, one statistics source."""
    used = [flag for flag, on in (
        ("--qe-stats-file", args.qe_stats_file), ("--qe-dynamic", args.qe_dynamic),
        ("--qe-config-file", args.qe_config_file), ("--qe-per-channel", args.qe_per_channel),
        ("--qe-no-clip-layers", args.qe_no_clip_layers),
        ("--qe-no-quant-layers", args.qe_no_quant_layers),
        ("--qe-clip-n-stds", args.qe_clip_n_stds is not None),
        ("--qe-calibration-split", args.qe_calibration_split != "train")) if on]
    if not quantization_requested(args):
        if used:
            raise UsageError(f"{used[0]} configures post-training quantization; add -e --qe "
                             f"(or drop {used[0]})")
        return
    flag = ("--qe-convert-pytorch" if args.qe_convert_pytorch and not args.quantize_eval
            else "--qe-calibration" if not args.quantize_eval else "--quantize-eval")
    if not args.evaluate and not budget_requested(args):
        raise UsageError(f"{flag} quantizes a trained model for evaluation and needs -e (as in "
                         "Distiller) or a budget (--target-*); add -e, with --resume-from CKPT "
                         "or --pretrained")
    for other, on in (("--thinnify", args.thinnify), ("--sense", args.sense),
                      ("--export-onnx", args.export_onnx is not None)):
        if on:
            raise UsageError(f"{flag} and {other} are separate jobs; run them one after the "
                             "other")
    if (args.qe_convert_pytorch and args.qe_config_file is None
            and (args.qe_bits_acts, args.qe_bits_wts) != (8, 8)):
        raise UsageError(f"--qe-convert-pytorch needs 8-bit activations and weights, not "
                         f"--qeba {args.qe_bits_acts} --qebw {args.qe_bits_wts}; drop "
                         "--qe-convert-pytorch (other widths stay simulated)")
    if args.qe_convert_pytorch and args.qe_dynamic:
        raise UsageError("--qe-convert-pytorch needs activation statistics, and --qe-dynamic "
                         "has none; use --qe-calibration or --qe-stats-file instead")
    if args.qe_clip_n_stds is not None and args.qe_clip_acts != "n_std":
        raise UsageError("--qe-clip-n-stds needs --qe-clip-acts n_std; add it or drop "
                         "--qe-clip-n-stds")
    if args.qe_calibration_split != "train" and (args.qe_stats_file or args.qe_dynamic):
        raise UsageError("--qe-calibration-split chooses what calibration reads, and the "
                         "statistics come from elsewhere here; drop it")
    if args.qe_clip_acts == "n_std" and args.qe_clip_n_stds is None:
        raise UsageError("--qe-clip-acts n_std needs --qe-clip-n-stds N (e.g. 3)")
