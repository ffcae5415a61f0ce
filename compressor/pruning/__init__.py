"""Pruners under Distiller's class names: element-wise, gradual (AGP), structured, random."""

from compressor.pruning.apoz import ActivationAPoZRankedFilterPruner
from compressor.pruning.base import LevelPruner, Pruner, PruneStep, agp_sparsity
from compressor.pruning.groups import GROUP_TYPES, element_mask, group_norms, sparsity
from compressor.pruning.magnitude import (
    AutomatedGradualPruner,
    MagnitudeParameterPruner,
    PerWeightPruner,
    SensitivityPruner,
    SparsityLevelParameterPruner,
    SplicingPruner,
)
from compressor.pruning.random_ranked import RandomRankedFilterPruner
from compressor.pruning.structured import (
    BernoulliFilterPruner,
    RandomLevelStructureParameterPruner,
    RankedStructurePruner,
    StructurePruner,
)

__all__ = [
    "Pruner", "LevelPruner", "PruneStep", "agp_sparsity", "GROUP_TYPES", "element_mask",
    "group_norms", "sparsity", "PerWeightPruner", "MagnitudeParameterPruner",
    "SparsityLevelParameterPruner", "AutomatedGradualPruner", "SensitivityPruner",
    "SplicingPruner", "StructurePruner", "RankedStructurePruner",
    "RandomLevelStructureParameterPruner", "BernoulliFilterPruner",
    "ActivationAPoZRankedFilterPruner", "RandomRankedFilterPruner",
]
