"""Quantization-aware training (Distiller's QAT quantizers): wrappers, EMA ranges, the base class.

A QAT quantizer wraps modules in place (`QATWrapper`, the wrapped module kept as `wrapped`, so
`conv1.weight` becomes `conv1.wrapped.weight`). Each forward fake-quantizes the float "shadow"
weights with a straight-through estimator, so the optimizer keeps updating float weights, and
fake-quantizes the output of the module (Distiller's FakeQuantizationWrapper). Everything a
resume needs lives in buffers and parameters: the tracked ranges, the step counts, PACT's
clipping values and an `enabled` flag (before the policy's starting epoch the wrappers pass
through in float). Flags are applied with `torch.where`, so a step needs no host sync.

`QuantAwareTrainRangeLinearQuantizer` tracks activation ranges with Distiller's bias-corrected
exponential moving average (Jacob et al., arXiv:1712.05877) in training and uses the tracked
range in eval; the other methods are in `methods.py`.
"""

from __future__ import annotations

import copy
import itertools
import math
import numbers
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from compressor.models.description import unwrap_model
from compressor.quantization.core.errors import QuantizationError, shown
from compressor.quantization.core.range_linear import (
    MAX_BITS,
    check_bits,
)
from compressor.quantization.core.settings import (
    ELTWISE_LAYERS,
    PARAM_LAYERS,
    LayerSettings,
    QuantSettings,
    reduced_bits,
    resolve_layers,
)
from compressor.quantization.qat.fold import FoldedBatchNorm, FusedQATWrapper
from compressor.quantization.qat.modules import (
    DEFAULT_EMA_DECAY,
    FakeLinearQuantization,
    InputGrid,
    InputQuantizer,
    LinearWeightQuant,
    QATWrapper,
    RangeTracker,
    range_qparams,
    update_ema,
)
from compressor.quantization.simulated.fusion import (
    Fusion,
    find_fusions,
    input_sources,
    trace_model,
)

__all__ = [
    "DEFAULT_EMA_DECAY", "INPUTS_QUANT_NAME", "update_ema", "range_qparams", "RangeTracker",
    "FakeLinearQuantization", "LinearWeightQuant", "QATWrapper", "InputQuantizer",
    "QATQuantizer", "QuantAwareTrainRangeLinearQuantizer", "is_qat_prepared",
    "quantizer_parameter_names", "set_qat_enabled", "set_compact_save", "qat_to_float",
    "unprepare",
]

INPUTS_QUANT_NAME = "inputs_quant"  # Distiller's attribute for the model-input quantizer
_ELTWISE_INPUTS = 2  # input ranges tracked for an element-wise module (more are not tracked)


def _is_input_hook(hook: Any, model: nn.Module) -> bool:
    """Whether a pre-hook is the input quantizer's of `model`."""
    owner = getattr(hook, "__self__", None)
    return isinstance(owner, InputQuantizer) and owner is getattr(model, INPUTS_QUANT_NAME, None)


def _input_hooks(model: nn.Module) -> list[int]:
    """The ids of `model`'s input-quantizer hooks (torch keeps no public registry of hooks)."""
    return [key for key, hook in model._forward_pre_hooks.items() if _is_input_hook(hook, model)]


def _wrappers(model: nn.Module) -> dict[str, QATWrapper]:
    """The QAT wrappers of a model, by name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, QATWrapper)}


def _set_child(model: nn.Module, name: str, module: nn.Module) -> None:
    """Replace the submodule called `name`."""
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def _traced(model: nn.Module) -> tuple[torch.fx.Graph | None, list[Fusion]]:
    """`model`'s eval-mode graph (aux heads, which evaluation never runs, are not in it) and its
    conv / linear -> BN -> ReLU chains, as post-training quantization finds them."""
    training = model.training
    model.eval()
    try:
        graph = trace_model(model)
        return graph, (find_fusions(model, graph) if graph is not None else [])
    finally:
        model.train(training)


def _set_input_grids(model: nn.Module, graph: torch.fx.Graph, planned: Mapping[str, QATWrapper],
                     layers: Mapping[str, LayerSettings], fusions: list[Fusion]) -> None:
    """Give each param / element-wise wrapper the grids the int8 model quantizes its inputs to:
    the producing layer's output grid, else the input's own tracked range."""
    wanted = [name for name, w in planned.items()
              if isinstance(w.wrapped, (*PARAM_LAYERS, *ELTWISE_LAYERS))]
    for name, sources in input_sources(model, graph, wanted, fusions).items():
        wrapper, layer = planned[name], layers[name]
        if layer.bits_activations is None or not layer.quantize_inputs:
            continue
        grids: list[InputGrid | None] = []
        for index, source in enumerate(sources[:len(wrapper.input_ranges)]):
            producer = planned.get(source) if source is not None else None
            if producer is not None and isinstance(producer.output_quant, FakeLinearQuantization):
                grids.append(InputGrid(producer=producer.output_quant))
            else:
                grids.append(InputGrid(own=(wrapper.input_ranges[index],
                                            layer.bits_activations, layer.mode.activations)))
        wrapper.input_grids = grids


def unprepare(model: nn.Module) -> nn.Module:
    """Take a QAT quantizer's wrappers, folded batch norms and input quantizer off `model`, in
    place (the wrapped modules come back as they are: copy effective weights in first)."""
    for name, wrapper in _wrappers(model).items():
        if isinstance(wrapper, FusedQATWrapper):
            wrapper.uninstall(model)
        _set_child(model, name, wrapper.wrapped)
    for key in _input_hooks(model):
        del model._forward_pre_hooks[key]
    if isinstance(getattr(model, INPUTS_QUANT_NAME, None), InputQuantizer):
        delattr(model, INPUTS_QUANT_NAME)
    return model


def is_qat_prepared(model: nn.Module) -> bool:
    """Whether a QAT quantizer has wrapped modules of `model`."""
    target = unwrap_model(model)
    return bool(_wrappers(target)) or isinstance(getattr(target, INPUTS_QUANT_NAME, None),
                                                 InputQuantizer)


def quantizer_parameter_names(model: nn.Module) -> set[str]:
    """The names of the parameters a QAT quantizer added (PACT's clipping values)."""
    names = set()
    for name, module in unwrap_model(model).named_modules():
        if isinstance(module, (QATWrapper, InputQuantizer)):
            for child_name, child in module.named_children():
                if child_name == "wrapped":
                    continue
                prefix = f"{name}.{child_name}" if name else child_name
                names.update(f"{prefix}.{p}" for p, _ in child.named_parameters())
    return names


def set_qat_enabled(model: nn.Module, enabled: bool) -> None:
    """Turn fake quantization (and range tracking) on or off; the flag is a buffer."""
    for module in unwrap_model(model).modules():
        if isinstance(module, (QATWrapper, InputQuantizer)):
            module.enabled.fill_(bool(enabled))


def set_compact_save(model: nn.Module, compact: bool) -> None:
    """Keep integer codes and bit masks for backward (the default), or torch's own float
    tensors (for debugging: the gradients are bitwise the same either way)."""
    for module in unwrap_model(model).modules():
        if isinstance(module, (QATWrapper, InputQuantizer)):
            module.compact_save = bool(compact)


class QATQuantizer:
    """Base of Distiller's QAT quantizers: plan the wrappers from settings, wrap, describe.

    Subclasses give `weight_quant` (the parameters' fake quantization) and `output_quant`
    (activations); `bits_bias` > 16 (Distiller's default 32) keeps the bias in float.
    """

    class_name: ClassVar[str] = ""
    # the YAML keys this class reads besides its settings, and the settings keys it accepts
    extra_keys: ClassVar[tuple[str, ...]] = ()
    # extra arguments a saved recipe lacking them meant (older checkpoints)
    recipe_defaults: ClassVar[dict[str, Any]] = {}
    settings_keys: ClassVar[tuple[str, ...]] = ("bits_activations", "bits_weights",
                                                "bits_parameters", "bits_bias", "overrides")
    override_keys: ClassVar[tuple[str, ...]] = ("bits_activations", "bits_weights",
                                                "bits_parameters", "bits_bias")

    def __init__(self, settings: QuantSettings) -> None:
        self.settings = settings
        # what backward keeps: codes and bit masks, or (False, for debugging) float tensors;
        # no part of the recipe, as it changes no number
        self.compact_save = True

    # --- what subclasses define
    def extra_args(self) -> dict[str, Any]:
        """The class's own arguments as plain data (for the recipe)."""
        return {}

    def weight_quant(self, num_bits: int, layer: LayerSettings) -> nn.Module:
        """The fake quantization of a weight (and a bias) at `num_bits`."""
        raise NotImplementedError

    def output_quant(self, module: nn.Module, layer: LayerSettings) -> nn.Module | None:
        """The fake quantization of the module's output, None to leave it in float."""
        raise NotImplementedError

    def input_quant(self) -> FakeLinearQuantization | None:
        """The fake quantization of the model's input, None to leave it in float."""
        return None

    def tracker_decay(self) -> float:
        """The EMA decay of the statistics-only ranges."""
        return DEFAULT_EMA_DECAY

    def param_groups(self, model: nn.Module) -> list[dict[str, Any]]:
        """The optimizer groups of the parameters the quantizer added."""
        return []

    # --- the life cycle
    def recipe(self) -> dict[str, Any]:
        """Plain data that `qat_from_recipe` rebuilds this quantizer from."""
        return {"class": self.class_name, "settings": self.settings.to_recipe(),
                "args": self.extra_args()}

    def set_enabled(self, model: nn.Module, enabled: bool) -> None:
        """Turn fake quantization on (from the policy's starting epoch) or off (float)."""
        set_qat_enabled(model, enabled)

    def plan(self, model: nn.Module) -> dict[str, QATWrapper]:
        """The wrappers this quantizer puts on a float model, by module name."""
        planned = {}
        for name, layer in resolve_layers(model, self.settings).items():
            module = model.get_submodule(name)
            weight_quant = bias_quant = None
            if isinstance(module, PARAM_LAYERS):
                if layer.bits_weights is not None:
                    weight_quant = self.weight_quant(layer.bits_weights, layer)
                if (layer.bits_bias is not None and layer.bits_bias <= MAX_BITS
                        and isinstance(getattr(module, "bias", None), Tensor)):
                    bias_quant = self.weight_quant(layer.bits_bias, layer)
            output_quant = (self.output_quant(module, layer)
                            if layer.bits_activations is not None else None)
            if weight_quant is None and bias_quant is None and output_quant is None:
                continue
            inputs = _ELTWISE_INPUTS if isinstance(module, ELTWISE_LAYERS) else 1
            planned[name] = QATWrapper(module, weight_quant, bias_quant, output_quant, inputs,
                                       self.tracker_decay())
        return planned

    def prepare(self, model: nn.Module) -> list[dict[str, Any]]:
        """Wrap the modules in place; the optimizer groups of the new parameters.

        On a model already prepared with the same recipe nothing is wrapped again.
        """
        target = unwrap_model(model)
        existing = _wrappers(target)
        if existing or isinstance(getattr(target, INPUTS_QUANT_NAME, None), InputQuantizer):
            self._check_prepared(target, existing)
        else:
            if hasattr(target, INPUTS_QUANT_NAME):
                raise QuantizationError(f"the model already has an attribute "
                                        f"'{INPUTS_QUANT_NAME}'; rename it before QAT")
            for name, wrapper in self.plan(target).items():
                _set_child(target, name, wrapper)
                if isinstance(wrapper, FusedQATWrapper):
                    wrapper.install(target)
            quant = self.input_quant()
            if quant is not None:
                setattr(target, INPUTS_QUANT_NAME, InputQuantizer(quant))
                target.register_forward_pre_hook(getattr(target, INPUTS_QUANT_NAME).pre_hook)
        set_compact_save(target, self.compact_save)
        return self.param_groups(target)

    def _check_prepared(self, model: nn.Module, existing: Mapping[str, QATWrapper]) -> None:
        """Refuse a model prepared with another recipe; re-attach a lost input hook."""
        # plan on the unwrapped structure: a copy of the modules that shares their tensors
        # (planning reads names, types and shapes, never values; a full copy of a large model
        # was most of the check's time and memory)
        shared = {id(tensor): tensor for tensor in itertools.chain(model.parameters(),
                                                                   model.buffers())}
        plain = copy.deepcopy(model, memo=shared)
        unprepare(plain)
        planned = self.plan(plain)
        wanted = {name: w.signature() for name, w in planned.items()}
        have = {name: w.signature() for name, w in existing.items()}
        has_input = isinstance(getattr(model, INPUTS_QUANT_NAME, None), InputQuantizer)
        wants_input = self.input_quant() is not None
        if wanted != have or has_input != wants_input:
            differ = sorted(set(wanted.items()) ^ set(have.items()))
            where = differ[0][0] if differ else INPUTS_QUANT_NAME
            raise QuantizationError(
                f"the model is already prepared for QAT differently from this {self.class_name} "
                f"(first difference at '{where}'); build the model again from float weights or "
                "use the recipe it was prepared with")
        if has_input and not _input_hooks(model):
            model.register_forward_pre_hook(getattr(model, INPUTS_QUANT_NAME).pre_hook)


class QuantAwareTrainRangeLinearQuantizer(QATQuantizer):
    """Distiller's range-linear QAT: weights from their own range, activations from EMA ranges.

    Outputs of ReLU-family, element-wise and parameter layers with bits_activations are
    fake-quantized (what the post-training quantizer quantizes); the model input too when
    quantize_inputs (at num_bits_inputs, default bits_activations). With fold_batchnorm (the
    default) a conv / linear -> batch norm -> ReLU chain trains as the int8 model computes it:
    the folded weight is fake-quantized and only the chain's output (qat_fold.py); false keeps
    Distiller's form (the layer's output quantized before its batch norm); with fuse_add_relu
    (the default, with fold_batchnorm) a residual add -> ReLU quantizes once, after the ReLU,
    as int8's add_relu. reduce_range trains 7-bit activations, for int8 kernels that saturate
    8 bits (CPUs without VNNI).
    """

    class_name = "QuantAwareTrainRangeLinearQuantizer"
    extra_keys = ("ema_decay", "num_bits_inputs", "fold_batchnorm", "fuse_add_relu")
    # what a recipe saved before fold_batchnorm (fuse_add_relu) existed meant
    recipe_defaults: ClassVar[dict[str, Any]] = {"fold_batchnorm": False, "fuse_add_relu": False}
    settings_keys = (*QATQuantizer.settings_keys, "mode", "per_channel_wts", "quantize_inputs",
                     "reduce_range")
    override_keys = (*QATQuantizer.override_keys, "mode", "per_channel_wts")

    def __init__(self, settings: QuantSettings, ema_decay: float = DEFAULT_EMA_DECAY,
                 num_bits_inputs: int | None = None, fold_batchnorm: bool = True,
                 fuse_add_relu: bool = True) -> None:
        super().__init__(settings)
        for key, value in (("fold_batchnorm", fold_batchnorm), ("fuse_add_relu", fuse_add_relu)):
            if not isinstance(value, bool):
                raise QuantizationError(f"{key} must be true or false, got {shown(value)}; "
                                        f"write {key}: true")
        self.fold_batchnorm = fold_batchnorm
        self.fuse_add_relu = fuse_add_relu
        if (isinstance(ema_decay, bool) or not isinstance(ema_decay, numbers.Real)
                or not 0 < ema_decay < 1):
            raise QuantizationError(f"ema_decay must be a number in (0, 1), got "
                                    f"{shown(ema_decay)}; use e.g. 0.999")
        self.ema_decay = float(ema_decay)
        self.num_bits_inputs = (None if num_bits_inputs is None
                                else check_bits(num_bits_inputs, "num_bits_inputs"))

    def extra_args(self) -> dict[str, Any]:
        """ema_decay, num_bits_inputs, fold_batchnorm and fuse_add_relu."""
        return {"ema_decay": self.ema_decay, "num_bits_inputs": self.num_bits_inputs,
                "fold_batchnorm": self.fold_batchnorm, "fuse_add_relu": self.fuse_add_relu}

    def plan(self, model: nn.Module) -> dict[str, QATWrapper]:
        """The base plan, with each wrapped layer's batch norm folded and ReLU fused."""
        planned = super().plan(model)
        if not self.fold_batchnorm:
            return planned
        modules = dict(model.named_modules())
        graph, fusions = _traced(model)
        if graph is not None:  # as int8: only what the graph calls (a Linear whose weight a
            # parent reads itself, and aux heads evaluation never runs, stay float)
            called = {str(node.target) for node in graph.nodes if node.op == "call_module"}
            planned = {name: w for name, w in planned.items() if name in called}
        fusions = [f for f in fusions if type(planned.get(f.layer)) is QATWrapper
                   and (self.fuse_add_relu or isinstance(modules.get(f.layer), PARAM_LAYERS))]
        for fusion in fusions:
            base = planned[fusion.layer]
            if fusion.activation is not None:
                planned.pop(fusion.activation, None)  # quantized by the layer, after it
            norm = (FoldedBatchNorm(modules[fusion.batchnorm])
                    if fusion.batchnorm is not None else None)
            activation = modules[fusion.activation] if fusion.activation is not None else None
            planned[fusion.layer] = FusedQATWrapper(base, fusion, norm, activation)
        if graph is not None:
            _set_input_grids(model, graph, planned, resolve_layers(model, self.settings), fusions)
        return planned

    def weight_quant(self, num_bits: int, layer: LayerSettings) -> nn.Module:
        """Range-linear from the tensor's own range."""
        return LinearWeightQuant(num_bits, layer.mode.weights, layer.per_channel_wts)

    def output_quant(self, module: nn.Module, layer: LayerSettings) -> nn.Module | None:
        """EMA-tracked range-linear fake quantization."""
        return FakeLinearQuantization(layer.bits_activations or 8, layer.mode.activations,
                                      self.ema_decay)

    def input_quant(self) -> FakeLinearQuantization | None:
        """The model input at num_bits_inputs (default bits_activations)."""
        if self.fold_batchnorm:  # each layer quantizes its own inputs, as the int8 model does
            return None
        bits = self.num_bits_inputs or self.settings.bits_activations
        if self.settings.reduce_range:
            bits = reduced_bits(bits)
        if not self.settings.quantize_inputs or bits is None:
            return None
        return FakeLinearQuantization(bits, self.settings.mode.activations, self.ema_decay)

    def tracker_decay(self) -> float:
        """The quantizer's own decay."""
        return self.ema_decay


def _record(low: float, high: float) -> dict[str, float]:
    """A statistics record from a range alone: mean, std and b of a uniform distribution."""
    width = high - low
    return {"min": low, "max": high, "avg_min": low, "avg_max": high, "mean": (low + high) / 2,
            "std": width / math.sqrt(12), "b": width / 4}


def _tracked(tracker: RangeTracker) -> dict[str, float] | None:
    """The record of a tracker that has seen data."""
    if int(tracker.iter_count) == 0:
        return None
    low, high = tracker.range()
    return _record(float(low), float(high))


def _layer_stats(wrapper: QATWrapper) -> dict[str, Any] | None:
    """Distiller-format statistics of one wrapped module from its tracked ranges."""
    inputs = {i: r for i, r in enumerate(_tracked(t) for t in wrapper.input_ranges)
              if r is not None}
    quant = wrapper.output_quant
    if quant is None:
        output = _tracked(wrapper.output_range) if wrapper.output_range is not None else None
    elif isinstance(quant, FakeLinearQuantization):
        output = _tracked(quant.tracker)
    else:
        output = _record(*quant.output_range())
    if output is None:
        return None
    return {"inputs": inputs, "output": output}


@torch.no_grad()
def qat_to_float(model: nn.Module) -> tuple[nn.Module, dict[str, Any]]:
    """A float copy of a QAT model with its effective weights, and statistics of its ranges.

    The copy is the plain model (original module names and classes) whose weights and biases
    are the fake-quantized ones the QAT model computes with; the statistics (Distiller's
    format, keyed by the original names) hold the tracked ranges as min / max / avg_min /
    avg_max, and mean, std and b of a uniform distribution over them (a best effort).
    """
    source = unwrap_model(model)
    if not is_qat_prepared(source):
        raise QuantizationError("the model is not prepared for quantization-aware training; "
                                "give a model trained with a QAT quantizer")
    plain = copy.deepcopy(source)
    stats: dict[str, Any] = {}
    for name, wrapper in _wrappers(plain).items():
        for param_name, value in wrapper.effective_params().items():
            getattr(wrapper.wrapped, param_name).copy_(value)
        layer = _layer_stats(wrapper)
        if layer is None:
            continue
        stats[name] = layer
        if isinstance(wrapper, FusedQATWrapper):  # the chain's output, at its last module too
            end = wrapper.fusion.activation or wrapper.fusion.batchnorm or name
            stats[end] = {"inputs": {}, "output": layer["output"]}
    return unprepare(plain), stats
