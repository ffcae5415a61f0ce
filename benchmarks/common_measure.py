"""Measuring helpers shared by the demo table and the quantization benchmark.

Every figure is taken from a model rebuilt from its checkpoint, the same way for float,
thinned, simulated-quantized and int8 models: parameters and non-zeros count the integer
weights of int8 kernels too, MACs come from forward hooks on float and quantized layers,
file sizes are the checkpoint's stored weights, and latencies are timed in interleaved rounds
(fair under a shared machine's load).
"""

from __future__ import annotations

import io
import math
import os
import statistics
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.ao.nn import quantized as nnq

from compressor.models.description import description_of
from compressor.quantization.int8.onednn import OnednnLayer
from compressor.training.checkpoint import load_checkpoint

__all__ = ["stored_weights_size", "weight_counts", "count_macs", "model_input",
           "interleaved_latency", "ratio_cell"]

FLOAT_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)
INT8_LAYERS = (nnq.Conv1d, nnq.Conv2d, nnq.Conv3d, nnq.Linear)
ZLIB_LEVEL = 9
INPUT_SEED = 0


def stored_weights_size(checkpoint_path: str | os.PathLike[str]) -> tuple[int, int]:
    """Bytes of the checkpoint's state_dict saved alone (no optimizer state), plain and zlib.

    This is the model file a deployment ships: int8 checkpoints store integer weights, and
    zlib shows what the zeros of a sparse model save.
    """
    state = load_checkpoint(checkpoint_path)
    buffer = io.BytesIO()
    torch.save(state.get("state_dict", state), buffer)
    data = buffer.getvalue()
    return len(data), len(zlib.compress(data, ZLIB_LEVEL))


def _stored_tensors(model: nn.Module) -> Iterator[Tensor]:
    """Every learned tensor once: float parameters and the packed weights of int8 layers."""
    for module in model.modules():
        if isinstance(module, INT8_LAYERS):  # packed weights, unpacked by weight() / bias()
            yield module.weight().dequantize()
            if module.bias() is not None:
                yield module.bias().detach()
        if isinstance(module, OnednnLayer):  # oneDNN's: integer weights kept as buffers
            yield module.weight_ints
            if module.bias is not None:
                yield module.bias
        for param in module.parameters(recurse=False):
            yield param.detach()


def weight_counts(model: nn.Module) -> tuple[int, int]:
    """(parameters, non-zero parameters), int8 kernels' integer weights included."""
    total = nonzero = 0
    for tensor in _stored_tensors(model):
        total += tensor.numel()
        nonzero += int(torch.count_nonzero(tensor))
    return total, nonzero


def model_input(model: nn.Module, batch_size: int) -> Tensor:
    """A seeded float batch at the model's own InputSpec (int8 models quantize it inside)."""
    spec = description_of(model).input_spec
    generator = torch.Generator().manual_seed(INPUT_SEED)
    return torch.randn(batch_size, *spec.input_size, generator=generator)


def _layer_macs(module: nn.Module, output: Tensor) -> int:
    out_per_sample = output[0].numel()
    if isinstance(module, OnednnLayer):  # one weight row per output value
        return out_per_sample * module.weight_ints[0].numel()
    if isinstance(module, (nn.Linear, nnq.Linear)):
        return out_per_sample * module.in_features
    kernel = 1
    for size in module.kernel_size:
        kernel *= size
    return out_per_sample * (module.in_channels // module.groups) * kernel


def count_macs(model: nn.Module) -> int:
    """Multiply-accumulates of one sample, hooked on float and int8 conv/linear layers."""
    total = 0

    def hook(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> None:
        nonlocal total
        total += _layer_macs(module, output)

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, FLOAT_LAYERS + INT8_LAYERS + (OnednnLayer,))]
    was_training = model.training
    try:
        model.eval()
        with torch.inference_mode():
            model(model_input(model, 1))
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return total


def _repetitions(model: nn.Module, inputs: Tensor, min_ms: float) -> int:
    """Calls per timing so that one timing lasts about `min_ms` (after 3 warm-up calls)."""
    for _ in range(2):  # int8 kernels and allocators settle in the first calls
        model(inputs)
    start = time.perf_counter()
    model(inputs)
    once_ms = 1000 * (time.perf_counter() - start)
    return max(1, math.ceil(min_ms / max(once_ms, 1e-3)))


def interleaved_latency(models: Mapping[str, nn.Module], batch_size: int, threads: int,
                        rounds: int = 15, min_ms: float = 20.0) -> dict[str, float]:
    """Median CPU milliseconds per batch of each model, timed in interleaved rounds.

    Each timing repeats a model's call for about `min_ms`, so fast models are timed above the
    clock's noise and slow (simulated) ones cost one call a round.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    inputs = {name: model_input(model, batch_size) for name, model in models.items()}
    times: dict[str, list[float]] = {name: [] for name in models}
    try:
        with torch.inference_mode():
            reps = {name: _repetitions(model.eval(), inputs[name], min_ms)
                    for name, model in models.items()}
            for _ in range(rounds):
                for name, model in models.items():
                    start = time.perf_counter()
                    for _ in range(reps[name]):
                        model(inputs[name])
                    times[name].append(1000 * (time.perf_counter() - start) / reps[name])
    finally:
        torch.set_num_threads(previous)
    return {name: statistics.median(values) for name, values in times.items()}


def ratio_cell(value: float, base: float, fmt: Callable[[float], str]) -> str:
    """`ratio x (absolute)`: the figure relative to the baseline, the absolute as context."""
    if not base:
        return fmt(value)
    return f"{value / base:.2f}x ({fmt(value)})"


def run_cli_logged(*args: str, log: Path) -> None:
    """Run `compress_classifier.py ARGS`, appending the command and its output to `log`."""
    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, str(root / "compress_classifier.py"), *args]
    with open(log, "a") as handle:
        handle.write("$ " + " ".join(command) + "\n")
        handle.flush()
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, cwd=root)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(args)}; see {log}")
