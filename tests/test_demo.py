"""scripts/demo_table.py: the demo's table, on tiny stage checkpoints made here (not the demo)."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from compressor.assembly.state import assemble_checkpoint
from compressor.models import create_model
from compressor.thinning.transform import thin
from compressor.training.checkpoint import save_run_checkpoint
from tests.conftest import run_cli, trained_like_batchnorms

ROOT = Path(__file__).resolve().parents[1]
# simplenet_digits (width 32) by hand: conv1 1*32*9, bn1 2*32, conv2 32*64*9, bn2 2*64,
# conv3 64*128*9, bn3 2*128, fc 128*10 + 10
DENSE_PARAMS = 288 + 64 + 18432 + 128 + 73728 + 256 + 1290
# MACs of one 8x8 sample: conv1 and conv2 at 8x8, conv3 at 4x4 (after the pool), fc
DENSE_MACS = 64 * 32 * 9 + 64 * 64 * 32 * 9 + 16 * 128 * 64 * 9 + 10 * 128
PRUNED_FILTERS = 64  # of conv3's 128 filters
PRUNED_ZEROS = PRUNED_FILTERS * 64 * 9


def _load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def demo_table() -> ModuleType:
    return _load_script("demo_table")


def _save_stage(run_dir: Path, model: torch.nn.Module, results: dict) -> None:
    run_dir.mkdir(parents=True)
    state = assemble_checkpoint(model, args={}, epoch=0, best_top1=results["top1"],
                                best_epoch=0)
    save_run_checkpoint(run_dir, state, is_best=False)
    (run_dir / "results.json").write_text(json.dumps(results))


@pytest.fixture(scope="module")
def stages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dense, pruned (conv3's first 64 filters zeroed) and thinned stage run directories made
    here, and the int8 stage made by the real CLI as scripts/demo.sh makes it."""
    runs = tmp_path_factory.mktemp("demo")
    torch.manual_seed(0)
    model = trained_like_batchnorms(create_model("simplenet_digits", "digits"))
    _save_stage(runs / "dense", model, {"top1": 90.0})
    with torch.no_grad():
        model.conv3.weight[:PRUNED_FILTERS] = 0
    _save_stage(runs / "pruned", model, {"top1": 89.5})
    thin(model)
    _save_stage(runs / "thinned", model, {"top1": 89.25})
    done = run_cli("-e", "--resume-from", str(runs / "thinned" / "checkpoint.pth.tar"), "--qe",
                   "--qe-per-channel", "--qe-calibration", "0.2", "--qe-convert-pytorch",
                   "-j", "0", "-o", str(runs), "-n", "int8")
    assert done.returncode == 0, done.stderr
    return runs


def test_figures_are_counted_on_the_rebuilt_models(demo_table: ModuleType, stages: Path) -> None:
    figures = demo_table.measure_stages(
        [(name, stages / name) for name in demo_table.STAGES], rounds=2)
    dense, pruned, thinned, int8 = figures
    assert (dense.params, dense.nonzeros, dense.macs) == (DENSE_PARAMS, DENSE_PARAMS, DENSE_MACS)
    assert (pruned.params, pruned.nonzeros, pruned.macs) == (
        DENSE_PARAMS, DENSE_PARAMS - PRUNED_ZEROS, DENSE_MACS)
    # thinning removes conv3's 64 filters, bn3's 64 channels and fc's 64 input columns
    removed = PRUNED_ZEROS + 2 * PRUNED_FILTERS + 10 * PRUNED_FILTERS
    assert (thinned.params, thinned.nonzeros) == (DENSE_PARAMS - removed,) * 2
    assert thinned.macs == DENSE_MACS - 16 * PRUNED_FILTERS * 64 * 9 - 10 * PRUNED_FILTERS
    # int8 folds each batch norm into its conv: 2 values per channel become 1 bias
    bn_channels = 32 + 64 + (128 - PRUNED_FILTERS)
    assert int8.params == thinned.params - bn_channels
    assert int8.macs == thinned.macs
    assert int8.checkpoint.name == "quantized_checkpoint.pth.tar"
    results = json.loads((stages / "int8" / "results.json").read_text())
    assert int8.top1 == results["quantized_top1"]
    assert [f.top1 for f in figures[:3]] == [90.0, 89.5, 89.25]
    # 8-bit weights: about a quarter of the float file (scales and zero points besides)
    assert 0.2 < int8.file_bytes / thinned.file_bytes < 0.35
    assert all(f.latency_ms > 0 for f in figures)


def test_quantized_checkpoint_and_top1_win(demo_table: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "checkpoint.pth.tar").write_bytes(b"")
    (tmp_path / "results.json").write_text(json.dumps({"top1": 10.0}))
    assert demo_table.stage_checkpoint(tmp_path).name == "checkpoint.pth.tar"
    assert demo_table.stage_top1(tmp_path) == 10.0
    (tmp_path / "quantized_checkpoint.pth.tar").write_bytes(b"")
    (tmp_path / "results.json").write_text(json.dumps({"top1": 10.0, "quantized_top1": 9.5}))
    assert demo_table.stage_checkpoint(tmp_path).name == "quantized_checkpoint.pth.tar"
    assert demo_table.stage_top1(tmp_path) == 9.5


def test_file_size_is_the_stored_state_dict(demo_table: ModuleType, stages: Path) -> None:
    figures = demo_table.measure_stages([("dense", stages / "dense")], rounds=1)
    state = torch.load(stages / "dense" / "checkpoint.pth.tar", weights_only=True)
    buffer = io.BytesIO()
    torch.save(state["state_dict"], buffer)
    assert figures[0].file_bytes == len(buffer.getvalue())
    assert 0 < figures[0].zlib_bytes < figures[0].file_bytes


def test_table_shows_ratios_to_dense(demo_table: ModuleType, stages: Path) -> None:
    figures = demo_table.measure_stages(
        [(name, stages / name) for name in ("dense", "pruned")], rounds=1)
    text = demo_table.format_table(figures)
    header, _, dense_row, pruned_row = text.splitlines()
    assert "stage" in header and "run directory" in header
    assert "1.00x (94,186)" in dense_row and str(stages / "dense") in dense_row
    nonzero = DENSE_PARAMS - PRUNED_ZEROS
    assert f"{nonzero / DENSE_PARAMS:.2f}x ({nonzero:,})" in pruned_row
    assert "89.50 (-0.50)" in pruned_row
    assert "-e --resume-from" in demo_table.resume_hint(figures)


def test_main_prints_one_table_and_the_hint(demo_table: ModuleType, stages: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert demo_table.main([str(stages), "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert all(out.count(f"| {name} ") == 1 for name in demo_table.STAGES)
    assert f"--resume-from {stages / 'int8' / 'quantized_checkpoint.pth.tar'}" in out


def test_missing_stage_names_the_fix(demo_table: ModuleType, stages: Path) -> None:
    with pytest.raises(SystemExit, match="run that stage of scripts/demo.sh"):
        demo_table.main([str(stages), "--stages", "dense", "int4"])
