"""Model size and cost figures: parameters, non-zeros, sparsity, MACs and saved-file size.

Pruning masks are applied in place to plain parameters (compressor.schedule), so the model's
own parameters and state_dict are what the forward pass sees: no mask bookkeeping here.
"""

from __future__ import annotations

import io
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from compressor.models.description import description_of
from compressor.quantization.recipe import quantization_kind

__all__ = [
    "LayerCost", "weight_tensors", "layer_costs", "count_macs", "model_file_size",
    "model_metrics", "probe_input", "holds_integer_weights", "weight_sparsity",
]

COMPUTE_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


def weight_tensors(model: nn.Module) -> Iterator[tuple[str, nn.Module, Tensor]]:
    """(name, module, weight) of every convolution and fully connected layer."""
    for module_name, module in model.named_modules():
        if isinstance(module, COMPUTE_LAYERS):
            yield f"{module_name}.weight", module, module.weight.detach()


@dataclass(frozen=True)
class LayerCost:
    """One convolution or linear layer as seen in a forward pass at the model's input size."""

    name: str
    kind: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    weights: int
    macs: int


def probe_input(model: nn.Module, batch_size: int = 1) -> Tensor:
    """A zero batch at the model's own InputSpec (its ModelDescription's input size)."""
    spec = description_of(model).input_spec
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    return torch.zeros(batch_size, *spec.input_size, device=device, dtype=dtype)


def _layer_macs(module: nn.Module, output: Tensor) -> int:
    out_per_sample = output[0].numel()
    if isinstance(module, nn.Linear):
        return out_per_sample * module.in_features
    kernel = 1
    for size in module.kernel_size:
        kernel *= size
    return out_per_sample * (module.in_channels // module.groups) * kernel


def layer_costs(model: nn.Module, inputs: Tensor | None = None) -> list[LayerCost]:
    """Per-layer MACs of one sample, measured with forward hooks (eval mode, no grad)."""
    records: list[LayerCost] = []
    names = {module: name for name, module in model.named_modules()}

    def hook(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> None:
        records.append(LayerCost(
            name=names[module], kind=type(module).__name__,
            input_shape=tuple(args[0].shape[1:]), output_shape=tuple(output.shape[1:]),
            weights=module.weight.numel(), macs=_layer_macs(module, output)))

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, COMPUTE_LAYERS)]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(probe_input(model) if inputs is None else inputs)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return records


def count_macs(model: nn.Module) -> int:
    """Dense multiply-accumulates of one sample at the model's InputSpec."""
    return sum(cost.macs for cost in layer_costs(model))


def _saved_state(model: nn.Module) -> bytes:
    """The bytes torch.save writes for the model's state_dict (integer weights when quantized)."""
    from compressor.assembly.state import plain_state_dict

    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in plain_state_dict(model).items()}, buffer)
    return buffer.getvalue()


def model_file_bytes(model: nn.Module) -> int:
    """Bytes of the saved state_dict (masks are in the weights), without compressing it."""
    return len(_saved_state(model))


def model_file_size(model: nn.Module) -> tuple[int, int]:
    """Bytes of the saved state_dict (masks are in the weights), plain and compressed.

    Element-wise sparsity leaves the plain size unchanged; the compressed size shows what the
    zeros would save in a compressed file format. It is deflate with run-length matching
    (zlib's Z_RLE strategy): the runs of zeros are what it finds, at half the time of level-1
    deflate's general matching on float weights (seconds for a 100 MB model) and a size within
    1% of it.
    """
    data = _saved_state(model)
    compressor = zlib.compressobj(1, zlib.DEFLATED, 15, 9, zlib.Z_RLE)
    return len(data), len(compressor.compress(data) + compressor.flush())


def holds_integer_weights(model: nn.Module) -> bool:
    """Whether `model` is post-training quantized (simulated or int8 kernels): its weights are
    integers, where a quantization-aware-trained model's are still float."""
    try:
        return quantization_kind(description_of(model)) == "post_train"
    except ValueError:  # a model compressor did not describe: a float model of one's own
        return False


def weight_sparsity(model: nn.Module) -> float:
    """The share of the weights (convolutions, linear layers) that are zero."""
    weights = [w for _, _, w in weight_tensors(model)]
    total = sum(w.numel() for w in weights)
    return 1.0 - sum(int(torch.count_nonzero(w)) for w in weights) / max(total, 1)


def model_metrics(model: nn.Module, checkpoint_path: str | os.PathLike | None = None
                  ) -> dict[str, Any]:
    """Size and cost figures that a run adds to results.json (of an int8 model: of the
    simulated model it was converted from, whose integer weights it holds).

    A quantized model's zero weights are pruned ones and small ones its rounding made zero,
    which it cannot tell apart: it reports them as `quantized_zero_weights`, not as a
    sparsity (a run that quantizes reports the float model's `sparsity` itself)."""
    from compressor.models.description import stored_form

    quantized = holds_integer_weights(model)
    model = stored_form(model)
    params = {name: param.detach() for name, param in model.named_parameters()}
    total = sum(p.numel() for p in params.values())
    nonzero = sum(int(torch.count_nonzero(p)) for p in params.values())
    weights = [w for _, _, w in weight_tensors(model)]
    weight_total = sum(w.numel() for w in weights)
    weight_nonzero = sum(int(torch.count_nonzero(w)) for w in weights)
    file_size, compressed = model_file_size(model)
    metrics: dict[str, Any] = {
        "sparsity": 1.0 - weight_nonzero / max(weight_total, 1),
        "params": total,
        "nonzero_params": nonzero,
        "params_sparsity": 1.0 - nonzero / max(total, 1),
        "macs": count_macs(model),
        "model_file_size": file_size,
        "model_file_size_compressed": compressed,
    }
    if quantized:
        metrics["quantized_zero_weights"] = metrics.pop("sparsity")
    if checkpoint_path is not None and os.path.exists(checkpoint_path):
        metrics["checkpoint_file_size"] = os.path.getsize(checkpoint_path)
    return metrics
