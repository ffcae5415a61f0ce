"""thin_model: physically remove zeroed filters/channels, checked against the model's outputs.

compressor.thinning.plan finds what can go (and folds the constants a dead channel carries);
this applies it to a working copy, checks the copy computes what the model did, and only then
changes the model.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from compressor.models.description import description_of
from compressor.thinning.graph_guard import run_thinned
from compressor.thinning.plan import find_thinning
from compressor.thinning.recipe import apply_thinning_recipe
from compressor.thinning.renormalize import renormalized, renormalized_norms
from compressor.training.losses import main_logits
from compressor.utils.errors import CompressorError, UsageError

__all__ = ["thin_model"]


def _probe_batch(model: nn.Module) -> Tensor:
    """A random batch of two at the model's InputSpec (from its ModelDescription)."""
    try:
        spec = description_of(model).input_spec
    except ValueError:
        raise UsageError("thin_model needs `inputs` for a model without a ModelDescription; "
                         "pass a batch or build the model with create_model") from None
    param = next(model.parameters())
    return torch.randn(2, *spec.input_size, device=param.device, dtype=param.dtype)


def _working_copy(model: nn.Module, inputs: Tensor) -> tuple[nn.Module, Tensor, Tensor]:
    """A copy of `model` to thin, the inputs to check it on, and its outputs on them.

    In float64 where the model runs in it: float32 rounds every sum by about 1e-7 of its
    terms, which passes 1e-5 of the logits where activations are large beside them (random
    data through a trained network) or a fold adds up hundreds of constants; float64 rounding
    is far below the tolerance, so any error left is thinning's own. The folded constants are
    computed in float64 too, and rounded once, when the model takes the copy's values.
    """
    if inputs.is_floating_point() and inputs.dtype != torch.float64:
        try:
            work = copy.deepcopy(model).double()
            precise = inputs.double()
            with torch.no_grad():
                return work, precise, main_logits(work(precise))
        except (RuntimeError, TypeError):
            pass  # no float64 on this device (MPS), or a forward that fixes its own dtype
    work = copy.deepcopy(model)
    with torch.no_grad():
        return work, inputs, main_logits(work(inputs))


def _as(model: nn.Module, inputs: Tensor) -> nn.Module:
    """A copy of `model` in the working copy's dtype (that of `inputs`)."""
    return copy.deepcopy(model).to(inputs.dtype) if inputs.is_floating_point() else (
        copy.deepcopy(model))


def thin_model(model: nn.Module, *, exact: bool = True, inputs: Tensor | None = None,
               atol: float = 1e-5) -> dict[str, Any]:
    """Remove zeroed filters/channels of `model` in place and return this thinning's recipe.

    A channel goes when every layer producing it has an all-zero filter, or when every layer
    reading it has an all-zero input channel (column). The constant a dead channel may still
    carry (a bias, a batch norm's shift, through its activation) is folded into the next
    layer's bias; where zero padding makes that inexact the channel is kept, unless
    `exact=False` (then the interior value is folded, close to what Distiller's thinning did).
    The result is checked against the original outputs on `inputs` (default: a random batch
    at the model's InputSpec), in eval mode, in float64 where the model runs in it. A layer
    that would lose every filter or every input is refused (UsageError), and `model` is left
    unchanged. The recipe's indices are those of `model` as it was: compose it with an
    earlier recipe (compose_recipes) to get one for the freshly built model; nothing is
    recorded on `model`.
    """
    if inputs is None:
        inputs = _probe_batch(model)
    was_training = model.training
    model.eval()
    try:
        # folds and slices happen on the copy; `model` stays intact until the check passes
        work, inputs, reference = _working_copy(model, inputs)
        recipe, _ = find_thinning(work, inputs, exact)
        if renormalized_norms(model, recipe):  # a LayerNorm keeps fewer channels: by design
            with torch.no_grad(), renormalized(_as(model, inputs), recipe) as renormalizing:
                reference = main_logits(renormalizing(inputs))
        apply_thinning_recipe(work, recipe)
        error = float((run_thinned(work, inputs, recipe) - reference).abs().max())
        if exact and error > atol * max(1.0, float(reference.abs().max())):
            raise CompressorError(
                f"thinning would change the model's outputs by {error:.3g}; this is a bug in "
                f"compressor.thinning for this architecture, please report it")
        apply_thinning_recipe(model, recipe)
        model.load_state_dict(work.state_dict())
    finally:
        model.train(was_training)
    return recipe
