"""The architecture registry and the model families it holds."""

from compressor.models.description import ModelDescription, describe, description_of
from compressor.models.input_spec import InputSpec
from compressor.models.registry import (
    ArchSpec,
    create_model,
    get_arch_spec,
    list_archs,
    register_model,
)

__all__ = ["ArchSpec", "InputSpec", "ModelDescription", "create_model", "describe",
           "description_of", "get_arch_spec", "list_archs", "register_model"]
