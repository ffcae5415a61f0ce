"""The Python API for one's own training loop: what `import compressor as cz` exposes.

    scheduler = cz.compression_scheduler("agp.yaml", model, optimizer)  # Distiller's callbacks
    model = cz.thin(model, example_inputs)          # remove zeroed filters/channels
    cz.recalibrate_batch_norm(model, train_loader, 20)  # fresh batch-norm statistics
    int8_model = cz.quantize_int8(model, calibration_loader)
    cz.save_checkpoint(int8_model, "ckpt.pth.tar", arch="my_model.py:Net")

Each name lives in a small module of this package (by concern); they are imported when first
used (PEP 562), so `import compressor` stays cheap. The command line's commands call the same
functions.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compressor.api.batchnorm import recalibrate_batch_norm
    from compressor.api.budget_compression import BudgetResult, compress_to_budget
    from compressor.api.checkpoint import load_model, save_checkpoint
    from compressor.api.distillation import DistillationLoss
    from compressor.api.evaluation import evaluate
    from compressor.api.export import export_onnx
    from compressor.api.quantize import quantize_int8
    from compressor.api.schedule import CompressionScheduler, compression_scheduler
    from compressor.api.thinning import thin

# public name -> the module of this package that defines (or re-exports) it
_HOMES = {
    "compression_scheduler": "schedule", "CompressionScheduler": "schedule", "thin": "thinning",
    "quantize_int8": "quantize", "compress_to_budget": "budget_compression",
    "BudgetResult": "budget_compression",
    "DistillationLoss": "distillation", "export_onnx": "export",
    "save_checkpoint": "checkpoint", "load_model": "checkpoint", "evaluate": "evaluation",
    "recalibrate_batch_norm": "batchnorm",
}

__all__ = ["compression_scheduler", "CompressionScheduler", "thin", "quantize_int8",
           "compress_to_budget", "BudgetResult", "DistillationLoss", "export_onnx",
           "save_checkpoint", "load_model", "evaluate", "recalibrate_batch_norm"]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
