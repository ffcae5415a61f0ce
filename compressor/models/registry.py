"""The architecture registry: one ArchSpec per name, registered with a decorator on a builder.

The model files import this module to register themselves; nothing here imports them, so
there is no cycle. Look architectures up through compressor.models.factory, which imports
every family first (timm's _registry / _factory split).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from torch import nn

from compressor.utils.dataset_table import SYNTHETIC, dataset_names, dataset_spec
from compressor.utils.errors import UsageError
from compressor.utils.input_spec import InputSpec

__all__ = ["ArchSpec", "register_model", "registered_specs", "SYNTHETIC", "DATASETS"]

DATASETS = dataset_names()  # the rows of compressor.utils.dataset_table.DATASET_SPECS

Builder = Callable[..., nn.Module]


@dataclass(frozen=True)
class ArchSpec:
    """Everything the framework knows about one architecture, read from one place."""

    name: str
    builder: Builder  # builder(num_classes=..., input_spec=..., **model_attrs) -> nn.Module
    datasets: tuple[str, ...]  # the first is the default dataset
    input_specs: Mapping[str, InputSpec]
    loss: str = "cross_entropy"  # a name in compressor.training.losses.LOSSES
    weights: str | None = None  # torchvision weights enum, e.g. "ResNet18_Weights.IMAGENET1K_V1"
    weights_file: Callable[[], Path] | None = None  # or a weights file an installed package ships
    model_attrs: Mapping[str, Any] = field(default_factory=dict)  # accepted attrs -> defaults
    pretrained_attrs: Mapping[str, Any] = field(default_factory=dict)  # defaults with weights
    family: str = ""
    checkpoint_blocks: tuple[str, ...] = ()  # module class names to recompute in backward
    # The classification head(s): module names whose weights a pretrained backbone leaves out
    # when the dataset's classes differ from the weights' (transfer learning).
    classifier: tuple[str, ...] = ()
    # Where a model that is not registered comes from (timm, the user's own code), as plain
    # values the checkpoint records: {"kind": "timm" | "code", ...}; {} for registered archs.
    source: Mapping[str, Any] = field(default_factory=dict)

    @property
    def default_dataset(self) -> str:
        """The dataset used when none is given."""
        return self.datasets[0]

    def own_dataset(self, dataset: str) -> str:
        """The dataset whose input spec and classes apply (synthetic: the default dataset)."""
        return self.default_dataset if dataset_spec(dataset).input_spec is None else dataset

    def input_spec(self, dataset: str) -> InputSpec:
        """The InputSpec for a dataset (synthetic data uses the default dataset's)."""
        dataset = self.own_dataset(dataset)
        if dataset not in self.input_specs:
            raise UsageError(
                f"architecture '{self.name}' does not support dataset '{dataset}'; "
                f"use one of: {', '.join(self.datasets)}")
        return self.input_specs[dataset]

    def num_classes(self, dataset: str) -> int:
        """Number of classes of a dataset (synthetic data uses the default dataset's)."""
        if dataset_spec(dataset).num_classes is None and dataset != SYNTHETIC:
            raise UsageError(f"dataset '{dataset}' takes its classes from DATASET_DIR; pass "
                             "DATASET_DIR or --num-classes N")
        own = dataset_spec(self.own_dataset(dataset))
        if own.num_classes is None:
            raise UsageError(f"dataset '{own.name}' has no fixed number of classes; pass a "
                             "checkpoint or a model built with num_classes")
        return own.num_classes

    def resolve_attrs(self, given: Mapping[str, Any] | None, pretrained: bool = False
                      ) -> dict[str, Any]:
        """Defaults < pretrained defaults < given attributes; unknown names are an error."""
        attrs = dict(self.model_attrs)
        if pretrained:
            attrs.update(self.pretrained_attrs)
        for key, value in (given or {}).items():
            if key not in self.model_attrs:
                accepted = ", ".join(sorted(self.model_attrs)) or "none"
                raise UsageError(f"architecture '{self.name}' has no model attribute '{key}' "
                                 f"(accepted: {accepted})")
            attrs[key] = value
        return attrs


# Filled once, at import time, by the @register_model decorators of the model families.
_REGISTRY: dict[str, ArchSpec] = {}


def register_model(name: str, *, datasets: tuple[str, ...],
                   input_specs: Mapping[str, InputSpec] | None = None,
                   **spec_fields: Any) -> Callable[[Builder], Builder]:
    """Register a builder under `name`; duplicates are refused."""

    def decorator(builder: Builder) -> Builder:
        if name in _REGISTRY:
            raise ValueError(f"architecture '{name}' is already registered")
        specs = dict(input_specs or {})
        for dataset in datasets:
            default = dataset_spec(dataset).input_spec
            if default is None:
                raise ValueError(f"architecture '{name}' lists dataset '{dataset}', which follows "
                                 "the default dataset; list real datasets only")
            specs.setdefault(dataset, default)
        _REGISTRY[name] = ArchSpec(name=name, builder=builder, datasets=tuple(datasets),
                                   input_specs=MappingProxyType(specs), **spec_fields)
        return builder

    return decorator


def registered_specs() -> Mapping[str, ArchSpec]:
    """A read-only view of what has registered so far (compressor.models.factory loads all)."""
    return MappingProxyType(_REGISTRY)
