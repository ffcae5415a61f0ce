"""`export_onnx`: a float model as it is, a post-training quantized one as its QDQ graph, each
checked in ONNX Runtime before the file is written (the [onnx] extra); the command line's
--export-onnx exports through `export_model` here."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from compressor.api.identity import ensure_described, input_batch
from compressor.export.onnx import export_onnx as export_checked
from compressor.export.onnx import require_onnx
from compressor.export.qdq import check_qdq_exportable, qdq_form
from compressor.models.description import description_of, stored_form
from compressor.quantization import QuantizationError, check_convertible
from compressor.quantization.recipe import int8_model, quantization_kind

__all__ = ["export_onnx", "export_model", "check_exportable", "INT8_BACKEND"]

INT8_BACKEND = "auto"  # the kernels a QDQ export is compared with
SAMPLE_BATCH = 8  # random inputs a described model is checked on when none are given
LOG = logging.getLogger("compressor")


def check_exportable(model: nn.Module) -> None:
    """Refuse, before anything is written, a quantized model that a QDQ graph cannot hold."""
    if quantization_kind(description_of(model)) == "post_train":
        check_qdq_exportable(model)


def export_model(model: nn.Module, destination: Path, sample: torch.Tensor,
                 run_dir: Path | None) -> dict[str, Any]:
    """Export a described model: a float one as it is; a post-training quantized one as its QDQ
    graph, compared in ONNX Runtime with the int8 kernels it converts to (the simulation where
    it cannot); returns the export record (also export.json in `run_dir`, when given)."""
    description = description_of(model)
    if quantization_kind(description) != "post_train":
        return export_checked(model, destination, sample, run_dir)
    form = qdq_form(model)
    simulated = stored_form(model)
    try:
        check_convertible(simulated, INT8_BACKEND)
        reference, compared = int8_model(simulated, INT8_BACKEND), "int8"
    except QuantizationError as exc:
        LOG.info("the QDQ export is compared with the simulation: %s", exc)
        reference, compared = simulated, "simulation"
    return export_checked(form, destination, sample, run_dir, kind="qdq",
                          compare_with=reference, compared=compared)


def export_onnx(model: nn.Module, path: str | os.PathLike[str],
                example_inputs: Any = None) -> dict[str, Any]:
    """Write `model` as ONNX (opset 20, dynamic batch axis), checked in ONNX Runtime first.

    A float model (thinned or not) is exported as it is; a model from quantize_int8 as a QDQ
    graph (QuantizeLinear / DequantizeLinear around integer operators). Nothing is written
    unless ONNX Runtime computes what PyTorch does, within the export kind's tolerance.
    Needs the [onnx] extra (`pip install -e '.[onnx]'`).

    Args:
        model: the classifier to export (it is not changed).
        path: the .onnx file to write (replaced atomically when it exists).
        example_inputs: a batch of inputs (N x C x H x W) the check runs through both runtimes;
            required for a model compressor did not build, else random inputs at its spec.

    Returns:
        The export record: file, bytes, sha256, opset, inputs and outputs, preprocessing, and
        the check's largest difference.
    """
    require_onnx("export_onnx")
    description = ensure_described(model, example_inputs, "export_onnx")
    check_exportable(model)
    if example_inputs is not None:
        sample = input_batch(example_inputs, "export_onnx")
    else:
        generator = torch.Generator().manual_seed(0)
        sample = torch.randn(SAMPLE_BATCH, *description.input_spec.input_size,
                             generator=generator)
    return export_model(model, Path(path), sample, None)
