"""`thin`: remove a pruned model's zeroed filters and channels, as `--thinnify` does."""

from __future__ import annotations

from typing import Any

from torch import nn

from compressor.api.identity import ensure_described
from compressor.quantization.recipe import quantization_kind
from compressor.thinning.transform import thin as thin_in_place
from compressor.utils.errors import UsageError

__all__ = ["thin"]


def thin(model: nn.Module, example_inputs: Any = None) -> nn.Module:
    """Physically remove the zeroed filters and channels of `model`, in place (exactly: the
    thin model computes what the pruned one did).

    The thinning recipe is recorded in the model's description, so a checkpoint written by
    save_checkpoint rebuilds the smaller model. Parameters are replaced: an optimizer made
    before thinning must be made again.

    Args:
        model: a pruned model (zeroed filters, channels or rows), float.
        example_inputs: a batch of inputs (N x C x H x W), needed for a model compressor did not
            build; thinning follows the layers' dependencies on a batch of that size.

    Returns:
        `model`, thinned.
    """
    description = ensure_described(model, example_inputs, "thin")
    if quantization_kind(description) == "post_train":
        raise UsageError("thin: the model is post-training quantized, and thinning needs a float "
                         "model; thin first, then quantize")
    thin_in_place(model)
    return model
