"""The schedule preview of `--compress FILE --dry-run`: per epoch, each pruner's target and the
learning rate, computed from the schedule alone (no data, no training)."""

from __future__ import annotations

from tabulate import tabulate

from compressor.pruning import PruneStep
from compressor.schedule.policies import (
    ExtensionPolicy,
    LRPolicy,
    PruningPolicy,
    RegularizationPolicy,
)
from compressor.schedule.scheduler import CompressionScheduler

__all__ = ["format_dry_run", "preview_rows"]


def preview_rows(scheduler: CompressionScheduler, epochs: int) -> tuple[list[str], list[list[str]]]:
    """Headers and one row per epoch: epoch, lr, then one column per instance."""
    columns: list[str] = []
    for policy in scheduler.policies:
        if not isinstance(policy, LRPolicy) and policy.instance_name not in columns:
            columns.append(policy.instance_name)
    lrs = [float(group["lr"]) for group in scheduler.optimizer.param_groups]
    rows = []
    for epoch in range(epochs):
        cells = dict.fromkeys(columns, "")
        for policy in scheduler.policies:
            if epoch not in policy.window.epochs:
                continue
            if isinstance(policy, PruningPolicy):
                window = policy.window
                step = PruneStep(epoch, window.starting_epoch, window.ending_epoch,
                                 window.frequency)
                cells[policy.instance_name] = policy.pruner.describe_target(step)
            elif isinstance(policy, RegularizationPolicy):
                cells[policy.instance_name] = "on"
            elif isinstance(policy, ExtensionPolicy):
                cells[policy.instance_name] = "thin"
        rows.append([str(epoch), f"{lrs[0]:.6g}", *cells.values()])
        for policy in scheduler.policies:
            if isinstance(policy, LRPolicy) and epoch in policy.window.epochs:
                lrs = policy.scheduler.preview(epoch, lrs)
    return ["epoch", "lr", *columns], rows


def format_dry_run(scheduler: CompressionScheduler, epochs: int) -> str:
    """A table: per epoch the learning rate and each pruner's target sparsity (fraction)."""
    headers, rows = preview_rows(scheduler, epochs)
    notes = [f"schedule {scheduler.source}: {len(scheduler.policies)} policies, "
             f"{epochs} epochs; pruner cells are target sparsities (fractions) in the epochs "
             f"the pruner acts, 'on' marks an active regularizer, 'thin' a thinning step"]
    if any(isinstance(p, LRPolicy) and not hasattr(p.scheduler, "lrs_at")
           for p in scheduler.policies):
        notes.append("ReduceLROnPlateau depends on validation results: its reductions are not "
                     "shown")
    return "\n".join([*notes, tabulate(rows, headers=headers, tablefmt="github",
                                       disable_numparse=True)])
