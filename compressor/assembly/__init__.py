"""Model assembly's upper half: the recipe table (each method's structural Transform), the
builder that replays a description's recipes, a model's weights in and out of a checkpoint
through the recipes' hooks, and resolving a run's model from an arch or a checkpoint."""

from compressor.assembly.builder import build_model
from compressor.assembly.recipes import TRANSFORMS, Transform, get_transform
from compressor.assembly.setup import (
    ResolvedModel,
    RunSetup,
    build_resolved_model,
    load_model,
    resolve_model,
    resolve_run,
)
from compressor.assembly.state import assemble_checkpoint, load_weights, plain_state_dict

__all__ = ["TRANSFORMS", "Transform", "get_transform", "build_model", "ResolvedModel",
           "RunSetup", "build_resolved_model", "load_model", "resolve_model", "resolve_run",
           "assemble_checkpoint", "load_weights", "plain_state_dict"]
