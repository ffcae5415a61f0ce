"""End-to-end: the user's own model (-a path/to/file.py:Name) through every compression step,
and every mistake in it refused in one line before anything is written."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from compressor.training.checkpoint import load_checkpoint, save_checkpoint
from tests.conftest import assert_user_error, run_cli
from tests.test_cli_train_resume import _assert_tensors_equal
from tests.test_user_code import MODEL_SOURCE, write_model

# digits (8x8 grayscale, embedded) shown to the model at 16 px
DATA = ("--dataset", "digits", "--input-size", "1,16,16")
COMMON = ("-b", "64", "-j", "0", "-p", "0", "--deterministic")
TRAIN = (*COMMON, "--lr", "0.05", "--etrs", "0.3")
# AGP: filters of the stem (tied to the residual add), the branch and the downsampling conv
# go gradually; the head's weights element-wise
SCHEDULE = {
    "version": 1,
    "pruners": {
        "filters": {"class": "L1RankedStructureParameterPruner_AGP", "initial_sparsity": 0.25,
                    "final_sparsity": 0.5, "group_type": "Filters",
                    "weights": ["stem.0.weight", "branch.0.0.weight", "down.0.weight"]},
        "head": {"class": "AutomatedGradualPruner", "initial_sparsity": 0.2,
                 "final_sparsity": 0.5, "weights": ["fc.weight"]}},
    "policies": [{"pruner": {"instance_name": name}, "starting_epoch": 0, "ending_epoch": 2,
                  "frequency": 1} for name in ("filters", "head")]}


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | str]:
    """The user's model trained 2 epochs straight, and 1 epoch resumed to 2 with -a again."""
    out = tmp_path_factory.mktemp("user_code")
    ref = f"{write_model(out / 'code')}:ResidualNet"
    for name, epochs in (("full", "2"), ("first", "1")):
        result = run_cli("-a", ref, *DATA, *TRAIN, "--epochs", epochs, "-o", str(out), "-n", name)
        assert result.returncode == 0, result.stderr[-3000:]
    resumed = run_cli("-a", ref, "--resume-from", str(out / "first" / "checkpoint.pth.tar"),
                      *TRAIN, "--epochs", "2", "-o", str(out), "-n", "resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return {"out": out, "ref": ref, "file": out / "code" / "user_net.py",
            "checkpoint": out / "full" / "checkpoint.pth.tar"}


def test_the_run_records_the_code_it_imported(runs: dict) -> None:
    sha256 = hashlib.sha256(runs["file"].read_bytes()).hexdigest()
    expected = {"kind": "code", "ref": runs["ref"], "file": str(runs["file"].resolve()),
                "sha256": sha256}
    args = yaml.safe_load((runs["out"] / "full" / "args.yaml").read_text())
    assert args["arch_source"] == expected and args["arch"] == runs["ref"]
    checkpoint = torch.load(runs["checkpoint"], weights_only=True)
    assert checkpoint["args"]["arch_source"] == expected and checkpoint["arch"] == runs["ref"]
    assert checkpoint["input_spec"]["input_size"] == [1, 16, 16]
    assert checkpoint["input_spec"]["mean"] == [0.3054]  # digits' own normalization
    assert "stem.0.weight" in checkpoint["state_dict"] and checkpoint["num_classes"] == 10


def test_resume_with_the_arch_repeated_is_exact(runs: dict) -> None:
    full = load_checkpoint(runs["checkpoint"])
    resumed = load_checkpoint(runs["out"] / "resumed" / "checkpoint.pth.tar")
    assert full["epoch"] == resumed["epoch"] == 1
    _assert_tensors_equal(full["state_dict"], resumed["state_dict"], "state_dict")
    _assert_tensors_equal(full["optimizer"], resumed["optimizer"], "optimizer")


def test_evaluate_needs_the_arch_named_again(runs: dict, tmp_path: Path) -> None:
    refused = run_cli("--resume-from", str(runs["checkpoint"]), "-e", *COMMON,
                      "-o", str(tmp_path / "refused"))
    assert_user_error(refused, "your own code", f"-a {runs['ref']}")
    assert not (tmp_path / "refused").exists()
    evaluated = run_cli("-a", runs["ref"], "--resume-from", str(runs["checkpoint"]), "-e",
                        *COMMON, "-o", str(tmp_path), "-n", "eval")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "changed since" not in evaluated.stderr
    assert _results(tmp_path / "eval")["top1"] == pytest.approx(
        _results(runs["out"] / "full")["top1"])


def test_a_changed_file_is_one_warning_and_the_run_goes_on(runs: dict, tmp_path: Path) -> None:
    """The checkpoint of a copy of the code; the copy then edited: the resume warns and runs."""
    code = shutil.copy(runs["file"], tmp_path / "net_copy.py")
    ref = f"{code}:ResidualNet"
    checkpoint = load_checkpoint(runs["checkpoint"])
    checkpoint["arch"] = ref
    checkpoint["args"]["arch_source"] = {**checkpoint["args"]["arch_source"], "ref": ref,
                                         "file": str(Path(code).resolve())}
    save_checkpoint(tmp_path / "copy.pth.tar", checkpoint)
    Path(code).write_text(MODEL_SOURCE + "\n# widened later, perhaps\n")
    result = run_cli("-a", ref, "--resume-from", str(tmp_path / "copy.pth.tar"), "-e", *COMMON,
                     "-o", str(tmp_path), "-n", "eval")
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if "changed since" in line]
    assert len(warnings) == 1 and str(Path(code).resolve()) in warnings[0]
    recorded = checkpoint["args"]["arch_source"]["sha256"]
    assert recorded[:12] in warnings[0]
    assert hashlib.sha256(Path(code).read_bytes()).hexdigest()[:12] in warnings[0]
    assert _results(tmp_path / "eval")["top1"] == pytest.approx(
        _results(runs["out"] / "full")["top1"])


def test_agp_filter_pruning_then_thinnify(runs: dict, tmp_path: Path) -> None:
    schedule = tmp_path / "agp.yaml"
    schedule.write_text(yaml.safe_dump(SCHEDULE))
    pruned = run_cli("-a", runs["ref"], *DATA, *TRAIN, "--epochs", "2", "--compress",
                     str(schedule), "-o", str(tmp_path), "-n", "pruned")
    assert pruned.returncode == 0, pruned.stderr[-3000:]
    dense = _results(tmp_path / "pruned")
    assert dense["sparsity"] > 0.3
    thin = run_cli("-a", runs["ref"], "--resume-from",
                   str(tmp_path / "pruned" / "checkpoint.pth.tar"), "--thinnify", *COMMON,
                   "-o", str(tmp_path), "-n", "thin")
    assert thin.returncode == 0, thin.stderr[-3000:]
    thinned = _results(tmp_path / "thin")
    assert thinned["params"] < 0.7 * dense["params"] and thinned["macs"] < dense["macs"]
    assert thinned["top1"] == pytest.approx(dense["top1"], abs=1e-6)  # thinning is exact
    state = load_checkpoint(tmp_path / "thin" / "checkpoint.pth.tar")["state_dict"]
    assert state["branch.0.0.weight"].shape[0] < 16 and state["down.0.weight"].shape[0] < 32
    # the stem's zeroed filters still carry its batch norm's shift into the residual add, where
    # the unpruned branch adds to them: those channels are alive and stay
    assert state["stem.0.weight"].shape[0] == state["branch.2.weight"].shape[0] == 16
    evaluated = run_cli("-a", runs["ref"], "--resume-from",
                        str(tmp_path / "thin" / "checkpoint.pth.tar"), "-e", *COMMON,
                        "-o", str(tmp_path), "-n", "eval")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert _results(tmp_path / "eval")["top1"] == pytest.approx(thinned["top1"], abs=1e-6)
    assert _results(tmp_path / "eval")["params"] == thinned["params"]


@pytest.mark.slow
def test_int8_kernels_and_onnx_exports(runs: dict, tmp_path: Path) -> None:
    quantized = run_cli("-a", runs["ref"], "--resume-from", str(runs["checkpoint"]), "-e",
                        "--qe", "--qept", *COMMON, "-o", str(tmp_path), "-n", "int8")
    assert quantized.returncode == 0, quantized.stderr[-3000:]
    results = _results(tmp_path / "int8")
    assert results["kernels"] == "int8" and results["bits_activations"] == 8
    # int8 with the residual add quantized follows the float model closely
    assert results["top1"] == pytest.approx(_results(runs["out"] / "full")["top1"], abs=5.0)
    for name, checkpoint, kind in (
            ("float", runs["checkpoint"], "float"),
            ("qdq", tmp_path / "int8" / "quantized_checkpoint.pth.tar", "qdq")):
        exported = run_cli("-a", runs["ref"], "--resume-from", str(checkpoint), "--export-onnx",
                           *COMMON, "--etes", "0.2", "-o", str(tmp_path), "-n", name)
        assert exported.returncode == 0, exported.stderr[-3000:]
        record = json.loads((tmp_path / name / "export.json").read_text())
        assert record["kind"] == kind and record["arch"] == runs["ref"]
        assert record["input"]["shape"] == ["batch", 1, 16, 16]
        assert record["check"]["max_abs_diff"] <= record["check"]["allowed"]
        assert (tmp_path / name / "model.onnx").is_file()


def test_distillation_with_the_users_model_as_student(runs: dict, tmp_path: Path) -> None:
    """The teacher is a checkpoint of the user's code too: --kd-teacher names it again."""
    kd = ("--kd-resume", str(runs["checkpoint"]), "--kd-temp", "2")
    refused = run_cli("-a", runs["ref"], *DATA, *TRAIN, "--epochs", "1", *kd,
                      "-o", str(tmp_path / "refused"))
    assert_user_error(refused, "distillation teacher", f"--kd-teacher {runs['ref']}")
    assert not (tmp_path / "refused").exists()
    result = run_cli("-a", runs["ref"], *DATA, *TRAIN, "--epochs", "1", *kd,
                     "--kd-teacher", runs["ref"], "-o", str(tmp_path), "-n", "kd")
    assert result.returncode == 0, result.stderr[-3000:]
    record = load_checkpoint(tmp_path / "kd" / "checkpoint.pth.tar")["distillation"]
    assert record["teacher_arch"] == runs["ref"]
    assert record["teacher_path"] == str(runs["checkpoint"])
    assert f"distillation: teacher {runs['ref']}" in (tmp_path / "kd" / "log.txt").read_text()


def test_pretrained_weights_come_from_a_file_of_the_user(runs: dict, tmp_path: Path) -> None:
    torch.save(load_checkpoint(runs["checkpoint"])["state_dict"], tmp_path / "weights.pth")
    refused = run_cli("-a", runs["ref"], *DATA, "--pretrained", "-e", *COMMON,
                      "-o", str(tmp_path / "refused"))
    assert_user_error(refused, "no pretrained weights", "--pretrained-file")
    result = run_cli("-a", runs["ref"], *DATA, "--pretrained", "--pretrained-file",
                     str(tmp_path / "weights.pth"), "-e", *COMMON, "-o", str(tmp_path), "-n", "e")
    assert result.returncode == 0, result.stderr[-3000:]
    assert _results(tmp_path / "e")["top1"] == pytest.approx(
        _results(runs["out"] / "full")["top1"])


# -- one line for every mistake in the user's code, nothing written --------------------------

BAD_SOURCE = '''\
from torch import nn


class NotAModel:
    pass


class RaisesInInit(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        raise ValueError("width must be even")


def returns_a_number():
    return 3


class SevenClasses(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 7)

    def forward(self, x):
        return self.fc(x.flatten(1))


class WrongInput(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.fc = nn.Linear(100, num_classes)

    def forward(self, x):
        return self.fc(x.reshape(x.shape[0], -1))


instance = SevenClasses()
'''


def _line(source: str, text: str) -> int:
    return next(number for number, line in enumerate(source.splitlines(), 1) if text in line)


def _bad_case(case: str, root: Path) -> tuple[str, tuple[str, ...]]:
    """The -a of a mistake, and what its one line must say."""
    models = root / "bad_models.py"
    models.write_text(BAD_SOURCE)
    if case == "missing file":
        return f"{root / 'absent.py'}:Net", (str(root / "absent.py"), "not found")
    if case == "syntax error":
        (root / "syntax.py").write_text("from torch import nn\n\nclass Net(nn.Module:\n")
        return f"{root / 'syntax.py'}:Net", (f"{root / 'syntax.py'}:3", "SyntaxError")
    if case == "import error inside":
        (root / "imports.py").write_text("import torch\nimport a_module_nobody_installed\n")
        return f"{root / 'imports.py'}:Net", (f"{root / 'imports.py'}:2",
                                              "a_module_nobody_installed")
    if case == "script exits on import":  # argparse at the top of a training script
        (root / "script.py").write_text("import argparse\n\nparser = argparse.ArgumentParser()\n"
                                        "args = parser.parse_args()\n")
        return f"{root / 'script.py'}:Net", (f"{root / 'script.py'}:4", "SystemExit",
                                             "if __name__ == '__main__'")
    if case == "missing module":
        return "a_package_nobody_installed.models:Net", ("not found", "PYTHONPATH")
    fragments = {
        "missing name": ("SevenClases", ("has no 'SevenClases'", "did you mean SevenClasses")),
        "not a module class": ("NotAModel", ("'NotAModel'", "not a torch.nn.Module")),
        "an instance": ("instance", ("'instance'", "model instance")),
        "factory raises": ("RaisesInInit", (f"{models}:{_line(BAD_SOURCE, 'must be even')}",
                                            "ValueError: width must be even")),
        "factory returns no model": ("returns_a_number", ("returns_a_number()", "int",
                                                          "not a torch.nn.Module")),
        "forward fails": ("WrongInput", (f"{models}:{_line(BAD_SOURCE, 'x.reshape')}",
                                         "1x1x8x8", "--input-size")),
        "other class count": ("SevenClasses", ("outputs 7 classes", "10", "--num-classes 7",
                                               "num_classes parameter")),
    }
    name, expected = fragments[case]
    return f"{models}:{name}", expected


@pytest.mark.parametrize("case", [
    "missing file", "syntax error", "import error inside", "script exits on import",
    "missing module", "missing name",
    "not a module class", "an instance", "factory raises", "factory returns no model",
    "forward fails", "other class count"])
def test_a_mistake_in_the_code_is_one_line(case: str, tmp_path: Path) -> None:
    ref, fragments = _bad_case(case, tmp_path)
    result = run_cli("-a", ref, "--dataset", "digits", "--epochs", "1", *COMMON,
                     "-o", str(tmp_path / "out"))
    assert_user_error(result, *fragments)
    assert not (tmp_path / "out").exists()
