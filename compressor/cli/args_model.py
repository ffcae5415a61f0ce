"""The model flags: the architecture, its weights and input, and its memory-efficient variant."""

from __future__ import annotations

import argparse

from compressor.cli.domains import (
    INT_MAX,
    input_size,
    integer,
    path,
    positive_reals,
    real,
    reals,
)
from compressor.utils.vocabulary import AUTO, MEMORY_VARIANTS

__all__ = ["add_model_args", "add_memory_args"]


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """-a, --pretrained, --pretrained-file, --num-classes, --input-size, --mean, --std."""
    group = parser.add_argument_group(
        "model", "the architecture, the weights it starts from and its input")
    group.add_argument("-a", "--arch", default=None,
                       help="architecture: a registered name (see compressor.models.list_archs()), "
                            "timm/NAME (any timm model; the [timm] extra), or your own code as "
                            "path/to/file.py:Name or package.module:Name")
    group.add_argument("--pretrained", action="store_true",
                       help="start from the arch's pretrained weights (torchvision's, timm's from "
                            "the local Hugging Face cache, a package's); on a dataset with other "
                            "classes the classifier is new (transfer learning)")
    group.add_argument("--pretrained-file", dest="pretrained_file", default=None, metavar="PATH",
                       type=path,
                       help="with --pretrained: read the weights from this file (a state dict or "
                            "a safetensors file) instead of the arch's own")
    group.add_argument("--num-classes", dest="num_classes", type=integer(1, INT_MAX),
                       default=None, help="classes of the model, >= 1 (default: the dataset's)")
    group.add_argument("--input-size", dest="input_size", type=input_size, default=None,
                       metavar="C,H,W", help="the model's input size, e.g. 3,64,64: 1..4 "
                                              "channels, a square side of 1..4096 pixels "
                                              "(default: the arch's, for its dataset)")
    group.add_argument("--mean", type=reals, default=None, metavar="M[,M,M]",
                       help="normalization mean per channel (default: the arch's)")
    group.add_argument("--std", type=positive_reals, default=None, metavar="S[,S,S]",
                       help="normalization standard deviation per channel, > 0 (default: the "
                            "arch's)")


def add_memory_args(parser: argparse.ArgumentParser) -> None:
    """--memory-efficient, --memory-budget."""
    group = parser.add_argument_group(
        "memory", "train with less memory: the same model, computed by a memory-efficient variant")
    group.add_argument("--memory-efficient", dest="memory_efficient", default=None,
                       choices=(*MEMORY_VARIANTS, AUTO),
                       help="memory-efficient variant: recompute (activation checkpointing, "
                            "efficient DenseNet), inplace-abn (fused BN + leaky ReLU), or auto "
                            "(the fastest plain model, variant or combination whose measured "
                            "training step at -b fits --memory-budget; inplace-abn only when "
                            "training from scratch)")
    group.add_argument("--memory-budget", dest="memory_budget", default=None, metavar="GIB",
                       type=real(0.0, None, low_open=True),
                       help="with --memory-efficient auto: the memory one training step may "
                            "take on the run's device, in GiB (weights, gradients, optimizer "
                            "state and activations)")
