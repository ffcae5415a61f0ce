"""Post-training range-linear quantization simulated in float (Distiller's post-train quantizer).

`quantize` folds batch norms, fuses ReLUs into the layer before them (fusion.py), then replaces
each quantizable module by a wrapper (wrappers.py) whose quantization parameters come from
activation statistics (Distiller's stats files, keyed by the unfused model's module names) or,
in dynamic mode, from each batch. An input produced by a quantized layer (directly or through
pooling / flattening) is quantized with that layer's output parameters, as Distiller propagates
them; other inputs use their own statistics. Everything needed to redo it on a freshly built
model is plain data: `recipe()` / `quantize_from_recipe`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx
from torch import Tensor, nn

from compressor.models.layers.eltwise import Concat
from compressor.quantization.core.clipping import ClipMode, shared_histogram_range, stats_range
from compressor.quantization.core.errors import MissingStatisticsError, QuantizationError, shown
from compressor.quantization.core.range_linear import quant_params
from compressor.quantization.core.settings import (
    ACTIVATION_LAYERS,
    ELTWISE_LAYERS,
    PARAM_LAYERS,
    LayerSettings,
    QuantSettings,
    quantizable_modules,
    resolve_layers,
)
from compressor.quantization.simulated.fusion import (
    Fusion,
    apply_fusions,
    find_fusions,
    fusions_from_recipe,
    fusions_to_recipe,
    input_sources,
    trace_model,
)
from compressor.quantization.simulated.graph import GRAPH_VERSION, explicit_graph
from compressor.quantization.simulated.wrappers import (
    ActivationWrapper,
    EltwiseWrapper,
    ParamLayerWrapper,
    QuantWrapper,
    TensorQuant,
    WeightQuant,
)
from compressor.quantization.statistics.stats_file import ActivationStats, parse_stats

__all__ = ["PostTrainLinearQuantizer", "quantize_from_recipe", "is_quantized",
           "quantization_summary", "calibration_batches", "RECIPE_VERSION"]

RECIPE_VERSION = 1
_STATS_FIX = "collect them with --qe-calibration 0.05 or pass a stats file made for this model"
Sources = Mapping[str, Sequence[str | None]]


def _output_spec(layer: LayerSettings, half_range: bool = False) -> TensorQuant | None:
    """The layer's activation quantization (None: float)."""
    if layer.bits_activations is None:
        return None
    return TensorQuant(layer.bits_activations, layer.mode.activations, layer.clip_acts,
                       layer.clip_n_stds, layer.clip_half_range or half_range)


class _Planner:
    """Works out each wrapper's specs and parameters from settings, stats and the data flow."""

    def __init__(self, layers: Mapping[str, LayerSettings], stats: ActivationStats | None,
                 fusions: Sequence[Fusion], sources: Sources | None, auto_fallback: bool,
                 concats: Sequence[str] = ()) -> None:
        """`concats`: the concatenations whose inputs and output share one grid."""
        self.layers, self.stats, self.sources = layers, stats, sources
        self.auto_fallback = auto_fallback
        self.fused = {f.layer: f for f in fusions}
        self.outputs = {name: _output_spec(s, name in self.fused
                                           and self.fused[name].activation is not None)
                        for name, s in layers.items()}
        self._output_qparams: dict[str, tuple[Tensor, Tensor]] = {}
        self.groups = self._shared_groups(concats) if stats is not None else {}

    def _shared_groups(self, concats: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """Each layer's group of layers whose outputs share one grid: a concatenation with the
        quantized layers producing its inputs, joined transitively (a DenseNet block is one
        group), as torch.ao shares one observer across cat's inputs and output. Then every
        input of a concatenation is already on its output's grid: one rounding in the
        simulation, no requantization in int8 (a plain copy). A concatenation sharing nothing
        (an input in float or overridden, other widths or modes) keeps its own grid."""
        parent: dict[str, str] = {}

        def root(name: str) -> str:
            while parent.setdefault(name, name) != name:
                name = parent[name]
            return name

        for cat in concats:
            layer, spec = self.layers.get(cat), self.outputs.get(cat)
            sources = (self.sources or {}).get(cat)
            if layer is None or spec is None or not sources or layer.input_overrides:
                continue
            specs = [self.outputs.get(s) if s is not None else None for s in sources]
            if not layer.quantize_inputs or any(
                    other is None or (other.bits, other.mode) != (spec.bits, spec.mode)
                    for other in specs):
                continue
            for source in sources:
                parent[root(str(source))] = root(cat)
        groups: dict[str, list[str]] = {}
        for name in parent:
            groups.setdefault(root(name), []).append(name)
        return {name: tuple(members) for members in groups.values() if len(members) > 1
                for name in members}

    def record(self, layer: str, key: str, part: str, index: int | None = None) -> Mapping:
        """A stats record, or the error naming what is missing."""
        what = "output" if index is None else f"input {index}"
        if self.stats is None:
            raise MissingStatisticsError(f"activation statistics lack layer '{key}' ({what}); "
                                         f"{_STATS_FIX}")
        entry = self.stats.get(key)
        record = None if entry is None else (
            entry.get("output") if index is None else entry.get("inputs", {}).get(index))
        if record is None:
            raise MissingStatisticsError(f"activation statistics lack layer '{key}' ({what}); "
                                         f"{_STATS_FIX}")
        return record

    @staticmethod
    def _range(spec: TensorQuant, record: Mapping) -> tuple[float, float]:
        """The (min, max) a tensor is quantized to, from its statistics."""
        return stats_range(record, spec.clip, spec.mode, spec.bits, spec.clip_n_stds,
                           spec.half_range)

    def _qparams(self, spec: TensorQuant, record: Mapping) -> tuple[Tensor, Tensor]:
        """(scale, zero_point) of a tensor from its statistics."""
        return quant_params(*self._range(spec, record), spec.bits, spec.mode)

    def _output_record(self, name: str) -> Mapping:
        """The stats record of a layer's output: its fused chain's last."""
        fusion = self.fused.get(name)
        key = name if fusion is None else (fusion.activation or fusion.batchnorm or name)
        return self.record(name, key, "output")

    def _output_range(self, name: str) -> tuple[float, float]:
        """The (min, max) a layer's output is quantized to."""
        spec = self.outputs[name]
        assert spec is not None
        return self._range(spec, self._output_record(name))

    def output_qparams(self, name: str) -> tuple[Tensor, Tensor]:
        """The output parameters of a quantized layer: its own range's, or its shared group's:
        MSE on the group's histograms merged where every member clips by MSE (as one observer
        over them all), else the union of the members' ranges."""
        if name not in self._output_qparams:
            spec = self.outputs[name]
            assert spec is not None
            members = self.groups.get(name, (name,))
            member_specs = [self.outputs[m] for m in members]
            if len(members) > 1 and all(s is not None and s.clip is ClipMode.MSE
                                        for s in member_specs):
                low, high = shared_histogram_range(
                    [self._output_record(m) for m in members], spec.bits, spec.mode)
            else:
                ranges = [self._output_range(member) for member in members]
                low, high = min(r[0] for r in ranges), max(r[1] for r in ranges)
            self._output_qparams[name] = quant_params(low, high, spec.bits, spec.mode)
        return self._output_qparams[name]

    def num_inputs(self, name: str, module: nn.Module) -> int:
        """How many positional inputs the layer gets."""
        if isinstance(module, (*PARAM_LAYERS, *ACTIVATION_LAYERS)):
            return 1
        if self.sources is not None and name in self.sources:
            return len(self.sources[name])
        if self.stats is not None and self.stats.get(name, {}).get("inputs"):
            return max(self.stats[name]["inputs"]) + 1
        if self.stats is None:
            return 2
        raise MissingStatisticsError(f"activation statistics lack layer '{name}' (inputs); "
                                     f"{_STATS_FIX}")

    def input_plan(self, name: str, index: int, dynamic: bool
                   ) -> tuple[TensorQuant | None, tuple[Tensor, Tensor] | None]:
        """The spec and (static) parameters of one input of a param or eltwise layer."""
        layer = self.layers[name]
        if layer.bits_activations is None or not layer.quantize_inputs:
            return None, None
        override = layer.input_overrides.get(index)
        source = None
        if self.sources is not None and name in self.sources:
            source = self.sources[name][index]
        own = TensorQuant(layer.bits_activations, layer.mode.activations, layer.clip_acts,
                          layer.clip_n_stds)
        if override is not None and not override.get("from_output", False):
            bits = override.get("bits_activations", layer.bits_activations)
            if bits is None:
                return None, None
            clip = override.get("clip_acts", layer.clip_acts)
            own = TensorQuant(bits, override.get("mode", layer.mode.activations), clip,
                              override.get("clip_n_stds", layer.clip_n_stds))
        elif override is None and source is not None and self.outputs.get(source) is not None:
            spec = self.outputs[source]
            return spec, None if dynamic else self.output_qparams(source)
        elif override is None and not self.auto_fallback:
            raise QuantizationError(
                f"layer '{name}' input {index} does not come from a quantized layer and "
                "inputs_quant_auto_fallback is false; give it input_overrides (e.g. "
                "{from_output: true}) or set inputs_quant_auto_fallback: true")
        if dynamic:
            return own, None
        return own, self._qparams(own, self.record(name, name, "inputs", index))


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    """Replace the submodule called `name`."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def _weight_spec(layer: LayerSettings) -> WeightQuant | None:
    """The layer's weight quantization (None: float)."""
    if layer.bits_weights is None:
        return None
    return WeightQuant(layer.bits_weights, layer.mode.weights, layer.per_channel_wts)


def _apply(model: nn.Module, settings: QuantSettings, stats: ActivationStats | None,
           dynamic: bool, fusions: Sequence[Fusion], sources: Sources | None,
           share_concat: bool = False) -> nn.Module:
    """Fold, fuse and wrap `model` in place, by a plan that is plain data."""
    if stats is None and not dynamic:
        raise QuantizationError("post-training quantization needs activation statistics; "
                                f"{_STATS_FIX}, or use dynamic ranges (--qe-dynamic)")
    model.eval()
    layers = resolve_layers(model, settings)  # before fusion: overrides see the original modules
    fused_away = {n for f in fusions for n in (f.batchnorm, f.activation) if n}
    modules = quantizable_modules(model)
    concats = [n for n, m in modules.items() if isinstance(m, Concat)] if share_concat else []
    planner = _Planner(layers, None if dynamic else stats, fusions, sources,
                       settings.inputs_quant_auto_fallback, concats)
    apply_fusions(model, fusions)
    fused = {f.layer: f for f in fusions}
    for name, original in modules.items():
        if name in fused_away:
            continue
        module = model.get_submodule(name)  # the folded layer where a BN was folded
        layer = layers[name]
        weight = _weight_spec(layer) if isinstance(module, PARAM_LAYERS) else None
        output = planner.outputs[name]
        if output is None and weight is None:
            continue  # stays float
        plans = [(None, None)] if isinstance(module, ACTIVATION_LAYERS) else [
            planner.input_plan(name, i, dynamic) for i in range(planner.num_inputs(name, original))]
        qparams = None
        if not dynamic:
            qparams = {f"input{i}": p for i, (_, p) in enumerate(plans) if p is not None}
            if output is not None:
                qparams["output"] = planner.output_qparams(name)
        specs = [spec for spec, _ in plans]
        fusion = fused.get(name)
        activation = None
        if fusion is not None and fusion.activation is not None:
            activation = _fused_activation(modules[fusion.activation])
        if isinstance(module, PARAM_LAYERS):
            wrapper: QuantWrapper = ParamLayerWrapper(module, specs, output, qparams, weight,
                                                      layer.bits_bias, activation,
                                                      layer.bits_accum)
        elif isinstance(module, ELTWISE_LAYERS):
            wrapper = EltwiseWrapper(module, specs, output, qparams, activation)
        else:
            wrapper = ActivationWrapper(module, specs, output, qparams)
        _set_module(model, name, wrapper)
    return model.eval()


def _fused_activation(module: nn.Module) -> nn.Module:
    """A fresh, not-in-place copy of a fused activation (it runs inside the wrapper)."""
    if isinstance(module, nn.ReLU6):
        return nn.ReLU6()
    return nn.ReLU()


class PostTrainLinearQuantizer:
    """Distiller's post-training quantizer: fold, fuse and wrap a model for simulation."""

    def __init__(self, settings: QuantSettings, stats: ActivationStats | None,
                 dynamic: bool = False, share_concat: bool = True) -> None:
        """`stats` as from load_stats / collect_stats (unfused module names); None if dynamic.
        `share_concat`: a concatenation's inputs and output share one grid (false: the output
        has its own and the inputs are requantized onto it, as quantization-aware training
        tracks them)."""
        if stats is None and not dynamic:
            raise QuantizationError("post-training quantization needs activation statistics; "
                                    f"{_STATS_FIX}, or use dynamic ranges (--qe-dynamic)")
        self.settings = settings
        self.stats = None if stats is None else parse_stats(stats)
        self.dynamic = dynamic
        self.share_concat = share_concat
        self.fusions: list[Fusion] = []
        self.sources: dict[str, list[str | None]] | None = None
        self.graph: int | None = None  # GRAPH_VERSION when the model was explicit_graph's
        self.histograms = False  # whether a layer clips by histogram (MSE): the recipe keeps them

    def quantize(self, model: nn.Module) -> nn.Module:
        """Fold, fuse and wrap `model` in place; returns it in eval mode."""
        if is_quantized(model):
            raise QuantizationError("the model is already quantized; build a float model to "
                                    "quantize it again")
        model.eval()
        self.graph = GRAPH_VERSION if isinstance(model, torch.fx.GraphModule) else None
        resolve_layers(model, self.settings)  # settings errors before any change
        graph = trace_model(model)
        self.fusions = find_fusions(model, graph) if graph is not None else []
        if graph is not None:
            self.sources = input_sources(model, graph, quantizable_modules(model), self.fusions)
        layers = resolve_layers(model, self.settings)
        self.histograms = self.settings.clips_by_histogram()
        self.fusions = [f if f.activation is None or _can_fuse(layers, f) else
                        Fusion(f.layer, f.batchnorm, None) for f in self.fusions]
        self.fusions = [f for f in self.fusions if f.batchnorm or f.activation]
        if graph is not None:
            self.sources = input_sources(model, graph, quantizable_modules(model), self.fusions)
        return _apply(model, self.settings, self.stats, self.dynamic, self.fusions, self.sources,
                      self.share_concat)

    def recipe(self) -> dict[str, Any]:
        """Everything `quantize_from_recipe` needs, as plain data."""
        return {
            "version": RECIPE_VERSION,
            "settings": self.settings.to_recipe(),
            "stats": None if self.stats is None else _plain_stats(self.stats, self.histograms),
            "dynamic": self.dynamic,
            "fusions": fusions_to_recipe(self.fusions),
            "sources": None if self.sources is None else {k: list(v)
                                                          for k, v in self.sources.items()},
            "graph": self.graph,
            "share_concat": self.share_concat,
        }


def _can_fuse(layers: Mapping[str, LayerSettings], fusion: Fusion) -> bool:
    """Fuse a ReLU only into a layer with quantized outputs of the ReLU's own width."""
    layer, activation = layers.get(fusion.layer), layers.get(str(fusion.activation))
    return (layer is not None and activation is not None
            and layer.bits_activations is not None
            and layer.bits_activations == activation.bits_activations
            and layer.mode.activations == activation.mode.activations)


def _plain_stats(stats: ActivationStats, histograms: bool) -> dict[str, Any]:
    """Stats with string input indices (JSON/YAML friendly); histograms only where asked (a
    checkpoint of a model that clips by no histogram does not carry them)."""
    def plain(record: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in record.items() if histograms or k != "histogram"}

    return {name: {"inputs": {str(i): plain(r) for i, r in entry.get("inputs", {}).items()},
                   "output": plain(entry["output"])} for name, entry in stats.items()}


def quantize_from_recipe(model: nn.Module, recipe: Mapping[str, Any]) -> nn.Module:
    """The same quantized structure on a freshly built float model (to load a state_dict into)."""
    if not isinstance(recipe, Mapping) or recipe.get("version") != RECIPE_VERSION:
        raise QuantizationError(f"unsupported quantization recipe (version "
                                f"{shown(getattr(recipe, 'get', lambda k: None)('version'))}); "
                                f"quantize the model again with this version")
    settings = QuantSettings.from_recipe(recipe.get("settings", {}))
    stats = recipe.get("stats")
    stats = None if stats is None else parse_stats(stats, "the recipe's statistics")
    sources = recipe.get("sources")
    if sources is not None and not isinstance(sources, Mapping):
        raise QuantizationError(f"the recipe's sources are malformed ({shown(sources)}); "
                                "quantize the model again")
    graph = recipe.get("graph")
    if graph not in (None, GRAPH_VERSION):
        raise QuantizationError(f"the recipe was made on graph version {shown(graph)}, which "
                                "this compressor does not know; upgrade compressor")
    if graph is not None:
        model = explicit_graph(model)
    # a recipe saved before grids were shared gave each concatenation its own
    return _apply(model, settings, stats, bool(recipe.get("dynamic", False)),
                  fusions_from_recipe(recipe.get("fusions", [])), sources,
                  bool(recipe.get("share_concat", False)))


def is_quantized(model: nn.Module) -> bool:
    """Whether the model holds simulated-quantization wrappers."""
    return any(isinstance(m, QuantWrapper) for m in model.modules())


def quantization_summary(model: nn.Module) -> list[dict[str, Any]]:
    """One row per wrapped layer: name, kind, widths, mode, clipping, per-channel."""
    rows = []
    for name, module in model.named_modules():
        if not isinstance(module, QuantWrapper):
            continue
        output = module.output
        weight = getattr(module, "weight_quant", None)
        rows.append({
            "name": name, "kind": module.kind, "module": type(module.wrapped).__name__,
            "bits_activations": None if output is None else output.bits,
            "bits_weights": None if weight is None else weight.bits,
            "mode": {"activations": None if output is None else output.mode.name,
                     "weights": None if weight is None else weight.mode.name},
            "clip": None if output is None else output.clip.name,
            "per_channel": bool(weight is not None and weight.per_channel),
            "dynamic": module.dynamic,
            "fused": _fused_name(module),
        })
    return rows


def _fused_name(wrapper: QuantWrapper) -> str | None:
    """The class name of the activation fused into a param layer or an add, if any."""
    activation = getattr(wrapper, "activation", None)
    return None if activation is None else type(activation).__name__


def calibration_batches(dataset: Any, fraction: float, batch_size: int, seed: int
                        ) -> list[tuple[Tensor, Tensor]]:
    """A seeded random `fraction` of `dataset` (at least one sample) as a list of batches."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not (
            0 < fraction <= 1):
        raise QuantizationError(f"the calibration fraction must be in (0, 1], got "
                                f"{shown(fraction)}; use e.g. --qe-calibration 0.05")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise QuantizationError(f"the calibration batch size must be a positive integer, got "
                                f"{shown(batch_size)}; use e.g. -b 256")
    size = len(dataset)
    if size == 0:
        raise QuantizationError("the calibration dataset is empty; give a dataset with samples")
    count = max(1, math.floor(size * fraction))
    generator = torch.Generator().manual_seed(seed)
    indices = torch.randperm(size, generator=generator)[:count].tolist()
    batches = []
    for start in range(0, count, batch_size):
        samples = [dataset[i] for i in indices[start:start + batch_size]]
        inputs = torch.stack([torch.as_tensor(s[0]) for s in samples])
        targets = torch.as_tensor([int(s[1]) for s in samples])
        batches.append((inputs, targets))
    return batches
