"""Multi-head attention thinned by head dimension (ViT, DeiT: timm's `Attention` and any module
laid out as it is).

The fused projection `qkv` makes q, k and v of every head, rows ordered (part, head, dim); the
heads' outputs, concatenated, are the input columns of `proj`. Torch-Pruning follows v's rows to
`proj` but not q's and k's, which meet only in the dot product. Here a head dimension goes
where it contributes nothing:
- in q and k at once, where k's row is zero (the term is the same for every key, which softmax
  ignores) or q's row and bias are (the term is zero);
- in v, where v's row carries a constant (folded into `proj`'s bias, softmax rows summing to
  one) or `proj` no longer reads it.
Every head keeps as many dimensions in q, k and v (the reshape into heads needs it), and the
softmax keeps its temperature: q's rows are scaled by sqrt(kept / head_dim) and the module's
`scale` by the inverse, so the fused kernel (whose scale follows the head size) and the
explicit one compute what the unthinned module did. Whether a module follows this layout is
tested on its own input before anything is planned: one that does not keeps its heads whole.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from compressor.utils.errors import CheckpointError

__all__ = ["PARTS", "HeadLayout", "Heads", "head_layout", "attention_layouts", "conforms",
           "conforming_heads",
           "head_roots", "head_rows", "proj_columns", "fold_head_scale", "set_head_dim",
           "thin_heads"]

PARTS = 3  # q, k, v
# The contract test compares float32 outputs of a few tokens: rounding is far below this, a
# module that reshapes otherwise is off by far more.
CONTRACT_TOLERANCE = 1e-4


@dataclass(frozen=True)
class HeadLayout:
    """An attention module's heads and their size (dimensions per head in q, k and v)."""

    heads: int
    head_dim: int

    def rows(self, part: int, head: int) -> range:
        """`qkv` rows of one part (0 q, 1 k, 2 v) of one head."""
        start = (part * self.heads + head) * self.head_dim
        return range(start, start + self.head_dim)


# qkv layer -> (its attention module, the layout; None where the heads do not thin as here)
Heads = dict[nn.Module, tuple[nn.Module, HeadLayout | None]]


def head_layout(module: nn.Module) -> HeadLayout | None:
    """The heads of a module with a fused `qkv` and a `proj` linear layer and `num_heads`, or
    None where it is not one, or adds something thinning does not slice (a norm over q and k,
    over the heads' output, or a gate)."""
    qkv, proj, heads = (getattr(module, "qkv", None), getattr(module, "proj", None),
                        getattr(module, "num_heads", None))
    if not (isinstance(qkv, nn.Linear) and isinstance(proj, nn.Linear)
            and isinstance(heads, int) and heads > 0):
        return None
    width = qkv.out_features
    if width % (PARTS * heads) or proj.in_features != width // PARTS:
        return None
    if any(not isinstance(getattr(module, attr, nn.Identity()), nn.Identity)
           for attr in ("q_norm", "k_norm", "norm")) or getattr(module, "gate", None) is not None:
        return None
    head_dim = width // (PARTS * heads)
    if getattr(module, "head_dim", head_dim) != head_dim:
        return None
    return HeadLayout(heads, head_dim)


def attention_layouts(model: nn.Module) -> dict[nn.Module, HeadLayout]:
    """Every module of `model` laid out as a fused-qkv attention, with its heads."""
    return {m: layout for m in model.modules() if (layout := head_layout(m)) is not None}


def _first_dims(layout: HeadLayout) -> list[int]:
    """The `qkv` rows of dimension 0 of every head, in q, k and v."""
    return [layout.rows(part, head)[0] for part in range(PARTS) for head in range(layout.heads)]


def conforms(module: nn.Module, layout: HeadLayout, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> bool:
    """Whether thinning a head dimension out of `module` leaves its output on this input as the
    zeroed dimension had it (a module that reshapes by something else than its attributes, or
    scales otherwise, does not)."""
    if layout.head_dim < 2:
        return False
    trial = copy.deepcopy(module).eval()
    rows = _first_dims(layout)
    with torch.no_grad():
        trial.qkv.weight[rows] = 0.0
        if trial.qkv.bias is not None:
            trial.qkv.bias[rows] = 0.0
    try:
        with torch.no_grad():
            reference = trial(*args, **kwargs)
            fold_head_scale(trial, layout, layout.head_dim - 1)
            thin_heads(trial, layout, rows)
            set_head_dim(trial, layout, layout.head_dim - 1)
            thinned = trial(*args, **kwargs)
    except (RuntimeError, ValueError, TypeError, IndexError):
        return False
    if not isinstance(reference, Tensor) or not isinstance(thinned, Tensor) or (
            reference.shape != thinned.shape):
        return False
    error = float((thinned.float() - reference.float()).abs().max())
    return error <= CONTRACT_TOLERANCE * max(1.0, float(reference.float().abs().max()))


def _zero(rows: Tensor) -> Tensor:
    return (rows.amax(dim=1) == 0) & (rows.amin(dim=1) == 0)


def head_rows(qkv: nn.Linear, layout: HeadLayout, dead_v: Iterable[int]) -> list[int]:
    """The `qkv` rows thinning may remove, as many dimensions from every head's q, k and v:
    q's and k's where the dot product does not need them, v's among `dead_v` (rows whose
    channel is constant or unread). Every head keeps at least one dimension."""
    weight = qkv.weight.detach()
    zero = _zero(weight).tolist()
    bias_zero = ([True] * weight.shape[0] if qkv.bias is None
                 else (qkv.bias.detach() == 0).tolist())
    dead_v = set(dead_v)
    qk_dims, v_dims = [], []
    for head in range(layout.heads):
        q, k, v = (layout.rows(part, head) for part in range(PARTS))
        qk_dims.append([d for d in range(layout.head_dim)
                        if zero[k[d]] or (zero[q[d]] and bias_zero[q[d]])])
        v_dims.append([d for d in range(layout.head_dim) if v[d] in dead_v])
    count = min(layout.head_dim - 1, *(len(dims) for dims in qk_dims + v_dims))
    rows = []
    for head in range(layout.heads):
        q, k, v = (layout.rows(part, head) for part in range(PARTS))
        rows += [q[d] for d in qk_dims[head][:count]] + [k[d] for d in qk_dims[head][:count]]
        rows += [v[d] for d in v_dims[head][:count]]
    return sorted(rows)


def fold_head_scale(module: nn.Module, layout: HeadLayout, kept: int) -> None:
    """Scale q's rows by sqrt(kept / head_dim) (in place), so that the softmax's temperature
    stays that of `layout.head_dim` once each head keeps `kept` dimensions."""
    factor = math.sqrt(kept / layout.head_dim)
    rows = slice(0, layout.heads * layout.head_dim)
    with torch.no_grad():
        module.qkv.weight[rows] *= factor
        if module.qkv.bias is not None:
            module.qkv.bias[rows] *= factor


def proj_columns(layout: HeadLayout, qkv_rows: Iterable[int]) -> list[int]:
    """The `proj` input columns that read the v rows among `qkv_rows`."""
    offset = (PARTS - 1) * layout.heads * layout.head_dim
    return sorted(r - offset for r in qkv_rows if r >= offset)


def thin_heads(module: nn.Module, layout: HeadLayout, qkv_rows: list[int]) -> None:
    """Slice `qkv_rows` out of `qkv` and the columns reading them out of `proj` (the contract
    test's thinning; a recipe slices the layers themselves)."""
    removed_rows, removed_columns = set(qkv_rows), set(proj_columns(layout, qkv_rows))
    keep_rows = [r for r in range(module.qkv.out_features) if r not in removed_rows]
    keep_columns = [c for c in range(module.proj.in_features) if c not in removed_columns]
    with torch.no_grad():
        qkv, proj = module.qkv, module.proj
        qkv.weight = nn.Parameter(qkv.weight[keep_rows].clone())
        if qkv.bias is not None:
            qkv.bias = nn.Parameter(qkv.bias[keep_rows].clone())
        proj.weight = nn.Parameter(proj.weight[:, keep_columns].clone())
        qkv.out_features, proj.in_features = len(keep_rows), len(keep_columns)


def set_head_dim(module: nn.Module, layout: HeadLayout, kept: int) -> None:
    """Give an attention module the head size `kept` (its attributes; the layers are sliced
    apart): `head_dim`, `attn_dim` and `scale` where it has them, the last divided by
    sqrt(kept / head_dim) as fold_head_scale multiplied q."""
    if getattr(module, "num_heads", None) != layout.heads:
        raise CheckpointError(f"thinning recipe expects {layout.heads} attention heads in "
                              f"'{type(module).__name__}'; rebuild with the checkpoint's arch")
    if hasattr(module, "head_dim"):
        module.head_dim = kept
    if hasattr(module, "attn_dim"):
        module.attn_dim = layout.heads * kept
    scale = getattr(module, "scale", None)
    if isinstance(scale, float):
        module.scale = scale * math.sqrt(layout.head_dim / kept)


def conforming_heads(calls: dict[nn.Module, tuple[tuple[Any, ...], dict[str, Any]]]) -> Heads:
    """qkv layer -> (attention module, layout) for every attention module called (`calls`:
    module -> its first call's args and kwargs); the layout None where its heads do not thin
    as this module expects (tested on that input): its q, k and v rows are then kept."""
    found: Heads = {}
    for module, (args, kwargs) in calls.items():
        layout = head_layout(module)
        if layout is not None:
            found[module.qkv] = (module, layout if conforms(module, layout, args, kwargs)
                                 else None)
    return found


def head_roots(producers: list[tuple[nn.Module, list[int], list[int]]], dead: set[int],
               heads: Heads) -> tuple[set[int] | None, tuple[nn.Module, HeadLayout, int] | None]:
    """Where a channel group's producer (module, indices, root indices) is an attention's
    `qkv`: the roots of the rows to remove among `dead`, as many dimensions from every head,
    and (attention, layout, dimensions kept) where it shrinks; (None, None) where it is not
    one."""
    if not any(module in heads for module, _, _ in producers):
        return None, None
    qkv, idxs, roots = producers[0]
    attention, layout = heads.get(qkv, (None, None))
    if len(producers) != 1 or attention is None or layout is None:
        return set(), None  # rows shared with another layer, or heads laid out otherwise
    row_of = dict(zip(roots, idxs, strict=True))
    rows = set(head_rows(qkv, layout, {row_of[r] for r in dead if r in row_of}))
    kept = layout.head_dim - len(rows) // (PARTS * layout.heads)
    planned = (attention, layout, kept) if kept < layout.head_dim else None
    return {r for r in roots if row_of[r] in rows}, planned
