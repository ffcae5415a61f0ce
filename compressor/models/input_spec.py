"""InputSpec, and the per-dataset defaults the registry reads, views of compressor.datasets."""

from __future__ import annotations

from types import MappingProxyType

from compressor.datasets import DATASET_SPECS
from compressor.input_spec import IMAGENET_MEAN, IMAGENET_STD, InputSpec

__all__ = ["InputSpec", "IMAGENET_MEAN", "IMAGENET_STD", "DATASET_INPUT_SPECS",
           "DATASET_NUM_CLASSES"]

# Derived from the dataset table (datasets with their own preprocessing and class count; the
# synthetic dataset takes both from the architecture's default dataset).
DATASET_INPUT_SPECS: MappingProxyType[str, InputSpec] = MappingProxyType({
    name: spec.input_spec for name, spec in DATASET_SPECS.items() if spec.input_spec is not None})

DATASET_NUM_CLASSES: MappingProxyType[str, int] = MappingProxyType({
    name: spec.num_classes for name, spec in DATASET_SPECS.items()
    if spec.num_classes is not None})
