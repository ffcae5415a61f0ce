"""The command line: Distiller's compress_classifier.py flags, with their names and meanings."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from compressor.errors import UsageError
from compressor.memory import MEMORY_VARIANTS

__all__ = ["get_args_parser", "parse_args"]

DATASET_CHOICES = ("digits", "mnist", "fashion-mnist", "cifar10", "cifar100", "imagenet",
                   "synthetic")
SUMMARY_CHOICES = ("sparsity", "compute", "model", "modules")
SENSE_CHOICES = ("element", "filter", "channel")


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one line on stderr, exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction in [0, 1]")
    return value


def _add_data_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data")
    group.add_argument("data", metavar="DATASET_DIR", nargs="?", default=None,
                       help="dataset directory (not needed for digits and synthetic)")
    group.add_argument("--dataset", choices=DATASET_CHOICES, default=None,
                       help="dataset (default: inferred from the arch or the checkpoint)")
    group.add_argument("-j", "--workers", type=int, default=4, help="data loading workers")
    group.add_argument("-b", "--batch-size", type=int, default=256, help="mini-batch size")
    group.add_argument("--vs", "--validation-split", dest="validation_split", type=_fraction,
                       default=0.1, help="fraction of the training set held out for validation")
    group.add_argument("--etrs", "--effective-train-size", dest="effective_train_size",
                       type=_fraction, default=1.0, help="fraction of the training set to use")
    group.add_argument("--evs", "--effective-valid-size", dest="effective_valid_size",
                       type=_fraction, default=1.0, help="fraction of the validation set to use")
    group.add_argument("--etes", "--effective-test-size", dest="effective_test_size",
                       type=_fraction, default=1.0, help="fraction of the test set to use")


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("-a", "--arch", default=None,
                       help="architecture (see compressor.models.list_archs())")
    group.add_argument("--pretrained", action="store_true",
                       help="start from torchvision's pretrained weights")
    group.add_argument("--memory-efficient", dest="memory_efficient", default=None,
                       choices=MEMORY_VARIANTS,
                       help="memory-efficient variant: recompute (activation checkpointing, "
                            "efficient DenseNet) or inplace-abn (fused BN + leaky ReLU)")


def _add_training_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("training")
    group.add_argument("--epochs", type=int, default=90,
                       help="total number of epochs (also when resuming)")
    group.add_argument("--lr", "--learning-rate", dest="lr", type=float, default=0.1)
    group.add_argument("--momentum", type=float, default=0.9)
    group.add_argument("--wd", "--weight-decay", dest="weight_decay", type=float, default=1e-4)
    group.add_argument("-p", "--print-freq", type=int, default=10,
                       help="log every N mini-batches")
    group.add_argument("--deterministic", "--det", action="store_true",
                       help="reproducible run (seed 0 unless --seed is given)")
    group.add_argument("--seed", type=int, default=None, help="random seed")
    group.add_argument("--cpu", action="store_true", help="run on the CPU even if CUDA exists")
    group.add_argument("--gpus", default=None,
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
    group.add_argument("--sense-range", dest="sense_range", type=float, nargs=3,
                       default=(0.0, 0.95, 0.05), metavar=("START", "STOP", "STEP"),
                       help="sparsity levels for --sense")
    group.add_argument("--thinnify", action="store_true",
                       help="with --resume-from: remove zeroed filters/channels and save")


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
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and cross-check the command line."""
    args = get_args_parser().parse_args(argv)
    if args.arch is None and args.resume_from is None:
        raise UsageError("no architecture given: pass -a ARCH, or --resume-from CKPT")
    if args.epochs < 0 or args.batch_size < 1 or args.workers < 0:
        raise UsageError("--epochs, -b and -j must be positive")
    if args.thinnify and args.resume_from is None:
        raise UsageError("--thinnify needs --resume-from CKPT (the pruned model to thin)")
    if args.dry_run and args.compress is None:
        raise UsageError("--dry-run needs --compress YAML")
    if args.reset_optimizer and args.resume_from is None:
        raise UsageError("--reset-optimizer needs --resume-from CKPT")
    if args.resume_from and args.load_weights_from:
        raise UsageError("give either --resume-from or --exp-load-weights-from, not both")
    args.gpus = _parse_gpus(args.gpus)
    return args


def _parse_gpus(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--gpus {text}: expected comma-separated indices, e.g. 0,1") from None
