"""`--summary` reports: per-layer sparsity, compute (MACs), the model and its modules."""

from __future__ import annotations

from typing import Any

import torch
from tabulate import tabulate
from torch import Tensor, nn

from compressor.models.description import description_of
from compressor.pruning.groups import sparsity
from compressor.reports.metrics import layer_costs, model_metrics, weight_tensors
from compressor.reports.numbers import integer
from compressor.utils.errors import UsageError

__all__ = ["SUMMARY_KINDS", "print_summary", "sparsity_table", "compute_table",
           "model_table", "modules_table"]

SUMMARY_KINDS = ("sparsity", "compute", "model", "modules")


def _pct(value: float) -> str:
    return f"{100.0 * value:.2f}"


def _zero_groups(weight: Tensor, dim: int) -> float:
    """Fraction of slices along `dim` (filters: 0, channels: 1) that are entirely zero."""
    if weight.dim() < 2:
        return 0.0
    other = [d for d in range(weight.dim()) if d != dim]
    alive = weight.abs().sum(dim=other) != 0
    return 1.0 - float(alive.sum()) / alive.numel()


def sparsity_table(model: nn.Module) -> str:
    """Per weight tensor: shape, params, non-zeros, element/filter/channel sparsity."""
    rows: list[list[Any]] = []
    total = nonzero = 0
    for name, _, weight in weight_tensors(model):
        nnz = int(torch.count_nonzero(weight))
        total += weight.numel()
        nonzero += nnz
        rows.append([name, str(tuple(weight.shape)), integer(weight.numel()), integer(nnz),
                     _pct(_zero_groups(weight, 0)), _pct(_zero_groups(weight, 1)),
                     _pct(sparsity(weight)),
                     f"{float(weight.float().std()) if weight.numel() > 1 else 0.0:.4f}",
                     f"{float(weight.abs().float().mean()):.4f}"])
    rows.append(["Total", "", integer(total), integer(nonzero), "", "",
                 _pct(1.0 - nonzero / max(total, 1)), "", ""])
    headers = ["Name", "Shape", "Params", "Non-zeros", "Filters/Rows zero (%)",
               "Channels/Cols zero (%)", "Sparsity (%)", "Std", "Abs-Mean"]
    # formatted text, not re-parsed: percentages keep their 2 decimals (compressor.reports.numbers)
    return tabulate(rows, headers=headers, tablefmt="psql", disable_numparse=True,
                    colalign=("left", "left", *["right"] * 7))


def compute_table(model: nn.Module) -> str:
    """Per convolution/linear layer: input and output shapes, weights and MACs."""
    costs = layer_costs(model)
    rows: list[list[Any]] = [
        [c.name, c.kind, "x".join(map(str, c.input_shape)), "x".join(map(str, c.output_shape)),
         c.weights, c.macs] for c in costs]
    total_macs = sum(c.macs for c in costs)
    rows.append(["Total", "", "", "", sum(c.weights for c in costs), total_macs])
    size = "x".join(map(str, description_of(model).input_spec.input_size))
    headers = ["Name", "Type", "IFM (CxHxW)", "OFM (CxHxW)", "Weights", "MACs"]
    table = tabulate(rows, headers=headers, tablefmt="psql", intfmt=",")
    return f"{table}\nTotal MACs at input {size}: {integer(total_macs)}"


def model_table(model: nn.Module) -> str:
    """The module tree followed by the model's totals (params, sparsity, MACs, size)."""
    metrics = model_metrics(model)
    description = description_of(model)
    rows = [
        ["arch", description.arch],
        ["dataset", description.dataset],
        ["input size", "x".join(map(str, description.input_spec.input_size))],
        ["parameters", integer(metrics["params"])],
        ["non-zero parameters", integer(metrics["nonzero_params"])],
        ["weight sparsity (%)", _pct(metrics["sparsity"])] if "sparsity" in metrics else
        ["quantized weights at 0, pruned or rounded (%)",
         _pct(metrics["quantized_zero_weights"])],
        ["MACs", integer(metrics["macs"])],
        ["model file size (bytes)", integer(metrics["model_file_size"])],
        ["compressed file size (bytes)", integer(metrics["model_file_size_compressed"])],
    ]
    table = tabulate(rows, tablefmt="psql", disable_numparse=True)  # "0.00" % stays "0.00"
    return f"{model}\n{table}"


def modules_table(model: nn.Module) -> str:
    """Every leaf module with its type and parameter names, as schedules address them."""
    rows = []
    for name, module in model.named_modules():
        if name and next(module.children(), None) is None:
            params = [f"{param_name} {tuple(tensor.shape)}"
                      for param_name, tensor in module.named_parameters(recurse=False)]
            rows.append([name, type(module).__name__, ", ".join(params)])
    return tabulate(rows, headers=["Module", "Type", "Parameters"], tablefmt="psql")


def print_summary(model: nn.Module, kind: str) -> str:
    """The `--summary KIND` report as text (the caller prints or logs it)."""
    builders = {"sparsity": sparsity_table, "compute": compute_table, "model": model_table,
                "modules": modules_table}
    if kind not in builders:
        raise UsageError(f"unknown summary '{kind}'; use one of: {', '.join(SUMMARY_KINDS)}")
    return builders[kind](model)
