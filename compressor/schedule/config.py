"""Reading one YAML entry with checks: typed values, allowed keys, parameter names.

Every error names the file, the entry and the fix, on one line (a ScheduleError).
"""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

from torch import Tensor, nn

from compressor.models.description import unwrap_model
from compressor.models.names import canonical_name
from compressor.utils.errors import ScheduleError

__all__ = ["EntryReader", "ParamResolver", "unwrap_model", "shown", "DEFAULT_KEY"]

_REQUIRED = object()
# Distiller's key for "every weight not listed by name" in per-weight mappings (thresholds ...).
DEFAULT_KEY = "*"


def shown(value: Any) -> str:
    """A short one-line repr of a user's value for an error message (bounded in size and depth,
    so that a huge or deeply shared YAML value cannot flood or stall the message)."""
    limits = reprlib.Repr()  # keyword arguments need Python 3.12
    limits.maxlevel, limits.maxlist, limits.maxdict = 2, 4, 4
    limits.maxstring, limits.maxother = 200, 80
    text = " ".join(limits.repr(value).split())
    return text if len(text) <= 240 else f"{text[:237]}..."


class EntryReader:
    """Typed access to one mapping of a schedule; `finish()` refuses keys nobody read."""

    def __init__(self, source: str, where: str, mapping: Any) -> None:
        self.source, self.where = source, where
        if not isinstance(mapping, Mapping):
            self.fail(f"expected a mapping, got {type(mapping).__name__}",
                      "write it as 'key: value' lines")
        self.mapping = dict(mapping)
        self.read: set[str] = set()

    def fail(self, problem: str, fix: str) -> NoReturn:
        """Raise the one-line error of this entry."""
        message = f"{self.source}: {self.where}: {problem}; {fix}"
        raise ScheduleError(" ".join(message.split()))

    def has(self, key: str) -> bool:
        """Whether `key` is present."""
        return key in self.mapping

    def raw(self, key: str, default: Any = _REQUIRED) -> Any:
        """The value as written (required unless a default is given)."""
        self.read.add(key)
        if key not in self.mapping:
            if default is _REQUIRED:
                self.fail(f"missing '{key}'", f"add '{key}: ...' to this entry")
            return default
        return self.mapping[key]

    def number(self, key: str, default: Any = _REQUIRED, *, kind: type = float,
               low: float | None = None, high: float | None = None,
               high_open: bool = False) -> Any:
        """An int or float, optionally within [low, high] (or [low, high))."""
        value = self.raw(key, default)
        if value is default and default is not _REQUIRED:
            return value
        return self.check_number(key, value, kind=kind, low=low, high=high, high_open=high_open)

    def check_number(self, key: str, value: Any, *, kind: type = float,
                     low: float | None = None, high: float | None = None,
                     high_open: bool = False) -> Any:
        """Check that `value` is a number within the bounds; returns it converted to `kind`."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                kind is int and not isinstance(value, int)):
            noun = "integer" if kind is int else "number"
            self.fail(f"'{key}' must be {'an' if kind is int else 'a'} {noun}, "
                      f"not {shown(value)}", f"write a plain {noun}")
        upper_bad = high is not None and (value >= high if high_open else value > high)
        if (low is not None and value < low) or upper_bad:
            bracket = ")" if high_open else "]"
            self.fail(f"'{key}' is {shown(value)}, outside [{low}, {high}{bracket}",
                      f"use a value in [{low}, {high}{bracket}")
        return kind(value)

    def sparsity(self, key: str, default: Any = _REQUIRED) -> Any:
        """A sparsity fraction in [0, 1)."""
        return self.number(key, default, low=0.0, high=1.0, high_open=True)

    def choice(self, key: str, choices: Iterable[str], default: Any = _REQUIRED) -> Any:
        """One of `choices`."""
        value = self.raw(key, default)
        choices = tuple(choices)
        if value is not default and value not in choices:
            self.fail(f"'{key}' is {shown(value)}", f"use one of: {', '.join(choices)}")
        return value

    def boolean(self, key: str, default: bool = False) -> bool:
        """True or False."""
        value = self.raw(key, default)
        if not isinstance(value, bool):
            self.fail(f"'{key}' must be True or False, not {shown(value)}", "write True or False")
        return value

    def finish(self, extra_allowed: Iterable[str] = ()) -> None:
        """Refuse any key that was not read."""
        unknown = sorted(set(self.mapping) - self.read - set(extra_allowed), key=str)
        if unknown:
            allowed = sorted(self.read | set(extra_allowed))
            close = difflib.get_close_matches(str(unknown[0]), allowed, n=1)
            hint = f"did you mean '{close[0]}'?" if close else (
                f"accepted keys: {', '.join(allowed)}")
            self.fail(f"unknown key {shown(unknown[0])}", f"remove it or fix its name ({hint})")


class ParamResolver:
    """Map schedule parameter names (with or without Distiller's `module.`) to the model's."""

    def __init__(self, model: nn.Module) -> None:
        self.model = unwrap_model(model)
        self.params: dict[str, Tensor] = dict(self.model.named_parameters())

    def candidates(self, name: str) -> list[str]:
        """Spellings to try: as written, without a leading module., without any module. part."""
        spellings = [name]
        for prefix in ("module.", "_orig_mod."):
            if name.startswith(prefix):
                spellings.append(name[len(prefix):])
        canonical = canonical_name(name)
        spellings.append(canonical)
        parts = canonical.split(".")
        if len(parts) > 1:  # a quantizer wraps layers: conv1.weight is conv1.wrapped.weight
            spellings.append(".".join([*parts[:-1], "wrapped", parts[-1]]))
        return spellings

    def resolve(self, name: Any, reader: EntryReader, key: str) -> str:
        """The model's name for `name`, or an error that suggests the closest names."""
        if not isinstance(name, str):
            reader.fail(f"'{key}' holds {shown(name)}, not a parameter name",
                        "write names such as layer1.0.conv1.weight")
        if name == DEFAULT_KEY:
            reader.fail(f"'{key}' does not accept Distiller's '*' (every weight)",
                        "name each parameter")
        for spelling in self.candidates(name):
            if spelling in self.params:
                return spelling
        close = difflib.get_close_matches(self.candidates(name)[-1][:200], self.params, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else (
            "list the model's names with --summary sparsity")
        reader.fail(f"parameter {shown(name)} in '{key}' matches nothing in "
                    f"{type(self.model).__name__}", f"fix the name ({hint})")

    def resolve_list(self, value: Any, reader: EntryReader, key: str) -> list[str]:
        """A name or a list of names, resolved; an empty list is an error."""
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list) or not names:
            reader.fail(f"'{key}' must be a non-empty list of parameter names",
                        f"write {key}: [layer1.0.conv1.weight, ...]")
        resolved = [self.resolve(name, reader, key) for name in names]
        return list(dict.fromkeys(resolved))

    def resolve_map(self, value: Any, reader: EntryReader, key: str,
                    allow_default: bool = False) -> dict[str, Any]:
        """A mapping keyed by parameter names, with the keys resolved.

        With `allow_default`, Distiller's '*' key gives its value to every weight (parameter of
        two or more dimensions: convolution and linear weights) that no other key names.
        """
        if not isinstance(value, Mapping) or not value:
            reader.fail(f"'{key}' must be a non-empty mapping of parameter names",
                        f"write {key}: {{layer1.0.conv1.weight: ...}}")
        named = {self.resolve(name, reader, key): item for name, item in value.items()
                 if not (allow_default and name == DEFAULT_KEY)}
        if not allow_default or DEFAULT_KEY not in value:
            return named
        default = {name: value[DEFAULT_KEY] for name, param in self.params.items()
                   if param.dim() > 1}
        return {**default, **named}
