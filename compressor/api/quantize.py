"""`quantize_int8`: post-training int8 quantization from a calibration loader, on real kernels.

The steps are the command line's (`-e --qe --qe-convert-pytorch`): settings from the same
options, the model as the graph quantization follows, Distiller's activation statistics,
the simulated quantized model (its recipe recorded, so a checkpoint rebuilds it), then int8
kernels. compressor.commands.quantize calls the same helpers for its float models.
"""

from __future__ import annotations

import copy
import itertools
import logging
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from torch import nn

from compressor.api.identity import check_module, ensure_described, input_batch
from compressor.assembly.recipes import record_transform
from compressor.models.description import describe, description_of
from compressor.quantization import (
    INT8_BACKENDS,
    PostTrainLinearQuantizer,
    QuantizationError,
    QuantSettings,
    collect_stats,
    settings_from_args,
)
from compressor.quantization.core.errors import unknown_choice
from compressor.quantization.int8.convert import (
    check_convertible,
    kernels_saturate,
    resolve_backend,
)
from compressor.quantization.int8.placement import int8_placement
from compressor.quantization.recipe import QUANTIZATION, int8_model, quantization_kind
from compressor.quantization.request import QuantizeRequest
from compressor.quantization.simulated.graph import explicit_graph
from compressor.utils.errors import UsageError
from compressor.utils.vocabulary import (
    CLIP_MODE_NAMES,
    QUANT_MODE_NAMES,
    clip_mode_name,
    quant_mode_name,
)

__all__ = ["quantize_int8", "MODE_NAMES", "CLIP_MODES",
           "kernel_settings", "quantization_graph", "post_train", "convert_int8"]

LOG = logging.getLogger("compressor")
# --qe-mode's names -> Distiller's LinearQuantMode names
MODE_NAMES = QUANT_MODE_NAMES
CLIP_MODES = CLIP_MODE_NAMES  # --qe-clip-acts's names (ClipMode's members, lower case)
CALIBRATION_SOURCE = "the calibration loader's first batch"


def kernel_settings(settings: QuantSettings, config: QuantizeRequest) -> QuantSettings:
    """The settings to quantize with: with reduce_range where int8 conversion is asked for and
    this CPU's kernels need it, so the simulation computes what the kernels will."""
    if config.convert and not settings.reduce_range and kernels_saturate(config.backend):
        LOG.info("this CPU's %s int8 kernels saturate 8-bit activations (no VNNI): "
                 "activations use 7 bits (reduce_range)", config.backend)
        return replace(settings, reduce_range=True)
    return settings


def quantization_graph(model: nn.Module, config: QuantizeRequest, source: str) -> nn.Module:
    """The float model as the graph quantization follows (compressor.quantization.simulated.graph:
    functional adds, multiplies and concatenations as named modules); where torch.fx cannot
    trace it, the model itself (its modules are quantized, functional ops stay float) and int8
    kernels, which need the graph, are refused."""
    try:
        return explicit_graph(model)
    except QuantizationError as exc:
        if config.convert:
            raise QuantizationError(f"{source}: {exc}; --qe-convert-pytorch needs it: drop it "
                                    "to evaluate the model simulated") from None
        LOG.warning("%s: %s; its modules are quantized, its functional ops stay float", source,
                    exc)
        return model


def post_train(float_model: nn.Module, settings: QuantSettings, stats: dict[str, Any] | None,
               dynamic: bool, share_concat: bool = True) -> nn.Module:
    """The simulated post-training quantized model, its recipe recorded in its description."""
    description = description_of(float_model)
    quantizer = PostTrainLinearQuantizer(settings, stats, dynamic=dynamic,
                                         share_concat=share_concat)
    quantized = quantizer.quantize(float_model)
    return record_transform(describe(quantized, description), QUANTIZATION,
                            {"kind": "post_train", "kernels": "simulated",
                             **quantizer.recipe()})


def convert_int8(simulated: nn.Module, backend: str) -> nn.Module:
    """The int8-kernel model (CPU) of a simulated one; the recipe records kernels and backend."""
    check_convertible(simulated, backend)
    backend = resolve_backend(simulated, backend)
    if backend == "onednn":
        LOG.info("int8 kernels: oneDNN's (torch.ops.onednn) on plain uint8 tensors")
    else:
        LOG.info("int8 kernels: torch.ao.nn.quantized modules on the %s engine (torch 2.14 "
                 "deprecates torch.ao's quantized tensors for torchao: docs/quantization.md)",
                 backend)
    recipe = dict(description_of(simulated).recipe(QUANTIZATION))
    record_transform(simulated, QUANTIZATION, {**recipe, "kernels": "int8", "backend": backend})
    return int8_model(simulated, backend)


def _choice(what: str, value: Any, choices: Iterable[str]) -> str:
    names = tuple(choices)
    if value not in names:
        raise unknown_choice(f"quantize_int8 {what}", value, names)
    return str(value)


def _calibration(loader: Any, num_batches: int | None) -> Any:
    """What the statistics read (twice): the loader, or its first `num_batches` as a list."""
    if num_batches is None:
        return loader
    if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 1:
        raise UsageError(f"quantize_int8: num_batches is {num_batches!r}; give a positive "
                         "integer, or None for the whole loader")
    return list(itertools.islice(loader, num_batches))


def _first_batch(loader: Any) -> Any:
    try:
        return next(iter(loader))
    except StopIteration:
        raise UsageError("quantize_int8: the calibration loader is empty; give it batches of "
                         "the training data") from None
    except TypeError:
        raise UsageError("quantize_int8: the calibration loader is of type "
                         f"{type(loader).__name__}, not an iterable of batches; pass a "
                         "DataLoader or a list of batches") from None


def quantize_int8(model: nn.Module, calibration_loader: Iterable[Any], *, mode: str = "sym",
                  per_channel: bool = False, clip: str = "none", backend: str = "auto",
                  num_batches: int | None = None) -> nn.Module:
    """Post-training int8 quantization of a float model, calibrated on `calibration_loader`.

    The same as `-e --qe --qe-convert-pytorch` with the flags named alike: 8-bit weights and
    activations, ranges from Distiller's activation statistics. The model is not changed.

    Args:
        model: a trained float classifier (thinned or not), on any device.
        calibration_loader: batches of (inputs, targets) or of inputs, read twice (a DataLoader
            or a list; a few hundred training images suffice).
        mode: --qe-mode: "sym", "sym_restr", "asym_u" or "asym_s" (or Distiller's names, as
            its YAML takes them: "SYMMETRIC", "ASYMMETRIC_UNSIGNED" ...).
        per_channel: --qe-per-channel: one weight scale per output channel (usually closer to
            float than one per tensor).
        clip: --qe-clip-acts: "none", "avg", "gauss", "laplace" or "mse" ("n_std" needs
            --qe-clip-n-stds, which only the command line takes).
        backend: --qe-pytorch-backend: "auto", "onednn", "x86", "fbgemm" or "qnnpack".
        num_batches: calibrate on the loader's first `num_batches` batches (default: all).

    Returns:
        A CPU module running int8 kernels; save_checkpoint stores it (as integers and scales)
        and export_onnx writes it as a QDQ graph.
    """
    mode = _choice("mode", quant_mode_name(mode), MODE_NAMES)
    clip = _choice("clip", clip_mode_name(clip), CLIP_MODES)
    backend = _choice("backend", backend, INT8_BACKENDS)
    if clip == "n_std":
        raise UsageError("quantize_int8: clip 'n_std' needs a number of standard deviations, "
                         "which this function does not take; use 'gauss' or 'laplace' (ACIQ)")
    if mode.startswith("asym") and backend == "onednn":
        raise UsageError("quantize_int8: the onednn backend takes symmetric weights; use "
                         "mode='sym', or backend='x86' (or 'auto')")
    check_module(model, "quantize_int8")
    first = _first_batch(calibration_loader)
    description = ensure_described(model, first, "quantize_int8", CALIBRATION_SOURCE)
    shape = tuple(input_batch(first, "quantize_int8", CALIBRATION_SOURCE).shape[1:])
    if shape != tuple(description.input_spec.input_size):
        raise UsageError(f"quantize_int8: the calibration images are {list(shape)} and the "
                         f"model takes {list(description.input_spec.input_size)}; calibrate on "
                         "data preprocessed as the model is evaluated")
    kind = quantization_kind(description)
    if kind is not None:
        fix = ("it is already quantized" if kind == "post_train" else
               "it was trained quantization-aware: save it with save_checkpoint and convert it "
               "with compress_classifier.py -e --qe --qe-convert-pytorch --resume-from CKPT")
        raise UsageError(f"quantize_int8 quantizes a float model, and {fix}")
    settings = settings_from_args({"mode": mode, "clip_acts": clip,
                                   "per_channel_wts": bool(per_channel)}, "quantize_int8")
    config = QuantizeRequest(settings=settings, quantize=True, convert=True, backend=backend)
    settings = kernel_settings(settings, config)
    float_model = copy.deepcopy(model)
    int8_placement(float_model)  # calibration and conversion run where the kernels do
    graph = quantization_graph(float_model, config, description.arch)
    stats = collect_stats(graph, _calibration(calibration_loader, num_batches),
                          histograms=settings.clips_by_histogram())
    simulated = post_train(graph, settings, stats, dynamic=False)
    return convert_int8(simulated, backend)

