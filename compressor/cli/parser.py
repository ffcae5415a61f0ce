"""The command line: Distiller's compress_classifier.py flags, with their names and meanings,
in the groups that --help and docs/cli.md show (one args_* module per group or two)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from compressor.cli.args_data import MACHINE_DEFAULTS, add_data_args
from compressor.cli.args_distillation import add_distillation_args
from compressor.cli.args_model import add_memory_args, add_model_args
from compressor.cli.args_quantization import add_quantization_args
from compressor.cli.args_reports import add_export_args, add_report_args
from compressor.cli.args_schedule import add_schedule_args
from compressor.cli.args_training import add_run_args, add_training_args
from compressor.cli.budget_args import add_budget_args
from compressor.cli.checks import check_args

__all__ = ["get_args_parser", "parse_args", "option_groups", "MACHINE_DEFAULTS"]

# the groups in the order --help (and docs/cli.md) shows them
_GROUPS = (add_data_args, add_model_args, add_training_args, add_run_args, add_schedule_args,
           add_quantization_args, add_distillation_args, add_budget_args, add_memory_args,
           add_export_args, add_report_args)


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one line on stderr, exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)


def get_args_parser() -> argparse.ArgumentParser:
    """The compress_classifier.py argument parser."""
    parser = _OneLineParser(
        prog="compress_classifier.py",
        description="Train, compress, resume and evaluate PyTorch image classifiers.")
    for add_group in _GROUPS:
        add_group(parser)
    return parser


def option_groups(parser: argparse.ArgumentParser
                  ) -> list[tuple[str, str, list[argparse.Action]]]:
    """(title, description, actions) of each of our groups, in --help's order (argparse's own
    positional and options sections, which hold only -h, are left out)."""
    # argparse has no public accessor for its groups; these attributes are what its own
    # HelpFormatter reads
    own = (parser._positionals, parser._optionals)
    return [(group.title or "", group.description or "", list(group._group_actions))
            for group in parser._action_groups if group not in own]


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
    check_args(args)
    return args
