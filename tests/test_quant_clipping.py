"""Activation clipping (Distiller's ClipMode and ACIQ) on a known stats record and tensor."""

from __future__ import annotations

import math

import pytest
import torch

from compressor.quantization import (
    ALPHA_GAUSS,
    ALPHA_LAPLACE,
    ClipMode,
    LinearQuantMode,
    QuantizationError,
    aciq_alpha,
    parse_clip_mode,
    quant_params,
    stats_range,
    tensor_range,
)

SYM, ASYM_U = LinearQuantMode.SYMMETRIC, LinearQuantMode.ASYMMETRIC_UNSIGNED
STATS = {"min": -4.0, "max": 6.0, "avg_min": -2.0, "avg_max": 3.0, "mean": 0.5, "std": 1.0,
         "b": 0.8, "shape": "(8, 4)"}


def test_aciq_tables_are_the_papers():
    # ACIQ (arXiv:1810.05723): Laplace alpha* = 2.83 b, 3.89 b, 5.03 b at 2, 3, 4 bits;
    # Gauss 1.71, 2.15, 2.55 sigma; Distiller's tables go up to 8 bits (9.89 b, 3.92 sigma)
    assert [ALPHA_LAPLACE[b] for b in (2, 3, 4, 8)] == [2.83, 3.89, 5.03, 9.89]
    assert [ALPHA_GAUSS[b] for b in (2, 3, 4, 8)] == [1.71, 2.15, 2.55, 3.92]
    assert aciq_alpha(ClipMode.LAPLACE, 8, half_range=True) == 11.16
    assert aciq_alpha("gauss", 8, half_range=True) == 4.2


@pytest.mark.parametrize(("clip", "mode", "bits", "n_stds", "half", "expected"), [
    ("none", SYM, 8, None, False, (-4.0, 6.0)),
    ("NONE", ASYM_U, 8, None, False, (-4.0, 6.0)),
    ("avg", ASYM_U, 8, None, False, (-2.0, 3.0)),
    # N_STD: mean -/+ n * std, never beyond min / max
    ("n_std", ASYM_U, 8, 2, False, (0.5 - 2.0, 0.5 + 2.0)),
    ("N_STD", SYM, 8, 10, False, (-4.0, 6.0)),
    # GAUSS symmetric: -/+(|mean| + 3.92 * std) = -/+4.42
    ("gauss", SYM, 8, None, False, (-4.42, 4.42)),
    # GAUSS asymmetric: lo = max(avg_min, mean - 3.92) = -2, hi = lo + 2 * 3.92 = 5.84
    ("gauss", ASYM_U, 8, None, False, (-2.0, 5.84)),
    # half range: alpha = 4.2 (positive table), lo = max(-2, 0.5 - 4.2) = -2, hi = lo + 4.2
    ("gauss", ASYM_U, 8, None, True, (-2.0, 2.2)),
    # half range is ignored in symmetric modes, as in Distiller
    ("gauss", SYM, 8, None, True, (-4.42, 4.42)),
    # LAPLACE symmetric 4 bits: -/+(0.5 + 5.03 * 0.8) = -/+4.524
    ("laplace", SYM, 4, None, False, (-4.524, 4.524)),
    # LAPLACE asymmetric 8 bits: alpha = 9.89 * 0.8 = 7.912, lo = max(-2, -7.412), hi = lo + 15.824
    ("laplace", ASYM_U, 8, None, False, (-2.0, 13.824)),
    # LAPLACE half range 2 bits: alpha = 3.89 * 0.8 = 3.112, lo = max(-2, -2.612), hi = lo + alpha
    ("laplace", ASYM_U, 2, None, True, (-2.0, 1.112)),
])
def test_stats_range_hand_worked(clip, mode, bits, n_stds, half, expected):
    low, high = stats_range(STATS, clip, mode, bits, clip_n_stds=n_stds, half_range=half)
    assert (low, high) == pytest.approx(expected)


def test_stats_range_to_quant_params():
    # AVG, asymmetric unsigned 8 bits: [-2, 3] -> scale 255 / 5 = 51, zp round(51 * -2) = -102
    scale, zp = quant_params(*stats_range(STATS, ClipMode.AVG, ASYM_U, 8), 8, ASYM_U)
    assert (scale.item(), zp.item()) == (51.0, -102.0)
    # NONE, symmetric 8 bits: sat = max(4, 6) = 6 -> scale 127.5 / 6 = 21.25
    scale, zp = quant_params(*stats_range(STATS, ClipMode.NONE, SYM, 8), 8, SYM)
    assert (scale.item(), zp.item()) == (21.25, 0.0)


T = torch.tensor([[-1.0, 2.0], [-3.0, 0.5]])  # two samples of two values


def test_tensor_range_hand_worked():
    assert [v.item() for v in tensor_range(T, "none", SYM, 8)] == [-3.0, 2.0]
    # AVG: per-sample mins -1, -3 -> -2; maxes 2, 0.5 -> 1.25
    assert [v.item() for v in tensor_range(T, "avg", ASYM_U, 8)] == [-2.0, 1.25]
    # N_STD with the unbiased std, as Distiller's tensor path: mean -0.375,
    # squared deviations 0.390625 + 5.640625 + 6.890625 + 0.765625 = 13.6875, / 3
    std = math.sqrt(13.6875 / 3)
    low, high = tensor_range(T, "n_std", ASYM_U, 8, clip_n_stds=1)
    assert (low.item(), high.item()) == pytest.approx((-0.375 - std, -0.375 + std))
    # LAPLACE symmetric: b = mean |x - mean| = (0.625 + 2.375 + 2.625 + 0.875) / 4 = 1.625
    low, high = tensor_range(T, "laplace", SYM, 8)
    edge = 0.375 + 1.625 * 9.89
    assert (low.item(), high.item()) == pytest.approx((-edge, edge))
    # asymmetric ACIQ starts from the absolute min: lo = max(-3, -0.375 - 2.55 * std)
    low, high = tensor_range(T, "gauss", ASYM_U, 4)
    alpha = 2.55 * std
    assert (low.item(), high.item()) == pytest.approx((-3.0, -3.0 + 2 * alpha))
    low, high = tensor_range(T, "none", SYM, 8, per_channel=True)
    assert low.tolist() == [-1.0, -3.0] and high.tolist() == [2.0, 0.5]


@pytest.mark.parametrize("clip", ["avg", "n_std", "gauss", "laplace"])
def test_per_channel_needs_clip_none(clip):
    with pytest.raises(QuantizationError, match="per-channel ranges need clip mode NONE"):
        tensor_range(T, clip, SYM, 8, clip_n_stds=2, per_channel=True)


def test_n_std_without_clip_n_stds_is_refused():
    with pytest.raises(QuantizationError, match="clip_n_stds") as info:
        stats_range(STATS, ClipMode.N_STD, SYM, 8)
    assert "\n" not in str(info.value)
    with pytest.raises(QuantizationError, match="clip_n_stds"):
        tensor_range(T, "n_std", SYM, 8)
    for bad in (0, -1.0, True, "3", float("inf")):
        with pytest.raises(QuantizationError, match="positive number"):
            stats_range(STATS, "n_std", SYM, 8, clip_n_stds=bad)


def test_parse_clip_mode():
    assert [parse_clip_mode(n) for n in ("none", "avg", "n_std", "gauss", "laplace", "mse")] \
        == list(ClipMode)
    assert parse_clip_mode("Laplace") is ClipMode.LAPLACE
    with pytest.raises(QuantizationError, match="unknown clip mode 'lapace'.*'LAPLACE'") as info:
        parse_clip_mode("lapace")
    assert "\n" not in str(info.value)
    with pytest.raises(QuantizationError, match="unknown clip mode"):
        stats_range(STATS, "max", SYM, 8)


def test_aciq_beyond_its_tables_and_missing_stats_are_refused():
    with pytest.raises(QuantizationError, match="up to 8 bits"):
        stats_range(STATS, "gauss", SYM, 9)
    with pytest.raises(QuantizationError, match="out of range"):
        stats_range(STATS, "none", SYM, 17)
    with pytest.raises(QuantizationError, match="lack a finite 'avg_min'.*AVG"):
        stats_range({"min": -1.0, "max": 1.0}, "avg", SYM, 8)
    with pytest.raises(QuantizationError, match="'b'"):
        stats_range({**STATS, "b": "x"}, "laplace", SYM, 8)
