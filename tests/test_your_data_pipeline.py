"""The README's path for a user's own data, end to end in real CLI runs: a folder of images ->
fine-tune a pretrained backbone -> compress to a budget -> int8 -> ONNX, each step reading only
what the step before wrote. About 25 s of CLI runs: marked `registry`, run by CI after the
suite (.ci/run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.test_data_folder import write_tree
from tests.test_transfer import _plant

ARCH = "resnet18"
TINY = ("-b", "8", "-j", "0", "-p", "0", "--deterministic")


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


@pytest.mark.registry
@pytest.mark.filterwarnings("ignore")
def test_folder_fine_tune_budget_int8_onnx(torch_home: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime", reason="the [onnx] extra (onnxruntime) is not installed")
    _plant(ARCH)
    data = write_tree(tmp_path / "data", {"train": 8, "val": 3})
    out = tmp_path / "logs"
    tuned = run_cli(str(data), "-a", ARCH, "--pretrained", "--input-size", "3,32,32",
                    "--lr", "0.01", "--epochs", "2", "--vs", "0.25", *TINY, "-o", str(out),
                    "-n", "tuned")
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    assert "newly initialised for the dataset's classes: fc" in tuned.stdout
    assert _results(out / "tuned")["dataset"] == "folder"

    small = run_cli(str(data), "--resume-from", str(out / "tuned" / "checkpoint.pth.tar"),
                    "--target-macs", "0.5", "--epochs", "2", "--vs", "0.25", "--qe", "--qept",
                    *TINY, "-o", str(out), "-n", "small")
    budget = json.loads((out / "small" / "budget.json").read_text())
    assert all(entry["met"] for entry in budget["budgets"]), budget["budgets"]
    # eight noise images a class: the pruned model may fall to chance, which is never "met"
    # (exit status 1, one line, every file written all the same)
    assert small.returncode == (0 if budget["met"] else 1), small.stderr[-3000:]
    if not budget["met"]:
        assert budget["accuracy"]["collapsed"], budget["accuracy"]
        assert "at chance" in small.stderr.strip().splitlines()[-1]
    int8 = out / "small" / "quantized_checkpoint.pth.tar"
    assert int8.is_file()

    evaluated = run_cli(str(data), "-e", "--resume-from", str(int8), *TINY, "-o", str(out),
                        "-n", "eval")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    results = _results(out / "eval")
    assert results["num_classes"] == 3 and results["class_names"] == ["ant", "bee", "cat"]
    assert "top5" not in results

    exported = run_cli(str(data), "--resume-from", str(int8), "--export-onnx", *TINY,
                       "-o", str(out), "-n", "onnx")
    assert exported.returncode == 0, exported.stderr[-3000:]
    export = json.loads((out / "onnx" / "export.json").read_text())
    assert export["kind"] == "qdq" and (out / "onnx" / "model.onnx").is_file()
