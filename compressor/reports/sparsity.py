"""Per-layer sparsity of weights and pruning masks: the --masks-sparsity table and its numbers.

Masks are applied in place (compressor.schedule), so a pruned layer's weight sparsity is at
least its mask's; the weight may have more zeros than its mask (a regularizer's, or exact
zeros from training).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tabulate import tabulate
from torch import Tensor, nn

from compressor.pruning import sparsity
from compressor.reports.metrics import weight_tensors

__all__ = ["LayerSparsity", "schedule_masks", "layer_sparsities", "total_sparsity",
           "masks_sparsity_table"]


@dataclass(frozen=True)
class LayerSparsity:
    """One parameter: its shape, the percentage of zeros of its mask (if any) and of itself."""

    name: str
    shape: tuple[int, ...]
    numel: int
    weight: float  # % of zero elements of the parameter
    mask: float | None = None  # % of zero elements of its pruning mask; None: not masked


def schedule_masks(compression: Any) -> dict[str, Tensor]:
    """The effective pruning masks of a compression schedule ({} without one, or before any)."""
    masks = getattr(compression, "masks", None) if compression is not None else None
    return dict(masks) if isinstance(masks, Mapping) else {}


def layer_sparsities(model: nn.Module, masks: Mapping[str, Tensor] | None = None
                     ) -> list[LayerSparsity]:
    """Every convolution and linear weight, and every other masked parameter, in model order."""
    masks = masks or {}
    wanted = {name for name, _, _ in weight_tensors(model)} | set(masks)
    rows = []
    for name, param in model.named_parameters():
        if name not in wanted:
            continue
        mask = masks.get(name)
        rows.append(LayerSparsity(
            name=name, shape=tuple(param.shape), numel=param.numel(),
            weight=100.0 * sparsity(param.detach()),
            mask=None if mask is None else 100.0 * sparsity(mask)))
    return rows


def total_sparsity(rows: list[LayerSparsity]) -> tuple[float, float | None]:
    """% of zeros over all the rows' weights, and over the masked rows' masks (None: no mask)."""
    numel = sum(row.numel for row in rows)
    weight = sum(row.weight * row.numel for row in rows) / max(numel, 1)
    masked = [row for row in rows if row.mask is not None]
    if not masked:
        return weight, None
    mask_numel = sum(row.numel for row in masked)
    return weight, sum((row.mask or 0.0) * row.numel for row in masked) / max(mask_numel, 1)


def masks_sparsity_table(rows: list[LayerSparsity], with_masks: bool) -> str:
    """Distiller's --masks-sparsity table: name, shape, mask and weight sparsity (%), total."""
    weight_total, mask_total = total_sparsity(rows)
    body: list[list[Any]] = [[row.name, "x".join(str(size) for size in row.shape), row.mask,
                              row.weight] for row in rows]
    body.append(["Total", "", mask_total, weight_total])
    headers = ["Name", "Shape", "Mask sparsity (%)", "Weight sparsity (%)"]
    if not with_masks:  # no schedule: the weights alone
        body = [[name, shape, weight] for name, shape, _, weight in body]
        headers = ["Name", "Shape", "Weight sparsity (%)"]
    return tabulate(body, headers=headers, tablefmt="github", floatfmt=".2f", missingval="-")
