"""Module and parameter names as the unwrapped model has them (STYLE: accept Distiller's
`module.` on input, never require it)."""

from __future__ import annotations

__all__ = ["WRAPPER_PARTS", "canonical_name"]

# DataParallel / DistributedDataParallel's `module`, torch.compile's `_orig_mod`: Distiller's
# names carry them anywhere (`module.conv1.weight`, `features.module.0.weight`).
WRAPPER_PARTS = ("module", "_orig_mod")


def canonical_name(name: str) -> str:
    """`name` without any wrapper part: `features.module.0.weight` -> `features.0.weight`."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_PARTS)
