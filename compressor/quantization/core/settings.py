"""Distiller's quantizer settings (the YAML arguments of a quantizer) and their per-layer values.

`settings_from_args` reads a quantizer entry of a schedule (minus `class` and
`model_activation_stats`) into a `QuantSettings`; `resolve_layers` gives each quantizable module
its `LayerSettings`: the top-level values replaced by those of the first override whose regex
matches the module's full name (Distiller: re.fullmatch, first match wins). Bit widths of 0 or
null mean "keep float".
"""

from __future__ import annotations

import difflib
import numbers
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

import torch.fx
from torch import nn

from compressor.models.layers.eltwise import Concat, EltwiseAdd, EltwiseMult
from compressor.models.names import canonical_name
from compressor.quantization.core.clipping import ClipMode, check_clip_n_stds, parse_clip_mode
from compressor.quantization.core.errors import QuantizationError, shown
from compressor.quantization.core.range_linear import (
    LinearQuantMode,
    ModuleQuantMode,
    check_accum_bits,
    check_bits,
    parse_module_quant_mode,
    parse_quant_mode,
)

__all__ = [
    "LayerSettings", "QuantSettings", "settings_from_args", "with_layer_overrides",
    "resolve_layers", "quantizable_modules", "reduced_bits", "PARAM_LAYERS", "ELTWISE_LAYERS",
    "ACTIVATION_LAYERS", "REDUCED_BITS",
]

PARAM_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)
ELTWISE_LAYERS = (EltwiseAdd, EltwiseMult, Concat)
ACTIVATION_LAYERS = (nn.ReLU, nn.ReLU6, nn.LeakyReLU)

_SYMMETRIC = ModuleQuantMode(LinearQuantMode.SYMMETRIC, LinearQuantMode.SYMMETRIC)
_LAYER_KEYS = ("bits_activations", "bits_weights", "bits_bias", "bits_accum", "mode",
               "clip_acts", "clip_n_stds", "clip_half_range", "per_channel_wts",
               "quantize_inputs")
_TOP_KEYS = (*_LAYER_KEYS, "inputs_quant_auto_fallback", "reduce_range", "overrides")
_OVERRIDE_KEYS = (*_LAYER_KEYS, "input_overrides")
_INPUT_KEYS = ("from_output", "bits_activations", "mode", "clip_acts", "clip_n_stds")
_ALIASES = MappingProxyType({"bits_parameters": "bits_weights"})
_BOOL_KEYS = ("clip_half_range", "per_channel_wts", "quantize_inputs",
              "inputs_quant_auto_fallback", "reduce_range", "from_output")
_PREFIXES = ("module.", "module\\.")
REDUCED_BITS = 7  # reduce_range's activation width


@dataclass(frozen=True)
class LayerSettings:
    """The resolved quantization settings of one module."""

    bits_activations: int | None  # None = keep float (Distiller's null / 0)
    bits_weights: int | None
    bits_bias: int | None
    bits_accum: int
    mode: ModuleQuantMode  # (activations, weights)
    clip_acts: ClipMode
    clip_n_stds: float | None
    clip_half_range: bool
    per_channel_wts: bool
    quantize_inputs: bool
    input_overrides: Mapping[int, Mapping[str, Any]]  # Distiller's per-input overrides


@dataclass(frozen=True)
class QuantSettings:
    """What the user asked for, as plain data (Distiller's quantizer arguments)."""

    bits_activations: int | None = 8
    bits_weights: int | None = 8
    bits_bias: int | None = 32
    bits_accum: int = 32
    mode: ModuleQuantMode = _SYMMETRIC
    clip_acts: ClipMode = ClipMode.NONE
    clip_n_stds: float | None = None
    clip_half_range: bool = False
    per_channel_wts: bool = False
    quantize_inputs: bool = True
    inputs_quant_auto_fallback: bool = True
    # 8-bit activations on a 7-bit grid, as x86 int8 kernels without VNNI need (torch.ao's
    # reduce_range): set when converting to such kernels, so the simulation computes with them
    reduce_range: bool = False
    overrides: tuple[tuple[str, Mapping[str, Any]], ...] = ()  # ordered regex -> settings

    def clips_by_histogram(self) -> bool:
        """Whether any layer or input may clip by histogram (MSE): statistics need histograms."""
        def mse(values: Mapping[str, Any]) -> bool:
            return parse_clip_mode(values.get("clip_acts", ClipMode.NONE)) is ClipMode.MSE

        return self.clip_acts is ClipMode.MSE or any(
            mse(values) or any(mse(inner) for inner in values.get("input_overrides", {}).values())
            for _, values in self.overrides)

    def to_recipe(self) -> dict[str, Any]:
        """The settings as plain YAML/JSON data that `from_recipe` reads back."""
        data = {f.name: _plain(getattr(self, f.name)) for f in fields(self)
                if f.name != "overrides"}
        data["overrides"] = [[pattern, _plain(values)] for pattern, values in self.overrides]
        return data

    @classmethod
    def from_recipe(cls, data: Mapping[str, Any]) -> QuantSettings:
        """The settings saved by `to_recipe`."""
        if not isinstance(data, Mapping):
            raise QuantizationError(f"quantization settings must be a mapping, got {shown(data)}; "
                                    "quantize the model again")
        args = dict(data)
        pairs = args.get("overrides") or []
        if not isinstance(pairs, (list, tuple)) or not all(
                isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
            raise QuantizationError(f"saved quantization overrides are malformed "
                                    f"({shown(pairs)}); quantize the model again")
        args["overrides"] = [tuple(p) for p in pairs]  # a list keeps repeated patterns
        return settings_from_args(args, "saved quantization settings")


def _plain(value: Any) -> Any:
    """Enums and mode tuples as names, mappings and sequences recursively, the rest as is."""
    if isinstance(value, ModuleQuantMode):
        return {"activations": value.activations.name, "weights": value.weights.name}
    if isinstance(value, (LinearQuantMode, ClipMode)):
        return value.name
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _fail_key(where: str, key: Any, allowed: Sequence[str]) -> QuantizationError:
    """The error of an unknown key, suggesting the closest allowed one."""
    close = difflib.get_close_matches(str(key), list(allowed), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return QuantizationError(f"{where}: unknown key {shown(key)}{hint}; use only "
                             f"{', '.join(allowed)}")


def _bits(value: Any, key: str, where: str, high: int = 16) -> int | None:
    """A bit width, None for Distiller's null / 0 (keep float)."""
    if value is None or (isinstance(value, numbers.Integral) and not isinstance(value, bool)
                         and int(value) == 0):
        return None
    try:
        return check_bits(value, key, 2, high)
    except QuantizationError as exc:
        raise QuantizationError(f"{where}: {exc} (0 or null keeps float)") from None


def _value(key: str, value: Any, where: str) -> Any:
    """One setting parsed from its YAML value."""
    try:
        if key in ("bits_activations", "bits_weights"):
            return _bits(value, key, where)
        if key == "bits_bias":
            return _bits(value, key, where, high=32)
        if key == "bits_accum":
            return check_accum_bits(value)
        if key == "mode":
            return parse_module_quant_mode(value)
        if key == "clip_acts":
            return parse_clip_mode(value)
        if key == "clip_n_stds":
            if value is None:
                return None
            return check_clip_n_stds(ClipMode.N_STD, value)
        if key in _BOOL_KEYS:
            if not isinstance(value, bool):
                raise QuantizationError(f"{key} must be true or false, got {shown(value)}; "
                                        "write true or false")
            return value
    except QuantizationError as exc:
        text = str(exc)
        raise QuantizationError(text if text.startswith(where) else f"{where}: {key}: {text}"
                                ) from None
    raise AssertionError(key)  # every caller checks the key first


def _canonical(raw: Mapping[Any, Any], allowed: Sequence[str], where: str) -> dict[str, Any]:
    """Keys checked, aliases resolved (bits_parameters -> bits_weights); values untouched."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = _ALIASES.get(key, key) if isinstance(key, str) else key
        if name not in allowed:
            raise _fail_key(where, key, [*allowed, *_ALIASES])
        if name in out:
            raise QuantizationError(f"{where}: both bits_weights and bits_parameters are given; "
                                    "keep one of them")
        out[name] = value
    return out


def _input_overrides(raw: Any, where: str) -> dict[int, dict[str, Any]]:
    """Distiller's {index: {from_output, bits_activations, mode, clip_acts, clip_n_stds}}."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise QuantizationError(f"{where}: input_overrides must map input indices to settings, "
                                f"got {shown(raw)}; write e.g. '0: {{from_output: true}}'")
    parsed: dict[int, dict[str, Any]] = {}
    for index, values in raw.items():
        if isinstance(index, str) and index.isdigit():
            index = int(index)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise QuantizationError(f"{where}: input_overrides index {shown(index)} is not a "
                                    "non-negative integer; use the input's position, e.g. 0")
        inner = f"{where}: input_overrides[{index}]"
        if not isinstance(values, Mapping):
            raise QuantizationError(f"{inner}: expected a mapping of settings, got "
                                    f"{shown(values)}; write e.g. 'clip_acts: AVG'")
        entry = _canonical(values, _INPUT_KEYS, inner)
        result = {}
        for key, value in entry.items():
            if key == "mode":
                result[key] = _value_mode_activations(value, inner)
            else:
                result[key] = _value(key, value, inner)
        parsed[index] = result
    return parsed


def _value_mode_activations(value: Any, where: str) -> LinearQuantMode:
    """An input's mode: one activation mode name."""
    try:
        return parse_quant_mode(value, "activations mode")
    except QuantizationError as exc:
        raise QuantizationError(f"{where}: mode: {exc}") from None


def _override_values(raw: Any, where: str) -> Mapping[str, Any]:
    """One override's parsed settings (an empty override is allowed, as in Distiller)."""
    if raw is None:
        return MappingProxyType({})
    if not isinstance(raw, Mapping):
        raise QuantizationError(f"{where}: expected a mapping of settings, got {shown(raw)}; "
                                "write e.g. 'bits_activations: 8'")
    entry = _canonical(raw, _OVERRIDE_KEYS, where)
    values: dict[str, Any] = {}
    for key, value in entry.items():
        if key == "input_overrides":
            values[key] = _input_overrides(value, where)
        else:
            values[key] = _value(key, value, where)
    return MappingProxyType(values)


def _overrides(raw: Any, where: str) -> tuple[tuple[str, Mapping[str, Any]], ...]:
    """The ordered (pattern, settings) pairs of Distiller's `overrides`."""
    if raw is None:
        return ()
    if isinstance(raw, list) and all(isinstance(p, tuple) for p in raw):
        items = raw  # (pattern, settings) pairs saved by to_recipe
    elif isinstance(raw, Mapping):
        items = list(raw.items())
    else:
        raise QuantizationError(f"{where}: overrides must map module-name regexes to settings, "
                                f"got {shown(raw)}; write e.g. 'fc: {{clip_acts: NONE}}'")
    result = []
    for pattern, values in items:
        if not isinstance(pattern, str) or not pattern:
            raise QuantizationError(f"{where}: override name {shown(pattern)} is not a module "
                                    "name or regex; write it as a string")
        for prefix in _PREFIXES:
            if pattern.startswith(prefix):
                pattern = pattern[len(prefix):]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise QuantizationError(f"{where}: override {shown(pattern)} is not a valid regex "
                                    f"({exc}); escape special characters or fix the pattern"
                                    ) from None
        result.append((pattern, _override_values(values, f"{where}: override '{pattern}'")))
    return tuple(result)


def settings_from_args(args: Mapping[str, Any], where: str,
                       extra_keys: Collection[str] = ()) -> QuantSettings:
    """Distiller's quantizer arguments (minus `class`, `model_activation_stats`) as settings."""
    if not isinstance(args, Mapping):
        raise QuantizationError(f"{where}: expected a mapping of quantizer arguments, got "
                                f"{shown(args)}; write them as 'key: value' lines")
    entry = _canonical({k: v for k, v in args.items() if k not in extra_keys},
                       _TOP_KEYS, where)
    values: dict[str, Any] = {}
    for key, value in entry.items():
        if key == "overrides":
            values[key] = _overrides(value, where)
        else:
            values[key] = _value(key, value, where)
    settings = QuantSettings(**values)
    try:
        check_clip_n_stds(settings.clip_acts, settings.clip_n_stds)
    except QuantizationError as exc:
        raise QuantizationError(f"{where}: {exc}") from None
    return settings


def with_layer_overrides(settings: QuantSettings, no_quant: Sequence[str] = (),
                         no_clip: Sequence[str] = ()) -> QuantSettings:
    """Distiller's --qenql / --qencl: exact-name overrides put before the user's ones."""
    added: list[tuple[str, Mapping[str, Any]]] = []
    keep_float = MappingProxyType(dict.fromkeys(("bits_activations", "bits_weights",
                                                 "bits_bias")))
    for name in no_quant:
        added.append((re.escape(canonical_name(name)), keep_float))
    for name in no_clip:
        added.append((re.escape(canonical_name(name)),
                      MappingProxyType({"clip_acts": ClipMode.NONE})))
    return QuantSettings(**{f.name: getattr(settings, f.name) for f in fields(settings)
                            if f.name != "overrides"},
                         overrides=(*added, *settings.overrides))


def quantizable_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Param layers, element-wise ops and activations by module name, in model order; of a
    traced model (torch.fx GraphModule) only those its graph calls: a Linear inside a leaf such
    as nn.MultiheadAttention, which reads the weight itself, is no layer of the graph."""
    kinds = (*PARAM_LAYERS, *ELTWISE_LAYERS, *ACTIVATION_LAYERS)
    called = None
    if isinstance(model, torch.fx.GraphModule):
        called = {str(node.target) for node in model.graph.nodes if node.op == "call_module"}
    return {name: module for name, module in model.named_modules()
            if name and isinstance(module, kinds) and (called is None or name in called)}


def resolve_layers(model: nn.Module, settings: QuantSettings) -> dict[str, LayerSettings]:
    """Every quantizable module's settings: the first override matching its full name wins."""
    names = [name for name, _ in model.named_modules() if name]
    compiled = []
    for pattern, values in settings.overrides:
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise QuantizationError(f"override {shown(pattern)} is not a valid regex ({exc}); "
                                    "escape special characters or fix the pattern") from None
        if not any(regex.fullmatch(name) for name in names):
            raise QuantizationError(f"override '{pattern}' matches no module of the model; check "
                                    "the names with --summary modules")
        compiled.append((regex, values))
    resolved = {}
    for name in quantizable_modules(model):
        values = next((v for regex, v in compiled if regex.fullmatch(name)), {})
        chosen = {key: values.get(key, getattr(settings, key)) for key in _LAYER_KEYS}
        try:
            check_clip_n_stds(chosen["clip_acts"], chosen["clip_n_stds"])
        except QuantizationError as exc:
            raise QuantizationError(f"layer '{name}': {exc}") from None
        overrides = dict(values.get("input_overrides", {}))
        if settings.reduce_range:
            chosen["bits_activations"] = reduced_bits(chosen["bits_activations"])
            overrides = {index: {**entry, "bits_activations": reduced_bits(
                entry["bits_activations"])} if "bits_activations" in entry else entry
                for index, entry in overrides.items()}
        resolved[name] = LayerSettings(**chosen, input_overrides=MappingProxyType(overrides))
    return resolved


def reduced_bits(bits: int | None) -> int | None:
    """An 8-bit activation width under reduce_range (7); other widths stay as they are."""
    return REDUCED_BITS if bits == 8 else bits
