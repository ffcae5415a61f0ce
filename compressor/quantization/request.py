"""What a run asks of post-training quantization: the step (simulate, convert to int8 kernels,
calibrate only) and the one `QuantSettings` it quantizes with.

The command line's --qe-* flags, a --qe-config-file YAML and `quantize_int8`'s arguments all
become a `QuantSettings` (compressor.quantization.core.settings) through Distiller's quantizer
keys; this request only adds what the run does with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from compressor.quantization.core.settings import QuantSettings

__all__ = ["QuantizeRequest"]


@dataclass(frozen=True)
class QuantizeRequest:
    """Post-training quantization of a run (Distiller's --qe* flags) and its settings."""

    settings: QuantSettings = field(default_factory=QuantSettings)  # the --qe-* flags'
    quantize: bool = False  # --qe: quantize the float model (simulated)
    convert: bool = False  # --qe-convert-pytorch: run it on int8 kernels
    backend: str = "auto"
    calibration: float | None = None  # --qe-calibration: the fraction to collect stats on
    calibration_split: str = "train"  # where calibration reads: "train" (eval transforms), "test"
    stats_file: Path | None = None
    dynamic: bool = False
    config_file: Path | None = None  # --qe-config-file: its settings replace `settings`

    @property
    def calibrate_only(self) -> bool:
        """--qe-calibration alone: collect statistics, write them, quantize nothing."""
        return self.calibration is not None and not (self.quantize or self.convert)
