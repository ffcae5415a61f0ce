"""TensorBoard scalars of a training run (--tensorboard), one step per epoch.

Written with torch.utils.tensorboard's SummaryWriter under <run_dir>/tensorboard/ (its event
file is appended to, the one file the project writes without compressor.utils.atomic_io's atomic
write); metrics.csv stays the source of truth. Tags:

    loss/train loss/val top1/train top1/val top5/train top5/val lr time/train cpu_time/train
        every numeric metrics.csv column: train_X -> X/train, val_X -> X/val
    sparsity/weights/<param> sparsity/weights/total   % of zeros of conv/linear weights
    sparsity/masks/<param> sparsity/masks/total       % of zeros of the pruning masks
    compression/<instance>/<key>                      what a schedule's objects offer

The last group is the seam for compression methods (quantization ranges, regularizer terms):
a policy of the schedule, or the object it drives (pruner, regularizer, quantizer, LR scheduler,
extension), that has a method `tensorboard_scalars() -> dict[str, float]` has its scalars
logged at the end of every epoch under compression/<the policy's instance name>/<key>.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from compressor.reports.sparsity import LayerSparsity, total_sparsity
from compressor.utils.errors import UsageError

__all__ = ["INSTALL_HINT", "SCALARS_HOOK", "require_tensorboard", "row_scalars",
           "sparsity_scalars", "compression_scalars", "TensorBoardLog"]

INSTALL_HINT = "pip install -e '.[tensorboard]'"
SCALARS_HOOK = "tensorboard_scalars"
# The attributes under which a schedule's policies hold what they drive.
_COMPONENTS = ("pruner", "regularizer", "quantizer", "scheduler", "extension")
_SPLITS = ("train", "val")


def require_tensorboard() -> Callable[..., Any]:
    """torch's SummaryWriter class; a UsageError naming the extra when tensorboard is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"--tensorboard needs the tensorboard package ({reason}); install it "
                         f"with `{INSTALL_HINT}`, or drop --tensorboard") from None
    return SummaryWriter


def row_scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The numeric columns of a metrics.csv row as tags: train_loss -> loss/train, lr -> lr."""
    scalars: dict[str, float] = {}
    for key, value in row.items():
        if key == "epoch" or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        tag = key
        for split in _SPLITS:
            if key.startswith(f"{split}_"):
                tag = f"{key[len(split) + 1:]}/{split}"
                break
        scalars[tag] = float(value)
    return scalars


def sparsity_scalars(layers: list[LayerSparsity]) -> dict[str, float]:
    """Per-layer and total sparsity (%) of the weights and, where there are some, the masks."""
    scalars = {f"sparsity/weights/{layer.name}": layer.weight for layer in layers}
    scalars.update({f"sparsity/masks/{layer.name}": layer.mask for layer in layers
                    if layer.mask is not None})
    weight_total, mask_total = total_sparsity(layers)
    if layers:
        scalars["sparsity/weights/total"] = weight_total
    if mask_total is not None:
        scalars["sparsity/masks/total"] = mask_total
    return scalars


def _scalar_sources(compression: Any) -> Iterator[tuple[str, Any]]:
    """(instance name, object) of every policy or policy component offering the hook, once."""
    seen: set[int] = set()
    for policy in getattr(compression, "policies", None) or ():
        name = str(getattr(policy, "instance_name", type(policy).__name__))
        for source in (policy, *(getattr(policy, attr, None) for attr in _COMPONENTS)):
            if callable(getattr(source, SCALARS_HOOK, None)) and id(source) not in seen:
                seen.add(id(source))
                yield name, source


def compression_scalars(compression: Any) -> dict[str, float]:
    """compression/<instance>/<key> for each `tensorboard_scalars()` of the schedule's objects."""
    scalars: dict[str, float] = {}
    for name, source in _scalar_sources(compression):
        for key, value in getattr(source, SCALARS_HOOK)().items():
            scalars[f"compression/{name}/{key}"] = float(value)
    return scalars


class TensorBoardLog:
    """Scalars of each epoch under log_dir; the writer opens at the first epoch it writes.

    It opens with purge_step at that epoch: a resumed run hides the steps that a crashed run
    logged after its last checkpoint, so each epoch appears once.
    """

    def __init__(self, open_writer: Callable[..., Any], log_dir: Path) -> None:
        self.open_writer = open_writer  # SummaryWriter, or a stand-in with its methods
        self.log_dir = log_dir
        self._writer: Any = None

    def write(self, epoch: int, scalars: Mapping[str, float]) -> None:
        """Add every scalar at step `epoch`, then flush (TensorBoard can follow a live run)."""
        if self._writer is None:
            self._writer = self.open_writer(log_dir=str(self.log_dir), purge_step=epoch)
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, value, epoch)
        self._writer.flush()

    def close(self) -> None:
        """Close the event file (nothing to do when no epoch was written)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
