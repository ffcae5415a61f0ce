"""The data flags: DATASET_DIR, --dataset, the loaders and Distiller's split fractions."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from types import MappingProxyType

from compressor.cli.domains import INT_MAX, integer, path, real
from compressor.utils.dataset_table import dataset_names

__all__ = ["add_data_args", "usable_cpus", "default_workers", "MACHINE_DEFAULTS", "FRACTION"]

MAX_WORKERS = 1024
DISTILLER_WORKERS = 4  # Distiller's -j default
# defaults that depend on the machine, as the CLI reference states them (dest -> words), so the
# page reads the same on every machine
MACHINE_DEFAULTS: Mapping[str, str] = MappingProxyType(
    {"workers": f"{DISTILLER_WORKERS}, capped at the CPUs"})
FRACTION = real(0.0, 1.0, low_open=True)  # a share of a split: (0, 1]
_VALIDATION_SPLIT = real(0.0, 1.0, high_open=True)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows: no affinity mask
        return os.cpu_count() or 1


def default_workers() -> int:
    """-j's default: Distiller's 4, never more than the CPUs at hand (torch warns beyond)."""
    return min(DISTILLER_WORKERS, usable_cpus())


def add_data_args(parser: argparse.ArgumentParser) -> None:
    """DATASET_DIR, --dataset, -j, -b, --vs, --etrs, --evs, --etes."""
    group = parser.add_argument_group(
        "data", "which dataset, how it is split (Distiller's fractions) and loaded")
    group.add_argument("data", metavar="DATASET_DIR", nargs="?", default=None, type=path,
                       help="dataset directory (not needed for digits and synthetic)")
    group.add_argument("--dataset", choices=dataset_names(), default=None,
                       help="dataset (default: the checkpoint's; else DATASET_DIR's class "
                            "folders: ImageNet wnids -> imagenet, other names -> folder; else "
                            "the arch's)")
    group.add_argument("-j", "--workers", type=integer(0, MAX_WORKERS),
                       default=default_workers(),
                       help=f"data loading worker processes, 0..{MAX_WORKERS} (0: load in the "
                            f"main process; default: Distiller's {DISTILLER_WORKERS}, capped at "
                            "the CPUs this process may use)")
    group.add_argument("-b", "--batch-size", type=integer(1, INT_MAX), default=256,
                       help="mini-batch size, >= 1 (training and evaluation)")
    group.add_argument("--vs", "--validation-split", dest="validation_split",
                       type=_VALIDATION_SPLIT, default=0.1,
                       help="fraction of the training set held out for validation, in [0, 1)")
    group.add_argument("--etrs", "--effective-train-size", dest="effective_train_size",
                       type=FRACTION, default=1.0,
                       help="fraction of the training set to use, in (0, 1]")
    group.add_argument("--evs", "--effective-valid-size", dest="effective_valid_size",
                       type=FRACTION, default=1.0,
                       help="fraction of the validation set to use, in (0, 1]")
    group.add_argument("--etes", "--effective-test-size", dest="effective_test_size",
                       type=FRACTION, default=1.0,
                       help="fraction of the test set to use, in (0, 1]")
