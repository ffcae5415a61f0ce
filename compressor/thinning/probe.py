"""A thinning rehearsal: thin a copy of the model in which each layer a schedule will thin has
lost one filter (or input channel), so that what thinning refuses on this architecture (a
slice or a fixed-size reshape its channel graph does not adjust, groups that never complete)
is refused when the schedule is loaded, before any epoch runs or any file is written."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor, nn

from compressor.thinning.thin import thin_model

__all__ = ["rehearse_thinning"]


def rehearse_thinning(model: nn.Module, inputs: Tensor, layers: Iterable[tuple[str, bool]],
                      blocks: Mapping[str, int] | None = None) -> None:
    """Thin a copy of `model` whose `layers` ((module name, True for its filters / False for
    its input channels)) each have their first filter or input channel zeroed (the first of
    each block where `blocks` names the pruner's channel_groups for the layer); thinning's
    refusals (UsageError) pass through, `model` is left as it was."""
    blocks = blocks or {}
    rehearsal = copy.deepcopy(model)
    with torch.no_grad():
        for name, outputs in layers:
            module = rehearsal.get_submodule(name)
            weight = getattr(module, "weight", None)
            if not isinstance(weight, Tensor) or weight.dim() < 2 or (
                    weight.shape[0 if outputs else 1] < 2):
                continue  # a layer of one filter is kept whole
            if outputs:
                count = blocks.get(name, 1)
                first = list(range(0, weight.shape[0], max(1, weight.shape[0] // count)))
                weight[first] = 0.0
                if isinstance(getattr(module, "bias", None), Tensor):
                    module.bias[first] = 0.0
            else:
                weight[:, 0] = 0.0
    thin_model(rehearsal, inputs=inputs)
