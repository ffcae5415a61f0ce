"""Model assembly's lower half: the architecture registry and factory, the model families and
their layers, ModelDescription, and torchvision's pretrained weights.

The factory's names load lazily: importing the factory imports every family, torchvision's
classifiers among them (seconds); code that only reads a ModelDescription (a checkpoint
reader, say) does not pay for that.
"""

from typing import Any

from compressor.models.description import ModelDescription, describe, description_of
from compressor.models.registry import ArchSpec, register_model
from compressor.utils.input_spec import InputSpec

__all__ = ["ArchSpec", "InputSpec", "ModelDescription", "create_model", "describe",
           "description_of", "get_arch_spec", "list_archs", "register_model"]

_FACTORY_NAMES = ("create_model", "get_arch_spec", "list_archs")


def __getattr__(name: str) -> Any:
    """compressor.models.factory's names, imported on first use (PEP 562)."""
    if name in _FACTORY_NAMES:
        from compressor.models import factory

        return getattr(factory, name)
    raise AttributeError(f"module 'compressor.models' has no attribute '{name}'")
