"""What a user would pick instead of our quantizer, on the same checkpoint and the same
calibration images: torch.ao's FX graph mode PTQ (x86 engine), and NNCF + OpenVINO when they
are installed (optional: `pip install nncf openvino`). Also the agreement of two models'
top-1 on a test set (an int8 model against its simulation)."""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from compressor.data.load import load_calibration_dataset, load_test_dataset
from compressor.models.description import describe, description_of
from compressor.quantization.simulated.post_train import calibration_batches
from compressor.utils.input_spec import InputSpec

__all__ = ["calibration_images", "test_loader", "fx_x86_ptq", "nncf_openvino_ptq",
           "OpenVinoModel", "OnnxRuntimeModel", "exported_runtimes", "predictions", "top1_of",
           "agreement"]


def calibration_images(spec: InputSpec, data: str, fraction: float, batch_size: int,
                       seed: int) -> list[Tensor]:
    """The images our PTQ calibrates on at this input spec (same split, fraction, seed)."""
    dataset = load_calibration_dataset("fashion-mnist", data, spec, seed=seed)
    return [images for images, _ in calibration_batches(dataset, fraction, batch_size, seed)]


def test_loader(spec: InputSpec, data: str, fraction: float, seed: int) -> DataLoader:
    """The test split at this input spec, as the CLI evaluates it."""
    test = load_test_dataset("fashion-mnist", data, spec, effective_test_size=fraction,
                             seed=seed).test
    return DataLoader(test, batch_size=256, shuffle=False, num_workers=0)


def fx_x86_ptq(float_model: nn.Module, images: Iterable[Tensor]) -> tuple[nn.Module, float]:
    """torch.ao FX PTQ of a copy of `float_model` with its default x86 qconfig mapping;
    (int8 model, calibration s)."""
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    description = description_of(float_model)
    torch.backends.quantized.engine = "x86"
    images = list(images)
    started = time.perf_counter()
    with warnings.catch_warnings():  # torch.ao's own deprecation notices: the anchor as it is
        warnings.simplefilter("ignore")
        prepared = prepare_fx(copy.deepcopy(float_model), get_default_qconfig_mapping("x86"),
                              example_inputs=(images[0][:1],))
        with torch.no_grad():
            for batch in images:
                prepared(batch)
        quantized = convert_fx(prepared)
    seconds = time.perf_counter() - started
    return describe(quantized, description), seconds


def nncf_openvino_ptq(float_model: nn.Module, images: Iterable[Tensor]
                      ) -> tuple[nn.Module, float] | str:
    """NNCF's PTQ of `float_model` compiled by OpenVINO, as a module; (model, seconds), or the
    reason as a string when nncf or openvino is not installed."""
    try:
        import nncf
        import openvino as ov
    except ImportError as exc:
        return f"not installed ({exc.name}): pip install nncf openvino"
    samples = [sample.unsqueeze(0) for batch in images for sample in batch]
    started = time.perf_counter()
    dataset = nncf.Dataset(samples, lambda sample: sample.numpy())
    with torch.no_grad():
        ov_model = ov.convert_model(float_model, example_input=samples[0])
    quantized = nncf.quantize(ov_model, dataset, subset_size=len(samples))
    model = OpenVinoModel(quantized)
    model(samples[0])  # compiled, as the timing of the others' conversion includes theirs
    seconds = time.perf_counter() - started
    return describe(model, description_of(float_model)), seconds


class _PerThreadCount(nn.Module):
    """A runtime's model called like a torch classifier (float batch in, logits out), built
    once for each thread count torch is set to use (the timing's setting)."""

    def __init__(self) -> None:
        super().__init__()
        self.built: dict[int, Any] = {}

    def build(self, threads: int) -> Any:
        """The runtime's callable for `threads` threads."""
        raise NotImplementedError

    def run(self, built: Any, batch: Any) -> Any:
        """The logits (a numpy array) of `built` for a numpy batch."""
        raise NotImplementedError

    def forward(self, batch: Tensor) -> Tensor:
        """The logits the runtime computes for `batch`."""
        threads = torch.get_num_threads()
        if threads not in self.built:
            self.built[threads] = self.build(threads)
        return torch.from_numpy(self.run(self.built[threads], batch.numpy()))


class OpenVinoModel(_PerThreadCount):
    """An OpenVINO model compiled for the CPU, float ops in f32."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def build(self, threads: int) -> Any:
        """The model compiled for `threads` threads."""
        import openvino as ov

        # float ops in f32, as torch computes them (on CPUs with bf16 OpenVINO's default is
        # bf16, and its int8 kernels then failed to compile for a dynamic batch)
        return ov.Core().compile_model(self.model, "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                           "INFERENCE_PRECISION_HINT": "f32"})

    def run(self, built: Any, batch: Any) -> Any:
        """The compiled model's first output."""
        return built(batch)[0]


class OnnxRuntimeModel(_PerThreadCount):
    """An ONNX file run by ONNX Runtime on the CPU."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def build(self, threads: int) -> Any:
        """A session with `threads` intra-op threads."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        return ort.InferenceSession(self.path, options, providers=["CPUExecutionProvider"])

    def run(self, built: Any, batch: Any) -> Any:
        """The session's first output."""
        return built.run(None, {built.get_inputs()[0].name: batch})[0]


def exported_runtimes(onnx_path: str) -> tuple[dict[str, nn.Module], list[str]]:
    """Our exported (QDQ) ONNX file in ONNX Runtime and, when installed, in OpenVINO; and a
    line saying what is missing."""
    runtimes: dict[str, nn.Module] = {"ort": OnnxRuntimeModel(onnx_path)}
    try:
        import openvino as ov
    except ImportError as exc:
        return runtimes, [f"our QDQ export in OpenVINO: not installed ({exc.name}): "
                          "pip install openvino"]
    runtimes["openvino"] = OpenVinoModel(ov.Core().read_model(onnx_path))
    return runtimes, []


def predictions(model: Any, loader: DataLoader) -> Tensor:
    """The model's top-1 class of every test sample, in order."""
    chosen = []
    with torch.inference_mode():
        for images, _ in loader:
            chosen.append(model(images).argmax(1))
    return torch.cat(chosen)


def top1_of(predicted: Tensor, loader: DataLoader) -> float:
    """Top-1 accuracy in percent of `predicted` against the loader's labels."""
    labels = torch.cat([labels for _, labels in loader])
    return 100.0 * float((predicted == labels).float().mean())


def agreement(first: Tensor, second: Tensor) -> float:
    """The fraction of samples on which two models' top-1 classes agree, in percent."""
    return 100.0 * float((first == second).float().mean())
