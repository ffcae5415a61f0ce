"""ModelDescription: a model's identity (arch, dataset, classes, input spec, attributes, recipes).

One frozen dataclass, attached once to the module it describes (`describe`), read back with
`description_of`; it carries the class names too, so they go wherever the model goes (thinned,
quantized, saved, exported). Checkpoints, args.yaml and results.json all read this one record:

    model_attrs = {**builder_attrs, "transforms": [{"name": "memory_efficient",
                                                    "recipe": "recompute"}, ...]}

`transforms` is the ordered list of framework transforms applied after the builder
(compressor.assembly.recipes: memory variant, thinning, quantization); it is left out when
empty. A model converted for deployment (int8 kernels) also remembers the model a checkpoint
stores (`attach_stored_form` / `stored_form`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from compressor.utils.errors import CheckpointError
from compressor.utils.input_spec import InputSpec

__all__ = ["ModelDescription", "TransformStep", "class_names_of", "describe", "described",
           "description_of", "unwrap_model", "attach_stored_form", "stored_form", "TRANSFORMS_KEY"]

TRANSFORMS_KEY = "transforms"
# a recipe larger than this (as JSON) is left out of a run's record (args.yaml)
RECORDED_RECIPE_BYTES = 1024
_ATTRIBUTE = "description"
_STORED_FORM = "_compressor_stored_form"  # a converted model's source (what is saved)
# Before format version 2, checkpoints stored the framework transforms as flat keys, in this order.
_LEGACY_TRANSFORM_KEYS = ("memory_efficient", "thinning")


@dataclass(frozen=True)
class TransformStep:
    """One framework transform applied after the builder: its table name and plain recipe."""

    name: str
    recipe: Any

    def to_dict(self) -> dict[str, Any]:
        """Plain-value form, as stored in model_attrs."""
        return {"name": self.name, "recipe": self.recipe}


@dataclass(frozen=True)
class ModelDescription:
    """Everything needed to rebuild a model and feed it: set once, replaced, never mutated."""

    arch: str
    dataset: str
    num_classes: int
    input_spec: InputSpec
    builder_attrs: Mapping[str, Any] = field(default_factory=dict)
    transforms: tuple[TransformStep, ...] = ()
    # the classes in label order, where known (a folder's, a dataset's); () when not
    class_names: tuple[str, ...] = ()

    def model_attrs(self) -> dict[str, Any]:
        """The checkpoint's `model_attrs`: builder attributes and the ordered transform recipes."""
        attrs = dict(self.builder_attrs)
        if self.transforms:
            attrs[TRANSFORMS_KEY] = [step.to_dict() for step in self.transforms]
        return attrs

    def to_dict(self) -> dict[str, Any]:
        """Plain values for args.yaml and results.json."""
        return {"arch": self.arch, "dataset": self.dataset, "num_classes": self.num_classes,
                "input_spec": self.input_spec.to_dict(), "model_attrs": self.model_attrs(),
                "class_names": list(self.class_names)}

    def to_record(self) -> dict[str, Any]:
        """to_dict for args.yaml and a checkpoint's `args`: a transform whose recipe is large
        (a thinning recipe lists every removed channel) is named with its size, its recipe
        left to the checkpoint's own model_attrs, so the record stays a few KB."""
        record = self.to_dict()
        steps = record["model_attrs"].get(TRANSFORMS_KEY)
        if steps:
            record["model_attrs"][TRANSFORMS_KEY] = [_summary(step) for step in steps]
        return record

    def with_class_names(self, names: Any) -> ModelDescription:
        """This description with `names` as its classes when they are one string per output
        (anything else leaves it as it is)."""
        return dataclasses.replace(self, class_names=class_names_of(names, self.num_classes)
                                   or self.class_names)

    def recipe(self, name: str) -> Any | None:
        """The recipe of transform `name`, or None when it was not applied."""
        for step in self.transforms:
            if step.name == name:
                return step.recipe
        return None

    def with_transform(self, name: str, recipe: Any) -> ModelDescription:
        """This description with `name`'s recipe replaced in place (or appended when new)."""
        steps = list(self.transforms)
        for index, step in enumerate(steps):
            if step.name == name:
                steps[index] = TransformStep(name, recipe)
                break
        else:
            steps.append(TransformStep(name, recipe))
        return dataclasses.replace(self, transforms=tuple(steps))

    def without_transforms(self) -> ModelDescription:
        """The description of the model the builder alone makes."""
        return dataclasses.replace(self, transforms=())

    @classmethod
    def from_model_attrs(cls, arch: str, dataset: str, num_classes: int, input_spec: InputSpec,
                         model_attrs: Mapping[str, Any]) -> ModelDescription:
        """Split a checkpoint's model_attrs into builder attributes and transform steps."""
        attrs = dict(model_attrs)
        steps: list[TransformStep] = []
        # DenseNet-BC's former builder attribute, now the recompute memory variant
        legacy_efficient = bool(attrs.pop("efficient", False))
        for key in _LEGACY_TRANSFORM_KEYS:  # format version 1
            if attrs.get(key) is not None:
                steps.append(TransformStep(key, attrs.pop(key)))
            attrs.pop(key, None)
        listed = attrs.pop(TRANSFORMS_KEY, None) or []
        if not isinstance(listed, list) or not all(
                isinstance(item, Mapping) and isinstance(item.get("name"), str)
                and "recipe" in item for item in listed):
            raise CheckpointError("model_attrs.transforms is not a list of {name, recipe} "
                                  "entries; the checkpoint is damaged, use another one")
        steps += [TransformStep(item["name"], item["recipe"]) for item in listed]
        if legacy_efficient and not any(step.name == "memory_efficient" for step in steps):
            steps.insert(0, TransformStep("memory_efficient", "recompute"))
        return cls(arch, dataset, int(num_classes), input_spec, attrs, tuple(steps))

    @classmethod
    def from_checkpoint(cls, checkpoint: Mapping[str, Any]) -> ModelDescription:
        """The description a compressor checkpoint records (class names from its own key, or
        from its run's arguments in checkpoints written before it had one)."""
        found = cls.from_model_attrs(str(checkpoint["arch"]), str(checkpoint["dataset"]),
                                     int(checkpoint["num_classes"]),
                                     InputSpec.from_dict(checkpoint["input_spec"]),
                                     checkpoint["model_attrs"])
        recorded = checkpoint.get("args")
        names = checkpoint.get("class_names") or (
            recorded.get("class_names") if isinstance(recorded, Mapping) else None)
        return found.with_class_names(names)


def _summary(step: dict[str, Any]) -> dict[str, Any]:
    """A transform step as a run's record gives it: its recipe when small, else its size."""
    size = len(json.dumps(step["recipe"], default=str))
    if size <= RECORDED_RECIPE_BYTES:
        return step
    return {"name": step["name"],
            "recipe": f"in the checkpoint's model_attrs ({size / 1024:.0f} KB)"}


def class_names_of(names: Any, num_classes: int) -> tuple[str, ...]:
    """`names` as a tuple when it is one string per class, else ()."""
    if (isinstance(names, (list, tuple)) and len(names) == num_classes
            and all(isinstance(name, str) for name in names)):
        return tuple(names)
    return ()


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside DataParallel / DistributedDataParallel / torch.compile wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def describe(model: nn.Module, description: ModelDescription) -> nn.Module:
    """Attach `description` to `model` (the one place a description is written); returns it."""
    object.__setattr__(unwrap_model(model), _ATTRIBUTE, description)
    return model


def described(model: nn.Module) -> bool:
    """Whether `model` carries a ModelDescription (plain torch modules do not)."""
    return isinstance(vars(unwrap_model(model)).get(_ATTRIBUTE), ModelDescription)


def description_of(model: nn.Module) -> ModelDescription:
    """The description attached to `model` (wrappers such as DDP are looked through)."""
    found = vars(unwrap_model(model)).get(_ATTRIBUTE)
    if not isinstance(found, ModelDescription):
        raise ValueError(f"{type(model).__name__} carries no ModelDescription; build it with "
                         "compressor.models.create_model or compressor.assembly.build_model")
    return found


def attach_stored_form(converted: nn.Module, source: nn.Module) -> nn.Module:
    """Remember the model `converted` was made from, which checkpoints save in its stead."""
    object.__setattr__(unwrap_model(converted), _STORED_FORM, source)
    return converted


def stored_form(model: nn.Module) -> nn.Module:
    """The model as a checkpoint stores it: a converted model's source, else itself."""
    inner = unwrap_model(model)
    return vars(inner).get(_STORED_FORM, inner)
