"""Every timm family through every step of the CLI, as a user runs them at 32 px on synthetic
data: train, resume (bitwise as one run), evaluate, AGP pruning, filter pruning with thinning,
a MACs budget, distillation from a pretrained timm teacher, int8 post-training quantization,
and ONNX export in float and int8. Each step works or refuses in one line as FAMILIES records
(the README's support table).

Minutes of CLI runs: marked `registry`, left out of the suite (pyproject's addopts) and run by
CI with `-m registry tests/test_timm_registry.py`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

from compressor.training.checkpoint import load_checkpoint
from tests.conftest import assert_user_error, run_cli
from tests.test_timm_models import plant_hub_weights

timm = pytest.importorskip("timm", reason="install the timm extra: pip install -e '.[timm]'")

pytestmark = pytest.mark.registry

WORKS = "works"
KEEPS = "keeps"  # thinning runs and removes nothing: the zeroed filters' channels are shared
UNMET = "unmet"  # the search ends without meeting the budget: exit 1, one line, model saved


@dataclass(frozen=True)
class Family:
    """A timm model, the weights its filter-pruning step prunes, and what each step does (WORKS,
    KEEPS / UNMET, or a fragment of the one-line refusal)."""

    name: str
    prune: tuple[str, ...]
    group: str = "Filters"
    channel_groups: int = 1
    thinning: str = WORKS
    budget: str = WORKS
    int8: str = WORKS
    qdq: str = WORKS


FAMILIES = (
    Family("resnet10t", ("layer1.0.conv1.weight", "layer2.0.conv1.weight")),
    Family("convnext_atto", ("stages.0.blocks.0.mlp.fc1.weight",)),  # a 1x1 convolution
    Family("mobilenetv3_small_050", ("blocks.1.0.conv_pw.weight",)),
    Family("efficientnet_b0", ("blocks.0.0.se.conv_reduce.weight",),
           qdq="ONNX Runtime's outputs for timm/efficientnet_b0 differ"),
    Family("regnetx_002", ("s1.b1.conv1.conv.weight",),
           thinning="grouped convolution 's1.b1.conv2.conv' (groups=3)"),
    # the budget search masks the identity-branch norms with the stream (its own schedule);
    # a plain filter schedule on one branch keeps its channels
    Family("repvgg_a0", ("stages.0.0.conv_kxk.conv.weight",), thinning=KEEPS),
    # a primary filter's channel reaches the concatenation twice (itself, its depthwise copy)
    Family("ghostnet_050", ("blocks.1.0.ghost1.primary_conv.0.weight",)),
    Family("vit_tiny_patch16_224", ("blocks.0.mlp.fc1.weight",), "Rows"),
    # one unit of qkv's rows is one dimension of each of the 3 heads in q, k and v
    Family("deit_tiny_patch16_224", ("blocks.0.attn.qkv.weight",), "Rows", channel_groups=9),
    Family("levit_128s", ("stages.0.blocks.0.mlp.ln1.linear.weight",), "Rows"),
    # its cascaded attention's groups never complete (set aside); filter pruners and the
    # search find the batch norm after a layer with torch.fx, which cannot trace it
    Family("efficientvit_m0", ("stages.0.blocks.0.ffn0.m.pw1.conv.weight",),
           thinning="torch.fx cannot trace EfficientVitMsra",
           budget="torch.fx cannot trace EfficientVitMsra",
           int8="torch.fx cannot trace EfficientVitMsra"),
    Family("fastvit_t8", ("stages.0.blocks.0.mlp.fc1.weight",)),
)
TEACHER = "timm/resnet10t"
COMMON = ("-j", "0", "-p", "0", "-b", "16", "--deterministic")
DATA = ("--dataset", "synthetic", "--etrs", "0.03", "--etes", "0.1", "--evs", "0.3")


def _ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


@dataclass(frozen=True)
class Runs:
    """One family's trained checkpoint and its runs' folder."""

    family: Family
    out: Path

    @property
    def arch(self) -> str:
        return f"timm/{self.family.name}"

    @property
    def checkpoint(self) -> Path:
        return self.out / "first" / "checkpoint.pth.tar"

    def train(self, *args: str) -> tuple[str, ...]:
        return ("-a", self.arch, "--input-size", "3,32,32", "--num-classes", "10", "--lr",
                "0.01", *args, *DATA, *COMMON)

    def run(self, name: str, *args: str, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, *COMMON, "-o", str(self.out), "-n", name, env=env)


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda family: family.name)
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Runs]:
    """The family trained for one epoch (what the other steps start from).

    A family's runs take up to a gigabyte of checkpoints and exports: they are removed once its
    tests pass, so that the whole registry never sits on disk at once (kept where one failed).
    """
    family: Family = request.param
    runs = Runs(family, tmp_path_factory.mktemp(family.name))
    failed_before = request.session.testsfailed
    # random weights on random images: re-estimated batch-norm statistics put some families'
    # logits near 100, where the exports' checks (float32 to 1e-5 of the output scale, QDQ
    # rounding) are at their limits; this module tests each step's path, so the first run keeps
    # its running statistics as trained
    _ok(run_cli(*runs.train("--epochs", "1", "--bn-recalibrate", "0", "-o", str(runs.out),
                            "-n", "first")))
    yield runs
    if request.session.testsfailed == failed_before:
        shutil.rmtree(runs.out, ignore_errors=True)


def _metrics(history: list[dict]) -> list[dict]:
    """An epoch's figures without its timings (which differ from run to run)."""
    return [{k: v for k, v in row.items() if not k.endswith("time")} for row in history]


def _schedule(path: Path, pruner: dict, extra: dict | None = None) -> Path:
    path.write_text(yaml.safe_dump({"version": 1, "pruners": {"p": pruner}, **(extra or {})}))
    return path


def test_resume_is_one_run(runs: Runs) -> None:
    # the same flags as the first run (--bn-recalibrate 0 included): a resume continues the run
    # its command line describes; resuming with re-estimation is tested on the digits
    _ok(run_cli(*runs.train("--epochs", "2", "--bn-recalibrate", "0", "-o", str(runs.out),
                            "-n", "full")))
    _ok(runs.run("resumed", "--resume-from", str(runs.checkpoint), "--epochs", "2", "--lr",
                 "0.01", "--bn-recalibrate", "0", *DATA))
    full = load_checkpoint(runs.out / "full" / "checkpoint.pth.tar")
    resumed = load_checkpoint(runs.out / "resumed" / "checkpoint.pth.tar")
    assert _metrics(full["history"]) == _metrics(resumed["history"]) and resumed["epoch"] == 1
    for key, value in full["state_dict"].items():
        assert torch.equal(value, resumed["state_dict"][key]), key


def test_evaluate_from_the_checkpoint_alone(runs: Runs) -> None:
    _ok(runs.run("eval", "--resume-from", str(runs.checkpoint), "-e", *DATA))
    assert _results(runs.out / "eval")["top1"] == pytest.approx(
        _results(runs.out / "first")["top1"])


def test_agp_pruning_reaches_its_sparsity(runs: Runs) -> None:
    state = load_checkpoint(runs.checkpoint)["state_dict"]
    weights = [key for key, value in state.items()
               if key.endswith("weight") and value.dim() in (2, 4) and value.shape[1] > 1][:6]
    schedule = _schedule(runs.out / "agp.yaml", {
        "class": "AutomatedGradualPruner", "initial_sparsity": 0.2, "final_sparsity": 0.5,
        "weights": weights}, {"policies": [{"pruner": {"instance_name": "p"},
                                            "starting_epoch": 0, "ending_epoch": 2,
                                            "frequency": 1}]})
    _ok(run_cli(*runs.train("--epochs", "2", "--compress", str(schedule), "-o", str(runs.out),
                            "-n", "agp")))
    pruned = load_checkpoint(runs.out / "agp" / "checkpoint.pth.tar")["state_dict"]
    for key in weights:
        assert float((pruned[key] == 0).float().mean()) >= 0.45, key


def test_filter_pruning_and_thinning(runs: Runs) -> None:
    family = runs.family
    pruner = {"class": "L1RankedStructureParameterPruner_AGP", "initial_sparsity": 0.3,
              "final_sparsity": 0.5, "group_type": family.group, "weights": list(family.prune)}
    if family.channel_groups > 1:
        pruner["channel_groups"] = family.channel_groups
    schedule = _schedule(runs.out / "filters.yaml", pruner, {
        "extensions": {"thinner": {"class": "FilterRemover",
                                   "thinning_func_str": "remove_filters"}},
        "policies": [{"pruner": {"instance_name": "p"}, "starting_epoch": 0,
                      "ending_epoch": 1, "frequency": 1},
                     {"extension": {"instance_name": "thinner"}, "epochs": [1]}]})
    result = run_cli(*runs.train("--epochs", "2", "--compress", str(schedule), "-o",
                                 str(runs.out), "-n", "filters"))
    if family.thinning not in (WORKS, KEEPS):
        assert_user_error(result, family.thinning)
        # refused when the schedule loaded, before any epoch
        assert not (runs.out / "filters" / "checkpoint.pth.tar").exists()
        return
    _ok(result)
    dense = _results(runs.out / "first")["params"]
    thinned = _results(runs.out / "filters")["params"]
    assert thinned < dense if family.thinning == WORKS else thinned == dense
    _ok(runs.run("filters_eval", "--resume-from",
                 str(runs.out / "filters" / "checkpoint.pth.tar"), "-e", *DATA))
    assert _results(runs.out / "filters_eval")["params"] == thinned


def test_macs_budget(runs: Runs) -> None:
    result = runs.run("budget", "--resume-from", str(runs.checkpoint), "--target-macs", "0.7",
                      "--epochs", "3", "--lr", "0.01", *DATA)
    budget = runs.family.budget
    if budget == UNMET:
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert "budget not met" in result.stderr.strip().splitlines()[-1]
    elif budget != WORKS:
        assert_user_error(result, budget)
        return
    else:
        _ok(result)
        assert json.loads((runs.out / "budget" / "budget.json").read_text())["met"] is True
    assert (runs.out / "budget" / "checkpoint.pth.tar").is_file()


def test_distillation_from_a_pretrained_timm_teacher(runs: Runs, tmp_path: Path) -> None:
    torch.manual_seed(0)
    teacher_weights = timm.create_model(TEACHER.removeprefix("timm/")).state_dict()
    plant_hub_weights(tmp_path / "hf", "timm/resnet10t.c3_in1k", teacher_weights)
    result = runs.run("kd", "-a", runs.arch, "--input-size", "3,32,32", "--epochs", "1", "--lr",
                      "0.01", "--kd-teacher", TEACHER, "--kd-pretrained", *DATA,
                      env={"HF_HOME": str(tmp_path / "hf")})
    _ok(result)
    assert load_checkpoint(runs.out / "kd" / "checkpoint.pth.tar")["distillation"] is not None


def test_int8_and_onnx_exports(runs: Runs) -> None:
    pytest.importorskip("onnxruntime", reason="install the onnx extra: pip install -e '.[onnx]'")
    _ok(runs.run("onnx", "--resume-from", str(runs.checkpoint), "-e", "--export-onnx", *DATA))
    record = json.loads((runs.out / "onnx" / "export.json").read_text())
    assert record["kind"] == "float"
    assert record["check"]["max_abs_diff"] <= record["check"]["allowed"]
    quantize = ("--resume-from", str(runs.checkpoint), "-e", "--qe", "--qe-calibration", "0.2",
                *DATA)
    result = runs.run("int8", *quantize, "--qept")
    if runs.family.int8 != WORKS:  # refused: the simulation is what quantization gives
        assert_user_error(result, runs.family.int8)
        _ok(runs.run("simulated", *quantize))
        assert _results(runs.out / "simulated")["kernels"] == "simulated"
        return
    _ok(result)
    int8 = _results(runs.out / "int8")
    assert int8["kernels"] == "int8"
    quantized = runs.out / "int8" / "quantized_checkpoint.pth.tar"
    _ok(runs.run("int8_eval", "--resume-from", str(quantized), "-e", *DATA))
    assert _results(runs.out / "int8_eval")["top1"] == int8["quantized_top1"]
    result = runs.run("qdq", "--resume-from", str(quantized), "--export-onnx", *DATA)
    if runs.family.qdq != WORKS:
        assert_user_error(result, runs.family.qdq)
        return
    _ok(result)
    record = json.loads((runs.out / "qdq" / "export.json").read_text())
    assert record["kind"] == "qdq"
    assert record["check"]["max_abs_diff"] <= record["check"]["allowed"]
