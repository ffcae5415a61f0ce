"""Caches some models fill in eval mode with what they derive from their parameters (timm's
LeViT and EfficientViT attention biases, indexed once and kept per device); they clear them
when set to training.

A forward that is not a real evaluation fills them with the wrong things: a forward with
gradients (Torch-Pruning's tracing) leaves tensors with autograd history, which
`copy.deepcopy` refuses, and a torch.fx trace leaves Proxy objects, whose copies break the
copied model. Whoever runs such a forward on a model in eval mode calls `drop_eval_caches`.
"""

from __future__ import annotations

from torch import nn

__all__ = ["drop_eval_caches"]


def drop_eval_caches(model: nn.Module) -> None:
    """Let `model`'s modules clear what they cached in eval mode (their train() does), keeping
    each module's training flag as it was."""
    modes = {module: module.training for module in model.modules()}
    model.train()
    for module, mode in modes.items():
        module.training = mode
