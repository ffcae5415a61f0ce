"""Building Distiller's QAT quantizers from a schedule entry or a saved recipe.

`build_qat_quantizer` reads the YAML arguments of one quantizer (the entry minus `class`):
the settings keys the class accepts in Distiller (bits, overrides, and for the range-linear one
mode, per_channel_wts, quantize_inputs) plus its own (ema_decay, num_bits_inputs;
act_clip_init_val, act_clip_decay). Any other key, e.g. a post-training one such as clip_acts,
is refused. `qat_from_recipe` prepares a freshly built float model as the saved one was.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from torch import nn

from compressor.quantization.core.errors import QuantizationError, shown, unknown_choice
from compressor.quantization.core.settings import QuantSettings, settings_from_args
from compressor.quantization.qat.methods import DorefaQuantizer, PACTQuantizer, WRPNQuantizer
from compressor.quantization.qat.quantizer import QATQuantizer, QuantAwareTrainRangeLinearQuantizer

__all__ = ["QAT_CLASSES", "build_qat_quantizer", "qat_from_recipe"]

QAT_CLASSES: Mapping[str, type[QATQuantizer]] = MappingProxyType({
    cls.class_name: cls for cls in (QuantAwareTrainRangeLinearQuantizer, DorefaQuantizer,
                                    PACTQuantizer, WRPNQuantizer)})
_RECIPE_KEYS = ("class", "settings", "args")


def _quantizer_class(class_name: Any, where: str) -> type[QATQuantizer]:
    """The class registered under Distiller's name."""
    if isinstance(class_name, str) and class_name in QAT_CLASSES:
        return QAT_CLASSES[class_name]
    problem = unknown_choice("QAT quantizer class", class_name, QAT_CLASSES)
    raise QuantizationError(f"{where}: {problem}")


def _check_keys(keys: Any, allowed: Sequence[str], where: str, what: str) -> None:
    """Refuse a key `what` does not read, suggesting the closest allowed one."""
    for key in keys:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), list(allowed), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise QuantizationError(f"{where}: unknown key {shown(key)} for {what}{hint}; "
                                    f"use only {', '.join(allowed)}")


def build_qat_quantizer(class_name: str, args: Mapping[str, Any], where: str) -> QATQuantizer:
    """The QAT quantizer of one schedule entry (`args`: the entry minus `class`)."""
    cls = _quantizer_class(class_name, where)
    if not isinstance(args, Mapping):
        raise QuantizationError(f"{where}: expected a mapping of quantizer arguments, got "
                                f"{shown(args)}; write them as 'key: value' lines")
    _check_keys(args, (*cls.settings_keys, *cls.extra_keys), where, cls.class_name)
    overrides = args.get("overrides")
    if isinstance(overrides, Mapping):
        for pattern, values in overrides.items():
            if isinstance(values, Mapping):
                _check_keys(values, cls.override_keys, f"{where}: override '{pattern}'",
                            cls.class_name)
    settings = settings_from_args(args, where, extra_keys=cls.extra_keys)
    extras = {key: args[key] for key in cls.extra_keys if key in args}
    try:
        return cls(settings, **extras)
    except QuantizationError as exc:
        raise QuantizationError(f"{where}: {exc}") from None


def qat_from_recipe(model: nn.Module, recipe: Mapping[str, Any]) -> nn.Module:
    """Prepare a freshly built float model as `recipe` says, so its saved state_dict loads."""
    where = "saved QAT recipe"
    if not isinstance(recipe, Mapping) or set(recipe) != set(_RECIPE_KEYS):
        raise QuantizationError(f"{where} must be a mapping with keys {', '.join(_RECIPE_KEYS)}, "
                                f"got {shown(recipe)}; save the checkpoint again")
    cls = _quantizer_class(recipe["class"], where)
    args = recipe["args"]
    if not isinstance(args, Mapping):
        raise QuantizationError(f"{where}: args must be a mapping, got {shown(args)}; "
                                "save the checkpoint again")
    _check_keys(args, cls.extra_keys, where, cls.class_name)
    settings = QuantSettings.from_recipe(recipe["settings"])
    try:
        quantizer = cls(settings, **{**cls.recipe_defaults, **args})
    except QuantizationError as exc:
        raise QuantizationError(f"{where}: {exc}") from None
    quantizer.prepare(model)
    return model
