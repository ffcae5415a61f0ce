"""Real int8 inference from a simulated post-training-quantized model (--qe-convert-pytorch).

Two families of kernels compute it. `onednn` (int8_onednn.py) calls oneDNN's int8 kernels with
plain uint8 tensors, what torchao's PT2E lowering calls on x86, without the quantized tensor
types torch 2.14 deprecates; `auto` (the default) picks it wherever it can compute the model,
and x86 otherwise. On torch.ao's engines (x86, fbgemm, qnnpack) each wrapper becomes torch.ao
quantized modules computing in int8 with the same integers and scales as the simulation: conv /
linear (with a fused ReLU: ConvReLU / LinearReLU), element-wise ops as QFunctional, activations
requantized to their own parameters. Distiller's parameters are converted with `torch_qparams`
(its scale is torch's reciprocal, its zero point torch's negation); 8-bit activations become
quint8 (signed modes shifted by 128) and weights qint8 (unsigned modes shifted by -128). An
input is quantized on entry unless it already arrives quantized with the same parameters
(Distiller's ConditionalQuantize); other modules dequantize on entry, and the model's output is
dequantized.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.ao.nn.intrinsic.quantized as nniq
import torch.ao.nn.quantized as nnq
import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn

from compressor.models.layers.eltwise import Concat, EltwiseAdd, EltwiseMult
from compressor.quantization.core.errors import QuantizationError, unknown_choice
from compressor.quantization.core.range_linear import (
    MAX_ACCUM_BITS,
    LinearQuantMode,
    quantize,
    torch_qparams,
)
from compressor.quantization.int8.graph import (
    QUANTIZED_SAFE_MODULES,
    flatten_calls,
    lower_int8_graph,
    requantize,
)
from compressor.quantization.int8.onednn import (
    ONEDNN,
    OnednnLayer,
    onednn_available,
    onednn_problem,
    onednn_saturates,
)
from compressor.quantization.int8.onednn_graph import lower_onednn_graph
from compressor.quantization.simulated.graph import ensure_float, float_functional_inputs
from compressor.quantization.simulated.wrappers import (
    ActivationWrapper,
    EltwiseWrapper,
    ParamLayerWrapper,
    QuantWrapper,
    TensorQuant,
    input_padding,
)
from compressor.utils.vocabulary import AUTO, INT8_BACKENDS, TORCH_ENGINES

__all__ = ["INT8_BACKENDS", "AUTO", "ACTIVATION_BITS", "Grid", "activation_grid",
           "weight_integers", "check_convertible", "convert_to_int8", "Int8Model",
           "kernels_saturate", "resolve_backend"]

# AUTO: oneDNN where it can compute the model, else x86 (the names: compressor.utils.vocabulary)
_CONV = {nn.Conv1d: (nnq.Conv1d, nniq.ConvReLU1d), nn.Conv2d: (nnq.Conv2d, nniq.ConvReLU2d),
         nn.Conv3d: (nnq.Conv3d, nniq.ConvReLU3d)}


@dataclass(frozen=True)
class Grid:
    """An activation's quint8 parameters and the top of its integer grid (255 at 8 bits, 127
    for reduce_range's 7: the kernels requantize to 0..255, so a narrower grid is clamped to,
    as the simulation clamps, and 7-bit inputs are what kernels without VNNI can take)."""

    scale: float
    zero_point: int
    top: int = 255
    sim_scale: float = 1.0  # Distiller's scale and zero point, as the simulation computes:
    sim_zero_point: float = 0.0  # integer = round(x * sim_scale - sim_zero_point) + shift

    def quantize_args(self) -> tuple[float, float, int, int]:
        """The arguments with which int8_onednn.quantize_uint8 computes the simulation's
        integers on this grid."""
        return self.sim_scale, self.sim_zero_point, self.zero_point, self.top

    def dequantize_args(self) -> tuple[float, int]:
        """The arguments with which int8_onednn.dequantize_uint8 computes the simulation's
        values of this grid's integers."""
        return self.sim_scale, self.zero_point

    def bounds(self) -> tuple[float, float] | None:
        """The float range of a grid narrower than quint8's (None: the whole of quint8)."""
        if self.top >= 255:
            return None
        return (0 - self.zero_point) * self.scale, (self.top - self.zero_point) * self.scale

ACTIVATION_BITS = (7, 8)  # activation widths quint8 holds (7: reduce_range)


def _refuse(name: str, problem: str) -> QuantizationError:
    """The error of a layer that cannot run in int8."""
    return QuantizationError(f"--qe-convert-pytorch needs 8-bit static quantization everywhere, "
                             f"but layer '{name}' {problem}; other widths stay simulated, so "
                             "quantize with 8 bits and statistics or drop --qe-convert-pytorch")


def resolve_backend(model: nn.Module, backend: str) -> str:
    """The kernels `backend` means for `model`: `auto` is oneDNN where it can compute the model
    (symmetric weights, a traced graph), else x86."""
    if backend != AUTO:
        return backend
    return ONEDNN if onednn_problem(model) is None else "x86"


def check_convertible(model: nn.Module, backend: str | None = None) -> None:
    """Raise a QuantizationError unless every wrapper is static and 8 bits wide (activations:
    7 with reduce_range, which `backend`'s kernels need where they saturate 8 bits) and the
    backend's kernels can compute the model."""
    wrappers = [(n, m) for n, m in model.named_modules() if isinstance(m, QuantWrapper)]
    if not wrappers:
        raise QuantizationError("--qe-convert-pytorch needs a post-training-quantized model; "
                                "quantize it first (--quantize-eval)")
    for name, wrapper in wrappers:
        if wrapper.dynamic:
            raise _refuse(name, "uses dynamic ranges (--qe-dynamic)")
        specs = [("output", wrapper.output)]
        if not isinstance(wrapper, ActivationWrapper):
            specs += [(f"input {i}", s) for i, s in enumerate(wrapper.inputs)]
        for what, spec in specs:
            if spec is None or spec.bits not in ACTIVATION_BITS:
                width = "float" if spec is None else f"{spec.bits} bits"
                raise _refuse(name, f"has its {what} in {width}")
        if isinstance(wrapper, ParamLayerWrapper):
            weight = wrapper.weight_quant
            if weight is None or weight.bits != 8:
                width = "float" if weight is None else f"{weight.bits} bits"
                raise _refuse(name, f"has its weights in {width}")
            if wrapper.bits_accum < MAX_ACCUM_BITS:
                raise QuantizationError(
                    f"--qe-convert-pytorch runs 32-bit accumulators, but layer '{name}' has "
                    f"bits_accum {wrapper.bits_accum}; keep it simulated (drop "
                    "--qe-convert-pytorch) or quantize with bits_accum 32")
    if backend == ONEDNN:
        problem = onednn_problem(model)
        if problem is not None:
            raise QuantizationError(f"the onednn int8 backend cannot compute this model: "
                                    f"{problem}; use --qe-pytorch-backend x86 (or auto)")
    if backend is not None and kernels_saturate(resolve_backend(model, backend)):
        full = [name for name, wrapper in wrappers
                if wrapper.output is not None and wrapper.output.bits > 7]
        if full:
            raise QuantizationError(
                f"this CPU's {backend} int8 kernels saturate 8-bit activations (no VNNI), and "
                f"layer '{full[0]}' has 8-bit outputs; quantize with reduce_range: true "
                "(7-bit activations), or keep the model simulated")


def activation_grid(scale: Tensor, zero_point: Tensor, spec: TensorQuant) -> Grid:
    """torch's quint8 grid of Distiller's activation parameters (signed modes shifted to start
    at 0: by 128 at 8 bits, by 64 at reduce_range's 7)."""
    torch_scale, torch_zero = torch_qparams(scale, zero_point)
    shift = 2 ** (spec.bits - 1) if spec.mode.signed else 0
    return Grid(float(torch_scale), int(torch_zero) + shift, 2 ** spec.bits - 1, float(scale),
                float(zero_point))


def _quantize_to(x: Tensor, grid: Grid | None) -> Tensor:
    """x as quint8 on `grid` (float when None), requantizing only when it is on another."""
    if grid is None:
        return ensure_float(x)
    return requantize(x, grid.scale, grid.zero_point, *(grid.bounds() or (None, None)))


class _Int8Module(nn.Module):
    """Quantizes (or dequantizes) each input as needed, then runs an int8 op."""

    def __init__(self, op: nn.Module, inputs: Sequence[Grid | None],
                 output: Grid | None = None, kind: str = "param") -> None:
        super().__init__()
        self.op, self.inputs, self.output, self.kind = op, tuple(inputs), output, kind
        self.clamp: tuple[float, float] | None = None  # the output grid's, where narrower
        self.pre_pad: tuple[int, ...] | None = None  # a padding conv's input padding

    def forward(self, *xs: Tensor) -> Tensor:
        """op of the entry-quantized inputs, clamped to a reduced output grid."""
        result = self._run(*xs)
        if self.clamp is not None:
            result = torch.clamp(result, *self.clamp)
        return result

    def _run(self, *xs: Tensor) -> Tensor:
        ready = [_quantize_to(x, self.inputs[i] if i < len(self.inputs) else self.inputs[-1])
                 for i, x in enumerate(xs)]
        if self.pre_pad is not None:  # zeros of the quantized input: its zero point
            ready[0] = F.pad(ready[0], self.pre_pad)
        if self.kind == "activation":
            # the activation in float, requantized to its own output parameters
            assert self.output is not None
            return _quantize_to(self.op(ready[0].dequantize()), self.output)
        if self.kind in ("add", "add_relu"):
            result = ready[0]
            for other in ready[1:-1]:
                result = self.op.add(result, other)
            last = self.op.add_relu if self.kind == "add_relu" else self.op.add
            return last(result, ready[-1]) if len(ready) > 1 else result
        if self.kind == "mul":
            result = ready[0]
            for other in ready[1:]:
                result = self.op.mul(result, other)
            return result
        if self.kind == "cat":
            if all(grid == self.output for grid in self.inputs):
                # every input on the output's grid: a plain copy of the integers (torch.cat
                # of quantized tensors sharing their parameters), exact and several times
                # faster than quantized::cat, which requantizes each input
                return torch.cat(ready, dim=self.cat_dim)
            return self.op.cat(ready, dim=self.cat_dim)
        return self.op(*ready)

    def extra_repr(self) -> str:
        """The entry quantization."""
        return f"kind={self.kind}, inputs={list(self.inputs)}"


class _Dequantized(nn.Module):
    """A float module whose quantized inputs are dequantized on entry."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """module(float args)."""
        return self.module(*[ensure_float(a) for a in args],
                           **{key: ensure_float(value) for key, value in kwargs.items()})


class Int8Model(nn.Module):
    """The converted model; dequantizes what it returns."""

    def __init__(self, model: nn.Module, backend: str) -> None:
        super().__init__()
        self.model, self.backend = model, backend

    def forward(self, x: Tensor) -> Any:
        """The float output of the int8 model."""
        if self.backend == ONEDNN:  # no allocation torch's deterministic check flags
            out = self.model(x)
        else:
            with _integer_kernels_are_deterministic():
                out = self.model(x)
        if isinstance(out, (tuple, list)):
            return type(out)(ensure_float(o) for o in out)
        return ensure_float(out)


def weight_integers(wrapper: ParamLayerWrapper) -> tuple[Tensor, Tensor, Tensor]:
    """The simulation's weight as int8 integers with torch's scales and zero points (one per
    output channel, or 0-dim): weight = (ints - zero_point) * scale."""
    spec = wrapper.weight_quant
    assert spec is not None
    weight = wrapper.wrapped.weight.detach().float()
    ints = quantize(weight, wrapper.weight_scale, wrapper.weight_zero_point, spec.bits, spec.mode)
    scale, zero_point = torch_qparams(wrapper.weight_scale, wrapper.weight_zero_point)
    if spec.mode is LinearQuantMode.ASYMMETRIC_UNSIGNED:
        ints, zero_point = ints - 128, zero_point - 128
    if spec.per_channel:
        return ints.to(torch.int8), scale.reshape(-1).double(), zero_point.reshape(-1)
    return ints.to(torch.int8), scale.reshape(()).double(), zero_point.reshape(())


def _qweight(wrapper: ParamLayerWrapper) -> Tensor:
    """The qint8 weight holding the simulation's integers."""
    ints, scale, zero_point = weight_integers(wrapper)
    if scale.dim():
        return torch._make_per_channel_quantized_tensor(ints, scale, zero_point, 0)
    return torch._make_per_tensor_quantized_tensor(ints, float(scale), int(zero_point))


def _grid_bias(wrapper: ParamLayerWrapper) -> Tensor:
    """The bias as the simulation adds it (the x86 kernels add a float bias unrounded)."""
    bias = wrapper.grid_bias(wrapper.input0_scale)
    assert bias is not None
    return bias.detach().float()


def _onednn_layer(wrapper: ParamLayerWrapper, x_grid: Grid, out_grid: Grid) -> nn.Module:
    """The conv / linear (+ activation) on oneDNN's kernels with the wrapper's integers."""
    ints, scale, _ = weight_integers(wrapper)
    bias = None if wrapper.wrapped.bias is None else _grid_bias(wrapper)
    return OnednnLayer(wrapper, ints, scale, bias, x_grid, out_grid)


def _convert_param(wrapper: ParamLayerWrapper) -> nn.Module:
    """A quantized conv / linear (+ ReLU) with the wrapper's integers and scales."""
    layer = wrapper.wrapped
    fused_relu = type(wrapper.activation) is nn.ReLU
    if isinstance(layer, nn.Linear):
        cls = nniq.LinearReLU if fused_relu else nnq.Linear
        module = cls(layer.in_features, layer.out_features)
    else:
        plain, with_relu = next(kinds for base, kinds in _CONV.items()
                                if isinstance(layer, base))
        module = (with_relu if fused_relu else plain)(
            layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride,
            layer.padding, layer.dilation, layer.groups, True, layer.padding_mode)
    bias = None if layer.bias is None else _grid_bias(wrapper)
    module.set_weight_bias(_qweight(wrapper), bias)
    assert wrapper.output is not None
    grid = activation_grid(*wrapper.qparams("output"), wrapper.output)
    module.scale, module.zero_point = grid.scale, grid.zero_point
    if wrapper.activation is not None and not fused_relu:
        return nn.Sequential(module, copy.deepcopy(wrapper.activation))  # ReLU6 on quint8
    return module


def _inputs(wrapper: QuantWrapper) -> list[Grid | None]:
    """torch's parameters of each input."""
    return [None if spec is None else activation_grid(*wrapper.qparams(f"input{i}"), spec)
            for i, spec in enumerate(wrapper.inputs)]


def _convert(wrapper: QuantWrapper, backend: str) -> nn.Module:
    """The int8 replacement of one wrapper, clamped to its output grid where narrower."""
    module = _replacement(wrapper, backend)
    assert wrapper.output is not None
    module.clamp = activation_grid(*wrapper.qparams("output"), wrapper.output).bounds()
    return module


def _replacement(wrapper: QuantWrapper, backend: str) -> _Int8Module:
    """The int8 module computing one wrapper (its output on quint8's whole grid)."""
    assert wrapper.output is not None
    output = activation_grid(*wrapper.qparams("output"), wrapper.output)
    if isinstance(wrapper, ParamLayerWrapper):
        inputs = _inputs(wrapper)
        assert inputs[0] is not None  # check_convertible: 8-bit inputs
        layer = (_onednn_layer(wrapper, inputs[0], output) if backend == ONEDNN
                 else _convert_param(wrapper))
        module = _Int8Module(layer, inputs, output)
        module.pre_pad = input_padding(wrapper.wrapped)
        return module
    if isinstance(wrapper, EltwiseWrapper):
        functional: nn.Module = nn.Identity()  # oneDNN: the lowering computes it
        if backend != ONEDNN:
            functional = nnq.QFunctional()
            functional.scale, functional.zero_point = output.scale, output.zero_point
        op = wrapper.wrapped
        kind = ("add" if isinstance(op, EltwiseAdd) else "mul" if isinstance(op, EltwiseMult)
                else "cat")
        if wrapper.activation is not None:
            if kind != "add" or type(wrapper.activation) is not nn.ReLU:
                raise QuantizationError(f"int8 has no kernel for {kind} fused with "
                                        f"{type(wrapper.activation).__name__}; quantize the "
                                        "model again with this version")
            kind = "add_relu"  # the ReLU on the sum's grid, as the simulation quantizes once
        module = _Int8Module(functional, _inputs(wrapper), output, kind)
        if isinstance(op, Concat):
            module.cat_dim = op.dim
        return module
    return _Int8Module(copy.deepcopy(wrapper.wrapped), [None], output, "activation")


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    """Replace the submodule called `name`."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def convert_to_int8(model: nn.Module, backend: str = AUTO) -> nn.Module:
    """A new model computing the simulated-quantized `model` with int8 kernels (CPU)."""
    if backend not in INT8_BACKENDS:
        raise unknown_choice("int8 backend", backend, INT8_BACKENDS)
    backend = resolve_backend(model, backend)
    if backend in TORCH_ENGINES and backend not in torch.backends.quantized.supported_engines:
        raise QuantizationError(f"this PyTorch build lacks the {backend} int8 engine; use one of "
                                f"{', '.join(torch.backends.quantized.supported_engines)}")
    check_convertible(model, backend)
    if backend in TORCH_ENGINES:
        torch.backends.quantized.engine = backend
    converted = copy.deepcopy(model).cpu().eval()
    called = None  # a traced model: the modules its graph calls (the others run inside them)
    if isinstance(converted, torch.fx.GraphModule):
        called = {str(n.target) for n in converted.graph.nodes if n.op == "call_module"}
    for name, module in list(converted.named_modules()):
        if not name or _inside_replaced(converted, name):
            continue
        if isinstance(module, QuantWrapper):
            _set_module(converted, name, _convert(module, backend))
        elif isinstance(module, QUANTIZED_SAFE_MODULES):
            continue
        elif called is not None and name in called:
            _set_module(converted, name, _Dequantized(module))  # a float leaf of the graph
        elif called is None and not any(True for _ in module.children()):
            _set_module(converted, name, _Dequantized(module))
    if isinstance(converted, torch.fx.GraphModule):
        float_functional_inputs(converted)  # functional ops compute in float, as simulated
        if backend == ONEDNN:
            lower_onednn_graph(converted, _Int8Module, _Dequantized, QUANTIZED_SAFE_MODULES)
            flatten_calls(converted)
        else:
            lower_int8_graph(converted, _Int8Module, _Dequantized)
    return Int8Model(converted, backend).eval()


def kernels_saturate(backend: str) -> bool:
    """Whether `backend`'s int8 kernels on this CPU saturate with full-range 8-bit activations.

    x86 CPUs without VNNI multiply u8 by s8 in pairs summed into int16 (vpmaddubsw), which
    overflows beyond 7-bit activations; torch.ao's reduce_range exists for them. Measured, not
    guessed from CPU flags: one 3x3 convolution of 255s by 127s, whose exact sum needs 32 bits.
    `auto` is probed on oneDNN where it is available (the same instructions compute both).
    """
    if backend == ONEDNN or (backend == AUTO and onednn_available()):
        return onednn_saturates()
    if backend == AUTO:
        backend = "x86"
    if backend not in torch.backends.quantized.supported_engines:
        return False
    previous = torch.backends.quantized.engine
    try:
        torch.backends.quantized.engine = backend
        conv = nnq.Conv2d(64, 1, 3)
        weight = torch.full((1, 64, 3, 3), 127.0)
        conv.set_weight_bias(torch.quantize_per_tensor(weight, 1.0, 0, torch.qint8), None)
        conv.scale, conv.zero_point = 2.0 ** 20, 0
        x = torch.quantize_per_tensor(torch.full((1, 64, 3, 3), 255.0), 1.0, 0, torch.quint8)
        got = int(conv(x).int_repr().item())
    finally:
        torch.backends.quantized.engine = previous
    return got != round(64 * 9 * 255 * 127 / 2.0 ** 20)


@contextlib.contextmanager
def _integer_kernels_are_deterministic() -> Iterator[None]:
    """--deterministic leaves the int8 forward alone: integer CPU kernels give the same result
    every run, and torch's alert there (quantized_resize_cpu_, the allocation of an output it
    then overwrites) would warn about nothing."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    if enabled:
        torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        if enabled:
            torch.use_deterministic_algorithms(True, warn_only=warn_only)


def _inside_replaced(model: nn.Module, name: str) -> bool:
    """Whether `name` no longer exists (it lay inside a module already replaced)."""
    try:
        model.get_submodule(name)
    except AttributeError:
        return True
    return False
