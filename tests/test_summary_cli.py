"""End-to-end: --summary prints the tables and exits without data or a run directory."""

from __future__ import annotations

from tests.conftest import run_cli


def test_summary_compute_and_sparsity(tmp_path):
    result = run_cli("-a", "resnet20_cifar", "--summary", "compute", "--summary", "sparsity",
                     "-o", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "layer3.2.conv2" in out and "IFM (CxHxW)" in out and "64x8x8" in out
    assert "Total MACs at input 3x32x32: 40,8" in out
    assert "Filters/Rows zero (%)" in out and "layer1.0.conv1.weight" in out
    assert list(tmp_path.iterdir()) == []
