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

from compressor.errors import ScheduleError
from compressor.schedule.config import EntryReader, ParamResolver
from compressor.schedule.lr import LR_SCHEDULERS
from compressor.schedule.policies import (
    ExtensionPolicy,
    LRPolicy,
    Policy,
    PruningOptions,
    PruningPolicy,
    RegularizationPolicy,
    Window,
)
from compressor.schedule.registry import QUANTIZER_CLASSES, SCHEDULE_CLASSES, section_of
from compressor.schedule.scheduler import CompressionScheduler

__all__ = ["load_schedule", "build_scheduler", "SECTIONS"]

LOG = logging.getLogger("compressor")

SECTIONS = ("pruners", "regularizers", "quantizers", "lr_schedulers", "extensions")
POLICY_KINDS = {"pruner": "pruners", "regularizer": "regularizers", "quantizer": "quantizers",
                "lr_scheduler": "lr_schedulers", "extension": "extensions"}
PRUNING_ARGS = tuple(PruningOptions.__dataclass_fields__)


def load_schedule(path: str | Path, model: nn.Module,
                  optimizer: torch.optim.Optimizer) -> CompressionScheduler:
    """Parse `path` (yaml.safe_load) and build its scheduler for `model` and `optimizer`."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScheduleError(f"{path}: cannot read the schedule ({exc.strerror}); "
                            f"check the --compress path") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "somewhere"
        raise ScheduleError(f"{path}: invalid YAML at {where} ({getattr(exc, 'problem', exc)});"
                            f" fix the syntax") from exc
    return build_scheduler(doc, model, optimizer, source=str(path))


def build_scheduler(doc: Any, model: nn.Module, optimizer: torch.optim.Optimizer,
                    source: str = "<schedule>") -> CompressionScheduler:
    """Build the scheduler of an already parsed schedule document."""
    top = EntryReader(source, "top level", doc if doc is not None else {})
    version = top.raw("version", 1)
    if version != 1:
        top.fail(f"version {version!r} is not supported", "write 'version: 1'")
    resolver = ParamResolver(model)
    instances: dict[str, tuple[str, str, Any]] = {}  # name -> (section, class, object)
    for section in SECTIONS:
        entries = top.raw(section, None) or {}
        if not isinstance(entries, Mapping):
            top.fail(f"'{section}' must be a mapping of instance names",
                     f"write '{section}:' followed by indented 'name: {{class: ...}}' entries")
        for name, entry in entries.items():
            instances[str(name)] = (section, *_build_instance(
                source, section, str(name), entry, resolver, optimizer))
    policies_doc = top.raw("policies", None) or []
    top.finish()
    if not isinstance(policies_doc, list):
        top.fail("'policies' must be a list", "write each policy as a '- pruner: ...' item")
    policies = [_build_policy(source, i, item, instances) for i, item in enumerate(policies_doc)]
    used = {policy.instance_name for policy in policies}
    for name in instances:
        if name not in used:
            LOG.warning("%s: %s '%s' is defined but no policy uses it; it will do nothing",
                        source, instances[name][0][:-1], name)
    return CompressionScheduler(model, optimizer, policies, source,
                                {name: obj for name, (_, _, obj) in instances.items()})


def _build_instance(source: str, section: str, name: str, entry: Any,
                    resolver: ParamResolver, optimizer: torch.optim.Optimizer
                    ) -> tuple[str, Any]:
    reader = EntryReader(source, f"{section}.{name}", entry)
    class_name = reader.raw("class")
    if not isinstance(class_name, str):
        reader.fail(f"'class' is {class_name!r}", "write a class name such as "
                                                  "AutomatedGradualPruner")
    if section == "quantizers" or class_name in QUANTIZER_CLASSES:
        reader.fail(f"class '{class_name}' is not implemented yet (quantization)",
                    "remove the quantizers section and its policies to run the rest")
    owner = section_of(class_name)
    if owner is None:
        close = difflib.get_close_matches(class_name, list(SCHEDULE_CLASSES), n=1)
        hint = f"did you mean '{close[0]}'?" if close else "see the README's support table"
        reader.fail(f"unknown class '{class_name}'", f"fix the class name ({hint})")
    if owner != section:
        reader.fail(f"class '{class_name}' belongs under '{owner}', not '{section}'",
                    f"move this entry to '{owner}'")
    if section == "lr_schedulers":
        obj = _build_lr(reader, class_name, optimizer)
    else:
        builder = SCHEDULE_CLASSES[class_name][1]
        assert builder is not None
        obj = builder(name, reader, resolver)
    reader.finish()
    return class_name, obj


def _build_lr(reader: EntryReader, class_name: str, optimizer: torch.optim.Optimizer) -> Any:
    cls, required, optional = LR_SCHEDULERS[class_name]
    kwargs = {key: reader.raw(key) for key in sorted(required)}
    kwargs.update({key: reader.raw(key) for key in sorted(optional) if reader.has(key)})
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
                or not all(isinstance(e, int) and not isinstance(e, bool) and e >= 0
                           for e in epochs)):
            reader.fail(f"'epochs' is {epochs!r}", "write a non-empty list of epoch numbers")
        for key in ("starting_epoch", "ending_epoch", "frequency"):
            if reader.has(key):
                reader.fail(f"both 'epochs' and '{key}' are given", "remove one of them")
        return Window.from_list(epochs)
    start = reader.number("starting_epoch", kind=int, low=0)
    end = reader.number("ending_epoch", kind=int, low=0)
    frequency = reader.number("frequency", 1, kind=int, low=1)
    if end <= start:
        reader.fail(f"ending_epoch {end} is not after starting_epoch {start}",
                    "make ending_epoch greater than starting_epoch (it is excluded)")
    return Window.from_range(start, end, frequency)


def _build_policy(source: str, index: int, item: Any,
                  instances: Mapping[str, tuple[str, str, Any]]) -> Policy:
    reader = EntryReader(source, f"policies[{index}]", item)
    kinds = [kind for kind in POLICY_KINDS if reader.has(kind)]
    if len(kinds) != 1:
        reader.fail(f"names {len(kinds)} instance kinds",
                    f"give exactly one of: {', '.join(POLICY_KINDS)}")
    kind = kinds[0]
    ref = EntryReader(source, f"policies[{index}].{kind}", reader.raw(kind))
    name = ref.raw("instance_name")
    if name not in instances:
        defined = [n for n, (section, _, _) in instances.items()
                   if section == POLICY_KINDS[kind]]
        close = difflib.get_close_matches(str(name), defined, n=1)
        hint = f"did you mean '{close[0]}'?" if close else (
            f"defined: {', '.join(defined) or 'none'}")
        ref.fail(f"instance '{name}' is not defined under '{POLICY_KINDS[kind]}'",
                 f"define it or fix the name ({hint})")
    section, class_name, obj = instances[name]
    if section != POLICY_KINDS[kind]:
        ref.fail(f"'{name}' is a {section[:-1]}, not a {kind}", f"use '{section[:-1]}:' here")
    window = _window(reader)
    reader.finish()
    args = EntryReader(source, f"policies[{index}].{kind}.args", ref.raw("args", None) or {})
    ref.finish()
    if kind == "pruner":
        options = {key: args.boolean(key) for key in PRUNING_ARGS
                   if key != "mini_batch_pruning_frequency" and args.has(key)}
        frequency = args.number("mini_batch_pruning_frequency", 0, kind=int, low=0)
        args.finish()
        return PruningPolicy(obj, window, PruningOptions(
            mini_batch_pruning_frequency=frequency, **options))
    if kind == "regularizer":
        keep = args.boolean("keep_mask")
        args.finish()
        return RegularizationPolicy(obj, window, keep)
    args.finish()
    if kind == "lr_scheduler":
        return LRPolicy(str(name), obj, window)
    return ExtensionPolicy(str(name), obj, window)
