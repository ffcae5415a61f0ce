"""The budget flags: compress a trained model to fractions of its own MACs, parameters,
latency or saved size in one run (and Distiller's --greedy spelling of a MACs budget)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from compressor.cli.domains import integer, real
from compressor.utils.errors import UsageError

if TYPE_CHECKING:
    from compressor.utils.config import BudgetConfig

__all__ = ["add_budget_args", "check_budget", "budget_requested", "budget_config",
           "budget_only_flags", "TARGETS", "QUANTITIES"]

# flag -> budgeted quantity
TARGETS = (("--target-macs", "macs"), ("--target-params", "params"),
           ("--target-latency", "latency"), ("--target-size", "size"))
QUANTITIES = tuple(quantity for _, quantity in TARGETS)
_fraction = real(0.0, 1.0, low_open=True, high_open=True)


def add_budget_args(parser: argparse.ArgumentParser) -> None:
    """--target-*, --max-accuracy-drop, --target-accuracy-drop, --minimize, --latency-*,
    --no-kd, --greedy*."""
    group = parser.add_argument_group(
        "budget", "compress a trained model (--resume-from or --pretrained) until every budget "
        "holds: search per-layer ratios, prune, thin, fine-tune --epochs with distillation")
    for flag, quantity in TARGETS:
        group.add_argument(flag, dest=f"target_{quantity}", type=_fraction, default=None,
                           metavar="F", help=f"{quantity} as a fraction of the dense model's, "
                           "in (0, 1)" + (" (after int8 with --qe)" if quantity == "size"
                                          else ""))
    group.add_argument("--max-accuracy-drop", "--max-drop", dest="max_drop",
                       type=real(0.0, 100.0), default=None, metavar="PTS",
                       help="accuracy as a budget: most validation top-1 points the run may "
                       "cost against the dense model, in [0, 100], checked after the fine-tune "
                       "and again after int8 (a model at chance is never met)")
    group.add_argument("--target-accuracy-drop", dest="target_accuracy_drop",
                       type=real(0.0, 100.0), default=None, metavar="PTS",
                       help="compress as far as accuracy allows: remove what --minimize names "
                       "while validation top-1 stays within PTS points of the dense model's, "
                       "in [0, 100] (checked again after the fine-tune and int8)")
    group.add_argument("--minimize", choices=QUANTITIES, default=None,
                       help="with --target-accuracy-drop: the quantity to reduce (default macs)")
    group.add_argument("--latency-batch", dest="latency_batch", type=integer(1, 4096),
                       default=None, metavar="N", help="batch size of latency measurements, "
                       "1..4096 (default 1)")
    group.add_argument("--latency-threads", dest="latency_threads", type=integer(1, 1024),
                       default=None, metavar="N", help="CPU threads of latency measurements, "
                       "1..1024 (default 1)")
    group.add_argument("--channel-multiple", dest="channel_multiple", type=integer(1, 1024),
                       default=None, metavar="N", help="pruned layers keep a multiple of N "
                       "channels, 1..1024 (default 8 on CUDA, where tensor cores run tiles of "
                       "8, and 1 on the CPU)")
    group.add_argument("--no-kd", dest="no_kd", action="store_true",
                       help="fine-tune without distillation from the dense model")
    group.add_argument("--greedy", action="store_true",
                       help="Distiller's greedy search: here a budget run with --target-macs")
    group.add_argument("--greedy-target-density", dest="greedy_target_density", type=_fraction,
                       default=None, metavar="D", help="with --greedy: the MACs fraction to "
                       "reach, in (0, 1) (= --target-macs D)")


def budget_requested(args: argparse.Namespace) -> bool:
    """Whether the command line gives a budget (a --target-* or --greedy)."""
    return args.greedy or args.target_accuracy_drop is not None or any(
        getattr(args, f"target_{q}") is not None for _, q in TARGETS)


def _map_greedy(args: argparse.Namespace) -> None:
    if args.greedy_target_density is not None and not args.greedy:
        raise UsageError("--greedy-target-density needs --greedy (or write --target-macs D)")
    if not args.greedy:
        return
    if args.greedy_target_density is None:
        raise UsageError("--greedy needs --greedy-target-density D (the MACs fraction to reach)")
    if args.target_macs is not None and args.target_macs != args.greedy_target_density:
        raise UsageError("--greedy-target-density and --target-macs disagree; give one")
    args.target_macs = args.greedy_target_density


def budget_only_flags(args: argparse.Namespace) -> list[str]:
    """The flags given that only a budget run reads (--max-accuracy-drop, --no-kd,
    --latency-*)."""
    return [flag for flag, on in (
        ("--max-accuracy-drop", args.max_drop is not None), ("--no-kd", args.no_kd),
        ("--latency-batch", args.latency_batch is not None),
        ("--latency-threads", args.latency_threads is not None),
        ("--channel-multiple", args.channel_multiple is not None),
        ("--minimize", args.minimize is not None)) if on]


def _check_accuracy_bounded(args: argparse.Namespace) -> None:
    """--target-accuracy-drop names no fraction: the other budgets and --minimize agree."""
    if args.minimize is not None and args.target_accuracy_drop is None:
        raise UsageError("--minimize names what --target-accuracy-drop PTS reduces; add "
                         "--target-accuracy-drop PTS (or give a --target-* fraction instead)")
    if args.target_accuracy_drop is None:
        return
    given = [flag for flag, quantity in TARGETS if getattr(args, f"target_{quantity}")
             is not None]
    if given:
        raise UsageError(f"--target-accuracy-drop compresses as far as accuracy allows, and "
                         f"{given[0]} sets a fraction; give one of them (with "
                         "--target-accuracy-drop, name the quantity with --minimize)")
    if args.max_drop is not None:
        raise UsageError("--target-accuracy-drop is the accuracy bound of its own run; drop "
                         "--max-accuracy-drop")


def check_budget(args: argparse.Namespace, non_training_mode: str | None) -> None:
    """Cross-check the budget flags (maps --greedy onto --target-macs); UsageError otherwise."""
    _map_greedy(args)
    _check_accuracy_bounded(args)
    if not budget_requested(args):
        extra = budget_only_flags(args)
        if extra and args.resume_from is None:  # else: only a budget run's checkpoint takes them
            raise UsageError(f"{extra[0]} belongs to a budget run; add a --target-* budget or "
                             f"drop {extra[0]}")
        return
    if non_training_mode is not None:
        raise UsageError(f"a budget (--target-*) compresses by fine-tuning, and "
                         f"{non_training_mode} trains nothing; drop one of them")
    if args.resume_from is None and not args.pretrained:
        raise UsageError("a budget run compresses a trained model: pass --resume-from "
                         "DENSE.pth.tar or -a ARCH --pretrained")
    if args.compress is not None:
        raise UsageError("a budget run writes its own schedule (budget_schedule.yaml); drop "
                         "--compress")
    latency = args.target_latency is not None or args.minimize == "latency"
    if not latency and (args.latency_batch is not None or args.latency_threads is not None):
        raise UsageError("--latency-batch/--latency-threads set how --target-latency is "
                         "measured; add --target-latency or drop them")


def budget_config(args: argparse.Namespace) -> BudgetConfig:
    """The budget flags as a typed config."""
    from compressor.utils.config import BudgetConfig  # torch: not for parsing alone

    targets = {q: getattr(args, f"target_{q}") for _, q in TARGETS
               if getattr(args, f"target_{q}") is not None}
    max_drop = args.max_drop
    if args.target_accuracy_drop is not None:  # any fraction of the one quantity minimized
        targets, max_drop = {args.minimize or "macs": 1.0}, args.target_accuracy_drop
    return BudgetConfig(targets=targets, max_drop=max_drop,
                        accuracy_drop=args.target_accuracy_drop,
                        latency_batch=args.latency_batch or 1,
                        latency_threads=args.latency_threads or 1,
                        distill=not args.no_kd, channel_multiple=args.channel_multiple)
