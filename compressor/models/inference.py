"""A frozen model's fast inference copy: batch norms folded into their convolutions, and
channels-last memory for image batches (oneDNN's and cuDNN's preferred layout).

The copy computes the same function as the model in eval mode (to float rounding: folding
reorders the arithmetic); it is for models whose weights no longer change while it is used (a
distillation teacher, a search scoring candidates). Folding is torch.fx's
`experimental.optimization.fuse`; a model torch.fx cannot trace is copied unfolded.
"""

from __future__ import annotations

import copy
import logging

import torch
from torch import Tensor, nn
from torch.fx.experimental.optimization import fuse

__all__ = ["InferenceCopy", "inference_copy"]

LOG = logging.getLogger("compressor")


class InferenceCopy(nn.Module):
    """Runs a folded, channels-last copy of a model on batches made channels-last."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: Tensor) -> object:
        """The copy's output for `inputs` (4-D batches made channels-last first)."""
        if inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return self.model(inputs)


def inference_copy(model: nn.Module) -> InferenceCopy:
    """An eval-mode copy of `model` with its batch norms folded (where torch.fx can trace it)
    and its 4-D weights channels-last; `model` itself is left as it was."""
    frozen = copy.deepcopy(model).eval().requires_grad_(False)
    try:
        folded: nn.Module = fuse(frozen)
    except Exception as exc:  # noqa: BLE001 - any untraceable forward: run it unfolded
        LOG.debug("inference copy of %s left unfolded: %s", type(model).__name__, exc)
        folded = frozen
    return InferenceCopy(folded.to(memory_format=torch.channels_last)).eval()
