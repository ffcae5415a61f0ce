"""Distiller's post-training quantization flags (range_linear.add_post_train_quant_args), and
the int8 conversion that follows them."""

from __future__ import annotations

import argparse

from compressor.cli.args_data import FRACTION
from compressor.cli.domains import integer, path, real
from compressor.utils.vocabulary import (
    CLIP_MODE_NAMES,
    INT8_BACKENDS,
    QUANT_MODE_NAMES,
    clip_mode_name,
    quant_mode_name,
)

__all__ = ["add_quantization_args", "QE_MODES", "QE_CLIP_MODES", "QE_BACKENDS",
           "CALIBRATION_SPLITS"]

# the names quantize_int8 and the commands read the flags with (one list each)
QE_MODES = tuple(QUANT_MODE_NAMES)
QE_CLIP_MODES = CLIP_MODE_NAMES
QE_BACKENDS = INT8_BACKENDS
CALIBRATION_SPLITS = ("train", "test")
MAX_QUANT_BITS = 16


def add_quantization_args(parser: argparse.ArgumentParser) -> None:
    """--quantize-eval/--qe and the --qe-* flags."""
    group = parser.add_argument_group(
        "quantization",
        "post-training quantization, with -e (quantization-aware training is a --compress "
        "schedule); 8-bit models convert to real int8 kernels with --qe-convert-pytorch, other "
        "widths are simulated")
    bits = integer(0, MAX_QUANT_BITS)
    group.add_argument("--quantize-eval", "--qe", dest="quantize_eval", action="store_true",
                       help="quantize the model after loading it, then evaluate it (with -e)")
    group.add_argument("--qe-mode", "--qem", dest="qe_mode", choices=QE_MODES, default="sym",
                       type=quant_mode_name,
                       help="linear quantization mode (default sym; Distiller's names, "
                            "e.g. SYMMETRIC, are taken too)")
    group.add_argument("--qe-mode-acts", "--qema", dest="qe_mode_acts", choices=QE_MODES,
                       type=quant_mode_name,
                       default=None, help="mode of the activations (overrides --qe-mode)")
    group.add_argument("--qe-mode-wts", "--qemw", dest="qe_mode_wts", choices=QE_MODES,
                       type=quant_mode_name,
                       default=None, help="mode of the weights (overrides --qe-mode)")
    group.add_argument("--qe-bits-acts", "--qeba", dest="qe_bits_acts", type=bits, default=8,
                       help="bits of the activations, 2..16 (0: keep float; default 8)")
    group.add_argument("--qe-bits-wts", "--qebw", dest="qe_bits_wts", type=bits, default=8,
                       help="bits of the weights, 2..16 (0: keep float; default 8)")
    group.add_argument("--qe-bits-accum", dest="qe_bits_accum", type=integer(1, 32),
                       default=32, help="bits of the accumulator, 1..32 (default 32)")
    group.add_argument("--qe-clip-acts", "--qeca", dest="qe_clip_acts", choices=QE_CLIP_MODES,
                       type=clip_mode_name,
                       default="none", help="activation clipping (default none; mse: the range "
                       "of least squared error on the calibration histogram, as torch.ao's "
                       "HistogramObserver)")
    group.add_argument("--qe-clip-n-stds", dest="qe_clip_n_stds",
                       type=real(0.0, None, low_open=True), default=None,
                       help="with --qe-clip-acts n_std: clip at mean +- N standard deviations, "
                            "N > 0")
    group.add_argument("--qe-no-clip-layers", "--qencl", dest="qe_no_clip_layers", nargs="+",
                       default=[], metavar="LAYER", help="layers whose activations are not "
                                                         "clipped")
    group.add_argument("--qe-no-quant-layers", "--qenql", dest="qe_no_quant_layers", nargs="+",
                       default=[], metavar="LAYER", help="layers kept in float")
    group.add_argument("--qe-per-channel", "--qepc", dest="qe_per_channel", action="store_true",
                       help="per-channel weight quantization")
    source = group.add_mutually_exclusive_group()
    source.add_argument("--qe-calibration", dest="qe_calibration", type=FRACTION,
                        default=None, metavar="FRACTION",
                        help="collect activation statistics on this fraction, in (0, 1], of the "
                             "calibration split (alone: write acts_quantization_stats.yaml and "
                             "exit)")
    source.add_argument("--qe-stats-file", dest="qe_stats_file", default=None, metavar="PATH",
                        type=path, help="activation statistics (Distiller's YAML format)")
    source.add_argument("--qe-dynamic", dest="qe_dynamic", action="store_true",
                        help="activation ranges computed on the fly, per batch (simulated)")
    source.add_argument("--qe-config-file", dest="qe_config_file", default=None,
                        metavar="YAML", type=path,
                        help="a Distiller YAML with a PostTrainLinearQuantizer (its settings "
                             "replace the --qe-* flags)")
    group.add_argument("--qe-calibration-split", dest="qe_calibration_split",
                       choices=CALIBRATION_SPLITS, default="train",
                       help="where calibration reads: a seeded fraction of the training split, "
                            "with evaluation transforms (default), or of the test split, which "
                            "Distiller used and which is then reported on")
    group.add_argument("--qe-convert-pytorch", "--qept", dest="qe_convert_pytorch",
                       action="store_true",
                       help="convert the quantized model to real int8 kernels (8 bits only)")
    group.add_argument("--qe-pytorch-backend", dest="qe_pytorch_backend", choices=QE_BACKENDS,
                       default="auto",
                       help="int8 kernels: onednn (plain uint8 tensors, the kernels torchao's x86 "
                            "lowering calls), x86 / fbgemm / qnnpack (torch.ao's quantized "
                            "engines); auto (default): onednn where it can compute the model "
                            "(symmetric weights), else x86")
