"""int8 on oneDNN's kernels with plain uint8 tensors (the default backend where it applies): no
deprecated quantized tensor, the simulation's integers, the kernels' pointwise forms exact."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from compressor.quantization.core.errors import QuantizationError
from compressor.quantization.core.range_linear import LinearQuantMode, fake_quantize, quant_params
from compressor.quantization.core.settings import settings_from_args
from compressor.quantization.int8.convert import (
    Grid,
    activation_grid,
    convert_to_int8,
    kernels_saturate,
    resolve_backend,
)
from compressor.quantization.int8.onednn import (
    OnednnLayer,
    OnednnPointwise,
    dequantize_uint8,
    onednn_available,
    quantize_uint8,
)
from compressor.quantization.simulated.graph import explicit_graph
from compressor.quantization.simulated.post_train import PostTrainLinearQuantizer
from compressor.quantization.simulated.wrappers import TensorQuant
from compressor.quantization.statistics.collect import collect_stats
from tests.conftest import run_cli
from tests.test_quant_graph import trained_like_model

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not onednn_available(),
                                 reason="this torch build lacks oneDNN's int8 kernels")]

COMMON = ("-b", "64", "-j", "0", "--deterministic", "-p", "0")


def _grid(low: float, high: float, mode: LinearQuantMode = LinearQuantMode.ASYMMETRIC_UNSIGNED
          ) -> tuple[Grid, tuple[torch.Tensor, torch.Tensor]]:
    """An 8-bit activation grid over [low, high] and Distiller's (scale, zero point) of it."""
    scale, zero_point = quant_params(low, high, 8, mode)
    spec = TensorQuant(bits=8, mode=mode)
    return activation_grid(scale, zero_point, spec), (scale, zero_point)


def _simulated(x: torch.Tensor, params: tuple[torch.Tensor, torch.Tensor],
               mode: LinearQuantMode = LinearQuantMode.ASYMMETRIC_UNSIGNED) -> torch.Tensor:
    return fake_quantize(x, *params, 8, mode)


def test_quantize_and_dequantize_are_the_simulations_to_the_bit() -> None:
    x = torch.randn(4, 8, 5, 5) * 3
    for mode in (LinearQuantMode.ASYMMETRIC_UNSIGNED, LinearQuantMode.SYMMETRIC):
        grid, params = _grid(-2.5, 4.0, mode)
        ints = quantize_uint8(x, *grid.quantize_args())
        assert ints.dtype == torch.uint8
        assert torch.equal(dequantize_uint8(ints, *grid.dequantize_args()),
                           _simulated(x, params, mode))


@pytest.mark.parametrize("shape", [(2, 6, 7, 7), (2, 5, 6)])  # the kernel, and in float
def test_pointwise_forms_compute_what_the_simulation_does(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    a_grid, a_params = _grid(-1.13, 2.07)
    b_grid, b_params = _grid(-2.71, 1.39)
    out_grid, out_params = _grid(0.0, 3.17)
    a = quantize_uint8(torch.randn(shape), *a_grid.quantize_args())
    b = quantize_uint8(torch.randn(shape), *b_grid.quantize_args())
    a_values = dequantize_uint8(a, *a_grid.dequantize_args())
    b_values = dequantize_uint8(b, *b_grid.dequantize_args())
    cases = {
        "requantize": (OnednnPointwise(a_grid, out_grid), (a,), a_values),
        "add_relu": (OnednnPointwise(a_grid, out_grid, activation=nn.ReLU(), accum_grid=b_grid),
                     (a, b.clone()), torch.relu(a_values + b_values)),
        "relu6": (OnednnPointwise(a_grid, out_grid, activation=nn.ReLU6()), (a,),
                  torch.clamp(a_values, 0, 6)),
    }
    channels = shape[1]
    gain, bias = torch.linspace(-2, 2, channels), torch.linspace(0.5, -0.5, channels)
    view = (-1,) + (1,) * (len(shape) - 2)
    cases["batchnorm_relu"] = (
        OnednnPointwise(a_grid, out_grid, gain, bias, nn.ReLU()), (a,),
        torch.relu(a_values * gain.reshape(view) + bias.reshape(view)))
    for name, (module, inputs, expected) in cases.items():
        got = dequantize_uint8(module(*inputs), *out_grid.dequantize_args())
        want = _simulated(expected, out_params)
        step = 1 / float(out_params[0])
        # the kernel rounds its float arithmetic in another order: a tie may go one step
        assert (got - want).abs().max() <= step * 1.001, name
        assert (got != want).float().mean() < 0.01, name


def test_an_added_tensor_read_elsewhere_is_left_intact() -> None:
    grid, _ = _grid(-1.0, 1.0)
    a = quantize_uint8(torch.randn(2, 4, 5, 5), *grid.quantize_args())
    b = quantize_uint8(torch.randn(2, 4, 5, 5), *grid.quantize_args())
    before = b.clone()
    OnednnPointwise(grid, grid, accum_grid=grid, accum_shared=True)(a, b)
    assert torch.equal(b, before)


def _quantized(arch: str, side: int | None, mode: dict | None = None
               ) -> tuple[nn.Module, torch.Tensor]:
    model, x = trained_like_model(arch, side)
    graph = explicit_graph(model, x[:1])
    stats = collect_stats(graph, [x[:4], x[4:]], histograms=False)
    args = {"reduce_range": kernels_saturate("auto")}
    if mode is not None:
        args["mode"] = mode
    return PostTrainLinearQuantizer(settings_from_args(args, "q"), stats).quantize(graph), x


def test_auto_is_onednn_for_symmetric_weights_and_x86_for_asymmetric() -> None:
    symmetric, _ = _quantized("resnet20_cifar", None)
    asymmetric, _ = _quantized("resnet20_cifar", None, "asym_u")
    assert resolve_backend(symmetric, "auto") == "onednn"
    assert resolve_backend(asymmetric, "auto") == "x86"
    with pytest.raises(QuantizationError, match="asymmetric weights.*--qe-pytorch-backend x86"):
        convert_to_int8(asymmetric, "onednn")


@pytest.mark.parametrize("arch,side", [("resnet20_cifar", None), ("densenet121", 64),
                                       ("mobilenet_v3_small", 64), ("googlenet", 64)])
def test_onednn_int8_follows_the_simulation_and_copies(arch: str, side: int | None) -> None:
    simulated, x = _quantized(arch, side)
    int8 = convert_to_int8(simulated)
    assert int8.backend == "onednn"
    called = {type(m).__name__ for m in int8.modules()}
    assert "OnednnLayer" in called and not any(n.startswith(("Conv", "Linear", "QFunctional"))
                                               and "Onednn" not in n for n in called
                                               if n not in ("ConvReLU2d",))
    inputs = torch.randn(4, *x.shape[1:], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        sim, got = simulated(inputs), int8(inputs)
        copied = copy.deepcopy(int8)(inputs)  # the packed weights are packed again
        one = int8(inputs[:1])  # weights packed for a second input shape
    assert got.dtype == torch.float32 and torch.equal(copied, got)
    assert torch.equal(one, got[:1])
    layers = [m for m in int8.modules() if isinstance(m, OnednnLayer)]
    assert all(len(layer._packed) == 2 for layer in layers)
    assert (got.argmax(1) == sim.argmax(1)).float().mean() >= 0.75
    scale = float((sim.max() - sim.min()).clamp_min(1e-6))
    assert (got - sim).abs().max() <= 0.1 * scale


@pytest.fixture(scope="module")
def float_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A float simplenet_digits checkpoint (one epoch)."""
    out = tmp_path_factory.mktemp("onednn")
    train = ("-a", "simplenet_digits", *COMMON, "--lr", "0.1", "--etrs", "0.3")
    first = run_cli(*train, "--epochs", "1", "-o", str(out), "-n", "fp32")
    assert first.returncode == 0, first.stderr[-2000:]
    return out / "fp32" / "checkpoint.pth.tar"


def test_the_default_int8_run_is_quiet_and_says_its_kernels(float_checkpoint: Path,
                                                             tmp_path: Path) -> None:
    """The demo's int8 stage: no torch warning (the deprecated quantized tensors are not used,
    not silenced), and the results name the kernels. (The CLI's forked children print torch's
    warning-once messages: with --qe-pytorch-backend x86 this stderr holds the deprecation.)"""
    checkpoint = float_checkpoint
    result = run_cli("--resume-from", str(checkpoint), "-e", *COMMON, "-o", str(tmp_path),
                     "--qe", "--qe-per-channel", "--qe-calibration", "0.2",
                     "--qe-convert-pytorch", "-n", "int8")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Warning" not in result.stderr and "deprecated" not in result.stderr, result.stderr
    results = json.loads((tmp_path / "int8" / "results.json").read_text())
    assert results["kernels"] == "int8" and results["backend"] == "onednn"
    again = run_cli("-e", "--resume-from", str(tmp_path / "int8" / "quantized_checkpoint.pth.tar"),
                    *COMMON, "-o", str(tmp_path), "-n", "again")
    assert again.returncode == 0 and "Warning" not in again.stderr, again.stderr[-2000:]
    rebuilt = json.loads((tmp_path / "again" / "results.json").read_text())
    assert rebuilt["top1"] == pytest.approx(results["quantized_top1"], abs=1e-6)


def test_asymmetric_weights_on_onednn_are_refused_in_one_line(float_checkpoint: Path,
                                                              tmp_path: Path) -> None:
    result = run_cli("--resume-from", str(float_checkpoint), "-e",
                     *COMMON, "-o", str(tmp_path), "--qe", "--qem", "asym_u", "--qept",
                     "--qe-pytorch-backend", "onednn", "-n", "refused")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "asymmetric ones" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "refused").exists() or not any((tmp_path / "refused").iterdir())
