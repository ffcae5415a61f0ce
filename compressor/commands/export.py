"""`--export-onnx [FILE]`: export at the arch's input spec, check in ONNX Runtime, write
export.json and results.json in a run directory of its own."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from compressor.api.export import check_exportable, export_model
from compressor.assembly.setup import RunSetup
from compressor.commands.common import load_run_data
from compressor.commands.record import open_run
from compressor.data import needs_data_dir
from compressor.export import require_onnx
from compressor.models.description import description_of
from compressor.utils.config import DataConfig
from compressor.utils.distributed import DistContext

__all__ = ["run_export", "export_sample"]

MAX_SAMPLE = 32  # test images the exported model is checked on


def export_sample(setup: RunSetup, data: DataConfig, batch_size: int) -> torch.Tensor:
    """A real test batch when the data is at hand, else a seeded random batch at the spec."""
    description = setup.description
    if data.root is not None or not needs_data_dir(description.dataset):
        test = load_run_data(setup, data, training=False).test
        count = min(len(test), max(1, min(batch_size, MAX_SAMPLE)))
        return torch.stack([test[i][0] for i in range(count)])
    generator = torch.Generator().manual_seed(setup.seed)
    return torch.randn(8, *description.input_spec.input_size, generator=generator)


def run_export(setup: RunSetup, ctx: DistContext, model: nn.Module, *, target: str,
               data: DataConfig, batch_size: int, output_dir: str, name: str | None,
               arguments: Mapping[str, Any], started: float) -> int:
    """Export `model` to `target` (a bare file name lands in the run directory); exit status."""
    require_onnx()  # without the extra, say so before any data is read
    check_exportable(model)  # a quantized model a QDQ graph cannot hold: before any file
    sample = export_sample(setup, data, batch_size)
    class_names = description_of(model).class_names
    with open_run(setup, ctx, arguments, class_names, output_dir=output_dir, name=name,
                  started=started) as opened:
        if opened.writer_dir is None:
            return 0  # one rank exports
        destination = Path(target)
        if not destination.is_absolute() and destination.parent == Path("."):
            destination = opened.run_dir / destination
        facts = export_model(model.cpu().eval(), destination, sample, opened.run_dir)
        opened.finish(model, {"export": facts})
        opened.log.info("exported %s (%s)", destination, opened.run_dir / "export.json")
    return 0
