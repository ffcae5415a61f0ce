"""Activation clipping as Distiller does it: the (min, max) to quantize, from stats or a tensor.

Clip modes (Distiller's ClipMode; command-line names none, avg, n_std, gauss, laplace, mse):

    NONE     the absolute min / max
    AVG      the average over samples of each sample's min / max (avg_min / avg_max)
    N_STD    mean -/+ clip_n_stds * std, never beyond min / max
    GAUSS    ACIQ's optimal clip for a Gaussian: alpha = ALPHA_GAUSS[bits] * std
    LAPLACE  ACIQ's optimal clip for a Laplace: alpha = ALPHA_LAPLACE[bits] * b (b: mean |x - mean|)
    MSE      the range of least expected squared error on the grid, from the tensor's histogram
             (the criterion of torch.ao's HistogramObserver, FX's default; not in Distiller)

ACIQ (Banner et al., "Post-training 4-bit quantization ...", arXiv:1810.05723) as Distiller applies
it: symmetric modes clip to -/+(|mean| + alpha); asymmetric ones to [lo, lo + 2 alpha] with
lo = max(avg_min, mean - alpha), or [lo, lo + alpha] with the `_POSITIVE` tables for half-range
(non-negative, post-ReLU) tensors. The tables are ACIQ's and stop at 8 bits: GAUSS / LAPLACE at
more bits are refused (Distiller failed there with a KeyError).

MSE scores every range [lo, hi] between two of the histogram's bin edges (widened to hold 0 in
asymmetric modes, -t..t in symmetric ones) by the error it would leave: step^2 / 12 for each value
inside (rounding), the squared distance to the edge for each value outside (clipping), values at
their bin's centre; it keeps the least. Prefix sums make that a few vector operations.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from enum import Enum
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from compressor.quantization.core.errors import QuantizationError, shown, unknown_choice
from compressor.quantization.core.range_linear import LinearQuantMode, check_bits, parse_quant_mode

__all__ = [
    "ClipMode", "parse_clip_mode", "check_clip_n_stds", "ALPHA_GAUSS", "ALPHA_GAUSS_POSITIVE",
    "ALPHA_LAPLACE", "ALPHA_LAPLACE_POSITIVE", "aciq_alpha", "stats_range", "tensor_range",
    "HISTOGRAM_BINS", "histogram_range", "shared_histogram_range",
]


class ClipMode(Enum):
    """Distiller's activation clipping modes (same names and values)."""

    NONE = 0
    AVG = 1
    N_STD = 2
    GAUSS = 3
    LAPLACE = 4
    MSE = 5  # ours: Distiller has no histogram mode


HISTOGRAM_BINS = 512  # bins of an activation's histogram over [min, max] (MSE clipping)

# ACIQ's optimal clipping value / (std for Gauss, b for Laplace), by bit width, as in Distiller;
# the _POSITIVE tables are for half-range tensors (one bit more of resolution on one side).
ALPHA_GAUSS: Mapping[int, float] = MappingProxyType(
    {1: 1.24, 2: 1.71, 3: 2.15, 4: 2.55, 5: 2.93, 6: 3.28, 7: 3.61, 8: 3.92})
ALPHA_GAUSS_POSITIVE: Mapping[int, float] = MappingProxyType(
    {1: 1.71, 2: 2.15, 3: 2.55, 4: 2.93, 5: 3.28, 6: 3.61, 7: 3.92, 8: 4.2})
ALPHA_LAPLACE: Mapping[int, float] = MappingProxyType(
    {0: 1.05, 1: 1.86, 2: 2.83, 3: 3.89, 4: 5.03, 5: 6.2, 6: 7.41, 7: 8.64, 8: 9.89})
ALPHA_LAPLACE_POSITIVE: Mapping[int, float] = MappingProxyType(
    {0: 1.86, 1: 2.83, 2: 3.89, 3: 5.02, 4: 6.2, 5: 7.41, 6: 8.64, 7: 9.89, 8: 11.16})
_ACIQ = (ClipMode.GAUSS, ClipMode.LAPLACE)


def parse_clip_mode(value: ClipMode | str) -> ClipMode:
    """A clip mode from Distiller's name or the command line's, in any case."""
    if isinstance(value, ClipMode):
        return value
    if isinstance(value, str) and value.strip().upper() in ClipMode.__members__:
        return ClipMode[value.strip().upper()]
    raise unknown_choice("clip mode", value, ClipMode.__members__)


def check_clip_n_stds(clip: ClipMode | str, clip_n_stds: Any) -> float | None:
    """`clip_n_stds` as a positive float when `clip` is N_STD (required then), else None."""
    if parse_clip_mode(clip) is not ClipMode.N_STD:
        return None  # Distiller ignores it for the other modes
    if clip_n_stds is None:
        raise QuantizationError("clip mode N_STD needs the number of standard deviations; "
                                "give clip_n_stds (--qe-clip-n-stds), e.g. 3")
    if (isinstance(clip_n_stds, bool) or not isinstance(clip_n_stds, numbers.Real)
            or not math.isfinite(clip_n_stds) or clip_n_stds <= 0):
        raise QuantizationError(f"clip_n_stds must be a positive number, got {shown(clip_n_stds)}; "
                                "give e.g. 3")
    return float(clip_n_stds)


def aciq_alpha(clip: ClipMode | str, num_bits: int, half_range: bool = False) -> float:
    """ACIQ's clipping multiplier (of std for GAUSS, of b for LAPLACE) at `num_bits`."""
    clip, bits = parse_clip_mode(clip), check_bits(num_bits)
    if clip not in _ACIQ:
        raise QuantizationError(f"clip mode {clip.name} has no ACIQ value; use GAUSS or LAPLACE")
    if clip is ClipMode.GAUSS:
        table = ALPHA_GAUSS_POSITIVE if half_range else ALPHA_GAUSS
    else:
        table = ALPHA_LAPLACE_POSITIVE if half_range else ALPHA_LAPLACE
    if bits not in table:
        raise QuantizationError(f"clip mode {clip.name} is defined up to {max(table)} bits (ACIQ's "
                                f"tables), got {bits}; use AVG, N_STD or NONE at {bits} bits")
    return table[bits]


def histogram_range(counts: Tensor, low: float, high: float, num_bits: int,
                    mode: LinearQuantMode | str) -> tuple[float, float]:
    """The (min, max) of least expected squared error on a `num_bits` grid of `mode`, for values
    counted in `counts` (equal bins over [low, high])."""
    bits, mode = check_bits(num_bits), parse_quant_mode(mode)
    counts = counts.detach().to("cpu", torch.float64).flatten()
    if counts.numel() == 0 or not high > low or not float(counts.sum()) > 0:
        return low, high
    edges = torch.linspace(low, high, counts.numel() + 1, dtype=torch.float64)
    centers = (edges[:-1] + edges[1:]) / 2
    start = torch.zeros(1, dtype=torch.float64)
    # prefix sums of the counts and of their first and second moments: [0, bin 0, bins 0-1, ...]
    n, s1, s2 = (torch.cat([start, (counts * centers ** k).cumsum(0)]) for k in range(3))
    if mode.symmetric:
        edge = torch.cat([edges.abs(), torch.tensor([max(-low, high)], dtype=torch.float64)])
        lo, hi = -edge, edge
        steps = (2 ** (bits - 1) - 1 if mode is LinearQuantMode.SYMMETRIC_RESTRICTED
                 else (2 ** bits - 1) / 2)
        step = edge / steps
    else:  # every pair of edges, widened to hold 0 as quant_params widens them
        lo = edges.clamp(max=0).unsqueeze(1).expand(-1, edges.numel()).flatten()
        hi = edges.clamp(min=0).unsqueeze(0).expand(edges.numel(), -1).flatten()
        step = (hi - lo) / (2 ** bits - 1)
    below = torch.searchsorted(centers, lo)  # bins whose centre lies under lo
    inside_end = torch.searchsorted(centers, hi, right=True)
    clipped_low = lo ** 2 * n[below] - 2 * lo * s1[below] + s2[below]
    clipped_high = (hi ** 2 * (n[-1] - n[inside_end]) - 2 * hi * (s1[-1] - s1[inside_end])
                    + (s2[-1] - s2[inside_end]))
    error = clipped_low + clipped_high + (n[inside_end] - n[below]) * step ** 2 / 12
    error = torch.where(hi > lo, error, torch.full_like(error, math.inf))
    best = int(torch.argmin(error))
    return float(lo[best]), float(hi[best])


def shared_histogram_range(records: Sequence[Mapping[str, Any]], num_bits: int,
                           mode: LinearQuantMode | str) -> tuple[float, float]:
    """The MSE range of several tensors quantized on one grid (a concatenation's): the search on
    their histograms merged, as one observer watching them all would see them."""
    low = min(_stat(r, "min", ClipMode.MSE) for r in records)
    high = max(_stat(r, "max", ClipMode.MSE) for r in records)
    bins = HISTOGRAM_BINS * 4  # finer than the parts: each part's bins land where they lie
    merged = torch.zeros(bins, dtype=torch.float64)
    for record in records:
        counts = _histogram(record)
        edges = torch.linspace(record["min"], record["max"], counts.numel() + 1,
                               dtype=torch.float64)
        centers = (edges[:-1] + edges[1:]) / 2
        width = max(high - low, 1e-30)
        index = ((centers - low) * (bins / width)).floor().long().clamp(0, bins - 1)
        merged.index_add_(0, index, counts)
    return histogram_range(merged, low, high, num_bits, mode)


def _histogram(stats: Mapping[str, Any]) -> Tensor:
    """The histogram of a stats record, or a one-line error saying how to get one."""
    counts = stats.get("histogram")
    if (not isinstance(counts, (list, tuple)) or not counts
            or not all(isinstance(c, numbers.Real) and not isinstance(c, bool)
                       and math.isfinite(c) and c >= 0 for c in counts)):
        raise QuantizationError("the activation statistics lack a 'histogram' of counts, which "
                                "clip mode MSE needs (Distiller's statistics have none); collect "
                                "the statistics again with --qe-calibration")
    return torch.tensor(counts, dtype=torch.float64)


def _stat(stats: Mapping[str, Any], key: str, clip: ClipMode) -> float:
    """One number of a stats record, or a one-line error naming the key and the clip mode."""
    value = stats.get(key)
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value)):
        raise QuantizationError(f"the activation statistics lack a finite '{key}' (got "
                                f"{shown(value)}), which clip mode {clip.name} needs; collect the "
                                "statistics again (--qe-calibration)")
    return float(value)


def stats_range(stats: Mapping[str, Any], clip: ClipMode | str, mode: LinearQuantMode | str,
                num_bits: int, clip_n_stds: float | None = None,
                half_range: bool = False) -> tuple[float, float]:
    """The (min, max) to quantize one tensor, from its statistics record (min, max, avg_min ...).

    As Distiller's _get_quant_params_from_stats_dict; symmetric modes then use max(|min|, |max|).
    `half_range` only changes GAUSS / LAPLACE in asymmetric modes, as in Distiller.
    """
    clip, mode = parse_clip_mode(clip), parse_quant_mode(mode)
    n_stds = check_clip_n_stds(clip, clip_n_stds)
    bits = check_bits(num_bits)
    prefix = "avg_" if clip is ClipMode.AVG else ""
    low, high = _stat(stats, prefix + "min", clip), _stat(stats, prefix + "max", clip)
    if clip is ClipMode.MSE:
        return histogram_range(_histogram(stats), low, high, bits, mode)
    if n_stds is not None:
        mean, std = _stat(stats, "mean", clip), _stat(stats, "std", clip)
        return max(low, mean - n_stds * std), min(high, mean + n_stds * std)
    if clip not in _ACIQ:
        return low, high
    spread = _stat(stats, "std" if clip is ClipMode.GAUSS else "b", clip)
    mean = _stat(stats, "mean", clip)
    if mode.symmetric:
        alpha = spread * aciq_alpha(clip, bits)
        return -(abs(mean) + alpha), abs(mean) + alpha
    alpha = spread * aciq_alpha(clip, bits, half_range)
    low = max(_stat(stats, "avg_min", clip), mean - alpha)
    return low, low + (alpha if half_range else 2 * alpha)


def tensor_range(t: Tensor, clip: ClipMode | str, mode: LinearQuantMode | str, num_bits: int,
                 clip_n_stds: float | None = None, half_range: bool = False,
                 per_channel: bool = False) -> tuple[Tensor, Tensor]:
    """The (min, max) to quantize `t`, computed from `t` itself (dynamic ranges, weights).

    As Distiller's _get_quant_params_from_tensor: AVG averages per-sample (dim 0) min / max,
    N_STD and ACIQ use the unbiased std of `t`, asymmetric ACIQ starts from the absolute min.
    Per-channel ranges (along dim 0) exist for clip mode NONE only.
    """
    clip, mode = parse_clip_mode(clip), parse_quant_mode(mode)
    n_stds = check_clip_n_stds(clip, clip_n_stds)
    bits = check_bits(num_bits)
    if t.numel() == 0:
        raise QuantizationError("cannot compute a quantization range of an empty tensor; "
                                "leave it in float")
    x = t.detach()
    if not x.is_floating_point():
        x = x.to(torch.float32)
    if per_channel:
        if clip is not ClipMode.NONE or x.dim() < 2:
            raise QuantizationError(
                f"per-channel ranges need clip mode NONE and a tensor with channels along dim 0, "
                f"got {clip.name} and shape {tuple(x.shape)}; quantize it per tensor")
        flat = x.reshape(x.shape[0], -1)
        return flat.min(dim=1).values, flat.max(dim=1).values
    if clip is ClipMode.AVG:
        flat = x.reshape(x.shape[0], -1) if x.dim() > 0 else x.reshape(1, 1)
        return flat.min(dim=1).values.mean(), flat.max(dim=1).values.mean()
    low, high = x.min(), x.max()
    if clip is ClipMode.MSE:
        counts = torch.histc(x.float(), HISTOGRAM_BINS, float(low), float(high))
        best = histogram_range(counts, float(low), float(high), bits, mode)
        return (torch.tensor(best[0], dtype=x.dtype, device=x.device),
                torch.tensor(best[1], dtype=x.dtype, device=x.device))
    if n_stds is not None:
        mean, std = x.mean(), x.std()
        return torch.maximum(low, mean - n_stds * std), torch.minimum(high, mean + n_stds * std)
    if clip not in _ACIQ:
        return low, high
    mean = x.mean()
    spread = x.std() if clip is ClipMode.GAUSS else (x - mean).abs().mean()
    if mode.symmetric:
        edge = mean.abs() + spread * aciq_alpha(clip, bits)
        return -edge, edge
    alpha = spread * aciq_alpha(clip, bits, half_range)
    low = torch.maximum(low, mean - alpha)
    return low, low + (alpha if half_range else 2 * alpha)
