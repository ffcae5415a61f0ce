"""Read a Distiller-format YAML schedule and build its CompressionScheduler, checking it all."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from compressor.pruning import SparsityLevelParameterPruner
from compressor.schedule.config import EntryReader, ParamResolver, shown
from compressor.schedule.extensions import check_schedule_thinning
from compressor.schedule.lr import LR_SCHEDULERS
from compressor.schedule.policies import (
    ExtensionPolicy,
    LRPolicy,
    Policy,
    PruningOptions,
    PruningPolicy,
    QuantizationPolicy,
    RegularizationPolicy,
    Window,
)
from compressor.schedule.quantizers import prepare_quantizer
from compressor.schedule.registry import (
    RETIRED_QUANTIZERS,
    SCHEDULE_CLASSES,
    per_weight_values,
    section_of,
)
from compressor.schedule.scheduler import CompressionScheduler
from compressor.utils.errors import ScheduleError

__all__ = ["load_schedule", "read_schedule", "build_scheduler", "SECTIONS"]

LOG = logging.getLogger("compressor")

SECTIONS = ("pruners", "regularizers", "quantizers", "lr_schedulers", "extensions")
# quantizers first: they wrap the model's modules, and the other sections name its parameters
BUILD_ORDER = ("quantizers", "pruners", "regularizers", "lr_schedulers", "extensions")
POLICY_KINDS = {"pruner": "pruners", "regularizer": "regularizers", "quantizer": "quantizers",
                "lr_scheduler": "lr_schedulers", "extension": "extensions"}
PRUNING_ARGS = tuple(PruningOptions.__dataclass_fields__)
WINDOW_KEYS = ("starting_epoch", "ending_epoch", "frequency", "epochs")
MAX_SCHEDULE_BYTES = 4 << 20
MAX_EPOCH = 100_000
_FIX_FILE = "pass --compress the path of a Distiller YAML schedule"


def load_schedule(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                  *, seed: int = 0) -> CompressionScheduler:
    """Parse `path` (yaml.safe_load) and build its scheduler for `model` and `optimizer`."""
    return build_scheduler(read_schedule(path), model, optimizer, source=_shown_path(path),
                           seed=seed)


def read_schedule(path: str | Path) -> dict[str, Any]:
    """The parsed top-level mapping of a schedule file.

    Any failure to read or parse it (missing, a directory, not UTF-8 text, too large, invalid or
    too deeply nested YAML, empty, not a mapping) is one ScheduleError line naming the file.
    """
    name = _shown_path(path)
    if Path(path).is_dir():
        raise ScheduleError(f"{name}: is a directory, not a schedule file; {_FIX_FILE}")
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_SCHEDULE_BYTES + 1)
    except OSError as exc:
        raise ScheduleError(_one_line(f"{name}: cannot read the schedule "
                                      f"({exc.strerror or type(exc).__name__}); "
                                      f"check the --compress path")) from exc
    if len(data) > MAX_SCHEDULE_BYTES:
        raise ScheduleError(f"{name}: larger than {MAX_SCHEDULE_BYTES >> 20} MiB, too large for "
                            f"a schedule; {_FIX_FILE}")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ScheduleError(f"{name}: not a text file (byte {exc.start} is not UTF-8); "
                            f"{_FIX_FILE}") from exc
    doc = _parse_yaml(name, text)
    if doc is None:
        raise ScheduleError(f"{name}: the schedule is empty; write its sections (version: 1, "
                            f"pruners: ..., policies: ...) or drop --compress")
    if not isinstance(doc, Mapping):
        raise ScheduleError(f"{name}: the top level is a {type(doc).__name__}, not a mapping; "
                            f"a schedule is 'key: value' sections such as 'pruners:' and "
                            f"'policies:'")
    return dict(doc)


def _shown_path(path: str | Path) -> str:
    text = str(path)
    return text if text.isprintable() else repr(text)


def _one_line(message: str) -> str:
    return " ".join(message.split())


def _parse_yaml(name: str, text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        if mark is not None:
            where = f"line {mark.line + 1}"
        elif isinstance(exc, yaml.reader.ReaderError):
            where = f"character {exc.position + 1}"
        else:
            where = "somewhere"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScheduleError(_one_line(f"{name}: invalid YAML at {where} ({problem}); "
                                      f"fix the syntax")) from exc
    except RecursionError:
        raise ScheduleError(f"{name}: YAML nested too deeply to be a schedule; "
                            f"{_FIX_FILE}") from None
    except Exception as exc:  # the parser's own errors on odd values (bad dates, !!int 'x')
        raise ScheduleError(_one_line(f"{name}: invalid YAML value ({type(exc).__name__}: "
                                      f"{exc}); fix the value")) from exc


def build_scheduler(doc: Any, model: nn.Module, optimizer: torch.optim.Optimizer,
                    source: str = "<schedule>", *, seed: int = 0) -> CompressionScheduler:
    """Build the scheduler of an already parsed schedule document."""
    top = EntryReader(source, "top level", doc if doc is not None else {})
    version = top.raw("version", 1)
    if version != 1:
        top.fail(f"version {shown(version)} is not supported", "write 'version: 1'")
    resolver = ParamResolver(model)
    fresh_quantizer = False
    instances: dict[str, tuple[str, str, Any]] = {}  # name -> (section, class, object)
    for section in BUILD_ORDER:
        entries = top.raw(section, None) or {}
        if not isinstance(entries, Mapping):
            top.fail(f"'{section}' must be a mapping of instance names",
                     f"write '{section}:' followed by indented 'name: {{class: ...}}' entries")
        for name, entry in entries.items():
            instances[str(name)] = (section, *_build_instance(
                source, section, str(name), entry, resolver, optimizer))
        if section == "quantizers" and entries:
            quantizers = [(name, obj) for name, (sec, _, obj) in instances.items()
                          if sec == "quantizers"]
            fresh_quantizer = prepare_quantizer(top, quantizers, model, optimizer)
            resolver = ParamResolver(model)  # the wrapped model's parameter names
    policies_doc = top.raw("policies", None) or []
    top.finish()
    if not isinstance(policies_doc, list):
        top.fail("'policies' must be a list", "write each policy as a '- pruner: ...' item")
    policies = [_build_policy(source, i, item, instances, resolver)
                for i, item in enumerate(policies_doc)]
    for policy in policies:  # fake quantization starts with the policy's first epoch
        if fresh_quantizer and isinstance(policy, QuantizationPolicy):
            policy.quantizer.set_enabled(model, min(policy.window.epochs) == 0)
    check_schedule_thinning(model, policies, source)
    used = {policy.instance_name for policy in policies}
    for name in instances:
        if name not in used:
            LOG.warning("%s: %s '%s' is defined but no policy uses it; it will do nothing",
                        source, instances[name][0][:-1], name)
    return CompressionScheduler(model, optimizer, policies, source,
                                {name: obj for name, (_, _, obj) in instances.items()},
                                seed=seed)


def _build_instance(source: str, section: str, name: str, entry: Any,
                    resolver: ParamResolver, optimizer: torch.optim.Optimizer
                    ) -> tuple[str, Any]:
    reader = EntryReader(source, f"{section}.{name}", entry)
    class_name = reader.raw("class")
    if not isinstance(class_name, str):
        reader.fail(f"'class' is {shown(class_name)}", "write a class name such as "
                                                      "AutomatedGradualPruner")
    if class_name in RETIRED_QUANTIZERS:
        reader.fail(f"class {shown(class_name)} was retired in Distiller 0.3 and is not "
                    "supported", "use QuantAwareTrainRangeLinearQuantizer (training) or "
                    "PostTrainLinearQuantizer with -e --qe-config-file")
    owner = section_of(class_name)
    if owner is None:
        close = difflib.get_close_matches(class_name[:200], list(SCHEDULE_CLASSES), n=1)
        hint = (f"did you mean '{close[0]}'?" if close
                else "see docs/schedules.md, Distiller schedule support")
        reader.fail(f"unknown class {shown(class_name)}", f"fix the class name ({hint})")
    if owner != section:
        reader.fail(f"class '{class_name}' belongs under '{owner}', not '{section}'",
                    f"move this entry to '{owner}'")
    builder = SCHEDULE_CLASSES[class_name][1]
    if builder is None:  # LR schedulers: built here, with the optimizer
        obj = _build_lr(reader, class_name, optimizer)
    else:
        obj = builder(name, reader, resolver)
    reader.finish()
    return class_name, obj


# LR scheduler arguments: key -> (int or float, lowest value); lists and choices apart
_LR_NUMBERS: Mapping[str, tuple[type, float]] = {
    "step_size": (int, 1), "T_max": (int, 1), "patience": (int, 0), "cooldown": (int, 0),
    "gamma": (float, 0.0), "eta_min": (float, 0.0), "factor": (float, 0.0),
    "threshold": (float, 0.0), "min_lr": (float, 0.0), "eps": (float, 0.0)}
_LR_CHOICES: Mapping[str, tuple[str, ...]] = {"mode": ("min", "max"),
                                              "threshold_mode": ("rel", "abs")}


def _lr_argument(reader: EntryReader, key: str) -> Any:
    if key in _LR_CHOICES:
        return reader.choice(key, _LR_CHOICES[key])
    if key in _LR_NUMBERS:
        kind, low = _LR_NUMBERS[key]
        return reader.number(key, kind=kind, low=low)
    values = reader.raw(key)  # milestones (epochs) or gammas (factors)
    kind = int if key == "milestones" else float
    if not isinstance(values, list) or not values:
        reader.fail(f"'{key}' is {shown(values)}", f"write a non-empty list, e.g. {key}: "
                                                  f"{'[30, 60]' if kind is int else '[0.1, 0.5]'}")
    return [reader.check_number(key, value, kind=kind, low=0) for value in values]


def _build_lr(reader: EntryReader, class_name: str, optimizer: torch.optim.Optimizer) -> Any:
    cls, required, optional = LR_SCHEDULERS[class_name]
    kwargs = {key: _lr_argument(reader, key) for key in sorted(required)}
    kwargs.update({key: _lr_argument(reader, key) for key in sorted(optional)
                   if reader.has(key)})
    reader.finish()
    try:
        return cls(optimizer, **kwargs)
    except (TypeError, ValueError) as exc:
        reader.fail(f"invalid arguments for {class_name} ({exc})",
                    f"see torch.optim.lr_scheduler.{class_name} for their meaning")


def _window(reader: EntryReader) -> Window:
    if reader.has("epochs"):
        epochs = reader.raw("epochs")
        if (not isinstance(epochs, list) or not epochs
                or not all(isinstance(e, int) and not isinstance(e, bool) and 0 <= e < MAX_EPOCH
                           for e in epochs)):
            reader.fail(f"'epochs' is {shown(epochs)}",
                        f"write a non-empty list of epoch numbers below {MAX_EPOCH}")
        for key in ("starting_epoch", "ending_epoch", "frequency"):
            if reader.has(key):
                reader.fail(f"both 'epochs' and '{key}' are given", "remove one of them")
        return Window.from_list(epochs)
    start = reader.number("starting_epoch", kind=int, low=0, high=MAX_EPOCH)
    end = reader.number("ending_epoch", kind=int, low=0, high=MAX_EPOCH)
    frequency = reader.number("frequency", 1, kind=int, low=1)
    if end <= start:
        reader.fail(f"ending_epoch {end} is not after starting_epoch {start}",
                    "make ending_epoch greater than starting_epoch (it is excluded)")
    return Window.from_range(start, end, frequency)


def _policy_kind(reader: EntryReader) -> str:
    kinds = [kind for kind in POLICY_KINDS if reader.has(kind)]
    if len(kinds) == 1:
        return kinds[0]
    if kinds:
        reader.fail(f"names {len(kinds)} instance kinds ({', '.join(kinds)})",
                    "give exactly one per policy item")
    others = [key for key in reader.mapping if key not in WINDOW_KEYS]
    if not others:
        reader.fail("names no instance", f"add one of: {', '.join(POLICY_KINDS)}")
    close = difflib.get_close_matches(str(others[0])[:200], list(POLICY_KINDS), n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"use one of: {', '.join(POLICY_KINDS)}"
    reader.fail(f"unknown policy kind {shown(others[0])}", f"fix it ({hint})")


def _build_policy(source: str, index: int, item: Any,
                  instances: Mapping[str, tuple[str, str, Any]],
                  resolver: ParamResolver) -> Policy:
    reader = EntryReader(source, f"policies[{index}]", item)
    kind = _policy_kind(reader)
    ref = EntryReader(source, f"policies[{index}].{kind}", reader.raw(kind))
    name = ref.raw("instance_name")
    if isinstance(name, bool) or not isinstance(name, (str, int)):
        ref.fail(f"'instance_name' is {shown(name)}", "write the name of a defined instance")
    name = str(name)
    if name not in instances:
        defined = [n for n, (section, _, _) in instances.items()
                   if section == POLICY_KINDS[kind]]
        close = difflib.get_close_matches(name[:200], defined, n=1)
        hint = f"did you mean '{close[0]}'?" if close else (
            f"defined: {', '.join(defined) or 'none'}")
        ref.fail(f"instance {shown(name)} is not defined under '{POLICY_KINDS[kind]}'",
                 f"define it or fix the name ({hint})")
    section, class_name, obj = instances[name]
    if section != POLICY_KINDS[kind]:
        ref.fail(f"'{name}' is a {section[:-1]}, not a {kind}", f"use '{section[:-1]}:' here")
    window = _window(reader)
    reader.finish()
    args = EntryReader(source, f"policies[{index}].{kind}.args", ref.raw("args", None) or {})
    ref.finish()
    if kind == "pruner":
        return _pruning_policy(args, obj, class_name, window, resolver)
    if kind == "regularizer":
        keep = args.boolean("keep_mask")
        args.finish()
        return RegularizationPolicy(obj, window, keep)
    args.finish()
    if kind == "quantizer":
        return QuantizationPolicy(name, obj, window)
    if kind == "lr_scheduler":
        return LRPolicy(name, obj, window)
    return ExtensionPolicy(name, obj, window)


def _pruning_policy(args: EntryReader, pruner: Any, class_name: str, window: Window,
                    resolver: ParamResolver) -> PruningPolicy:
    """Distiller's pruner_args: the PruningOptions flags, and `levels`, a per-policy override of
    a SparsityLevelParameterPruner's levels."""
    options = {key: args.boolean(key) for key in PRUNING_ARGS
               if key != "mini_batch_pruning_frequency" and args.has(key)}
    frequency = args.number("mini_batch_pruning_frequency", 0, kind=int, low=0)
    if options.get("mask_gradients") and not options.get("mask_on_forward_only"):
        args.fail("mask_gradients needs mask_on_forward_only (as in Distiller)",
                  "add 'mask_on_forward_only: True' or remove mask_gradients")
    if args.has("levels"):
        if not isinstance(pruner, SparsityLevelParameterPruner):
            args.fail(f"'levels' overrides the levels of a SparsityLevelParameterPruner, not of "
                      f"a {class_name}", "remove it, or set the pruner's own arguments")
        pruner = pruner.with_values(per_weight_values(args, resolver, "levels", high=1.0,
                                                      skip_zero=True))
    args.finish()
    return PruningPolicy(pruner, window, PruningOptions(
        mini_batch_pruning_frequency=frequency, **options))
