"""The results table a run prints last: each figure formatted once, on purpose, as text (see
compressor.reports.numbers for why tabulate must not re-parse it)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from tabulate import tabulate

from compressor.reports.numbers import fixed, integer, percent, significant
from compressor.utils.dataset_table import FOLDER

__all__ = ["dataset_label", "results_rows", "results_table"]

# (label, results.json key, format), in the order printed; a key the run lacks is not shown
_ROWS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("top-1 (%)", "top1", fixed),
    ("top-5 (%)", "top5", fixed),  # only with more than 5 classes (training.loop.reports_top5)
    ("loss", "loss", significant),
    ("kernels", "kernels", str),
    ("bits (acts/wts)", "bits", str),
    ("stats", "stats_file", str),
    ("weight sparsity (%)", "sparsity", percent),
    ("quantized weights at 0, pruned or rounded (%)", "quantized_zero_weights", percent),
    ("params", "params", integer),
    ("params before thinning", "params_before_thinning", integer),
    ("MACs", "macs", integer),
    ("test samples", "samples", integer),
    ("time (s)", "time", lambda seconds: fixed(seconds, 1)),
)


def dataset_label(dataset: str, data_dir: str | None) -> str:
    """The dataset as the user knows it: its name, and a folder dataset by its directory's
    name (`folder my_images`)."""
    if dataset == FOLDER and data_dir:
        return f"{FOLDER} {os.path.basename(os.path.abspath(data_dir))}"
    return dataset


def results_rows(results: Mapping[str, Any]) -> list[list[str]]:
    """(label, formatted value) for each figure of results.json the table shows."""
    if "kernels" in results:
        results = {**results, "bits": f"{results.get('bits_activations')}/"
                                      f"{results.get('bits_weights')}"}
    return [[label, show(results[key])] for label, key, show in _ROWS
            if results.get(key) is not None]


def results_table(results: Mapping[str, Any], dataset: str) -> str:
    """The final table: `ARCH on DATASET`, then one row per figure."""
    return tabulate(results_rows(results), headers=[f"{results['arch']} on {dataset}", ""],
                    tablefmt="github", disable_numparse=True, colalign=("left", "right"))
