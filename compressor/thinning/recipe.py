"""Thinning recipes: plain-value records of removed channels, replayed on a fresh model.

A recipe names, per module, the output and input indices removed from the freshly built
model, and whether a bias was added to absorb a removed channel's constant output:

    {"version": 1, "modules": {"layer1.0.conv1": {"type": "Conv2d", "sizes": [16, 16],
                                                  "out": [3, 7], "in": [], "add_bias": false}}}

An attention module thinned by head dimension (compressor.thinning.attention) goes under
"attention" with its heads and its head size before and after:

    {"attention": {"blocks.0.attn": {"heads": 3, "head_dim": [64, 32]}}}

A per-channel parameter that is no layer's own (a layer scale's gamma, `x * gamma`) goes
under "parameters", by its full name, with the dimension its channels are on:

    {"parameters": {"stages.0.blocks.0.layer_scale.gamma": {"dim": 0, "size": 48,
                                                            "removed": [3, 7]}}}

Indices always refer to the freshly built model, so recipes compose (thinning twice) and a
checkpoint's state_dict loads into `apply_thinning_recipe(build(...), recipe)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from compressor.thinning.attention import HeadLayout, set_head_dim
from compressor.utils.errors import CheckpointError

__all__ = ["RECIPE_VERSION", "THINNABLE", "apply_thinning_recipe", "compose_recipes",
           "module_sizes", "is_depthwise", "is_thinnable", "is_channel_layer_norm"]

RECIPE_VERSION = 1
# Every batch norm, including compressor.memory's InPlaceABN (its activation is applied per
# channel, so slicing its channels is all that thinning it takes).
THINNABLE = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear, nn.modules.batchnorm._BatchNorm)


def is_channel_layer_norm(module: nn.Module) -> bool:
    """A LayerNorm over one dimension, the channels (a transformer's, ConvNeXt's, timm's and
    torchvision's LayerNorm2d): thinning slices it, and the channels it keeps are normalized
    among themselves (compressor.thinning.renormalize)."""
    return isinstance(module, nn.LayerNorm) and len(module.normalized_shape) == 1


def is_thinnable(module: nn.Module) -> bool:
    """Whether thinning knows how to remove channels of `module`."""
    return isinstance(module, THINNABLE) or is_channel_layer_norm(module)


def is_depthwise(module: nn.Module) -> bool:
    """A convolution with one filter per input channel (channels pass through it)."""
    return (isinstance(module, nn.modules.conv._ConvNd) and module.groups > 1
            and module.groups == module.in_channels == module.out_channels)


def module_sizes(module: nn.Module) -> list[int]:
    """[output size, input size] of a thinnable module (batch norm: [features, features])."""
    if isinstance(module, nn.Linear):
        return [module.out_features, module.in_features]
    if isinstance(module, nn.modules.conv._ConvNd):
        return [module.out_channels, module.in_channels]
    if isinstance(module, nn.LayerNorm):
        return [module.normalized_shape[0]] * 2
    return [module.num_features, module.num_features]


def _keep(size: int, removed: Sequence[int]) -> Tensor:
    gone = set(int(i) for i in removed)
    return torch.tensor([i for i in range(size) if i not in gone], dtype=torch.long)


def _slice_param(module: nn.Module, name: str, dim: int, keep: Tensor) -> None:
    tensor = getattr(module, name)
    if tensor is None:
        return
    sliced = tensor.detach().index_select(dim, keep.to(tensor.device)).clone()
    if isinstance(tensor, nn.Parameter):
        setattr(module, name, nn.Parameter(sliced, requires_grad=tensor.requires_grad))
    else:
        setattr(module, name, sliced)


def _thin_module(module: nn.Module, name: str, entry: dict[str, Any]) -> None:
    sizes = module_sizes(module)
    if list(entry.get("sizes", sizes)) != sizes:
        raise CheckpointError(f"thinning recipe expects '{name}' of size {entry['sizes']}, the "
                              f"model has {sizes}; rebuild with the checkpoint's arch and attrs")
    if entry.get("add_bias") and getattr(module, "bias", None) is None:
        weight = module.weight
        module.bias = nn.Parameter(torch.zeros(sizes[0], dtype=weight.dtype,
                                               device=weight.device))
    keep_out = _keep(sizes[0], entry.get("out", ()))
    keep_in = _keep(sizes[1], entry.get("in", ()))
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        for attr in ("weight", "bias", "running_mean", "running_var"):
            _slice_param(module, attr, 0, keep_out)
        module.num_features = len(keep_out)
        return
    if isinstance(module, nn.LayerNorm):
        keep = _keep(sizes[0], sorted({*entry.get("out", ()), *entry.get("in", ())}))
        for attr in ("weight", "bias"):
            _slice_param(module, attr, 0, keep)
        module.normalized_shape = (len(keep),)
        return
    if isinstance(module, nn.Linear):
        _slice_param(module, "weight", 0, keep_out)
        _slice_param(module, "bias", 0, keep_out)
        _slice_param(module, "weight", 1, keep_in)
        module.out_features, module.in_features = len(keep_out), len(keep_in)
        return
    if is_depthwise(module):
        if sorted(entry.get("in", ())) not in ([], sorted(entry.get("out", ()))):
            raise CheckpointError(f"thinning recipe removes different inputs and outputs of the "
                                  f"depthwise convolution '{name}'")
        _slice_param(module, "weight", 0, keep_out)
        _slice_param(module, "bias", 0, keep_out)
        module.out_channels = module.in_channels = module.groups = len(keep_out)
        return
    if module.groups != 1:
        _thin_grouped(module, name, entry, keep_out)
        return
    _slice_param(module, "weight", 0, keep_out)
    _slice_param(module, "bias", 0, keep_out)
    _slice_param(module, "weight", 1, keep_in)
    module.out_channels, module.in_channels = len(keep_out), len(keep_in)


def _per_group(size: int, groups: int, removed: Sequence[int], name: str) -> int:
    """How many of each group's `size // groups` channels `removed` takes (the same in all)."""
    block = size // groups
    counts = {g: 0 for g in range(groups)}
    for index in removed:
        counts[int(index) // block] += 1
    if len(set(counts.values())) != 1:
        raise CheckpointError(f"thinning recipe removes different numbers of channels from the "
                              f"groups of the grouped convolution '{name}'")
    return counts[0]


def _thin_grouped(module: nn.Module, name: str, entry: dict[str, Any], keep_out: Tensor
                  ) -> None:
    """Slice a grouped convolution that loses the same number of channels in every group: its
    filters, and within each group of filters the inputs of that group it no longer reads."""
    groups, (out_size, in_size) = module.groups, module_sizes(module)
    _per_group(out_size, groups, entry.get("out", ()), name)
    lost = _per_group(in_size, groups, entry.get("in", ()), name)
    weight = module.weight.detach()
    block_in, block_out = in_size // groups, out_size // groups
    gone = set(int(i) for i in entry.get("in", ()))
    rows = []
    for g in range(groups):
        local = torch.tensor([i for i in range(block_in) if g * block_in + i not in gone],
                             dtype=torch.long, device=weight.device)
        rows.append(weight[g * block_out:(g + 1) * block_out].index_select(1, local))
    module.weight = nn.Parameter(torch.cat(rows).clone(), requires_grad=module.weight.requires_grad)
    _slice_param(module, "weight", 0, keep_out)
    _slice_param(module, "bias", 0, keep_out)
    module.out_channels, module.in_channels = len(keep_out), in_size - lost * groups


def apply_thinning_recipe(model: nn.Module, recipe: dict[str, Any]) -> nn.Module:
    """Give a freshly built model the thinned shapes a recipe records (values: any).

    Returns `model`, sliced in place; the caller records the recipe (in its description).
    """
    if not isinstance(recipe, dict) or recipe.get("version") != RECIPE_VERSION:
        raise CheckpointError("unsupported thinning recipe; re-run --thinnify with this version")
    modules = dict(model.named_modules())
    for name, entry in recipe.get("modules", {}).items():
        module = modules.get(name)
        if module is None or not is_thinnable(module):
            raise CheckpointError(f"thinning recipe names '{name}', which is not a thinnable "
                                  f"module of this model; rebuild with the checkpoint's arch")
        _thin_module(module, name, entry)
    for name, entry in recipe.get("parameters", {}).items():
        _thin_parameter(model, name, entry)
    for name, entry in recipe.get("attention", {}).items():
        module = modules.get(name)
        if module is None:
            raise CheckpointError(f"thinning recipe names the attention '{name}', which this "
                                  "model does not have; rebuild with the checkpoint's arch")
        size, kept = (int(v) for v in entry["head_dim"])
        set_head_dim(module, HeadLayout(int(entry["heads"]), size), kept)
    return model


def _thin_parameter(model: nn.Module, name: str, entry: dict[str, Any]) -> None:
    """Slice a per-channel parameter (a layer scale) the recipe records by its full name."""
    owner_name, _, attr = name.rpartition(".")
    try:
        owner = model.get_submodule(owner_name)
    except AttributeError:
        owner = None
    tensor = getattr(owner, attr, None)
    dim, size = int(entry["dim"]), int(entry["size"])
    if not isinstance(tensor, Tensor) or tensor.dim() <= dim or tensor.shape[dim] != size:
        raise CheckpointError(f"thinning recipe names the parameter '{name}' of {size} channels, "
                              "which this model does not have; rebuild with the checkpoint's "
                              "arch and attrs")
    _slice_param(owner, attr, dim, _keep(size, entry.get("removed", ())))


def compose_recipes(first: dict[str, Any] | None, second: dict[str, Any]) -> dict[str, Any]:
    """One recipe equal to applying `first` and then `second` (indices of the thinned model)."""
    if not first:
        return second
    merged = {name: {**entry, "out": list(entry.get("out", ())), "in": list(entry.get("in", ()))}
              for name, entry in first["modules"].items()}
    for name, entry in second["modules"].items():
        base = merged.get(name)
        if base is None:
            merged[name] = entry
            continue
        for dim, key in enumerate(("out", "in")):
            kept = _keep(base["sizes"][dim], base[key]).tolist()
            base[key] = sorted(set(base[key]) | {kept[i] for i in entry.get(key, ())})
        base["add_bias"] = bool(base.get("add_bias")) or bool(entry.get("add_bias"))
    parameters = {name: {**entry, "removed": list(entry.get("removed", ()))}
                  for name, entry in first.get("parameters", {}).items()}
    for name, entry in second.get("parameters", {}).items():
        base = parameters.get(name)
        if base is None:
            parameters[name] = entry
            continue
        kept = _keep(base["size"], base["removed"]).tolist()
        base["removed"] = sorted(set(base["removed"]) | {kept[i] for i in entry["removed"]})
    recipe: dict[str, Any] = {"version": RECIPE_VERSION, "modules": merged}
    if parameters:
        recipe["parameters"] = parameters
    attention = {name: dict(entry) for name, entry in first.get("attention", {}).items()}
    for name, entry in second.get("attention", {}).items():
        base = attention.setdefault(name, dict(entry))
        base["head_dim"] = [base["head_dim"][0], entry["head_dim"][1]]
    if attention:
        recipe["attention"] = attention
    return recipe
