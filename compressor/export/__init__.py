"""Export: ONNX at the arch's input spec, checked by onnx.checker and ONNX Runtime."""

from compressor.export.onnx import export_onnx, require_onnx

__all__ = ["export_onnx", "require_onnx"]
