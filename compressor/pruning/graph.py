"""Which batch-norm module directly consumes a layer's output, found by tracing with torch.fx."""

from __future__ import annotations

from collections.abc import Iterable

import torch.fx
from torch import nn

from compressor.models.eval_caches import drop_eval_caches

__all__ = ["following_batchnorms"]


# Modules traced as one call_module node whatever their forward does inside: batch norms (in-place
# ABN too), and the layers whose weights are pruned, including subclasses from outside torch.nn
# (efficientnet's Conv2dStaticSamePadding pads, then calls F.conv2d: traced through, the layer
# would have no node of its own, and the batch norm after it would go unmasked)
_LEAVES = (nn.modules.batchnorm._BatchNorm, nn.modules.conv._ConvNd, nn.Linear)


class _NormLeafTracer(torch.fx.Tracer):
    """A tracer that keeps every batch norm and every convolution / linear layer as one
    call_module node."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        """Batch norms, convolutions and linear layers are leaves."""
        return isinstance(m, _LEAVES) or super().is_leaf_module(m, module_qualified_name)


def following_batchnorms(model: nn.Module, module_names: Iterable[str]) -> dict[str, str | None]:
    """For each module name, the BatchNorm module that is the only user of its output, if any.

    Raises:
        ValueError: one line, when torch.fx cannot trace the model.
    """
    wanted = set(module_names)
    try:
        graph = _NormLeafTracer().trace(model)
    except Exception as exc:  # tracing fails on data-dependent control flow
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"torch.fx cannot trace {type(model).__name__} ({reason})") from exc
    finally:
        drop_eval_caches(model)  # the trace left Proxy objects in them
    modules = dict(model.named_modules())
    found: dict[str, str | None] = dict.fromkeys(wanted)
    for node in graph.nodes:
        if node.op != "call_module" or node.target not in wanted:
            continue
        users = list(node.users)
        if len(users) == 1 and users[0].op == "call_module":
            user = modules.get(str(users[0].target))
            if isinstance(user, nn.modules.batchnorm._BatchNorm):
                found[str(node.target)] = str(users[0].target)
    return found
