"""The training flags (epochs, optimizer) and the run flags (what a command starts from, where
it runs and where it writes)."""

from __future__ import annotations

import argparse

from compressor import __version__
from compressor.cli.domains import INT_MAX, gpu_list, integer, path, real
from compressor.utils.vocabulary import AMP_NAMES

__all__ = ["add_training_args", "add_run_args"]

SEED_MAX = 2**63 - 1  # torch.manual_seed takes a 64-bit seed
AMP_CHOICES = AMP_NAMES  # --amp's values


def add_training_args(parser: argparse.ArgumentParser) -> None:
    """--epochs, --lr, --lr-head, --bn-momentum, --bn-recalibrate, --momentum, --wd, -p, --amp,
    --channels-last, --compile."""
    group = parser.add_argument_group(
        "training", "epochs and the SGD optimizer (a checkpoint to resume from: see run)")
    group.add_argument("--epochs", type=integer(0, INT_MAX), default=90,
                       help="total number of epochs, >= 0 (also when resuming)")
    group.add_argument("--lr", "--learning-rate", dest="lr", type=real(0.0, None, low_open=True),
                       default=0.1, help="learning rate, > 0")
    group.add_argument("--lr-head", dest="lr_head", type=real(0.0, None, low_open=True),
                       default=None, help="learning rate of a classifier newly initialised for "
                       "the dataset's classes (--pretrained on other classes), > 0 (default "
                       "10 x --lr)")
    group.add_argument("--bn-momentum", dest="bn_momentum",
                       type=real(0.0, 1.0, low_open=True), default=None,
                       help="batch norm momentum while training, in (0, 1] (default: the "
                            "model's; TF-ported weights such as EfficientNet-Lite's use 0.01, "
                            "slow to adapt in a short fine-tune: 0.1 is PyTorch's)")
    group.add_argument("--bn-recalibrate", dest="bn_recalibrate", type=integer(0, INT_MAX),
                       default=None, metavar="N",
                       help="re-estimate batch-norm statistics from N training batches at the "
                            "end of every epoch (with -e: before evaluating); 0: never (default:"
                            " automatically, on about 1024 images, wherever they went stale)")
    group.add_argument("--momentum", type=real(0.0, 1.0, high_open=True), default=0.9,
                       help="SGD momentum, in [0, 1)")
    group.add_argument("--wd", "--weight-decay", dest="weight_decay", type=real(0.0, None),
                       default=1e-4, help="weight decay, >= 0")
    group.add_argument("-p", "--print-freq", type=integer(0, INT_MAX), default=10,
                       help="log every N mini-batches (0: never)")
    group.add_argument("--amp", choices=AMP_CHOICES, default=None,
                       help="mixed precision: forward passes under autocast in bf16 or fp16 "
                            "(fp16 with a gradient scaler); weights, optimizer and masks stay "
                            "fp32; bf16 runs on the CPU too (default: fp32)")
    group.add_argument("--channels-last", dest="channels_last", action="store_true",
                       help="train and validate in the channels-last memory format (faster "
                            "convolutions on tensor cores and oneDNN)")
    group.add_argument("--compile", dest="compile", action="store_true",
                       help="run the training step's forward through torch.compile (the "
                            "first steps compile; checkpoints and evaluation use the module)")


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """-e, --resume-from, --exp-load-weights-from, --reset-optimizer, --deterministic, --seed,
    --cpu, --gpus, -o, -n."""
    group = parser.add_argument_group(
        "run", "what a command starts from or evaluates, its seed and devices, and where it "
               "writes")
    group.add_argument("-e", "--evaluate", action="store_true", help="evaluate on the test set")
    group.add_argument("--resume-from", dest="resume_from", default=None, metavar="CKPT",
                       type=path, help="resume training (or evaluate with -e) from a checkpoint")
    group.add_argument("--exp-load-weights-from", dest="load_weights_from", default=None,
                       metavar="CKPT", type=path,
                       help="load model weights only, then train from epoch 0")
    group.add_argument("--reset-optimizer", action="store_true",
                       help="with --resume-from: fresh optimizer, epoch 0 and best top-1")
    group.add_argument("--deterministic", "--det", action="store_true",
                       help="reproducible run (seed 0 unless --seed is given)")
    group.add_argument("--seed", type=integer(0, SEED_MAX), default=None,
                       help="random seed, in 0..2**63-1")
    group.add_argument("--cpu", action="store_true", help="run on the CPU even if CUDA exists")
    group.add_argument("--gpus", type=gpu_list, default=None,
                       help="comma-separated GPU indices to use, e.g. 0,1")
    group.add_argument("-o", "--out-dir", dest="output_dir", default="logs", type=path,
                       help="directory that holds the run directories")
    group.add_argument("--version", action="version",
                       version=f"%(prog)s (compressor {__version__})",
                       help="print the version and exit")
    group.add_argument("-n", "--name", default=None,
                       help="run directory name (default: <arch>___<timestamp>)")
