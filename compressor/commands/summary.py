"""`--summary sparsity|compute|model|modules`: print the model's tables, then exit."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from compressor.reports.summary import print_summary

__all__ = ["run_summary"]


def run_summary(model: nn.Module, kinds: Sequence[str]) -> int:
    """Print each requested summary table of `model`; returns the exit status."""
    for kind in kinds:
        print(print_summary(model, kind))
    return 0
