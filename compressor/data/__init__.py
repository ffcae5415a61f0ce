"""Datasets (one row each in compressor.utils.dataset_table): their loaders, file formats,
splits and image transforms."""

from compressor.data.load import (
    DATASET_NAMES,
    load_calibration_dataset,
    load_datasets,
    load_test_dataset,
    needs_data_dir,
)
from compressor.data.splits import DatasetSplits, EvaluationData
from compressor.data.transforms import build_transforms

__all__ = ["DATASET_NAMES", "DatasetSplits", "EvaluationData", "build_transforms",
           "load_calibration_dataset", "load_datasets", "load_test_dataset", "needs_data_dir"]
