"""The statistics stage: calibration measures each quantizable tensor's range (min/max, mean,
standard deviation, histogram) over a few batches, and the activation-statistics file
(`acts_quantization_stats.yaml`, Distiller's format) is written, read back and checked here."""

from compressor.quantization.statistics.collect import collect_stats, tensor_stats
from compressor.quantization.statistics.stats_file import (
    STAT_KEYS,
    STATS_FILE_NAME,
    ActivationStats,
    dump_stats,
    load_stats,
    parse_stats,
    save_stats,
)

__all__ = [
    "collect_stats", "tensor_stats", "STATS_FILE_NAME", "STAT_KEYS", "ActivationStats",
    "load_stats", "parse_stats", "dump_stats", "save_stats",
]
