"""The architecture registry and the model families it holds."""

from compressor.models.input_spec import InputSpec
from compressor.models.registry import (
    ArchSpec,
    create_model,
    get_arch_spec,
    list_archs,
    register_model,
)

__all__ = ["ArchSpec", "InputSpec", "create_model", "get_arch_spec", "list_archs",
           "register_model"]
