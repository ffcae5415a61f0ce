"""End-to-end: --sense writes sensitivity.csv and sensitivity.png into the run directory."""

from __future__ import annotations

import csv

from tests.conftest import run_cli


def test_sense_filter_writes_csv_and_png(tmp_path):
    result = run_cli("-a", "simplenet_digits", "--sense", "filter", "--sense-range", "0", "0.9",
                     "0.45", "-j", "0", "-b", "128", "--etes", "0.3", "-o", str(tmp_path),
                     "-n", "sense")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "sense"
    with open(run_dir / "sensitivity.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert {r["parameter"] for r in rows} == {"conv1.weight", "conv2.weight", "conv3.weight"}
    assert sorted({float(r["sparsity"]) for r in rows}) == [0.0, 0.45]
    baseline = {r["top1"] for r in rows if float(r["sparsity"]) == 0.0}
    assert len(baseline) == 1  # level 0 leaves the model as it is, for every layer
    assert (run_dir / "sensitivity.png").read_bytes()[:4] == b"\x89PNG"
    assert (run_dir / "results.json").exists()
