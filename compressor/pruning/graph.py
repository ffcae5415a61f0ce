"""Which batch-norm module directly consumes a layer's output, found by tracing with torch.fx."""

from __future__ import annotations

from collections.abc import Iterable

import torch.fx
from torch import nn

__all__ = ["following_batchnorms"]


def following_batchnorms(model: nn.Module, module_names: Iterable[str]) -> dict[str, str | None]:
    """For each module name, the BatchNorm module that is the only user of its output, if any."""
    wanted = set(module_names)
    try:
        graph = torch.fx.symbolic_trace(model).graph
    except Exception as exc:  # tracing fails on data-dependent control flow
        raise ValueError(f"cannot trace {type(model).__name__} to find batch norms: {exc}") from exc
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
