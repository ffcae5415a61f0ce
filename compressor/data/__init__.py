"""Datasets (digits, mnist, fashion-mnist, cifar10/100, imagenet, synthetic) and transforms."""

from compressor.data.load import DATASET_NAMES, load_datasets, needs_data_dir
from compressor.data.splits import DatasetSplits
from compressor.data.transforms import build_transforms

__all__ = ["DATASET_NAMES", "DatasetSplits", "build_transforms", "load_datasets",
           "needs_data_dir"]
