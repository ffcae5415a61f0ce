"""Datasets (one row each in compressor.utils.dataset_table): their loaders, file formats,
splits and image transforms."""

from compressor.data.image_transforms import build_transforms
from compressor.data.load import (
    DATASET_NAMES,
    load_calibration_dataset,
    load_datasets,
    load_test_dataset,
    needs_data_dir,
)
from compressor.data.splits import DatasetSplits, EvaluationData

__all__ = ["DATASET_NAMES", "DatasetSplits", "EvaluationData", "build_transforms",
           "load_calibration_dataset", "load_datasets", "load_test_dataset", "needs_data_dir"]
