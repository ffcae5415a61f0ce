"""The export flag (ONNX) and the report flags: summaries, sensitivity analysis and the reports
a run adds (TensorBoard, confusion matrix, mask sparsity)."""

from __future__ import annotations

import argparse

from compressor.cli.domains import path, real

__all__ = ["add_export_args", "add_report_args", "SUMMARY_CHOICES", "SENSE_CHOICES"]

SUMMARY_CHOICES = ("sparsity", "compute", "model", "modules")
SENSE_CHOICES = ("element", "filter", "channel")


def add_export_args(parser: argparse.ArgumentParser) -> None:
    """--export-onnx."""
    group = parser.add_argument_group(
        "export", "the model as ONNX (float, or int8 QDQ from a quantized checkpoint)")
    group.add_argument("--export-onnx", dest="export_onnx", nargs="?", const="model.onnx",
                       default=None, metavar="FILE", type=path,
                       help="export the model to ONNX (default model.onnx in the run "
                            "directory), checked in ONNX Runtime; needs the [onnx] extra")


def add_report_args(parser: argparse.ArgumentParser) -> None:
    """--summary, --sense, --sense-range, --tensorboard, --confusion, --masks-sparsity."""
    group = parser.add_argument_group(
        "reports", "model summaries and sensitivity analysis (each instead of training), and "
                   "what a run reports besides results.json")
    group.add_argument("--summary", choices=SUMMARY_CHOICES, action="append", default=None,
                       help="print a summary of the model and exit (repeat for several)")
    group.add_argument("--sense", choices=SENSE_CHOICES, default=None,
                       help="sensitivity analysis by pruning granularity")
    group.add_argument("--sense-range", dest="sense_range", type=real(None, None), nargs=3,
                       default=(0.0, 0.95, 0.05), metavar=("START", "STOP", "STEP"),
                       help="sparsity levels for --sense: 0 <= START < STOP <= 1, STEP > 0")
    group.add_argument("--tensorboard", action="store_true",
                       help="write TensorBoard scalars under the run directory")
    group.add_argument("--confusion", action="store_true",
                       help="confusion matrix of the evaluated split (confusion.csv/.png)")
    group.add_argument("--masks-sparsity", dest="masks_sparsity", action="store_true",
                       help="log the per-layer mask sparsity table at the end of each epoch")
