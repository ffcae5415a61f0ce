"""compressor: a model-compression framework for PyTorch image classifiers.

The command line is `compress_classifier.py`; the Python API for one's own training loop is
this package's top level (`import compressor as cz`: cz.compression_scheduler, cz.thin,
cz.quantize_int8, cz.compress_to_budget, cz.DistillationLoss, cz.export_onnx,
cz.save_checkpoint ...), defined in compressor.api and imported on first use, so
`import compressor` imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compressor.api import (
        BudgetResult,
        CompressionScheduler,
        DistillationLoss,
        compress_to_budget,
        compression_scheduler,
        evaluate,
        export_onnx,
        load_model,
        quantize_int8,
        recalibrate_batch_norm,
        save_checkpoint,
        thin,
    )

__version__ = "0.2.0"

__all__ = ["compression_scheduler", "CompressionScheduler", "thin", "quantize_int8",
           "compress_to_budget", "BudgetResult", "DistillationLoss", "export_onnx",
           "save_checkpoint", "load_model", "evaluate", "recalibrate_batch_norm", "__version__"]


def __getattr__(name: str) -> Any:
    """A name of the Python API (compressor.api), imported on first use."""
    if name in __all__:
        from compressor import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
