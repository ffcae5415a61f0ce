"""Model assembly's lower half: the architecture registry and factory, the model families and
their layers, ModelDescription, and torchvision's pretrained weights."""

from compressor.models.description import ModelDescription, describe, description_of
from compressor.models.factory import create_model, get_arch_spec, list_archs
from compressor.models.registry import ArchSpec, register_model
from compressor.utils.input_spec import InputSpec

__all__ = ["ArchSpec", "InputSpec", "ModelDescription", "create_model", "describe",
           "description_of", "get_arch_spec", "list_archs", "register_model"]
