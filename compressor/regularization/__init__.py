"""Regularizers that a compression schedule adds to the training loss."""

from compressor.regularization.regularizers import (
    REGULARIZER_GROUPS,
    THRESHOLD_CRITERIA,
    GroupLassoRegularizer,
    GroupVarianceRegularizer,
    L1Regularizer,
    Regularizer,
)

__all__ = ["Regularizer", "L1Regularizer", "GroupLassoRegularizer", "GroupVarianceRegularizer",
           "THRESHOLD_CRITERIA", "REGULARIZER_GROUPS"]
