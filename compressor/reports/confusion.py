"""--confusion: the confusion matrix of the evaluated split (rows true, columns predicted).

Counted on the device, one bincount per batch and no host sync until the end; under DDP each
rank counts its shard and `reduce` sums the counts. A prediction outside the dataset's classes
(a model with more outputs than the dataset has classes) lands in a last column, `other`,
shown only when it is not empty. Rank 0 logs the table (tabulate) and writes confusion.csv and
confusion.png (a heatmap with counts) in the run directory.
"""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tabulate import tabulate
from torch import Tensor, nn

from compressor.training.losses import main_logits
from compressor.utils.atomic_io import atomic_write, atomic_write_text

__all__ = ["OTHER", "confusion_counts", "confusion_matrix", "per_class_top1", "confusion_labels",
           "format_confusion", "write_confusion_csv", "plot_confusion", "confusion_report"]

LOG = logging.getLogger("compressor")
Reduce = Callable[[Tensor], Tensor]

OTHER = "other"
PRINT_MAX_CLASSES = 20  # a larger matrix is not printed: the most frequent confusions are
ANNOTATE_MAX_CLASSES = 30  # the heatmap writes counts and class names up to this size
NAME_WIDTH = 12  # class names longer than this make indices the column headers
RESULTS_MAX_CLASSES = 100  # results.json gets per-class top-1 up to this many classes


def confusion_counts(logits: Tensor, target: Tensor, num_classes: int) -> Tensor:
    """One batch's flat counts, num_classes x (num_classes + 1): true * (N + 1) + predicted."""
    columns = num_classes + 1
    predicted = logits.argmax(dim=1).clamp_(max=num_classes)  # beyond the classes: `other`
    return torch.bincount(target.long() * columns + predicted, minlength=num_classes * columns)


@torch.no_grad()
def confusion_matrix(model: nn.Module, loader: Iterable[Any], device: torch.device,
                     num_classes: int, reduce: Reduce | None = None) -> Tensor:
    """Counts (int64, on the host) of (true, predicted) over a loader, summed over ranks.

    Returns:
        A num_classes x (num_classes + 1) matrix: rows true labels, columns predictions, the
        last column predictions of a label >= num_classes.
    """
    model.eval()
    counts = torch.zeros(num_classes * (num_classes + 1), dtype=torch.int64, device=device)
    for inputs, target in loader:
        logits = main_logits(model(inputs.to(device, non_blocking=True)))
        counts += confusion_counts(logits, target.to(device, non_blocking=True), num_classes)
    if reduce is not None:
        counts = reduce(counts)
    return counts.view(num_classes, num_classes + 1).cpu()


def per_class_top1(matrix: Tensor) -> list[float | None]:
    """Top-1 (%) of each true class: its diagonal count over its row (None: no samples)."""
    rows = matrix.sum(dim=1).tolist()
    hits = matrix.diagonal().tolist()
    return [None if total == 0 else 100.0 * hit / total
            for hit, total in zip(hits, rows, strict=True)]


def confusion_labels(num_classes: int, class_names: Sequence[str]) -> list[str]:
    """The classes' names in label order, or their indices when the names are not known."""
    if len(class_names) == num_classes:
        return [str(name) for name in class_names]
    return [str(index) for index in range(num_classes)]


def _shown(matrix: Tensor) -> Tensor:
    """The matrix without its `other` column when nothing landed there."""
    return matrix if int(matrix[:, -1].sum()) else matrix[:, :-1]


def format_confusion(matrix: Tensor, labels: Sequence[str]) -> str:
    """The matrix as a tabulate table (with per-class top-1), or its most frequent confusions."""
    shown, top1 = _shown(matrix), per_class_top1(matrix)
    count = len(labels)
    if count > PRINT_MAX_CLASSES:
        off = matrix.clone()
        off[:, :count].fill_diagonal_(0)
        values, flat = off.flatten().topk(min(10, off.numel()))
        pairs = [[labels[i // off.shape[1]],
                  OTHER if i % off.shape[1] == count else labels[i % off.shape[1]], int(v)]
                 for v, i in zip(values.tolist(), flat.tolist(), strict=True) if v > 0]
        return (f"{count} classes: the full matrix is in confusion.csv; most frequent "
                f"confusions:\n" + tabulate(pairs, headers=["true", "predicted", "count"],
                                            tablefmt="github", disable_numparse=[0, 1]))
    named = max((len(label) for label in labels), default=0) <= NAME_WIDTH
    columns = list(labels) if named else [str(i) for i in range(count)]
    columns += [OTHER] if shown.shape[1] > count else []
    body = [[label if named or label == str(i) else f"{i} {label}", *values, hit]
            for i, (label, values, hit) in enumerate(zip(labels, shown.tolist(), top1,
                                                         strict=True))]
    # class names stay text: a folder named 007 is not the number 7
    return tabulate(body, headers=["true \\ predicted", *columns, "top-1 (%)"],
                    tablefmt="github", floatfmt=".2f", missingval="-", disable_numparse=[0])


def write_confusion_csv(matrix: Tensor, labels: Sequence[str], path: Path) -> None:
    """Counts only: a header of predicted labels, then one row per true label."""
    shown = _shown(matrix)
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(["true \\ predicted", *labels, *([OTHER] if shown.shape[1] > len(labels)
                                                     else [])])
    for label, values in zip(labels, shown.tolist(), strict=True):
        writer.writerow([label, *values])
    atomic_write_text(path, text.getvalue())


def plot_confusion(matrix: Tensor, labels: Sequence[str], path: Path) -> None:
    """A heatmap of the counts (annotated, with class names, when there are few classes)."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed

    shown = _shown(matrix).numpy()
    count = len(labels)
    side = min(4.0 + 0.45 * count, 16.0)
    figure = Figure(figsize=(side + 1.5, side))
    axes = figure.add_subplot()
    image = axes.imshow(shown, cmap="Blues", interpolation="nearest", aspect="auto")
    figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04)
    if count <= ANNOTATE_MAX_CLASSES:
        columns = [*labels, OTHER][:shown.shape[1]]
        axes.set_xticks(range(len(columns)), columns, rotation=90, fontsize=8)
        axes.set_yticks(range(count), labels, fontsize=8)
        threshold = shown.max() / 2 if shown.size else 0
        for (row, column), value in np.ndenumerate(shown):
            axes.text(column, row, str(int(value)), ha="center", va="center", fontsize=7,
                      color="white" if value > threshold else "black")
    axes.set_xlabel("predicted")
    axes.set_ylabel("true")
    axes.set_title(f"Confusion matrix ({int(shown.sum())} samples)")
    atomic_write(path, lambda handle: figure.savefig(handle, format="png", dpi=100,
                                                     bbox_inches="tight"))


def confusion_report(model: nn.Module, loader: Iterable[Any], device: torch.device, *,
                     num_classes: int, class_names: Sequence[str] = (),
                     run_dir: Path | None = None, reduce: Reduce | None = None
                     ) -> dict[str, Any]:
    """Count, log and write the confusion matrix of a split; returns a summary for results.json.

    Args:
        model: the model to evaluate (eval mode is set here).
        loader: the split's loader (under DDP, this rank's shard).
        device: where the model is; the counting happens there.
        num_classes: size of the dataset's label space (rows).
        class_names: names in label order (indices when there are none).
        run_dir: where confusion.csv and confusion.png go; None writes nothing (other ranks).
        reduce: sums a tensor over ranks (DDP); None when running alone.

    Returns:
        {"confusion_samples": N, "per_class_top1": {name: % or None}} (the second key only up
        to RESULTS_MAX_CLASSES classes; the CSV has them all).
    """
    matrix = confusion_matrix(model, loader, device, num_classes, reduce)
    labels = confusion_labels(num_classes, class_names)
    samples = int(matrix.sum())
    LOG.info("confusion matrix (%d samples; rows true, columns predicted)\n%s", samples,
             format_confusion(matrix, labels))
    if run_dir is not None:
        write_confusion_csv(matrix, labels, run_dir / "confusion.csv")
        plot_confusion(matrix, labels, run_dir / "confusion.png")
    summary: dict[str, Any] = {"confusion_samples": samples}
    if num_classes <= RESULTS_MAX_CLASSES:
        top1 = per_class_top1(matrix)
        summary["per_class_top1"] = {label: None if hit is None else round(hit, 4)
                                     for label, hit in zip(labels, top1, strict=True)}
    return summary
