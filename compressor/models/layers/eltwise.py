"""Element-wise operations as modules, so that each residual add, product or concatenation has a
name (`layer1.0.add`) that activation statistics, quantizers and their overrides can address.

Distiller's `distiller.modules` introduced them for the same reason. They hold no parameters
or buffers, so adding one to a model changes no state_dict key. torch.fx traces through them
(they are not leaf modules by default), giving the same graph as the bare operators.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["EltwiseAdd", "EltwiseMult", "Concat"]


class _Eltwise(nn.Module):
    """Folds its inputs left to right with one binary operation; in place into the first."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def extra_repr(self) -> str:
        """Shows `inplace=True` when set."""
        return "inplace=True" if self.inplace else ""

    def combine(self, result: Tensor, other: Tensor) -> Tensor:
        """One step of the fold."""
        raise NotImplementedError

    def forward(self, *inputs: Tensor) -> Tensor:
        """The fold of the inputs, left to right."""
        result = inputs[0]
        for other in inputs[1:]:
            result = self.combine(result, other)
        return result


class EltwiseAdd(_Eltwise):
    """The sum of its inputs; `inplace=True` accumulates into the first input (as `+=`)."""

    def combine(self, result: Tensor, other: Tensor) -> Tensor:
        """result + other."""
        return result.add_(other) if self.inplace else result + other


class EltwiseMult(_Eltwise):
    """The element-wise product of its inputs; `inplace=True` multiplies into the first."""

    def combine(self, result: Tensor, other: Tensor) -> Tensor:
        """result * other."""
        return result.mul_(other) if self.inplace else result * other


class Concat(nn.Module):
    """torch.cat of its inputs along `dim`."""

    def __init__(self, dim: int = 0) -> None:
        super().__init__()
        self.dim = dim

    def extra_repr(self) -> str:
        """The concatenation dimension."""
        return f"dim={self.dim}"

    def forward(self, *inputs: Tensor) -> Tensor:
        """The inputs concatenated along `dim`."""
        return torch.cat(inputs, dim=self.dim)
