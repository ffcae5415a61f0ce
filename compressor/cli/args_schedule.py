"""The schedule flags: a Distiller YAML schedule, its dry run, and thinning what it pruned."""

from __future__ import annotations

import argparse

from compressor.cli.domains import path

__all__ = ["add_schedule_args"]


def add_schedule_args(parser: argparse.ArgumentParser) -> None:
    """--compress, --dry-run, --thinnify."""
    group = parser.add_argument_group(
        "schedule", "pruning, regularization, quantization-aware training and learning rates "
                    "per epoch from a Distiller YAML schedule; thinning what pruning zeroed")
    group.add_argument("--compress", default=None, metavar="YAML", type=path,
                       help="compression schedule (Distiller YAML format)")
    group.add_argument("--dry-run", action="store_true",
                       help="with --compress: print the schedule per epoch and exit")
    group.add_argument("--thinnify", action="store_true",
                       help="with --resume-from: remove zeroed filters/channels and save")
