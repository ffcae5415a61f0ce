"""`--sense element|filter|channel`: accuracy as each layer alone is pruned harder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from compressor.commands.common import EvaluateFn
from compressor.reports.sensitivity import run_sensitivity, sensitivity_levels

__all__ = ["run_sensitivity_analysis"]


def run_sensitivity_analysis(model: nn.Module, evaluate_fn: EvaluateFn, kind: str,
                             sense_range: tuple[float, float, float],
                             run_dir: Path | None) -> list[dict[str, Any]]:
    """Prune each weight alone at each --sense-range level; sensitivity.csv/png in run_dir."""
    return run_sensitivity(model, evaluate_fn, kind, sensitivity_levels(*sense_range), run_dir)
