"""Look up and build registered architectures: every family is imported here, once, so that its
@register_model decorators have run before any lookup (timm's _registry / _factory split)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from torch import nn

from compressor.models import families  # noqa: F401  (their decorators fill the registry)
from compressor.models.description import ModelDescription, describe
from compressor.models.registry import ArchSpec, registered_specs
from compressor.models.sources import is_code_reference, is_timm_arch
from compressor.utils.errors import UsageError
from compressor.utils.input_spec import InputSpec

__all__ = ["get_arch_spec", "list_archs", "create_model"]


def list_archs() -> list[str]:
    """All registered architecture names, sorted."""
    return sorted(registered_specs())


def get_arch_spec(name: str) -> ArchSpec:
    """The ArchSpec of `name`: a registered arch, `timm/NAME` (timm's model) or the user's own
    code (`path/to/file.py:Name`, `package.module:Name`, imported here, where the command line
    named it); an unknown name is an error that suggests the closest names."""
    specs = registered_specs()
    if name in specs:
        return specs[name]
    if is_timm_arch(name):
        from compressor.models.families.timm_models import timm_arch_spec

        return timm_arch_spec(name)
    if is_code_reference(name):
        from compressor.models.user_code import code_arch_spec

        return code_arch_spec(name)
    if name not in specs:
        close = difflib.get_close_matches(name, specs, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else "see --help for the list"
        raise UsageError(f"unknown architecture '{name}': {hint}")
    return specs[name]


def create_model(arch: str, dataset: str, *, num_classes: int | None = None,
                 input_spec: InputSpec | None = None, model_attrs: Mapping[str, Any] | None = None,
                 pretrained: bool = False) -> nn.Module:
    """Build `arch` for `dataset` with the builder alone, described by a ModelDescription."""
    spec = get_arch_spec(arch)
    if spec.own_dataset(dataset) not in spec.datasets:  # synthetic data fits any architecture
        raise UsageError(f"architecture '{arch}' does not support dataset '{dataset}'; "
                         f"use one of: {', '.join(spec.datasets)}")
    input_spec = input_spec or spec.input_spec(dataset)
    num_classes = num_classes or spec.num_classes(dataset)
    attrs = spec.resolve_attrs(model_attrs, pretrained)
    model = spec.builder(num_classes=num_classes, input_spec=input_spec, **attrs)
    return describe(model, ModelDescription(arch, dataset, num_classes, input_spec, attrs))
