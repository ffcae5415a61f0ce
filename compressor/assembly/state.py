"""A model's weights in and out of a checkpoint dict, through its recipes' hooks.

A method that stores weights in its own form (post-training quantization keeps integers and
scales) implements `pack_state(model, recipe, state)` and `unpack_state(model, recipe, state)`
on its Transform; this module calls them in recipe order and names no method itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from compressor.assembly.recipes import get_transform
from compressor.models.description import described, description_of, stored_form, unwrap_model
from compressor.training.checkpoint import FORMAT_VERSION, clean_state_dict
from compressor.utils.errors import CheckpointError

__all__ = ["assemble_checkpoint", "plain_state_dict", "load_weights"]


def _hooks(model: nn.Module, name: str) -> list[tuple[Any, Any]]:
    """(hook, recipe) of every recipe of `model` that implements hook `name`, in recipe order."""
    if not described(model):
        return []
    hooks = []
    for step in description_of(model).transforms:
        hook = getattr(get_transform(step.name), name, None)
        if hook is not None:
            hooks.append((hook, step.recipe))
    return hooks


def plain_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict a checkpoint stores: wrapper prefixes stripped (masks live in the
    tensors), of the model's stored form, in the form its recipes' `pack_state` hooks give."""
    inner = stored_form(model)
    state = inner.state_dict()
    for pack, recipe in _hooks(inner, "pack_state"):
        state = pack(inner, recipe, state)
    return clean_state_dict(state)


def load_weights(model: nn.Module, state_dict: Mapping[str, Any], source: str) -> None:
    """Load a state dict (module./_orig_mod. prefixes stripped, recipes' `unpack_state` hooks
    applied in reverse order), naming the file on a mismatch."""
    if not isinstance(state_dict, Mapping):
        raise CheckpointError(f"{source} holds no state dict of tensors; use a checkpoint "
                              "saved by compressor or torch.save(model.state_dict())")
    try:
        inner = unwrap_model(model)
        cleaned = clean_state_dict(state_dict)
        for unpack, recipe in reversed(_hooks(inner, "unpack_state")):
            cleaned = unpack(inner, recipe, cleaned)
        inner.load_state_dict(cleaned, strict=True)
    except (RuntimeError, TypeError, AttributeError, KeyError, ValueError) as exc:
        detail = " ".join(str(exc).split())[:300]
        raise CheckpointError(f"weights in {source} do not fit {description_of(model).arch} "
                              f"({detail}); check the arch and the file") from None


def assemble_checkpoint(model: nn.Module, *, args: Mapping[str, Any],
                        **progress: Any) -> dict[str, Any]:
    """The checkpoint dict for `model` (wrappers looked through) and its progress keys.

    The model's ModelDescription gives arch, dataset, classes, input spec and model_attrs;
    `progress` holds optimizer, lr_scheduler, compression, epoch, best_top1, best_epoch, rng...
    """
    description = description_of(model)
    return {
        "format_version": FORMAT_VERSION,
        "arch": description.arch,
        "dataset": description.dataset,
        "num_classes": description.num_classes,
        "model_attrs": description.model_attrs(),
        "input_spec": description.input_spec.to_dict(),
        "class_names": list(description.class_names),
        "state_dict": plain_state_dict(model),
        "args": dict(args),
        **progress,
    }
