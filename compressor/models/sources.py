"""Where an architecture name points: the registry, timm (`timm/NAME`) or the user's own code
(`path/to/file.py:Name`, `package.module:Name`). Names only: nothing here imports timm or code."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["TIMM_PREFIX", "is_timm_arch", "is_code_reference", "arch_dir_name"]

TIMM_PREFIX = "timm/"
# `file.py:Name` or `package.module:Name`: a colon, then a Python identifier
_CODE_REFERENCE = re.compile(r"^(?P<module>[^:]+):(?P<name>[A-Za-z_][A-Za-z0-9_]*)$")


def is_timm_arch(arch: str) -> bool:
    """Whether `arch` names a timm model (`timm/NAME`)."""
    return arch.startswith(TIMM_PREFIX)


def is_code_reference(arch: str) -> bool:
    """Whether `arch` names the user's own code (`path/to/file.py:Name` or `pkg.module:Name`)."""
    return _CODE_REFERENCE.match(arch) is not None and not is_timm_arch(arch)


def arch_dir_name(arch: str) -> str:
    """`arch` as one path component (a run directory's default name): `timm/convnext_atto` ->
    `timm-convnext_atto`, `models/net.py:Net` -> `net.py-Net`."""
    if is_code_reference(arch):
        module, name = arch.rsplit(":", 1)
        arch = f"{Path(module).name}-{name}"
    return re.sub(r"[^A-Za-z0-9_.+-]", "-", arch)
