"""Reports beside metrics.csv: TensorBoard scalars, mask sparsity tables, confusion matrices."""

from compressor.reports.confusion import confusion_matrix, confusion_report
from compressor.reports.epoch import EpochReports, open_epoch_reports
from compressor.reports.sparsity import LayerSparsity, layer_sparsities, masks_sparsity_table
from compressor.reports.tensorboard import SCALARS_HOOK, require_tensorboard

__all__ = ["EpochReports", "open_epoch_reports", "confusion_matrix", "confusion_report",
           "LayerSparsity", "layer_sparsities", "masks_sparsity_table", "SCALARS_HOOK",
           "require_tensorboard"]
