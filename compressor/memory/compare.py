"""Train two models side by side and report how far apart they drift (a variant's exactness)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from compressor.utils.config import OptimizerConfig, make_optimizer

__all__ = ["training_divergence", "flat_outputs", "square_loss"]


def flat_outputs(output: Any) -> list[Tensor]:
    """Every tensor of a model output (a tensor, a namedtuple of heads, a list ...)."""
    if isinstance(output, Tensor):
        return [output]
    if isinstance(output, dict):
        output = list(output.values())
    return [t for item in output if item is not None for t in flat_outputs(item)]


def square_loss(output: Any) -> Tensor:
    """Mean of squares of every output tensor: a loss with non-trivial gradients everywhere."""
    return sum(t.pow(2).mean() for t in flat_outputs(output))


@torch.no_grad()
def _max_diff(a: list[Tensor | None], b: list[Tensor | None]) -> float:
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        if (x is None) != (y is None):
            return float("inf")
        if x is None or torch.equal(x, y):
            continue
        if x.shape != y.shape:
            return float("inf")
        worst = max(worst, float((x - y).abs().max()))
    return worst


def training_divergence(reference: nn.Module, variant: nn.Module, inputs: Tensor, *,
                        steps: int = 2, loss_fn: Callable[[Any], Tensor] | None = None,
                        lr: float = 0.05, seed: int = 0) -> dict[str, float]:
    """Largest absolute differences between two models trained on the same batches with SGD.

    Both models must start from the same weights. Each step reseeds the RNG before each
    model's forward (so dropout draws the same masks), and compares the outputs, the input
    gradient and every parameter gradient; after the SGD update, the parameters and every
    buffer (batch-norm running_mean, running_var and num_batches_tracked). Returns the
    maximum over steps for each of those five, keyed by name, and under "grad_scale" the
    largest absolute parameter gradient of the reference (to judge float32 round-off).
    """
    loss_fn = loss_fn or square_loss
    worst = dict.fromkeys(("outputs", "input_grad", "param_grads", "params", "buffers"), 0.0)
    scale = 0.0
    config = OptimizerConfig(lr=lr, momentum=0.9, weight_decay=0.0)
    optimizers = [make_optimizer(m.parameters(), config) for m in (reference, variant)]
    for step in range(steps):
        results = []
        for model, optimizer in zip((reference, variant), optimizers, strict=True):
            x = inputs.detach().clone().requires_grad_(True)
            torch.manual_seed(seed + step)
            optimizer.zero_grad(set_to_none=True)
            output = model(x)
            loss_fn(output).backward()
            results.append(([t.detach() for t in flat_outputs(output)], x.grad,
                            [p.grad for p in model.parameters()]))
            optimizer.step()
        (out_a, gx_a, g_a), (out_b, gx_b, g_b) = results
        scale = max([scale] + [float(g.abs().max()) for g in g_a if g is not None and g.numel()])
        found = {
            "outputs": _max_diff(out_a, out_b),
            "input_grad": _max_diff([gx_a], [gx_b]),
            "param_grads": _max_diff(g_a, g_b),
            "params": _max_diff(list(reference.parameters()), list(variant.parameters())),
            "buffers": _max_diff(list(reference.buffers()), list(variant.buffers())),
        }
        for key, value in found.items():
            worst[key] = max(worst[key], value)
    return {**worst, "grad_scale": scale}
