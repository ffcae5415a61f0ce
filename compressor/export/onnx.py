"""ONNX export, checked in ONNX Runtime before the file is put in place.

Exporter: `torch.onnx.export(..., dynamo=True)` (torch.export + onnxscript), torch's default
since 2.9. Measured on torch 2.14.1 against the TorchScript exporter (`dynamo=False`), both
exported resnet20_cifar, inception_v3 at 299 px, densenet_bc_100_cifar with `recompute`, a
thinned resnet20_cifar and simplenet_digits, and ONNX Runtime matched PyTorch on each. Chosen
because the TorchScript exporter is deprecated ("The feature will be removed": two warnings
on every call), turns an autograd Function (in-place ABN) into an opaque `PythonOp` that no
runtime executes, and writes larger graphs (resnet20_cifar: 70 nodes vs 52, Identity and
Flatten nodes where dynamo folds eval batch norms into the convolutions). Its price is time:
4-17 s per model on a 2-core CPU (Inception v3 the slowest) against 0.1-2 s.

What is exported is the eval-mode network a deployer runs: torchvision's Inception v3 and
GoogLeNet return their main logits alone in eval mode, so their aux heads are not in the graph;
`recompute` only acts while autograd records (export runs under no_grad), and in-place ABN
layers run their reference form (batch norm, residual add, leaky ReLU as standard ops) in a
copy of the model; thinned models export at their thinned shapes. The batch axis is dynamic.

Every export is checked before it is written: `onnx.checker.check_model` (full check), one
CPUExecutionProvider session on the serialized bytes, and its outputs on the sample batch
(and at another batch size, which exercises the dynamic batch axis) against PyTorch's, within
the export kind's tolerance. Only then does `atomic_write` put the file at its destination.
A QDQ export is first given its integer form (compressor.export.qdq_graph): requantizations on
one grid folded, concatenations on integers, batch norms between grids as int8 convolutions;
export.json counts each rewrite under "integer_rewrites".
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from compressor.export.qdq_graph import integer_rewrites
from compressor.models.description import description_of, unwrap_model
from compressor.models.layers.inplace_abn import InPlaceABN
from compressor.utils.atomic_io import atomic_write, atomic_write_text
from compressor.utils.errors import CompressorError, ExportError, UsageError

__all__ = ["Tolerance", "TOLERANCES", "OPSET", "INPUT_NAME", "OUTPUT_NAME",
           "BATCH_AXIS", "EXPORT_JSON", "ONNX_EXTRA_MODULES", "require_onnx", "export_form",
           "export_onnx"]

OPSET = 20
INPUT_NAME = "input"
OUTPUT_NAME = "logits"
BATCH_AXIS = "batch"
EXPORT_JSON = "export.json"
# The `onnx` extra of setup.py, in import order (onnxscript is the dynamo exporter's back end).
ONNX_EXTRA_MODULES = ("onnx", "onnxruntime", "onnxscript")
_MAX_PROTO_BYTES = 2 ** 31 - 1  # protobuf's limit for one ModelProto
_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tolerance:
    """Allowed max |ORT - torch|: atol plus rtol times the largest |torch output|.

    The relative term matters only for outputs far above 1: an untrained Inception v3 in eval
    mode produces logits near 1e12, where float32 itself cannot resolve 1e-4.
    """

    atol: float
    rtol: float

    def allowed(self, scale: float) -> float:
        """The bound for outputs whose largest magnitude is `scale`."""
        return self.atol + self.rtol * scale


# One entry per export kind; quantization will add "int8" with its own bound.
TOLERANCES: MappingProxyType[str, Tolerance] = MappingProxyType({
    "float": Tolerance(atol=1e-4, rtol=1e-5),
    # QDQ: ONNX Runtime fuses quantize/dequantize pairs into integer kernels that requantize
    # with their own rounding, a step or two of a layer's grid apart from PyTorch's float ops
    "qdq": Tolerance(atol=1e-3, rtol=0.05)})


def require_onnx(needed_by: str = "--export-onnx") -> tuple[ModuleType, ModuleType]:
    """Import onnx and onnxruntime (and check onnxscript), or say in one line that `needed_by`
    (a flag or a function) needs the extra, and how to install it."""
    modules = {}
    for name in ONNX_EXTRA_MODULES:
        try:
            modules[name] = importlib.import_module(name)
        except ImportError as exc:
            raise UsageError(
                f"{needed_by} needs the 'onnx' extra ({name} cannot be imported: {exc}); "
                "install it with: pip install -e '.[onnx]'") from None
    return modules["onnx"], modules["onnxruntime"]


def _cpu_copy(model: nn.Module) -> nn.Module:
    return copy.deepcopy(unwrap_model(model)).cpu().float().eval()


def _unfuse(model: nn.Module) -> nn.Module:
    for module in model.modules():
        if isinstance(module, InPlaceABN):
            module.fused = False  # its autograd Function only saves memory in training
    return model


def export_form(model: nn.Module) -> nn.Module:
    """An eval-mode CPU float copy of `model` whose in-place ABN layers run as standard ops."""
    return _unfuse(_cpu_copy(model))


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def _trace(model: nn.Module, sample: Tensor, arch: str) -> Any:
    """torch.onnx's ModelProto of `model` (quietly: the exporter's warnings are not ours)."""
    batch = torch.export.Dim(BATCH_AXIS, min=1)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                model, (sample,), None, dynamo=True, opset_version=OPSET,
                input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                dynamic_shapes=({0: batch},), verbose=False, optimize=True)
            return program.model_proto
    except CompressorError:
        raise
    except Exception as exc:  # torch.export / onnxscript failures come in many types
        raise ExportError(f"torch.onnx could not export {arch} ({_first_line(exc)}); nothing "
                          "was written: report it with the torch and onnxscript versions") from None


def _torch_outputs(model: nn.Module, sample: Tensor, arch: str) -> np.ndarray:
    """The eval-mode logits of `model` on `sample` (the reference ORT must match)."""
    with torch.no_grad():
        output = model(sample)
    if not isinstance(output, Tensor):
        raise ExportError(f"{arch} returns {type(output).__name__} in eval mode, not one logits "
                          "tensor; export needs a model whose eval forward returns its logits")
    return output.float().numpy()


def _run_checks(onnx: ModuleType, ort: ModuleType, data: bytes, sample: Tensor,
                reference: np.ndarray, tolerance: Tolerance, arch: str
                ) -> tuple[dict[str, float], np.ndarray]:
    """check_model, then ORT on the CPU against `reference`; raises ExportError on a mismatch."""
    try:
        onnx.checker.check_model(onnx.load_from_string(data), full_check=True)
    except Exception as exc:
        raise ExportError(f"the ONNX model of {arch} fails onnx.checker ({_first_line(exc)}); "
                          "nothing was written: report it with the torch and onnx "
                          "versions") from None
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: ORT's warnings are about its own optimizer
    # The sample, and the graph at another batch size: its first row alone, or it twice.
    batches = [(sample, reference), (sample[:1], reference[:1]) if sample.shape[0] > 1
               else (torch.cat([sample, sample]), np.concatenate([reference, reference]))]
    try:
        session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        outputs = [(session.run([OUTPUT_NAME], {INPUT_NAME: x.numpy()})[0], ref)
                   for x, ref in batches]
    except Exception as exc:
        raise ExportError(f"ONNX Runtime cannot run the exported {arch} ({_first_line(exc)}); "
                          "nothing was written") from None
    diff = 0.0
    for got, ref in outputs:
        if got.shape != ref.shape:
            raise ExportError(f"ONNX Runtime returns shape {list(got.shape)} for {arch}, PyTorch "
                              f"{list(ref.shape)}; nothing was written")
        diff = max(diff, float(np.max(np.abs(got.astype(np.float64) - ref))))
    scale = float(np.max(np.abs(reference)))
    allowed = tolerance.allowed(scale)
    if not np.isfinite(diff) or diff > allowed:
        raise ExportError(f"ONNX Runtime's outputs for {arch} differ from PyTorch's by {diff:.3g} "
                          f"(allowed {allowed:.3g}); nothing was written: report it with the "
                          "torch, onnx and onnxruntime versions")
    return {"max_abs_diff": diff, "output_scale": scale, "allowed": allowed}, outputs[0][0]


def _check_destination(path: Path) -> None:
    if path.is_dir():
        raise UsageError(f"the ONNX destination {path} is a directory; give a file name, e.g. "
                         f"{path / 'model.onnx'}")


def _io_entry(value: Any) -> dict[str, Any]:
    """Name, shape (symbolic axes by name) and dtype of one graph input or output."""
    from onnx import helper

    tensor_type = value.type.tensor_type
    shape = [dim.dim_param or dim.dim_value for dim in tensor_type.shape.dim]
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)).name
    return {"name": value.name, "shape": shape, "dtype": dtype}


def _agreement(ort_outputs: np.ndarray, compare_with: Callable[[Tensor], Tensor],
               sample: Tensor) -> dict[str, float]:
    """ONNX Runtime's logits on the sample against another model's (the int8 kernels')."""
    with torch.no_grad():
        other = compare_with(sample).float().numpy()
    same = float(np.mean(np.argmax(ort_outputs, axis=1) == np.argmax(other, axis=1)))
    diff = float(np.max(np.abs(ort_outputs.astype(np.float64) - other)))
    # Two logit vectors within `diff` of each other can only disagree on a sample whose top-2
    # margin is at most 2 * diff: those are the near ties, which explain any disagreement.
    top2 = np.sort(other, axis=1)[:, -2:]
    near_ties = float(np.mean(top2[:, 1] - top2[:, 0] <= 2 * diff)) if other.shape[1] > 1 else 0.0
    return {"top1_agreement": same, "max_abs_diff": diff, "near_ties": near_ties}


def export_onnx(model: nn.Module, destination: Path, sample: Tensor, run_dir: Path | None, *,
                kind: str = "float", compare_with: Callable[[Tensor], Tensor] | None = None,
                compared: str = "") -> dict[str, Any]:
    """Export `model` to ONNX at `destination`, checked in ONNX Runtime; writes export.json.

    Args:
        model: the classifier (any device; a CPU copy is exported, the model is not changed).
        destination: the .onnx file to write (replaced atomically when it exists).
        sample: a batch at the model's input spec; the check runs it through both runtimes.
        run_dir: where export.json goes (None: not written).
        kind: the export kind, which sets the tolerance: "float", or "qdq" for a quantized
            model written with quantize / dequantize ops (compressor.export.qdq).
        compare_with: another model ONNX Runtime's outputs on the sample are compared with
            (for "qdq", the int8 kernels), recorded under `compared` in export.json.

    Returns:
        The export.json record (also stored in results.json under "export").
    """
    if kind not in TOLERANCES:
        raise UsageError(f"unknown export kind '{kind}'; use one of: {', '.join(TOLERANCES)}")
    onnx, ort = require_onnx()
    description = description_of(unwrap_model(model))
    spec, arch = description.input_spec, description.arch
    sample = sample.detach().cpu().float()
    if tuple(sample.shape[1:]) != tuple(spec.input_size):
        raise UsageError(f"the export sample has shape {list(sample.shape[1:])} but {arch}'s "
                         f"input spec is {list(spec.input_size)}; give data at the model's spec")
    destination = Path(destination)
    _check_destination(destination)
    form = _cpu_copy(model)
    reference = _torch_outputs(form, sample, arch)  # the model as trained (fused ABN and all)
    # Traced at batch 2 at least: a batch of one would be specialized, not left dynamic.
    traced = sample if sample.shape[0] > 1 else torch.cat([sample, sample])
    proto = _trace(_unfuse(form), traced, arch)
    rewrites = integer_rewrites(proto) if kind == "qdq" else None
    onnx.helper.set_model_props(proto, {
        "arch": arch, "dataset": description.dataset,
        "input_spec": json.dumps(spec.to_dict(), sort_keys=True),
        "class_names": json.dumps(list(description.class_names))})
    if proto.ByteSize() > _MAX_PROTO_BYTES:
        raise ExportError(f"the ONNX model of {arch} is over 2 GB, which needs external data "
                          "files that --export-onnx does not write; export a smaller model")
    data = proto.SerializeToString()
    tolerance = TOLERANCES[kind]
    check, ort_outputs = _run_checks(onnx, ort, data, sample, reference, tolerance, arch)
    destination.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(destination, lambda handle: handle.write(data))
    record = {
        "file": str(destination), "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "arch": arch, "dataset": description.dataset, "num_classes": description.num_classes,
        "class_names": list(description.class_names),
        "transforms": [step.name for step in description.transforms],
        "kind": kind, "opset": OPSET, "exporter": "torch.onnx.export(dynamo=True)",
        "input": _io_entry(proto.graph.input[0]), "output": _io_entry(proto.graph.output[0]),
        "preprocessing": {"input_size": list(spec.input_size), "channels": spec.channels,
                          "resize_size": spec.resize_size, "crop_size": spec.crop_size,
                          "interpolation": spec.interpolation, "mean": list(spec.mean),
                          "std": list(spec.std)},
        "check": {"sample_batch": int(sample.shape[0]), "atol": tolerance.atol,
                  "rtol": tolerance.rtol, **check},
        "versions": {"torch": torch.__version__, "onnx": onnx.__version__,
                     "onnxruntime": ort.__version__},
    }
    if rewrites is not None:
        record["integer_rewrites"] = rewrites
    if compare_with is not None:
        record[f"versus_{compared or 'reference'}"] = _agreement(ort_outputs, compare_with,
                                                                 sample)
    if run_dir is not None:
        atomic_write_text(run_dir / EXPORT_JSON, json.dumps(record, indent=2) + "\n")
    _LOG.debug("ONNX check of %s: max |diff| %.3g", arch, check["max_abs_diff"])
    return record
